use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{ReplicaTable, FIRST_EJECTION, MAX_ADDRS, MAX_EJECTION, MAX_NAMES};

fn three() -> Vec<SocketAddr> {
    ["127.0.0.1:80", "127.0.0.2:80", "127.0.0.3:80"]
        .map(|a| a.parse().unwrap())
        .to_vec()
}

fn picks(
    t: &ReplicaTable,
    addrs: &[SocketAddr],
    n: usize,
    now: Instant,
) -> HashMap<SocketAddr, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        *seen.entry(t.pick("svc", addrs, now).unwrap()).or_default() += 1;
    }
    seen
}

#[test]
fn new_connections_are_spread_over_the_healthy_addresses() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    let seen = picks(&t, &addrs, 30, now);
    assert_eq!(seen.len(), 3);
    assert!(seen.values().all(|n| *n == 10), "{seen:?}");
}

#[test]
fn a_failed_address_gets_no_new_connection_until_its_probe() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    t.failed("svc", addrs[0], now);
    assert!(t.degraded("svc", now));
    assert!(t.healthy_besides("svc", addrs[0], now));
    let during = now + FIRST_EJECTION - Duration::from_millis(1);
    assert!(!picks(&t, &addrs, 20, during).contains_key(&addrs[0]));
    // Its ejection over, the next connection probes it, once.
    let after = now + FIRST_EJECTION;
    assert_eq!(t.pick("svc", &addrs, after), Some(addrs[0]));
    assert!(!picks(&t, &addrs, 20, after).contains_key(&addrs[0]));
    // The probe succeeds: it is back in turn, and the name is whole again.
    t.succeeded("svc", addrs[0]);
    assert!(!t.degraded("svc", after));
    assert_eq!(picks(&t, &addrs, 30, after)[&addrs[0]], 10);
}

#[test]
fn a_probe_that_fails_ejects_for_longer_up_to_the_cap() {
    let (t, addrs, mut now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    let mut ejection = FIRST_EJECTION;
    for _ in 0..10 {
        t.failed("svc", addrs[0], now);
        let before = now + ejection - Duration::from_millis(1);
        assert!(!picks(&t, &addrs, 6, before).contains_key(&addrs[0]));
        now += ejection;
        assert_eq!(t.pick("svc", &addrs, now), Some(addrs[0]), "probe due");
        ejection = (ejection * 2).min(MAX_EJECTION);
    }
    assert_eq!(ejection, MAX_EJECTION);
}

#[test]
fn never_all_addresses_are_ejected() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    for a in &addrs {
        t.failed("svc", *a, now);
    }
    // Two ejected, the last kept in service: every connection goes to it,
    // and no address is "healthy besides" another: the host is down.
    let seen = picks(&t, &addrs, 10, now);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[&addrs[2]], 10);
    for a in &addrs {
        assert!(!t.healthy_besides("svc", *a, now));
    }
}

#[test]
fn one_address_alone_is_never_ejected() {
    let (t, now) = (ReplicaTable::default(), Instant::now());
    let one = vec!["10.0.0.1:443".parse().unwrap()];
    t.pick("solo", &one, now);
    t.failed("solo", one[0], now);
    assert_eq!(t.pick("solo", &one, now), Some(one[0]));
    assert!(!t.healthy_besides("solo", one[0], now));
}

#[test]
fn names_are_apart_and_spelled_one_way() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    t.pick("other", &addrs, now);
    t.failed("SVC.", addrs[0], now);
    assert!(t.degraded("svc", now));
    assert!(!t.degraded("other", now));
}

#[test]
fn addresses_follow_what_the_name_resolves_to() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    t.failed("svc", addrs[0], now);
    // The name no longer resolves to the failed address: it is forgotten.
    let two = &addrs[1..];
    t.pick("svc", two, now);
    assert!(!t.degraded("svc", now));
    assert_eq!(t.pick("svc", &[], now), None);
}

#[test]
fn the_table_is_bounded() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    for i in 0..MAX_NAMES + 100 {
        t.pick(
            &format!("n{i}"),
            &addrs,
            now + Duration::from_millis(i as u64),
        );
    }
    assert_eq!(t.len(), MAX_NAMES);
}

#[test]
fn an_address_of_another_name_is_no_replica_of_this_one() {
    // A redirect's answer comes from another host's address: it neither
    // counts against this name nor sends the retry elsewhere.
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    t.pick("svc", &addrs, now);
    let stranger: SocketAddr = "192.0.2.7:80".parse().unwrap();
    t.failed("svc", stranger, now);
    assert!(!t.healthy_besides("svc", stranger, now));
    assert!(!t.degraded("svc", now));
}

#[test]
fn every_address_is_ordered_healthy_first_in_turn_and_the_failed_last() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    let first = t.order("svc", &addrs, now);
    assert_eq!(first.len(), 3);
    // In turn: each order starts one address further.
    let second = t.order("svc", &addrs, now);
    assert_ne!(first[0], second[0]);
    t.failed("svc", addrs[1], now);
    for _ in 0..6 {
        let order = t.order("svc", &addrs, now);
        assert_eq!(order.len(), 3, "{order:?}");
        assert_eq!(order[2], addrs[1], "{order:?}");
    }
}

#[test]
fn a_due_probe_comes_first_and_ends_only_by_its_own_number() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    let k = t.key("svc");
    t.order("svc", &addrs, now);
    t.failed("svc", addrs[0], now);
    let due = now + FIRST_EJECTION;
    let (order, probe) = t.order_at(k, &addrs, due, true);
    assert_eq!(order[0], addrs[0]);
    let probe = probe.expect("a probe");
    // Under way: not probed twice, and last in every other order.
    assert_eq!(t.order_at(k, &addrs, due, true).1, None);
    assert_eq!(t.order("svc", &addrs, due)[2], addrs[0]);
    // Another probe's end leaves this one alone; its own end makes the
    // address due again a first ejection later.
    t.probe_ended_at(k, addrs[0], probe + 1, due);
    assert_eq!(t.order_at(k, &addrs, due, true).1, None);
    t.probe_ended_at(k, addrs[0], probe, due);
    let later = due + FIRST_EJECTION;
    assert_eq!(
        t.order_at(k, &addrs, later - Duration::from_millis(1), true)
            .1,
        None
    );
    let (order, again) = t.order_at(k, &addrs, later, true);
    assert_eq!((order[0], again.is_some()), (addrs[0], true));
}

#[test]
fn a_probe_nobody_ends_lapses() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    let k = t.key("svc");
    t.order("svc", &addrs, now);
    t.failed("svc", addrs[0], now);
    let due = now + FIRST_EJECTION;
    assert!(t.order_at(k, &addrs, due, true).1.is_some());
    let lapsed = due + MAX_EJECTION;
    let (order, probe) = t.order_at(k, &addrs, lapsed, true);
    assert_eq!((order[0], probe.is_some()), (addrs[0], true));
}

#[test]
fn a_look_up_without_a_probe_owner_probes_nothing() {
    let (t, addrs, now) = (ReplicaTable::default(), three(), Instant::now());
    let k = t.key("svc");
    t.order("svc", &addrs, now);
    t.failed("svc", addrs[0], now);
    let due = now + FIRST_EJECTION;
    let (order, probe) = t.order_at(k, &addrs, due, false);
    assert_eq!(probe, None);
    assert_eq!(order[2], addrs[0]);
}

#[test]
fn each_port_keeps_its_own_addresses() {
    let (t, now) = (ReplicaTable::default(), Instant::now());
    let on = |port: u16| -> Vec<SocketAddr> {
        three()
            .iter()
            .map(|a| SocketAddr::new(a.ip(), port))
            .collect()
    };
    t.order("svc", &on(80), now);
    t.failed("svc", on(80)[0], now);
    // A look-up for another port replaces nothing of port 80's.
    t.order("svc", &on(8080), now);
    assert!(t.degraded("svc", now));
    assert_eq!(t.order("svc", &on(80), now)[2], on(80)[0]);
}

#[test]
fn a_name_keeps_at_most_its_bound_of_addresses() {
    let (t, now) = (ReplicaTable::default(), Instant::now());
    let many: Vec<SocketAddr> = (0..MAX_ADDRS as u16 + 10)
        .map(|i| SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 80)))
        .collect();
    assert_eq!(t.order("svc", &many, now).len(), MAX_ADDRS);
}
