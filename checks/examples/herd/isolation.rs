//! `isolation`: several hosts through one client: per-host admission
//! keeps a dead host from taking the healthy ones down; the circuit
//! breaker spares the dead host its first attempts too.

use std::time::Duration;

use reqwest_safe_retry::RetryPolicy;

use crate::args::IsolationArgs;
use crate::server::{host, run, run_hosts, HostCalls, Scenario, BUCKET};
use crate::table::{ms, percentile};
use crate::AnyResult;

/// A host that is down for longer than any run.
const DOWN: Duration = Duration::from_secs(3_600);

/// The healthy hosts' figures, merged: (succeeded, calls, p50, p99,
/// longest admission wait).
fn healthy(rows: &[HostCalls]) -> (usize, usize, Duration, Duration, Duration) {
    let latencies: Vec<Duration> = rows.iter().flat_map(|r| r.latencies.clone()).collect();
    (
        rows.iter().map(|r| r.succeeded).sum(),
        rows.iter().map(|r| r.calls).sum(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        rows.iter()
            .map(|r| r.max_admission_wait)
            .max()
            .unwrap_or_default(),
    )
}

fn load(row: &HostCalls) -> f64 {
    let seen: u64 = row.arrivals.iter().map(|&a| u64::from(a)).sum();
    seen as f64 / row.calls.max(1) as f64
}

pub(crate) fn main(args: &IsolationArgs) -> AnyResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_all(args))
}

async fn run_all(args: &IsolationArgs) -> AnyResult<()> {
    let spread = Duration::from_millis(args.spread_ms);
    let flaky = || (host(Duration::ZERO, Some(args.fail_every)), args.calls);
    let dead_calls = args.dead_calls.unwrap_or(args.calls);
    let healthy_hosts = args.hosts.saturating_sub(1).max(1);
    println!(
        "Isolation: one client, RetryPolicy::default() (3 attempts, 100 ms..10 s, \
         deadline 30 s, adaptive admission), {} call(s) per healthy host evenly over \
         {} ms. {} healthy host(s) fail one request in {}; with them, one host is down \
         (503 to everything) for the whole run and gets {} call(s). Seed {}.\n",
        args.calls, args.spread_ms, healthy_hosts, args.fail_every, dead_calls, args.seed
    );
    let alone_hosts: Vec<_> = (0..healthy_hosts).map(|_| flaky()).collect();
    let alone = run_hosts(
        &alone_hosts,
        spread,
        RetryPolicy::builder().seed(args.seed).build()?,
    )
    .await?;
    let mut with_dead: Vec<_> = vec![(host(DOWN, None), dead_calls)];
    with_dead.extend((0..healthy_hosts).map(|_| flaky()));
    let rows = run_hosts(
        &with_dead,
        spread,
        RetryPolicy::builder().seed(args.seed).build()?,
    )
    .await?;
    let (dead, rest) = rows.split_at(1);
    println!(
        "| | healthy calls that succeed | healthy p50 (ms) | healthy p99 (ms) | \
         longest admission wait (ms) | dead host's load (arrivals / calls) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, healthy_rows, dead) in [
        ("healthy hosts alone", &alone[..], None),
        ("while one host is down", rest, Some(&dead[0])),
    ] {
        let (ok, calls, p50, p99, wait) = healthy(healthy_rows);
        println!(
            "| {label} | {ok}/{calls} | {} | {} | {} | {} |",
            ms(p50),
            ms(p99),
            ms(wait),
            dead.map_or("–".to_owned(), |d| format!("{:.2}×", load(d)))
        );
    }
    if !args.no_breaker {
        breaker(args).await?;
    }
    Ok(())
}

/// The default policy with the circuit breaker on.
fn with_breaker(seed: u64) -> AnyResult<RetryPolicy> {
    Ok(RetryPolicy::builder()
        .seed(seed)
        .circuit_breaker(reqwest_safe_retry::admission::CircuitBreakerConfig::default())
        .build()?)
}

/// The circuit breaker: a long outage, the blip, a quiet process.
async fn breaker(args: &IsolationArgs) -> AnyResult<()> {
    let outage = Duration::from_millis(args.breaker_outage_ms);
    let calls = usize::try_from(args.breaker_outage_ms / 10).unwrap_or(usize::MAX);
    println!(
        "\nCircuit breaker (CircuitBreakerConfig::default(): K = 2, 10 s window, \
         20 requests, 2 s of failures), RetryPolicy::default() otherwise. Outage: \
         {calls} calls, 100 per second, to a host that fails everything for {} ms; \
         blip: 400 calls at once, the host fails everything for 1 s then serves 50 per \
         50 ms; quiet: 60 calls, one per second, one request in three fails.\n",
        args.breaker_outage_ms
    );
    println!(
        "| scenario | breaker | succeeded | load: outage, after its first 2 s (arrivals / \
         offered); blip, quiet: whole run | \
         refused locally | refused call latency p99 / max (ms) |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for on in [false, true] {
        let policy = if on {
            with_breaker(args.seed)?
        } else {
            RetryPolicy::builder().seed(args.seed).build()?
        };
        let rows = run_hosts(&[(host(outage, None), calls)], outage, policy).await?;
        let row = &rows[0];
        // Offered after the first 2 s: the calls that start then.
        let first = (Duration::from_secs(2).as_millis() / BUCKET.as_millis()) as usize;
        // 100 calls per second: 200 start in the first 2 s.
        let offered_after = calls.saturating_sub(200);
        let seen_after: u64 = row.arrivals[first..].iter().map(|&a| u64::from(a)).sum();
        println!(
            "| outage {} s | {} | {}/{} | {:.2}× | {} | {} / {} |",
            args.breaker_outage_ms / 1000,
            if on { "on" } else { "off" },
            row.succeeded,
            row.calls,
            seen_after as f64 / offered_after.max(1) as f64,
            row.refused.len(),
            ms(percentile(&row.refused, 0.99)),
            ms(row.refused.iter().copied().max().unwrap_or_default()),
        );
    }
    let blip = Scenario {
        ops: 400,
        fail_for: Duration::from_secs(1),
        capacity: 50,
        spread: Duration::ZERO,
        fail_every: None,
    };
    let quiet = Scenario {
        ops: 60,
        fail_for: Duration::ZERO,
        capacity: u32::MAX,
        spread: Duration::from_secs(60),
        fail_every: Some(3),
    };
    let (b, q) = tokio::join!(
        run("blip", &blip, with_breaker(args.seed)?),
        run("quiet", &quiet, with_breaker(args.seed + 1)?),
    );
    for o in [b?, q?] {
        let refused = o.stop_reasons.get("circuit_open").copied().unwrap_or(0);
        println!(
            "| {} | on | {}/{} | {:.2}× | {} | – |",
            o.label,
            o.succeeded,
            o.ops,
            o.amplification(),
            refused
        );
    }
    Ok(())
}
