//! `herd`: what jitter and retry admission do to a thundering herd.
//!
//! Two experiments, one binary:
//!
//! - `brooker` — a deterministic discrete-event simulation of the model in
//!   Marc Brooker's "Exponential Backoff And Jitter" (AWS Architecture Blog,
//!   2015) and its companion simulator: N clients each update one row once
//!   under optimistic concurrency control. Nothing sleeps; a run is fixed by
//!   its seed. The delays come from this crate's own [`Backoff`].
//! - `blip` — real sockets: a local HTTP server fails every request for a
//!   window and then serves a limited number of requests per 50 ms; 400
//!   logical operations start together through the real [`RetryMiddleware`].
//!   Then an outage longer than every deadline, and a quiet process (one
//!   call per second to a server failing one attempt in three), each with
//!   no admission, the fail-fast token bucket and the default adaptive
//!   admission (fresh, and warmed by 1000 successful calls).
//!
//! - `isolation` — real sockets, several hosts through one client: one host
//!   is down for the whole run while the others fail one request in twenty;
//!   the healthy hosts' success and latency against the same hosts alone,
//!   and the dead host's load. Then the opt-in circuit breaker: a 30 s
//!   outage, the 400-call blip and a quiet process.
//!
//! ```text
//! cargo run --release --example herd -- isolation --hosts 2 --calls 300
//! cargo run --release --example herd -- brooker --clients 10,20,30,40,50,60,70,80,90,100 --trials 100 --csv
//! cargo run --release --example herd -- brooker            # table + SVG plots in bench-results/
//! cargo run --release --example herd -- blip               # table, sparklines + SVG plot
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use reqwest_safe_retry::{
    retry, Backoff, Jitter, MetricsSnapshot, ReportSlot, RetryMiddleware, RetryPolicy,
    RetryPolicyBuilder, TokenBucketConfig,
};

#[derive(Parser, Debug)]
#[command(
    name = "herd",
    about = "Brooker's backoff-and-jitter experiment, and a thundering herd on real sockets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Discrete-event simulation of Brooker's OCC experiment (no real sleeping).
    Brooker(BrookerArgs),
    /// A failure blip and an outage against a local HTTP server (real sockets).
    Blip(BlipArgs),
    /// One dead host and healthy ones through one client (real sockets).
    Isolation(IsolationArgs),
}

#[derive(Args, Debug)]
struct IsolationArgs {
    /// Hosts through the one client: one is down, the others are healthy.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// Calls per host, evenly spread over `--spread-ms`.
    #[arg(long, default_value_t = 300)]
    calls: usize,
    /// Calls to the host that is down (default: `--calls`); its load is
    /// measured over these.
    #[arg(long)]
    dead_calls: Option<usize>,
    /// The calls to each host start evenly spread over this, ms.
    #[arg(long, default_value_t = 6000)]
    spread_ms: u64,
    /// A healthy host fails one request in this many (503).
    #[arg(long, default_value_t = 20)]
    fail_every: u32,
    /// Circuit breaker outage: how long the host fails everything, ms; the
    /// calls (100 per second) span it.
    #[arg(long, default_value_t = 30_000)]
    breaker_outage_ms: u64,
    /// Skip the circuit breaker's scenarios.
    #[arg(long)]
    no_breaker: bool,
    /// Seed of the policies' random sources.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args, Debug)]
struct BrookerArgs {
    /// Numbers of clients, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,20,30,40,50,60,70,80,90,100"
    )]
    clients: Vec<usize>,
    /// Trials averaged per (clients, strategy).
    #[arg(long, default_value_t = 100)]
    trials: u32,
    /// Seed of the whole sweep; each (clients, strategy) row derives its own.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Strategies, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,exponential,full,equal,decorrelated"
    )]
    strategies: Vec<Strategy>,
    /// Print CSV (`clients,strategy,calls,completion_ms`) instead of a table
    /// and plots.
    #[arg(long)]
    csv: bool,
    /// Where the plots go (without `--csv`): under `target/` by default,
    /// so a run leaves the checkout clean; `--out-dir bench-results`
    /// replaces the plots BENCHMARKS.md shows.
    #[arg(long, default_value = "target/herd")]
    out_dir: PathBuf,
}

#[derive(Args, Debug)]
struct BlipArgs {
    /// Logical operations started together.
    #[arg(long, default_value_t = 400)]
    ops: usize,
    /// How long the server fails every request, from the start, in ms.
    #[arg(long, default_value_t = 1000)]
    fail_ms: u64,
    /// Requests the server serves per 50 ms bucket after the blip; the rest
    /// get a 503.
    #[arg(long, default_value_t = 50)]
    capacity: u32,
    /// Backoff base, ms.
    #[arg(long, default_value_t = 50)]
    base_ms: u64,
    /// Backoff cap, ms.
    #[arg(long, default_value_t = 2000)]
    cap_ms: u64,
    /// Attempts per logical operation, the first included.
    #[arg(long, default_value_t = 8)]
    max_attempts: u32,
    /// Deadline of a logical operation, ms.
    #[arg(long, default_value_t = 8000)]
    deadline_ms: u64,
    /// Outage scenario: how long the server fails everything, ms (longer
    /// than the outage deadline).
    #[arg(long, default_value_t = 5000)]
    outage_ms: u64,
    /// Outage scenario: the operations start evenly spread over this, ms
    /// (steady traffic rather than one burst).
    #[arg(long, default_value_t = 3000)]
    outage_spread_ms: u64,
    /// Outage scenario: deadline of a logical operation, ms.
    #[arg(long, default_value_t = 2000)]
    outage_deadline_ms: u64,
    /// Outage scenario: backoff base, ms.
    #[arg(long, default_value_t = 20)]
    outage_base_ms: u64,
    /// Outage scenario: backoff cap, ms.
    #[arg(long, default_value_t = 500)]
    outage_cap_ms: u64,
    /// Outage scenario: attempts per logical operation.
    #[arg(long, default_value_t = 6)]
    outage_max_attempts: u32,
    /// Seed of the policies' random sources.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the outage scenario.
    #[arg(long)]
    no_outage: bool,
    /// Outage scenario with the default policy (whose deadline is 30 s):
    /// how long the server fails everything, ms.
    #[arg(long, default_value_t = 40_000)]
    default_outage_ms: u64,
    /// Quiet-process scenario: calls, one per second.
    #[arg(long, default_value_t = 60)]
    quiet_calls: usize,
    /// Skip the quiet-process scenario.
    #[arg(long)]
    no_quiet: bool,
    /// Where the plot goes: under `target/` by default, so a run leaves
    /// the checkout clean; `--out-dir bench-results` replaces the plot
    /// BENCHMARKS.md shows.
    #[arg(long, default_value = "target/herd")]
    out_dir: PathBuf,
}

/// Brooker's five strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Strategy {
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
    fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Exponential => "exponential",
            Strategy::Full => "full",
            Strategy::Equal => "equal",
            Strategy::Decorrelated => "decorrelated",
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Brooker(args) => brooker::main(&args),
        Command::Blip(args) => blip::main(&args),
        Command::Isolation(args) => isolation::main(&args),
    };
    if let Err(e) = result {
        eprintln!("herd: {e}");
        std::process::exit(1);
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

mod brooker {
    //! The simulation. Times are integer nanoseconds, so the event queue is
    //! totally ordered; `(time, seq)` breaks ties in insertion order and
    //! makes every run with the same seed identical.

    use super::*;

    /// Brooker's parameters: base 5 ms, cap 2000 ms, hops |N(10 ms, 2 ms)|.
    const BASE: Duration = Duration::from_millis(5);
    const CAP: Duration = Duration::from_millis(2000);
    const HOP_MEAN_MS: f64 = 10.0;
    const HOP_SD_MS: f64 = 2.0;

    /// The crate's backoff for a strategy; `None` for "no backoff" (zero).
    ///
    /// Mapping: exponential is `Jitter::None` with multiplier 2; full, equal
    /// and decorrelated are the crate's jitter modes of the same name.
    pub(super) fn backoff_for(strategy: Strategy) -> Option<Backoff> {
        let jitter = match strategy {
            Strategy::None => return None,
            Strategy::Exponential => Jitter::None,
            Strategy::Full => Jitter::Full,
            Strategy::Equal => Jitter::Equal,
            Strategy::Decorrelated => Jitter::Decorrelated,
        };
        Some(Backoff::from_parts(BASE, CAP, 2.0, jitter).expect("Brooker's parameters are valid"))
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Event {
        /// A client's read request reaches the server.
        Read { client: usize },
        /// The read response (the version) reaches the client.
        ReadResponse { client: usize, version: u64 },
        /// A client's write (with the version it read) reaches the server.
        Write { client: usize, version: u64 },
        /// The write response reaches the client.
        WriteResponse { client: usize, accepted: bool },
    }

    struct Client {
        /// Rejected writes so far; Brooker's first backoff uses attempt 1.
        attempt: u32,
        /// The previous delay, for decorrelated jitter (starts at base).
        prev: Duration,
    }

    struct Sim<'a> {
        now: u64,
        seq: u64,
        queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
        rng: &'a mut StdRng,
        hop: Normal<f64>,
    }

    impl Sim<'_> {
        /// One one-way network hop, |N(10 ms, 2 ms)|, in nanoseconds.
        fn hop(&mut self) -> u64 {
            let ms = self.hop.sample(self.rng).abs();
            // Finite and small: the cast cannot truncate meaningfully.
            (ms * 1e6).round() as u64
        }

        fn at(&mut self, time: u64, event: Event) {
            self.seq += 1;
            self.queue.push(Reverse((time, self.seq, event)));
        }
    }

    /// One trial: returns (writes made, completion time in ns).
    pub(super) fn trial(clients: usize, strategy: Strategy, rng: &mut StdRng) -> (u64, u64) {
        let backoff = backoff_for(strategy);
        let base = backoff.map_or(Duration::ZERO, |b| b.base());
        let mut state: Vec<Client> = (0..clients)
            .map(|_| Client {
                attempt: 0,
                prev: base,
            })
            .collect();
        let mut sim = Sim {
            now: 0,
            seq: 0,
            queue: BinaryHeap::with_capacity(clients * 2),
            rng,
            hop: Normal::new(HOP_MEAN_MS, HOP_SD_MS).expect("a valid normal distribution"),
        };
        let mut version = 0u64;
        let mut calls = 0u64;
        let mut done_at = 0u64;
        for client in 0..clients {
            let t = sim.hop();
            sim.at(t, Event::Read { client });
        }
        while let Some(Reverse((time, _, event))) = sim.queue.pop() {
            debug_assert!(time >= sim.now, "time must move forward");
            sim.now = time;
            match event {
                Event::Read { client } => {
                    let t = time + sim.hop();
                    sim.at(t, Event::ReadResponse { client, version });
                }
                Event::ReadResponse { client, version } => {
                    let t = time + sim.hop();
                    sim.at(t, Event::Write { client, version });
                }
                Event::Write {
                    client,
                    version: read,
                } => {
                    calls += 1;
                    let accepted = read == version;
                    if accepted {
                        version += 1;
                    }
                    let t = time + sim.hop();
                    sim.at(t, Event::WriteResponse { client, accepted });
                }
                Event::WriteResponse { client, accepted } => {
                    if accepted {
                        done_at = done_at.max(time);
                        continue;
                    }
                    let c = &mut state[client];
                    c.attempt += 1;
                    // Brooker's first backoff is `backoff(attempt = 1)`, i.e.
                    // a ceiling of base·2¹. The crate numbers retries from 0
                    // (`delay(0, ..)` has ceiling `base`), so we pass
                    // `attempt` (1, 2, …) as `n` to get Brooker's
                    // `min(cap, base·2^attempt)`. Decorrelated ignores `n`
                    // and uses `prev`, as Brooker's does.
                    let delay = match &backoff {
                        Some(b) => b.delay(c.attempt, c.prev, sim.rng),
                        None => Duration::ZERO,
                    };
                    c.prev = delay;
                    let delay_ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
                    let t = time + sim.hop() + delay_ns;
                    sim.at(t, Event::Read { client });
                }
            }
        }
        (calls, done_at)
    }

    /// Mixes the sweep seed with a row's coordinates (SplitMix64 finaliser),
    /// so a row's numbers do not depend on which other rows were asked for.
    fn row_seed(seed: u64, clients: usize, strategy: Strategy) -> u64 {
        let mut z = seed
            ^ (clients as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (strategy as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Mean writes and mean completion time (ms) over `trials`.
    pub(super) fn row(clients: usize, strategy: Strategy, trials: u32, seed: u64) -> (f64, f64) {
        let mut rng = StdRng::seed_from_u64(row_seed(seed, clients, strategy));
        let (mut calls, mut time) = (0u64, 0u64);
        for _ in 0..trials {
            let (c, t) = trial(clients, strategy, &mut rng);
            calls += c;
            time += t;
        }
        let n = f64::from(trials.max(1));
        (calls as f64 / n, time as f64 / 1e6 / n)
    }

    pub(super) fn main(args: &BrookerArgs) -> AnyResult<()> {
        let mut rows: BTreeMap<(usize, Strategy), (f64, f64)> = BTreeMap::new();
        let started = Instant::now();
        for &clients in &args.clients {
            for &strategy in &args.strategies {
                rows.insert(
                    (clients, strategy),
                    row(clients, strategy, args.trials, args.seed),
                );
            }
        }
        if args.csv {
            println!("clients,strategy,calls,completion_ms");
            for ((clients, strategy), (calls, ms)) in &rows {
                println!("{clients},{},{calls:.2},{ms:.2}", strategy.name());
            }
            return Ok(());
        }
        println!(
            "Brooker's OCC experiment: base 5 ms, cap 2000 ms, hops |N(10, 2)| ms, \
             {} trials, seed {} ({:.1} s)\n",
            args.trials,
            args.seed,
            started.elapsed().as_secs_f64()
        );
        for (title, pick) in [
            ("Mean writes (calls)", 0usize),
            ("Mean completion time (ms)", 1),
        ] {
            println!("{title}");
            let mut header = format!("{:>8}", "clients");
            for s in &args.strategies {
                let _ = write!(header, " {:>13}", s.name());
            }
            println!("{header}");
            for &clients in &args.clients {
                let mut line = format!("{clients:>8}");
                for &s in &args.strategies {
                    let (calls, ms) = rows[&(clients, s)];
                    let v = if pick == 0 { calls } else { ms };
                    let _ = write!(line, " {v:>13.1}");
                }
                println!("{line}");
            }
            println!();
        }
        std::fs::create_dir_all(&args.out_dir)?;
        let series = |pick: usize| -> Vec<(String, Vec<(f64, f64)>)> {
            args.strategies
                .iter()
                .map(|&s| {
                    let points = args
                        .clients
                        .iter()
                        .map(|&c| {
                            let (calls, ms) = rows[&(c, s)];
                            (c as f64, if pick == 0 { calls } else { ms })
                        })
                        .collect();
                    (s.name().to_owned(), points)
                })
                .collect()
        };
        let calls_svg = args.out_dir.join("brooker-calls.svg");
        let time_svg = args.out_dir.join("brooker-completion.svg");
        plot::lines(
            &calls_svg,
            &format!("Writes to finish (mean of {} trials)", args.trials),
            ("clients", "writes (calls)"),
            false,
            &series(0),
        )?;
        plot::lines(
            &time_svg,
            &format!("Time to finish (mean of {} trials)", args.trials),
            ("clients", "completion time (ms, log scale)"),
            true,
            &series(1),
        )?;
        println!("plots: {}, {}", calls_svg.display(), time_svg.display());
        Ok(())
    }
}

mod blip {
    //! A local server that fails for a window, then serves `capacity`
    //! requests per 50 ms bucket and answers 503 to the rest; logical
    //! operations through the real middleware.

    use super::*;
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;
    use reqwest_middleware::ClientBuilder;

    pub(super) const BUCKET: Duration = Duration::from_millis(50);
    /// Buckets recorded: 60 s of traffic; later arrivals land in the last.
    const BUCKETS: usize = 1200;

    pub(super) struct Server {
        t0: Instant,
        fail_for: Duration,
        capacity: u32,
        /// Fail one request in this many (counting from the first), if set.
        fail_every: Option<u32>,
        served: AtomicU32,
        arrivals: Vec<AtomicU32>,
        admitted: Vec<AtomicU32>,
    }

    impl Server {
        fn bucket(&self) -> (Duration, usize) {
            let elapsed = self.t0.elapsed();
            let i = (elapsed.as_millis() / BUCKET.as_millis()) as usize;
            (elapsed, i.min(BUCKETS - 1))
        }
    }

    /// A host of a multi-host run: it fails everything for `fail_for`, then
    /// one request in `fail_every`.
    pub(super) fn host(fail_for: Duration, fail_every: Option<u32>) -> Arc<Server> {
        Arc::new(Server {
            t0: Instant::now(),
            fail_for,
            capacity: u32::MAX,
            fail_every,
            served: AtomicU32::new(0),
            arrivals: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            admitted: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// One host's calls in a multi-host run.
    pub(super) struct HostCalls {
        /// Calls made.
        pub(super) calls: usize,
        /// Calls that got a 2xx.
        pub(super) succeeded: usize,
        /// Every call's latency.
        pub(super) latencies: Vec<Duration>,
        /// The latencies of the calls the circuit breaker refused.
        pub(super) refused: Vec<Duration>,
        /// The longest admission wait of a call.
        pub(super) max_admission_wait: Duration,
        /// Requests the host saw, per 50 ms bucket.
        pub(super) arrivals: Vec<u32>,
    }

    /// Runs `hosts` at once through one client and `policy`: each host is
    /// its own server on its own port (so its own partition) and gets
    /// `calls` calls evenly spread over `spread`.
    pub(super) async fn run_hosts(
        hosts: &[(Arc<Server>, usize)],
        spread: Duration,
        policy: RetryPolicy,
    ) -> AnyResult<Vec<HostCalls>> {
        let mut urls = Vec::new();
        let mut serving = Vec::new();
        for (server, _) in hosts {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            urls.push(format!("http://{}/row", listener.local_addr()?));
            let app = Router::new()
                .route("/row", get(handle))
                .with_state(server.clone());
            serving.push(tokio::spawn(
                async move { axum::serve(listener, app).await },
            ));
        }
        let client = ClientBuilder::new(reqwest::Client::builder().build()?)
            .with(RetryMiddleware::new(policy))
            .build();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (h, (url, &(_, calls))) in urls.iter().zip(hosts).enumerate() {
            let step = spread / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
            for i in 0..calls {
                let client = client.clone();
                let url = url.clone();
                let start_at = t0 + step * u32::try_from(i).unwrap_or(u32::MAX);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(start_at.into()).await;
                    let started = Instant::now();
                    let slot = ReportSlot::new();
                    let result = client.get(&url).with_extension(slot.clone()).send().await;
                    let latency = started.elapsed();
                    let ok = matches!(&result, Ok(r) if r.status().is_success());
                    (h, ok, slot.take(), latency)
                }));
            }
        }
        let mut out: Vec<HostCalls> = hosts
            .iter()
            .map(|&(_, calls)| HostCalls {
                calls,
                succeeded: 0,
                latencies: Vec::with_capacity(calls),
                refused: Vec::new(),
                max_admission_wait: Duration::ZERO,
                arrivals: Vec::new(),
            })
            .collect();
        for task in tasks {
            let (h, ok, report, latency) = task.await?;
            let o = &mut out[h];
            o.latencies.push(latency);
            o.succeeded += usize::from(ok);
            if let Some(r) = report {
                o.max_admission_wait = o.max_admission_wait.max(r.admission_wait());
                if r.stop_reason().as_str() == "circuit_open" {
                    o.refused.push(latency);
                }
            }
        }
        for (o, (server, _)) in out.iter_mut().zip(hosts) {
            o.arrivals = server
                .arrivals
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect();
        }
        for s in serving {
            s.abort();
        }
        Ok(out)
    }

    async fn handle(State(server): State<Arc<Server>>) -> (StatusCode, &'static str) {
        let (elapsed, i) = server.bucket();
        server.arrivals[i].fetch_add(1, Ordering::Relaxed);
        if elapsed < server.fail_for {
            return (StatusCode::SERVICE_UNAVAILABLE, "blip");
        }
        let n = server.served.fetch_add(1, Ordering::Relaxed);
        if server.fail_every.is_some_and(|every| n % every == 0) {
            return (StatusCode::SERVICE_UNAVAILABLE, "flaky");
        }
        if server.admitted[i].fetch_add(1, Ordering::Relaxed) >= server.capacity {
            return (StatusCode::SERVICE_UNAVAILABLE, "over capacity");
        }
        (StatusCode::OK, "ok")
    }

    /// One scenario's setup.
    #[derive(Clone)]
    pub(super) struct Scenario {
        pub(super) ops: usize,
        pub(super) fail_for: Duration,
        pub(super) capacity: u32,
        /// Operations start evenly spread over this (zero: all together).
        pub(super) spread: Duration,
        /// Fail one request in this many, after the failing window.
        pub(super) fail_every: Option<u32>,
    }

    /// What one strategy did.
    pub(super) struct Outcome {
        pub(super) label: String,
        pub(super) ops: usize,
        pub(super) attempts: u64,
        pub(super) arrivals: Vec<u32>,
        pub(super) succeeded: usize,
        /// Time from the start until the last successful operation ended.
        pub(super) last_success: Option<Duration>,
        pub(super) latencies: Vec<Duration>,
        pub(super) stop_reasons: BTreeMap<String, usize>,
        /// The policy's counters after the run (warming calls included).
        pub(super) metrics: MetricsSnapshot,
        /// The longest time a call waited for admission.
        pub(super) max_admission_wait: Duration,
    }

    impl Outcome {
        pub(super) fn amplification(&self) -> f64 {
            self.attempts as f64 / self.ops.max(1) as f64
        }

        pub(super) fn peak(&self) -> u32 {
            self.arrivals.iter().copied().max().unwrap_or(0)
        }

        pub(super) fn percentile(&self, p: f64) -> Duration {
            let mut v = self.latencies.clone();
            v.sort_unstable();
            if v.is_empty() {
                return Duration::ZERO;
            }
            let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1]
        }
    }

    /// Runs `scenario` against a fresh server with a fresh client and policy.
    pub(super) async fn run(
        label: &str,
        scenario: &Scenario,
        policy: RetryPolicy,
    ) -> AnyResult<Outcome> {
        let server = Arc::new(Server {
            t0: Instant::now(),
            fail_for: scenario.fail_for,
            capacity: scenario.capacity,
            fail_every: scenario.fail_every,
            served: AtomicU32::new(0),
            arrivals: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            admitted: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/row", listener.local_addr()?);
        let app = Router::new()
            .route("/row", get(handle))
            .with_state(server.clone());
        let serving = tokio::spawn(async move { axum::serve(listener, app).await });

        let middleware = RetryMiddleware::new(policy);
        let client = ClientBuilder::new(
            reqwest::Client::builder()
                .pool_max_idle_per_host(scenario.ops)
                .build()?,
        )
        .with(middleware.clone())
        .build();

        let t0 = server.t0;
        let step = scenario.spread / u32::try_from(scenario.ops.max(1)).unwrap_or(u32::MAX);
        let mut tasks = Vec::with_capacity(scenario.ops);
        for i in 0..scenario.ops {
            let client = client.clone();
            let url = url.clone();
            let start_at = t0 + step * u32::try_from(i).unwrap_or(u32::MAX);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(start_at.into()).await;
                let started = Instant::now();
                let slot = ReportSlot::new();
                let result = client.get(&url).with_extension(slot.clone()).send().await;
                let ended = Instant::now();
                let report = slot.take();
                let ok = matches!(&result, Ok(r) if r.status().is_success());
                (ok, report, ended - started, ended - t0)
            }));
        }
        let mut out = Outcome {
            label: label.to_owned(),
            ops: scenario.ops,
            attempts: 0,
            arrivals: Vec::new(),
            succeeded: 0,
            last_success: None,
            latencies: Vec::with_capacity(scenario.ops),
            stop_reasons: BTreeMap::new(),
            metrics: MetricsSnapshot::default(),
            max_admission_wait: Duration::ZERO,
        };
        for task in tasks {
            let (ok, report, latency, end) = task.await?;
            out.latencies.push(latency);
            if ok {
                out.succeeded += 1;
                out.last_success = Some(out.last_success.map_or(end, |t| t.max(end)));
            }
            let reason = match &report {
                Some(r) => {
                    out.attempts += u64::from(r.attempts());
                    out.max_admission_wait = out.max_admission_wait.max(r.admission_wait());
                    r.stop_reason().as_str().to_owned()
                }
                None => "no report".to_owned(),
            };
            *out.stop_reasons.entry(reason).or_default() += 1;
        }
        out.metrics = middleware.policy().metrics().snapshot();
        serving.abort();
        let arrivals: Vec<u32> = server
            .arrivals
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        let last = arrivals.iter().rposition(|&a| a > 0).map_or(0, |i| i + 1);
        out.arrivals = arrivals[..last].to_vec();
        let seen: u64 = out.arrivals.iter().map(|&a| u64::from(a)).sum();
        if seen != out.attempts {
            eprintln!(
                "note: {label}: the server saw {seen} requests, the reports count {} attempts",
                out.attempts
            );
        }
        Ok(out)
    }

    /// `▁▂▃▄▅▆▇█`, one character per 50 ms bucket, scaled to `peak`.
    pub(super) fn sparkline(arrivals: &[u32], peak: u32) -> String {
        const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        arrivals
            .iter()
            .map(|&a| {
                if a == 0 {
                    ' '
                } else {
                    let level = (u64::from(a) * 8).div_ceil(u64::from(peak.max(1)));
                    BLOCKS[(level.clamp(1, 8) - 1) as usize]
                }
            })
            .collect()
    }

    /// Which admission a comparison row uses.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Admit {
        /// No admission: attempts and the deadline only.
        None,
        /// The fail-fast token bucket (10 tokens, +0.1 per first attempt,
        /// −1 per retry): the default before the adaptive admission.
        FailFast,
        /// The crate's default adaptive admission.
        Adaptive,
    }

    fn policy(
        jitter: Jitter,
        admit: Admit,
        base: Duration,
        cap: Duration,
        max_attempts: u32,
        deadline: Duration,
        seed: u64,
    ) -> AnyResult<RetryPolicy> {
        let builder = RetryPolicy::builder()
            .jitter(jitter)
            .backoff(base, cap)
            .max_attempts(max_attempts)
            .deadline(deadline)
            .attempt_timeout(Duration::from_secs(2))
            .seed(seed);
        Ok(with_admission(builder, admit).build()?)
    }

    /// A fresh admission of the given kind for each run.
    fn with_admission(builder: RetryPolicyBuilder, admit: Admit) -> RetryPolicyBuilder {
        match admit {
            Admit::None => builder.no_budget(),
            Admit::FailFast => builder.token_bucket(TokenBucketConfig::default()),
            Admit::Adaptive => builder,
        }
    }

    /// The default policy, seeded, with the given admission.
    fn default_policy(admit: Admit, seed: u64) -> AnyResult<RetryPolicy> {
        Ok(with_admission(RetryPolicy::builder().seed(seed), admit).build()?)
    }

    /// Gives `policy` a history: 1000 logical operations that succeed at
    /// once, through the same admission (no socket involved).
    async fn warm(policy: RetryPolicy) -> RetryPolicy {
        for _ in 0..1000 {
            retry(&policy, |_| async {
                reqwest_safe_retry::Outcome::success(())
            })
            .await;
        }
        policy
    }

    fn ms(d: Duration) -> String {
        format!("{:.0}", d.as_secs_f64() * 1e3)
    }

    pub(super) fn main(args: &BlipArgs) -> AnyResult<()> {
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

    fn reasons(map: &BTreeMap<String, usize>) -> String {
        map.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

mod isolation {
    //! Several hosts through one client: per-host admission keeps a dead
    //! host from taking the healthy ones down; the circuit breaker spares
    //! the dead host its first attempts too.

    use super::blip::{host, run_hosts, HostCalls, Scenario, BUCKET};
    use super::*;

    /// A host that is down for longer than any run.
    const DOWN: Duration = Duration::from_secs(3_600);

    fn percentile(v: &[Duration], p: f64) -> Duration {
        let mut v = v.to_vec();
        v.sort_unstable();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }

    fn ms(d: Duration) -> String {
        format!("{:.0}", d.as_secs_f64() * 1e3)
    }

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

    pub(super) fn main(args: &IsolationArgs) -> AnyResult<()> {
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
            .circuit_breaker(reqwest_safe_retry::CircuitBreakerConfig::default())
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
            blip::run("blip", &blip, with_breaker(args.seed)?),
            blip::run("quiet", &quiet, with_breaker(args.seed + 1)?),
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
}

mod plot {
    //! Line plots as SVG through plotters (no system fonts: its built-in
    //! text layout, text left to the SVG viewer).

    use super::*;
    use plotters::coord::ranged1d::{Ranged, ValueFormatter};
    use plotters::coord::types::RangedCoordf64;
    use plotters::prelude::*;

    type Series = [(String, Vec<(f64, f64)>)];

    /// Distinct, readable line colours (the last for a reference line).
    const COLORS: [RGBColor; 7] = [
        RGBColor(110, 110, 110),
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(0, 0, 0),
    ];

    /// One line per series; `log_y` for a logarithmic y axis.
    pub(super) fn lines(
        path: &Path,
        title: &str,
        (x_label, y_label): (&str, &str),
        log_y: bool,
        series: &Series,
    ) -> AnyResult<()> {
        let all = || series.iter().flat_map(|(_, p)| p.iter().copied());
        let x_min = all().map(|(x, _)| x).fold(f64::INFINITY, f64::min);
        let x_max = all().map(|(x, _)| x).fold(f64::NEG_INFINITY, f64::max);
        let y_min = all().map(|(_, y)| y).fold(f64::INFINITY, f64::min);
        let y_max = all().map(|(_, y)| y).fold(0.0, f64::max);
        let x_range = x_min.min(x_max)..x_max.max(x_min + 1.0);
        let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70);
        if log_y {
            let low = (y_min.max(1.0) / 1.5).max(1.0);
            let chart = builder
                .build_cartesian_2d(x_range, (low..y_max * 1.5).log_scale())
                .map_err(|e| e.to_string())?;
            draw(chart, x_label, y_label, series)?;
        } else {
            let chart = builder
                .build_cartesian_2d(x_range, 0.0..y_max * 1.05 + 1.0)
                .map_err(|e| e.to_string())?;
            draw(chart, x_label, y_label, series)?;
        }
        root.present().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn draw<'a, Y>(
        mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
        x_label: &str,
        y_label: &str,
        series: &Series,
    ) -> AnyResult<()>
    where
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let style = ShapeStyle::from(&color).stroke_width(2);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_a_run() {
        for s in [Strategy::Full, Strategy::Decorrelated, Strategy::None] {
            assert_eq!(brooker::row(20, s, 5, 9), brooker::row(20, s, 5, 9));
        }
    }

    #[test]
    fn one_client_writes_once_in_four_hops() {
        let mut rng = StdRng::seed_from_u64(1);
        let (calls, done_ns) = brooker::trial(1, Strategy::Full, &mut rng);
        assert_eq!(calls, 1);
        // Four hops of |N(10 ms, 2 ms)|: well inside 10..70 ms.
        assert!((10_000_000..70_000_000).contains(&done_ns), "{done_ns}");
    }

    #[test]
    fn at_least_one_write_per_client() {
        let mut rng = StdRng::seed_from_u64(2);
        for s in [
            Strategy::None,
            Strategy::Exponential,
            Strategy::Full,
            Strategy::Equal,
            Strategy::Decorrelated,
        ] {
            let (calls, _) = brooker::trial(30, s, &mut rng);
            assert!(calls >= 30, "{s:?}: {calls}");
        }
    }

    #[test]
    fn brookers_first_backoff_is_base_times_two() {
        // Brooker's attempt 1 → the crate's n = 1 → ceiling base·2 = 10 ms.
        let b = brooker::backoff_for(Strategy::Exponential).expect("a backoff");
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(b.delay(1, b.base(), &mut rng), Duration::from_millis(10));
        assert_eq!(b.delay(20, b.base(), &mut rng), Duration::from_secs(2));
        assert!(brooker::backoff_for(Strategy::None).is_none());
    }

    #[test]
    fn sparkline_scales_to_the_peak() {
        assert_eq!(blip::sparkline(&[0, 1, 4, 8], 8), " ▁▄█");
    }
}
