//! The command line: the three subcommands, their options and defaults,
//! and Brooker's five strategies.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "herd",
    about = "Brooker's backoff-and-jitter experiment, and a thundering herd on real sockets"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Discrete-event simulation of Brooker's OCC experiment (no real sleeping).
    Brooker(BrookerArgs),
    /// A failure blip and an outage against a local HTTP server (real sockets).
    Blip(BlipArgs),
    /// One dead host and healthy ones through one client (real sockets).
    Isolation(IsolationArgs),
}

#[derive(Args, Debug)]
pub(crate) struct IsolationArgs {
    /// Hosts through the one client: one is down, the others are healthy.
    #[arg(long, default_value_t = 2)]
    pub(crate) hosts: usize,
    /// Calls per host, evenly spread over `--spread-ms`.
    #[arg(long, default_value_t = 300)]
    pub(crate) calls: usize,
    /// Calls to the host that is down (default: `--calls`); its load is
    /// measured over these.
    #[arg(long)]
    pub(crate) dead_calls: Option<usize>,
    /// The calls to each host start evenly spread over this, ms.
    #[arg(long, default_value_t = 6000)]
    pub(crate) spread_ms: u64,
    /// A healthy host fails one request in this many (503).
    #[arg(long, default_value_t = 20)]
    pub(crate) fail_every: u32,
    /// Circuit breaker outage: how long the host fails everything, ms; the
    /// calls (100 per second) span it.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) breaker_outage_ms: u64,
    /// Skip the circuit breaker's scenarios.
    #[arg(long)]
    pub(crate) no_breaker: bool,
    /// Seed of the policies' random sources.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

#[derive(Args, Debug)]
pub(crate) struct BrookerArgs {
    /// Numbers of clients, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,20,30,40,50,60,70,80,90,100"
    )]
    pub(crate) clients: Vec<usize>,
    /// Trials averaged per (clients, strategy).
    #[arg(long, default_value_t = 100)]
    pub(crate) trials: u32,
    /// Seed of the whole sweep; each (clients, strategy) row derives its own.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Strategies, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,exponential,full,equal,decorrelated"
    )]
    pub(crate) strategies: Vec<Strategy>,
    /// Print CSV (`clients,strategy,calls,completion_ms`) instead of a table
    /// and plots.
    #[arg(long)]
    pub(crate) csv: bool,
    /// Where the plots go (without `--csv`): under `target/` by default,
    /// so a run leaves the checkout clean; `--out-dir bench-results`
    /// replaces the plots BENCHMARKS.md shows.
    #[arg(long, default_value = "target/herd")]
    pub(crate) out_dir: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct BlipArgs {
    /// Logical operations started together.
    #[arg(long, default_value_t = 400)]
    pub(crate) ops: usize,
    /// How long the server fails every request, from the start, in ms.
    #[arg(long, default_value_t = 1000)]
    pub(crate) fail_ms: u64,
    /// Requests the server serves per 50 ms bucket after the blip; the rest
    /// get a 503.
    #[arg(long, default_value_t = 50)]
    pub(crate) capacity: u32,
    /// Backoff base, ms.
    #[arg(long, default_value_t = 50)]
    pub(crate) base_ms: u64,
    /// Backoff cap, ms.
    #[arg(long, default_value_t = 2000)]
    pub(crate) cap_ms: u64,
    /// Attempts per logical operation, the first included.
    #[arg(long, default_value_t = 8)]
    pub(crate) max_attempts: u32,
    /// Deadline of a logical operation, ms.
    #[arg(long, default_value_t = 8000)]
    pub(crate) deadline_ms: u64,
    /// Outage scenario: how long the server fails everything, ms (longer
    /// than the outage deadline).
    #[arg(long, default_value_t = 5000)]
    pub(crate) outage_ms: u64,
    /// Outage scenario: the operations start evenly spread over this, ms
    /// (steady traffic rather than one burst).
    #[arg(long, default_value_t = 3000)]
    pub(crate) outage_spread_ms: u64,
    /// Outage scenario: deadline of a logical operation, ms.
    #[arg(long, default_value_t = 2000)]
    pub(crate) outage_deadline_ms: u64,
    /// Outage scenario: backoff base, ms.
    #[arg(long, default_value_t = 20)]
    pub(crate) outage_base_ms: u64,
    /// Outage scenario: backoff cap, ms.
    #[arg(long, default_value_t = 500)]
    pub(crate) outage_cap_ms: u64,
    /// Outage scenario: attempts per logical operation.
    #[arg(long, default_value_t = 6)]
    pub(crate) outage_max_attempts: u32,
    /// Seed of the policies' random sources.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Skip the outage scenario.
    #[arg(long)]
    pub(crate) no_outage: bool,
    /// Outage scenario with the default policy (whose deadline is 30 s):
    /// how long the server fails everything, ms.
    #[arg(long, default_value_t = 40_000)]
    pub(crate) default_outage_ms: u64,
    /// Quiet-process scenario: calls, one per second.
    #[arg(long, default_value_t = 60)]
    pub(crate) quiet_calls: usize,
    /// Skip the quiet-process scenario.
    #[arg(long)]
    pub(crate) no_quiet: bool,
    /// Where the plot goes: under `target/` by default, so a run leaves
    /// the checkout clean; `--out-dir bench-results` replaces the plot
    /// BENCHMARKS.md shows.
    #[arg(long, default_value = "target/herd")]
    pub(crate) out_dir: PathBuf,
}

/// Brooker's five strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(crate) enum Strategy {
    /// No backoff at all: retry at once.
    None,
    /// `min(cap, base·2^n)`, no jitter.
    Exponential,
    /// `U(0, min(cap, base·2^n))`.
    Full,
    /// `c/2 + U(0, c/2)` with `c = min(cap, base·2^n)`.
    Equal,
    /// `min(cap, U(base, prev·3))`, per-client state starting at base.
    Decorrelated,
}

impl Strategy {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Exponential => "exponential",
            Strategy::Full => "full",
            Strategy::Equal => "equal",
            Strategy::Decorrelated => "decorrelated",
        }
    }
}
