//! Replicas as they are deployed: names looked up as the system resolver
//! answers (several addresses, no port), a replica that recovers, an
//! address that is gone, addresses that change between look-ups, and a
//! probe whose caller gives up. Beside `replicas.rs`, which pins a name to
//! three addresses that stay as they are.
//!
//! Real sockets on 127.0.0.x, so the policy runs on a manual clock: its
//! sleeps are recorded, never slept, and ejections end only when the test
//! moves the clock. The last test goes through the real system resolver,
//! with names it adds to the hosts file.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::time::{Clock, ManualClock};
use reqwest_safe_retry::{ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy, StopReason};
use support::replicas::{
    dead, replicas, Lookup, Replica, ANSWERS_503, HANGS, HEALTHY, RESETS, RESETS_ONCE,
};

fn ips(addrs: &[SocketAddr]) -> Vec<IpAddr> {
    addrs.iter().map(SocketAddr::ip).collect()
}

fn policy(clock: &ManualClock, attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .manual_clock(clock)
        .seed(7)
        .max_attempts(attempts)
        .build()
        .unwrap()
}

/// Our client over `http`, the policy's resolver reading `lookup`.
fn through(policy: &RetryPolicy, lookup: &Lookup, pooled: bool) -> ClientWithMiddleware {
    let mut http = reqwest::Client::builder()
        .dns_resolver(policy.replica_resolver().lookup_with(lookup.clone()));
    if !pooled {
        http = http.pool_max_idle_per_host(0);
    }
    ClientBuilder::new(http.build().unwrap())
        .with(RetryMiddleware::new(policy.clone()))
        .build()
}

/// One GET, its status (0 for an error) and the report's addresses.
async fn get(client: &ClientWithMiddleware, url: &str) -> (u16, Vec<Option<SocketAddr>>) {
    let slot = ReportSlot::new();
    let r = client.get(url).with_extension(slot.clone()).send().await;
    let report = slot.take().expect("a report");
    (
        r.map_or(0, |r| r.status().as_u16()),
        report.addresses().to_vec(),
    )
}

fn requests(servers: &[Replica]) -> Vec<usize> {
    servers.iter().map(Replica::requests).collect()
}

/// A look-up answers without a port: the addresses are kept, reported and
/// compared with the port the connection used (the URL's), so an answer
/// clears the address that failed, and keep-alive comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looked_up_replica_that_reset_once_is_whole_again() {
    let (addrs, servers) = replicas().await;
    let port = addrs[0].port();
    let lookup = Lookup::new(&ips(&addrs));
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let client = through(&policy, &lookup, true);
    let url = format!("http://svc.test:{port}/items");

    // The first connection goes to the first address: it resets, and the
    // retry goes to the next one, at once.
    servers[0].set(RESETS_ONCE);
    let (status, seen) = get(&client, &url).await;
    assert_eq!(status, 200);
    assert_eq!(seen, vec![Some(addrs[0]), Some(addrs[1])], "real ports");
    assert!(clock.sleeps().iter().all(Duration::is_zero));
    assert!(policy.replicas().degraded("svc.test", clock.now()));

    // Once its ejection is over, a probe finds it healthy: the name is
    // whole again and connections are kept alive.
    clock.advance(Duration::from_secs(2));
    for _ in 0..13 {
        assert_eq!(get(&client, &url).await.0, 200);
    }
    assert!(
        servers[0].requests() >= 2,
        "probed: {:?}",
        requests(&servers)
    );
    assert!(!policy.replicas().degraded("svc.test", clock.now()));
    let closes: usize = servers.iter().map(Replica::closes).sum();
    assert!(
        closes <= 2,
        "{closes} of 13 requests asked Connection: close"
    );
}

/// A URL that names another port than the pinned addresses: the
/// connection goes to the URL's port, and so does every comparison, so a
/// replica answering 503 is left as with a pinned port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_port_other_than_the_pinned_one_still_leaves_a_503_replica() {
    let (addrs, servers) = replicas().await;
    servers[0].set(ANSWERS_503);
    let pinned: Vec<SocketAddr> = addrs.iter().map(|a| SocketAddr::new(a.ip(), 9)).collect();
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let http = reqwest::Client::builder()
        .dns_resolver(policy.replica_resolver().pin("svc.test", &pinned))
        .build()
        .unwrap();
    let client = ClientBuilder::new(http)
        .with(RetryMiddleware::new(policy.clone()))
        .build();
    let url = format!("http://svc.test:{}/items", addrs[0].port());
    let mut ok = 0;
    for _ in 0..45 {
        ok += usize::from(get(&client, &url).await.0 == 200);
    }
    let per = requests(&servers);
    assert_eq!(ok, 45, "{per:?}");
    let all: usize = per.iter().sum();
    assert!(per[0] * 100 <= all * 15, "the 503 replica took {per:?}");
}

/// A name with a dead address among its answers: every address is handed
/// to hyper, so a refused connection falls through to the next address
/// inside one attempt, as it does with reqwest alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_address_costs_no_call_that_reqwest_alone_completes() {
    let (addrs, _servers) = replicas().await;
    let port = addrs[0].port();
    let url = format!("http://svc.test:{port}/items");
    let clock = ManualClock::new();
    for (answer, attempts) in [
        // Two addresses, the first gone, one attempt.
        (vec![dead(4, port).ip(), addrs[0].ip()], 1),
        // Four addresses, three gone, the default three attempts.
        (
            vec![
                dead(4, port).ip(),
                dead(5, port).ip(),
                dead(6, port).ip(),
                addrs[1].ip(),
            ],
            3,
        ),
    ] {
        let lookup = Lookup::new(&answer);
        // reqwest alone completes every call.
        let alone = reqwest::Client::builder()
            .dns_resolver(lookup.clone())
            .build()
            .unwrap();
        for _ in 0..5 {
            assert_eq!(alone.get(&url).send().await.unwrap().status(), 200);
        }
        // So does ours, each in one attempt, never sleeping.
        let policy = policy(&clock, attempts);
        let client = through(&policy, &lookup, false);
        for _ in 0..10 {
            let slot = ReportSlot::new();
            let r = client.get(&url).with_extension(slot.clone()).send().await;
            let report = slot.take().unwrap();
            assert_eq!(r.map(|r| r.status().as_u16()).ok(), Some(200), "{report:?}");
            assert_eq!(report.attempts(), 1, "{report:?}");
        }
        assert!(clock.sleeps().is_empty(), "{:?}", clock.sleeps());
    }
}

/// Every address refused: an outage, not a replica's failure. Each
/// address is noted as failed, the call backs off as for any host down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_refused_is_the_host_down() {
    let (addrs, _servers) = replicas().await;
    let port = addrs[0].port();
    let lookup = Lookup::new(&[dead(4, port).ip(), dead(5, port).ip()]);
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let client = through(&policy, &lookup, true);
    let slot = ReportSlot::new();
    let r = client
        .get(format!("http://svc.test:{port}/"))
        .with_extension(slot.clone())
        .send()
        .await;
    assert!(r.unwrap_err().is_connect());
    let report = slot.take().unwrap();
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    // Backed off between attempts: no replica to go to at once.
    assert!(report.delays().iter().all(|d| !d.is_zero()), "{report:?}");
    assert!(policy.replicas().degraded("svc.test", clock.now()));
}

/// The first replica resets until it is ejected, then hangs, and its
/// ejection is over: the next new connection probes it. The requests it
/// had read.
async fn eject_then_hang(
    client: &ClientWithMiddleware,
    url: &str,
    servers: &[Replica],
    clock: &ManualClock,
) -> usize {
    servers[0].set(RESETS);
    for _ in 0..6 {
        assert_eq!(get(client, url).await.0, 200);
    }
    assert!(servers[0].requests() >= 1);
    servers[0].set(HANGS);
    clock.advance(Duration::from_secs(31));
    servers[0].requests()
}

/// The first replica recovers after a probe of it ended (`before` its
/// requests then): it is probed again a moment later, gets traffic, and
/// the name is whole. The calls are not hedged (what became of a probe
/// that lost a race is the test, not the races of the next ones), and the
/// client keeps no idle connection: each call opens one, so the
/// replica's share of new connections shows.
async fn recovers(
    client: &ClientWithMiddleware,
    url: &str,
    servers: &[Replica],
    clock: &ManualClock,
    policy: &RetryPolicy,
    before: usize,
) {
    servers[0].set(HEALTHY);
    clock.advance(Duration::from_secs(2));
    for _ in 0..30 {
        let r = client
            .get(url)
            .with_extension(RequestOptions::new().no_hedge())
            .send()
            .await;
        assert_eq!(r.unwrap().status(), 200);
    }
    assert!(
        servers[0].requests() > before + 2,
        "the recovered replica got {:?}",
        requests(servers)
    );
    assert!(!policy.replicas().degraded("svc.test", clock.now()));
}

/// The attempt that probes an ejected replica is dropped by its caller:
/// the probe ends all the same, and the replica, recovered, is probed
/// again and gets its traffic back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_probe_ends_and_the_recovered_replica_gets_traffic_back() {
    let (addrs, servers) = replicas().await;
    let port = addrs[0].port();
    let lookup = Lookup::new(&ips(&addrs));
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let client = through(&policy, &lookup, false);
    let url = format!("http://svc.test:{port}/items");

    // The caller gives up on the hanging probe and drops the call.
    let ejected = eject_then_hang(&client, &url, &servers, &clock).await;
    let probe = tokio::time::timeout(Duration::from_millis(300), client.get(&url).send()).await;
    assert!(probe.is_err(), "the probe answered: {probe:?}");
    assert_eq!(servers[0].requests(), ejected + 1, "the probe went out");
    recovers(&client, &url, &servers, &clock, &policy, ejected).await;
}

/// The probe goes out as the first copy of a hedged GET and hangs; the
/// hedge, sent to another address, wins the race and the probe's copy is
/// dropped: the probe ends with its attempt, and the recovered replica is
/// probed again and gets its traffic back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_loses_a_hedge_race_ends() {
    let (addrs, servers) = replicas().await;
    let port = addrs[0].port();
    let lookup = Lookup::new(&ips(&addrs));
    let clock = ManualClock::new();
    // On the manual clock every latency is 0 and the hedge delay is not
    // slept: once a sample is on record, every GET is hedged at once.
    let hedge = HedgeConfig {
        min_samples: 1,
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(7)
        .hedge(hedge)
        .no_budget()
        .build()
        .unwrap();
    let client = through(&policy, &lookup, false);
    let url = format!("http://svc.test:{port}/items");

    let before = eject_then_hang(&client, &url, &servers, &clock).await;
    let slot = ReportSlot::new();
    let r = client.get(&url).with_extension(slot.clone()).send().await;
    assert_eq!(r.unwrap().status(), 200);
    let report = slot.take().unwrap();
    assert_eq!((report.hedges(), report.hedge_wins()), (1, 1), "{report:?}");
    // The probe's copy lost: at once, it may not even have reached the
    // replica.
    let raced = servers[0].requests();
    assert!(raced <= before + 1);
    recovers(&client, &url, &servers, &clock, &policy, raced).await;
}

/// A rolling deploy: addresses appear and disappear between look-ups.
/// Each new connection looks the name up again; a new address gets
/// connections at once, and a gone one none, its record forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_that_come_and_go_are_followed() {
    let (addrs, servers) = replicas().await;
    let port = addrs[0].port();
    let lookup = Lookup::new(&ips(&addrs[..2]));
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let client = through(&policy, &lookup, false);
    let url = format!("http://svc.test:{port}/items");

    // The first address fails once: the name is degraded.
    servers[0].set(RESETS_ONCE);
    for _ in 0..10 {
        assert_eq!(get(&client, &url).await.0, 200);
    }
    assert!(policy.replicas().degraded("svc.test", clock.now()));
    let asked = lookup.asked();
    assert!(asked >= 10, "looked up {asked} times for 10 connections");
    // It leaves the name, a third comes in.
    lookup.answer(&ips(&addrs[1..]));
    let before = requests(&servers);
    for _ in 0..10 {
        assert_eq!(get(&client, &url).await.0, 200);
    }
    let after = requests(&servers);
    assert_eq!(after[0], before[0], "a gone address got requests");
    assert!(after[2] - before[2] >= 4, "the new address got {after:?}");
    // Forgotten with its failure: the name is whole.
    assert!(!policy.replicas().degraded("svc.test", clock.now()));
}

/// Through the real system resolver: a name of three addresses in the
/// hosts file, the connection's port in every address, and a name whose
/// first address is dead still answered in one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_resolver_with_several_addresses() {
    let (addrs, servers) = replicas().await;
    let port = addrs[0].port();
    let _hosts = support::hosts::add(&[
        ("127.0.0.1", "three.replicas.safe-retry.test"),
        ("127.0.0.2", "three.replicas.safe-retry.test"),
        ("127.0.0.3", "three.replicas.safe-retry.test"),
        ("127.0.0.4", "dead-first.replicas.safe-retry.test"),
        ("127.0.0.2", "dead-first.replicas.safe-retry.test"),
    ]);
    let clock = ManualClock::new();
    let policy = policy(&clock, 3);
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            .dns_resolver(policy.replica_resolver())
            .build()
            .unwrap(),
    )
    .with(RetryMiddleware::new(policy.clone()))
    .build();

    let url = format!("http://three.replicas.safe-retry.test:{port}/items");
    servers[0].set(RESETS_ONCE);
    let (status, seen) = get(&client, &url).await;
    assert_eq!(status, 200);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter().all(|a| a.is_some_and(|a| a.port() == port)),
        "{seen:?}"
    );
    clock.advance(Duration::from_secs(2));
    for _ in 0..13 {
        assert_eq!(get(&client, &url).await.0, 200);
    }
    assert!(!policy
        .replicas()
        .degraded("three.replicas.safe-retry.test", clock.now()));

    let one = RetryPolicy::builder()
        .manual_clock(&clock)
        .max_attempts(1)
        .build()
        .unwrap();
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            .dns_resolver(one.replica_resolver())
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
    )
    .with(RetryMiddleware::new(one))
    .build();
    let url = format!("http://dead-first.replicas.safe-retry.test:{port}/items");
    let alone = reqwest::Client::new();
    for _ in 0..5 {
        assert_eq!(alone.get(&url).send().await.unwrap().status(), 200);
        assert_eq!(get(&client, &url).await.0, 200);
    }
}
