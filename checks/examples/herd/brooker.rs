//! `brooker`: the discrete-event simulation of Brooker's OCC experiment,
//! its table, CSV and plots. Times are integer nanoseconds, so the event
//! queue is totally ordered; `(time, seq)` breaks ties in insertion order
//! and makes every run with the same seed identical.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use reqwest_safe_retry::retry::Backoff;
use reqwest_safe_retry::Jitter;

use crate::args::{BrookerArgs, Strategy};
use crate::{plot, AnyResult};

/// Brooker's parameters: base 5 ms, cap 2000 ms, hops |N(10 ms, 2 ms)|.
const BASE: Duration = Duration::from_millis(5);
const CAP: Duration = Duration::from_millis(2000);
const HOP_MEAN_MS: f64 = 10.0;
const HOP_SD_MS: f64 = 2.0;

/// The crate's backoff for a strategy; `None` for "no backoff" (zero).
///
/// Mapping: exponential is `Jitter::None` with multiplier 2; full, equal
/// and decorrelated are the crate's jitter modes of the same name.
pub(crate) fn backoff_for(strategy: Strategy) -> Option<Backoff> {
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
pub(crate) fn trial(clients: usize, strategy: Strategy, rng: &mut StdRng) -> (u64, u64) {
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
pub(crate) fn row(clients: usize, strategy: Strategy, trials: u32, seed: u64) -> (f64, f64) {
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

pub(crate) fn main(args: &BrookerArgs) -> AnyResult<()> {
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
