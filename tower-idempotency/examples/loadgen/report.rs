//! What a run prints: each round's table, the summary of medians over
//! rounds, and the ratios of a mode to its baseline in the same round.

use std::time::Duration;

use crate::args::{Args, Mode};
use crate::measure::Sample;
use crate::support::median;

/// `d` in whole microseconds, with the unit.
fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// The summary: medians over rounds, each round's ratio, and a warning
/// when any request was answered non-2xx or failed.
pub(crate) fn print_summary(results: &[Vec<(Mode, usize, Sample)>], args: &Args) {
    println!("\n### Summary: medians over {} rounds\n", args.rounds);
    println!(
        "| mode | clients | req/s | p50 | p99 | non-2xx | ratio (median) | ratio per round | \
         server CPU µs/req | CPU ratio (median) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for &clients in &args.clients {
        for &mode in &args.modes {
            let samples: Vec<&Sample> = results
                .iter()
                .filter_map(|r| {
                    r.iter()
                        .find(|(m, c, _)| *m == mode && *c == clients)
                        .map(|(_, _, s)| s)
                })
                .collect();
            let rps = median(samples.iter().map(|s| s.rps).collect());
            let p50 = median(samples.iter().map(|s| s.p50.as_secs_f64()).collect());
            let p99 = median(samples.iter().map(|s| s.p99.as_secs_f64()).collect());
            let non_2xx: u64 = samples.iter().map(|s| s.non_2xx + s.errors).sum();
            let ratios: Vec<f64> = results
                .iter()
                .filter_map(|r| ratio(r, mode, clients))
                .collect();
            let (ratio_median, per_round) = if ratios.is_empty() {
                ("—".to_owned(), "—".to_owned())
            } else {
                (
                    format!("{:.3}", median(ratios.clone())),
                    ratios
                        .iter()
                        .map(|r| format!("{r:.3}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            };
            let cpus: Vec<f64> = samples
                .iter()
                .filter_map(|s| s.server_cpu.map(|c| c.as_secs_f64() * 1e6))
                .collect();
            let cpu = if cpus.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.1}", median(cpus))
            };
            let cpu_ratios: Vec<f64> = results
                .iter()
                .filter_map(|r| cpu_ratio(r, mode, clients))
                .collect();
            let cpu_ratio = if cpu_ratios.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.3}", median(cpu_ratios))
            };
            println!(
                "| {mode} | {clients} | {rps:.0} | {} | {} | {non_2xx} | {ratio_median} | {per_round} | {cpu} | {cpu_ratio} |",
                micros(Duration::from_secs_f64(p50)),
                micros(Duration::from_secs_f64(p99)),
            );
        }
    }
    let bad: u64 = results
        .iter()
        .flatten()
        .map(|(_, _, s)| s.non_2xx + s.errors)
        .sum();
    if bad > 0 {
        println!(
            "\nWARNING: {bad} requests were answered non-2xx or failed; see the rounds above."
        );
    }
}

/// `value` of `mode` and of its baseline in the same round.
fn paired(
    round: &[(Mode, usize, Sample)],
    mode: Mode,
    clients: usize,
    value: impl Fn(&Sample) -> Option<f64>,
) -> Option<(f64, f64)> {
    let base = mode.baseline()?;
    let get = |m: Mode| {
        round
            .iter()
            .find(|(x, c, _)| *x == m && *c == clients)
            .and_then(|(_, _, s)| value(s))
    };
    Some((get(mode)?, get(base)?))
}

/// Throughput of `mode` over its baseline's in the same round.
fn ratio(round: &[(Mode, usize, Sample)], mode: Mode, clients: usize) -> Option<f64> {
    paired(round, mode, clients, |s| Some(s.rps)).map(|(m, base)| m / base)
}

/// The server's CPU per request of `mode`'s baseline over `mode`'s in the
/// same round: like the throughput ratio, 1 means the layer is free.
fn cpu_ratio(round: &[(Mode, usize, Sample)], mode: Mode, clients: usize) -> Option<f64> {
    paired(round, mode, clients, |s| {
        s.server_cpu.map(|c| c.as_secs_f64())
    })
    .map(|(m, base)| base / m)
}

/// One round's table.
pub(crate) fn print_round(round: &[(Mode, usize, Sample)], _args: &Args) {
    println!(
        "| mode | clients | req/s | p50 | p99 | 2xx | non-2xx | errors | ratio | server CPU \
         µs/req | CPU ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (mode, clients, s) in round {
        let r = ratio(round, *mode, *clients)
            .map(|r| format!("{r:.3}"))
            .unwrap_or_else(|| "—".to_owned());
        let cpu = s
            .server_cpu
            .map(|c| format!("{:.1}", c.as_secs_f64() * 1e6))
            .unwrap_or_else(|| "—".to_owned());
        let cpu_r = cpu_ratio(round, *mode, *clients)
            .map(|r| format!("{r:.3}"))
            .unwrap_or_else(|| "—".to_owned());
        println!(
            "| {mode} | {clients} | {:.0} | {} | {} | {} | {} | {} | {r} | {cpu} | {cpu_r} |",
            s.rps,
            micros(s.p50),
            micros(s.p99),
            s.ok,
            s.non_2xx,
            s.errors
        );
    }
}
