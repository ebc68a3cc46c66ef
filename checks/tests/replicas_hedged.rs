//! Replicas and hedging together (issue 51, "features that meet"): the
//! two copies of a hedged attempt run in one task, each on a connection
//! of its own, and each copy's failure is its own replica's.
//!
//! Three replicas of `svc.test` (127.0.0.1, .2 and .3, one port), pinned
//! through the policy's `ReplicaResolver`; no pooled connection, so every
//! request's connection is looked up and handed the addresses in turn (a
//! fresh table starts at the first). Real sockets on tokio's current
//! thread: a copy's answer can only arrive once the test's task yields,
//! so the first copy is always still connecting when its first poll ends,
//! and the policy's manual clock ends the hedge delay at once (moving the
//! clock by it): the hedge goes out on every hedged attempt, with no real
//! sleeping and no assertion on timing.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::time::{Clock, ManualClock};
use reqwest_safe_retry::{ReportSlot, RetryMiddleware, RetryPolicy, RetryReport};
use support::replicas::{replicas, Replica, HANGS, HEALTHY, RESETS, RESETS_ONCE};

const NAME: &str = "svc.test";
const MS: Duration = Duration::from_millis(1);
/// How long an address that failed once is out of service.
const FIRST_EJECTION: Duration = Duration::from_secs(1);

/// A policy on `clock` that hedges an attempt to a host with
/// `min_samples` latencies on record, after `delay`, `extra` hedges
/// earned by each first attempt (0.5 in every test: one hedge for the
/// warm call and the call tested, so that the latter's retry is not
/// hedged).
fn policy(clock: &ManualClock, delay: Duration, min_samples: u32, extra: f64) -> RetryPolicy {
    RetryPolicy::builder()
        .manual_clock(clock)
        .seed(7)
        .hedge(HedgeConfig {
            min_samples,
            min_delay: delay,
            max_delay: delay,
            max_extra_load: extra,
            ..HedgeConfig::default()
        })
        .build()
        .unwrap()
}

/// A client whose every request opens its own connection to `NAME`,
/// resolved to `addrs` by the policy's resolver.
fn client(policy: &RetryPolicy, addrs: &[SocketAddr]) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .dns_resolver(policy.replica_resolver().pin(NAME, addrs))
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(RetryMiddleware::new(policy.clone()))
        .build()
}

/// One GET: its status (0 for an error) and report.
async fn get(client: &ClientWithMiddleware) -> (u16, RetryReport) {
    let slot = ReportSlot::new();
    let r = client
        .get(format!("http://{NAME}/items"))
        .with_extension(slot.clone())
        .send()
        .await;
    let status = r.map_or(0, |r| r.status().as_u16());
    (status, slot.take().expect("a report"))
}

fn requests(servers: &[Replica]) -> Vec<usize> {
    servers.iter().map(Replica::requests).collect()
}

fn counts(report: &RetryReport) -> (u32, u32, u32) {
    (report.attempts(), report.hedges(), report.hedge_wins())
}

/// A call whose first attempt was hedged, both copies reset, and whose
/// retry succeeded on `retry`: the attempt's address is the first copy's
/// (`first`, whose failure the race returned), and each copy's replica
/// was blamed for its own reset, so `retry` alone is in service.
fn each_reset_blamed(
    policy: &RetryPolicy,
    clock: &ManualClock,
    (status, report): (u16, &RetryReport),
    first: SocketAddr,
    retry: SocketAddr,
) {
    assert_eq!(status, 200, "{report}");
    assert_eq!(counts(report), (2, 1, 0), "{report}");
    assert_eq!(
        report.addresses(),
        [Some(first), Some(retry)],
        "the first attempt's failure is the first copy's reset, on {first}"
    );
    assert!(
        !policy.replicas().healthy_besides(NAME, retry, clock.now()),
        "a replica that reset is still in service: only {retry} should be"
    );
}

/// Both copies reset before any answer, each on its own replica: each
/// replica is blamed for its own reset, the attempt's address is the one
/// whose failure the race returned (the first copy's), and the retry goes
/// at once to the one replica left.
#[tokio::test]
async fn each_copys_reset_is_blamed_on_its_own_replica() {
    let (addrs, servers) = replicas().await;
    let clock = ManualClock::new();
    let policy = policy(&clock, MS, 1, 0.5);
    let client = client(&policy, &addrs);
    // A latency on record: the host is hedged from now on. The first
    // connection went to .1, the next goes to .2, the one after to .3.
    assert_eq!(get(&client).await.0, 200);
    assert_eq!(requests(&servers), [1, 0, 0]);
    servers[1].set(RESETS);
    servers[2].set(RESETS);

    let (status, report) = get(&client).await;
    assert_eq!(requests(&servers), [2, 1, 1], "first copy .2, hedge .3");
    each_reset_blamed(&policy, &clock, (status, &report), addrs[1], addrs[0]);
    // The retry went elsewhere at once: the only sleep is the hedge delay.
    assert!(
        clock.sleeps().iter().all(|d| d.is_zero() || *d == MS),
        "{:?}",
        clock.sleeps()
    );
}

/// Of two replicas, both reset, one under each copy: no replica is left
/// healthy, so the failure is the host's (a backoff, not "elsewhere at
/// once"), though each reset alone would have been one replica's.
#[tokio::test]
async fn two_replicas_both_resetting_under_one_attempt_is_the_hosts_failure() {
    let (addrs, servers) = replicas().await;
    let addrs = &addrs[..2];
    let clock = ManualClock::new();
    let policy = policy(&clock, MS, 1, 0.5);
    let client = client(&policy, addrs);
    assert_eq!(get(&client).await.0, 200);
    // The first copy goes to .2 and resets; the hedge to .1, which resets
    // once, then answers the retry.
    servers[1].set(RESETS);
    servers[0].set(RESETS_ONCE);

    let (status, report) = get(&client).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(counts(&report), (2, 1, 0), "{report}");
    assert_eq!(
        report.addresses(),
        [Some(addrs[1]), Some(addrs[0])],
        "the first attempt's failure is the first copy's reset, on .2"
    );
    let backoffs: Vec<Duration> = clock.sleeps().into_iter().filter(|d| *d > MS).collect();
    assert_eq!(
        backoffs.len(),
        1,
        "every replica reset: the retry waits a backoff, {:?}",
        clock.sleeps()
    );
}

/// Sets up a replica due for a probe when the hedge is sent, not before:
/// .1 resets once (the warm call's first attempt; the retry goes to .2),
/// and the clock is moved to one hedge delay before its ejection ends.
/// The next connection goes to .3 (the first copy), the one after it
/// probes .1 (the hedge).
async fn probed_by_the_hedge(
    delay: Duration,
) -> (
    ManualClock,
    RetryPolicy,
    ClientWithMiddleware,
    Vec<SocketAddr>,
    Vec<Replica>,
) {
    let (addrs, servers) = replicas().await;
    let clock = ManualClock::new();
    // Two latencies before a hedge: the warm call's retry is not hedged.
    let policy = policy(&clock, delay, 2, 0.5);
    let client = client(&policy, &addrs);
    servers[0].set(RESETS_ONCE);
    let (status, report) = get(&client).await;
    assert_eq!((status, counts(&report)), (200, (2, 0, 0)), "{report}");
    assert_eq!(report.addresses(), [Some(addrs[0]), Some(addrs[1])]);
    clock.advance(FIRST_EJECTION - delay);
    (clock, policy, client, addrs, servers)
}

/// The hedge's connection probes a replica that still resets while the
/// first copy's replica resets too: the probe ends with the hedge's own
/// failure (its ejection doubles), the first copy's replica is blamed for
/// the first copy's.
#[tokio::test]
async fn a_probe_made_by_the_hedge_ends_with_the_hedges_failure() {
    let delay = 10 * MS;
    let (clock, policy, client, addrs, servers) = probed_by_the_hedge(delay).await;
    servers[0].set(RESETS);
    servers[2].set(RESETS);

    let (status, report) = get(&client).await;
    assert_eq!(requests(&servers), [2, 2, 1], "first copy .3, hedge .1");
    each_reset_blamed(&policy, &clock, (status, &report), addrs[2], addrs[1]);
    let table = policy.replicas();
    // Half way through .1's doubled ejection, .3's single one is over:
    // the next connection probes .3, not .1.
    clock.advance(FIRST_EJECTION + FIRST_EJECTION / 2);
    let order = table.order(NAME, &addrs, clock.now());
    assert_eq!(order[0], addrs[2], "{order:?}");
}

/// The hedge's connection probes a replica that never answers, and the
/// first copy's answer wins: the hedge is dropped, and its probe ends
/// with it (the replica is due again one ejection later), with no
/// verdict on the replica.
#[tokio::test]
async fn a_probe_made_by_a_hedge_that_lost_ends_when_it_is_dropped() {
    let delay = 10 * MS;
    let (clock, policy, client, addrs, servers) = probed_by_the_hedge(delay).await;
    servers[0].set(HANGS);
    servers[2].set(HEALTHY);

    let (status, report) = get(&client).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(counts(&report), (1, 1, 0), "{report}");
    assert_eq!(report.addresses(), [Some(addrs[2])]);
    let table = policy.replicas();
    let now = clock.now();
    assert!(table.degraded(NAME, now), ".1 is still out of service");
    clock.advance(FIRST_EJECTION);
    let order = table.order(NAME, &addrs, clock.now());
    assert_eq!(
        order[0], addrs[0],
        "the probe of .1 is due again: {order:?}"
    );
}
