//! One bad replica must not take its host down: three replicas of one
//! service behind one name (`svc.test`, pinned to 127.0.0.1, .2 and .3 on
//! one port through the policy's `ReplicaResolver`), the first one broken,
//! 8 calls in flight.
//!
//! Real sockets, so the policy runs on a manual clock: its sleeps are
//! recorded, never slept, and the replica table's ejections end only when
//! the test moves the clock.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, Partition,
    RetryAdmission, RetryRequest,
};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{ReportSlot, RetryMiddleware, RetryPolicy, RetryReportExt, StopReason};
use support::replicas::{replicas, Replica, ANSWERS_503, HEALTHY, RESETS};

fn client(policy: &RetryPolicy, addrs: &[SocketAddr]) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .dns_resolver(policy.replica_resolver().pin("svc.test", addrs))
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(RetryMiddleware::new(policy.clone()))
        .build()
}

/// What a run of calls came to.
#[derive(Debug, Default)]
struct Run {
    calls: usize,
    succeeded: usize,
    attempts: usize,
    /// Attempts whose report names the broken replica.
    on_broken: usize,
}

/// `calls` GETs, 8 in flight.
async fn run(client: &ClientWithMiddleware, calls: usize, broken: SocketAddr) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, next) = (client.clone(), next.clone());
        set.spawn(async move {
            let mut run = Run::default();
            while next.fetch_add(1, Ordering::SeqCst) < calls {
                run.calls += 1;
                let slot = ReportSlot::new();
                let r = client
                    .get("http://svc.test/items")
                    .with_extension(slot.clone())
                    .send()
                    .await;
                let report = slot.take().expect("a report");
                run.attempts += report.attempts() as usize;
                run.on_broken += report
                    .addresses()
                    .iter()
                    .filter(|a| **a == Some(broken))
                    .count();
                if r.is_ok_and(|r| r.status() == 200) {
                    run.succeeded += 1;
                }
            }
            run
        });
    }
    let mut total = Run::default();
    while let Some(r) = set.join_next().await {
        let r = r.unwrap();
        total.calls += r.calls;
        total.succeeded += r.succeeded;
        total.attempts += r.attempts;
        total.on_broken += r.on_broken;
    }
    total
}

fn policy(clock: &ManualClock) -> RetryPolicy {
    RetryPolicy::builder()
        .manual_clock(clock)
        .seed(7)
        .build()
        .unwrap()
}

/// The broken replica resets every connection after reading the request:
/// every call succeeds, each retry after a reset attributed to it goes to
/// another replica at once (no backoff sleep), and the broken one gets no
/// new connection once it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_resets_is_left_and_no_call_fails() {
    let (addrs, servers) = replicas().await;
    servers[0].set(RESETS);
    let clock = ManualClock::new();
    let policy = policy(&clock);
    let client = client(&policy, &addrs);
    let r = run(&client, 300, addrs[0]).await;
    println!(
        "reset: {r:?}, per replica {:?}",
        servers.iter().map(Replica::requests).collect::<Vec<_>>()
    );
    assert_eq!(r.succeeded, 300, "{r:?}");
    // A reset the resolver cannot attribute (on a connection the pool
    // handed over from another request's connect, see below) is the
    // host's failure and is retried after the usual backoff: at most one
    // such sleep per unattributed request. Every attributed reset is
    // retried at once.
    let unattributed = servers[0].requests().saturating_sub(r.on_broken);
    let slept = clock.sleeps().iter().filter(|d| !d.is_zero()).count();
    assert!(
        slept <= unattributed,
        "{slept} backoff sleeps for {unattributed} unattributed resets: {:?}, {r:?}",
        clock.sleeps()
    );
    // The broken replica's first connections fail; after that it gets
    // none until a probe is due (the clock never moved).
    assert!(servers[0].requests() <= 8, "{}", servers[0].requests());
    // Each attempt names its address, but one on a connection the pool
    // handed over from another request's connect (see above).
    assert!(
        r.on_broken >= 1 && r.on_broken <= servers[0].requests(),
        "{r:?}"
    );
    assert!(r.attempts <= 300 + 8, "{r:?}");
}

/// Admission as the default does it, counting the failures it is told of.
#[derive(Debug)]
struct Counting {
    inner: AdaptiveAdmission,
    failures: AtomicUsize,
}

impl RetryAdmission for Counting {
    fn first_attempt(&self, partition: Partition, now: Instant) {
        self.inner.first_attempt(partition, now);
    }
    fn admit(&self, partition: Partition, retry: RetryRequest, now: Instant) -> Admission {
        self.inner.admit(partition, retry, now)
    }
    fn record(&self, partition: Partition, attempt: AttemptRecord, now: Instant) {
        if attempt.result() == AttemptResult::Failure {
            self.failures.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.record(partition, attempt, now);
    }
}

/// One broken replica of three is not a host outage: the admission (and
/// the breaker, which is told the same) hears of none of its failures
/// while the other two answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_replica_is_no_outage_for_admission() {
    for mode in [RESETS, ANSWERS_503] {
        let (addrs, servers) = replicas().await;
        servers[0].set(mode);
        let clock = ManualClock::new();
        let counting = Arc::new(Counting {
            inner: AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap(),
            failures: AtomicUsize::new(0),
        });
        let policy = RetryPolicy::builder()
            .manual_clock(&clock)
            .seed(7)
            .shared_admission(counting.clone())
            .build()
            .unwrap();
        let client = client(&policy, &addrs);
        let r = run(&client, 100, addrs[0]).await;
        // A reset is never pooled; a 503's connection may be, once (see
        // the 503 test).
        let lost = if mode == RESETS { 0 } else { 2 };
        assert!(r.succeeded >= 100 - lost, "{r:?}");
        assert!(r.on_broken > 0, "{r:?}");
        // Every failure attributed to the broken replica is kept from the
        // admission. One that cannot be attributed counts against the host:
        // a reset on a connection the pool handed over from another
        // request's connect (the resolver noted its address in that
        // request's watch). An answer always names its address, so for
        // 503s that is none.
        let unattributed = servers[0].requests() - r.on_broken;
        let failures = counting.failures.load(Ordering::SeqCst);
        assert!(
            failures <= unattributed,
            "mode {mode}: {failures} failures, {r:?}"
        );
        if mode == ANSWERS_503 {
            assert_eq!(failures, 0);
        }
    }
}

/// The broken replica answers every request 503 on a connection it keeps
/// open: the calls succeed, and its share of attempts stays small.
///
/// Not every call, always: a connection to it that was idle in the pool
/// when it first failed carries one more request (with `Connection:
/// close`), and a call that meets such connections on all three attempts
/// fails. About 3 calls in 10 000 did so over 25 runs of this file; at
/// most two of 300 is the bound checked (the line is 99.5 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_answers_503_is_left_and_no_call_fails() {
    let (addrs, servers) = replicas().await;
    servers[0].set(ANSWERS_503);
    let clock = ManualClock::new();
    let policy = policy(&clock);
    let client = client(&policy, &addrs);
    let r = run(&client, 300, addrs[0]).await;
    let per_replica: Vec<usize> = servers.iter().map(Replica::requests).collect();
    println!(
        "503: {r:?}, per replica {per_replica:?}, slept {:?}",
        clock.elapsed()
    );
    assert!(r.succeeded >= 298, "{r:?}");
    let all: usize = per_replica.iter().sum();
    assert!(
        servers[0].requests() * 100 <= all * 15,
        "the broken replica took {} of {all} attempts",
        servers[0].requests()
    );
    assert_eq!(r.on_broken, servers[0].requests());
}

/// A replica that recovers gets traffic back: probed once its ejection is
/// over, and in turn again after the probe succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_replica_gets_traffic_back() {
    let (addrs, servers) = replicas().await;
    servers[0].set(RESETS);
    let clock = ManualClock::new();
    let policy = policy(&clock);
    let client = client(&policy, &addrs);
    let r = run(&client, 60, addrs[0]).await;
    assert_eq!(r.succeeded, 60);
    let before = servers[0].requests();
    servers[0].set(HEALTHY);
    // Still ejected: no new request reaches it.
    run(&client, 60, addrs[0]).await;
    assert_eq!(servers[0].requests(), before);
    // Its ejection over (at most 30 s), the next new connection probes it.
    clock.advance(Duration::from_secs(31));
    let r = run(&client, 120, addrs[0]).await;
    assert_eq!(r.succeeded, 120);
    assert!(
        servers[0].requests() > before + 1,
        "the recovered replica got {} requests",
        servers[0].requests() - before
    );
    assert!(!policy
        .replicas()
        .degraded("svc.test", std::time::Instant::now()));
}

/// Every replica broken: that is an outage, and the host's admission caps
/// it as it caps any outage; no call is retried elsewhere for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_replicas_all_fail_is_still_capped() {
    let (addrs, servers) = replicas().await;
    for s in &servers {
        s.set(ANSWERS_503);
    }
    let clock = ManualClock::new();
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(7)
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let client = client(&policy, &addrs);
    let r = run(&client, 400, addrs[0]).await;
    let all: usize = servers.iter().map(Replica::requests).sum();
    println!("all broken: {r:?}, {all} requests for 400 calls");
    assert_eq!(r.succeeded, 0);
    assert!(all as f64 <= 400.0 * 1.15, "{all} requests for 400 calls");
}

/// Without the resolver nothing changes: no address is reported, and the
/// report reads as before.
#[tokio::test]
async fn without_the_resolver_nothing_is_attributed() {
    let (addrs, _servers) = replicas().await;
    let clock = ManualClock::new();
    let policy = policy(&clock);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let r = client
        .get(format!("http://{}/items", addrs[1]))
        .send()
        .await
        .unwrap();
    let report = r.retry_report().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert!(report.addresses().is_empty());
}
