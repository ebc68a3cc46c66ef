//! `blip`: 400 operations start together against a server failing for a
//! window; then an outage longer than every deadline and a quiet process,
//! each with every admission. Tables, sparklines and the arrivals' plot.

use std::time::Duration;

use reqwest_safe_retry::Jitter;

use crate::args::BlipArgs;
use crate::policies::{default_policy, policy, warm, Admit};
use crate::server::{run, Outcome, Scenario, BUCKET};
use crate::table::{ms, reasons, sparkline};
use crate::{plot, AnyResult};

pub(crate) fn main(args: &BlipArgs) -> AnyResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_all(args))
}

async fn run_all(args: &BlipArgs) -> AnyResult<()> {
    let base = Duration::from_millis(args.base_ms);
    let cap = Duration::from_millis(args.cap_ms);
    let deadline = Duration::from_millis(args.deadline_ms);
    let blip = Scenario {
        ops: args.ops,
        fail_for: Duration::from_millis(args.fail_ms),
        capacity: args.capacity,
        spread: Duration::ZERO,
        fail_every: None,
    };
    let strategies = [
        ("none", Jitter::None, Admit::None),
        ("full", Jitter::Full, Admit::None),
        ("equal", Jitter::Equal, Admit::None),
        ("decorrelated", Jitter::Decorrelated, Admit::None),
        ("full+fail-fast", Jitter::Full, Admit::FailFast),
        ("full+adaptive", Jitter::Full, Admit::Adaptive),
    ];
    println!(
        "Blip: {} operations start together; the server fails everything for {} ms, \
         then serves {} requests per 50 ms (503 for the rest).\n\
         Rows 1-6: backoff {} ms..{} ms ×2, max {} attempts, deadline {} ms, seed {}. \
         Rows 'default': RetryPolicy::default() (3 attempts, 100 ms..10 s, deadline 30 s, \
         adaptive admission), fresh, and warmed by 1000 successful calls.\n",
        args.ops,
        args.fail_ms,
        args.capacity,
        args.base_ms,
        args.cap_ms,
        args.max_attempts,
        args.deadline_ms,
        args.seed
    );
    let mut outcomes = Vec::new();
    for (label, jitter, admit) in strategies {
        let p = policy(
            jitter,
            admit,
            base,
            cap,
            args.max_attempts,
            deadline,
            args.seed,
        )?;
        outcomes.push(run(label, &blip, p).await?);
    }
    outcomes.push(
        run(
            "default",
            &blip,
            default_policy(Admit::Adaptive, args.seed)?,
        )
        .await?,
    );
    let warmed = warm(default_policy(Admit::Adaptive, args.seed)?).await;
    outcomes.push(run("default, warmed", &blip, warmed).await?);
    println!(
        "| strategy | attempts | amplification | succeeded | all succeeded at (ms) | \
         p50 (ms) | p99 (ms) | peak / 50 ms | probes | longest admission wait (ms) | stop reasons |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for o in &outcomes {
        let all = if o.succeeded == o.ops {
            o.last_success.map_or("-".to_owned(), ms)
        } else {
            format!("never ({} failed)", o.ops - o.succeeded)
        };
        println!(
            "| {} | {} | {:.2}× | {}/{} | {} | {} | {} | {} | {} | {} | {} |",
            o.label,
            o.attempts,
            o.amplification(),
            o.succeeded,
            o.ops,
            all,
            ms(o.percentile(0.50)),
            ms(o.percentile(0.99)),
            o.peak(),
            o.metrics.probes,
            ms(o.max_admission_wait),
            reasons(&o.stop_reasons)
        );
    }
    let peak = outcomes.iter().map(Outcome::peak).max().unwrap_or(1);
    println!("\nArrivals per 50 ms bucket (one character each, common scale, peak {peak}):");
    for o in &outcomes {
        println!("{:>16} |{}|", o.label, sparkline(&o.arrivals, peak));
    }

    std::fs::create_dir_all(&args.out_dir)?;
    let svg = args.out_dir.join("blip-arrivals.svg");
    let mut series: Vec<(String, Vec<(f64, f64)>)> = outcomes
        .iter()
        .map(|o| {
            let points = o
                .arrivals
                .iter()
                .enumerate()
                .map(|(i, &a)| (i as f64 * BUCKET.as_secs_f64(), f64::from(a)))
                .collect();
            (o.label.clone(), points)
        })
        .collect();
    let end = series
        .iter()
        .filter_map(|(_, p)| p.last().map(|&(x, _)| x))
        .fold(0.0, f64::max);
    series.push((
        "capacity".to_owned(),
        vec![
            (0.0, f64::from(args.capacity)),
            (end, f64::from(args.capacity)),
        ],
    ));
    plot::lines(
        &svg,
        &format!(
            "Server arrivals per 50 ms: {} ops, {} ms blip",
            args.ops, args.fail_ms
        ),
        ("time since start (s)", "requests per 50 ms"),
        false,
        &series,
    )?;
    println!("plot: {}", svg.display());

    if !args.no_outage {
        outage(args).await?;
    }
    if !args.no_quiet {
        quiet(args).await?;
    }
    Ok(())
}

/// An outage longer than every deadline, with steady traffic.
async fn outage(args: &BlipArgs) -> AnyResult<()> {
    let outage = Scenario {
        ops: args.ops,
        fail_for: Duration::from_millis(args.outage_ms),
        capacity: args.capacity,
        spread: Duration::from_millis(args.outage_spread_ms),
        fail_every: None,
    };
    let long = Scenario {
        fail_for: Duration::from_millis(args.default_outage_ms),
        ..outage.clone()
    };
    println!(
        "\nOutage: {} operations start evenly over {} ms. Rows 1-3: the server fails \
         everything for {} ms; full jitter, backoff {} ms..{} ms, max {} attempts, \
         deadline {} ms. Rows 'default': RetryPolicy::default() (deadline 30 s); the \
         server fails everything for {} ms.\n",
        args.ops,
        args.outage_spread_ms,
        args.outage_ms,
        args.outage_base_ms,
        args.outage_cap_ms,
        args.outage_max_attempts,
        args.outage_deadline_ms,
        args.default_outage_ms,
    );
    println!(
        "| admission | attempts | amplification | budget rejections | probes | \
         longest call (ms) | deadline (ms) | peak / 50 ms | stop reasons |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut rows = Vec::new();
    for (label, admit) in [
        ("none", Admit::None),
        ("fail-fast (10, 0.1, 1)", Admit::FailFast),
        ("adaptive", Admit::Adaptive),
    ] {
        let p = policy(
            Jitter::Full,
            admit,
            Duration::from_millis(args.outage_base_ms),
            Duration::from_millis(args.outage_cap_ms),
            args.outage_max_attempts,
            Duration::from_millis(args.outage_deadline_ms),
            args.seed,
        )?;
        let deadline = p.deadline();
        rows.push((run(label, &outage, p).await?, deadline));
    }
    // The two long rows run side by side: each has its own server.
    let fresh = default_policy(Admit::Adaptive, args.seed)?;
    let warmed = warm(default_policy(Admit::Adaptive, args.seed)?).await;
    let deadline = fresh.deadline();
    let (a, b) = tokio::join!(
        run("default", &long, fresh),
        run("default, warmed", &long, warmed)
    );
    rows.push((a?, deadline));
    rows.push((b?, deadline));
    for (o, deadline) in &rows {
        let longest = o.latencies.iter().copied().max().unwrap_or_default();
        println!(
            "| {} | {} | {:.2}× | {} | {} | {} | {} | {} | {} |",
            o.label,
            o.attempts,
            o.amplification(),
            o.metrics.budget_rejections,
            o.metrics.probes,
            ms(longest),
            deadline.map_or("-".to_owned(), ms),
            o.peak(),
            reasons(&o.stop_reasons)
        );
    }
    Ok(())
}

/// A quiet process: one call per second to a server that fails one
/// request in three.
async fn quiet(args: &BlipArgs) -> AnyResult<()> {
    let scenario = Scenario {
        ops: args.quiet_calls,
        fail_for: Duration::ZERO,
        capacity: u32::MAX,
        spread: Duration::from_secs(u64::try_from(args.quiet_calls).unwrap_or(u64::MAX)),
        fail_every: Some(3),
    };
    println!(
        "\nQuiet process: {} calls, one per second, to a server that fails one request \
         in three (503). RetryPolicy::default() with each admission; the rows run side \
         by side, each against its own server.\n",
        args.quiet_calls
    );
    let fresh = default_policy(Admit::Adaptive, args.seed)?;
    let warmed = warm(default_policy(Admit::Adaptive, args.seed)?).await;
    let fail_fast = default_policy(Admit::FailFast, args.seed)?;
    let none = default_policy(Admit::None, args.seed)?;
    let (a, b, c, d) = tokio::join!(
        run("default (adaptive)", &scenario, fresh),
        run("default, warmed", &scenario, warmed),
        run("fail-fast (10, 0.1, 1)", &scenario, fail_fast),
        run("none", &scenario, none),
    );
    println!(
        "| admission | succeeded | attempts | retries | budget rejections | waits | \
         probes | longest admission wait (ms) | stop reasons |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for o in [a?, b?, c?, d?] {
        println!(
            "| {} | {}/{} | {} | {} | {} | {} | {} | {} | {} |",
            o.label,
            o.succeeded,
            o.ops,
            o.attempts,
            o.attempts - o.ops as u64,
            o.metrics.budget_rejections,
            o.metrics.waits,
            o.metrics.probes,
            ms(o.max_admission_wait),
            reasons(&o.stop_reasons)
        );
    }
    Ok(())
}
