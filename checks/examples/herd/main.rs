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
//!
//! The modules: `args` (the command line), `brooker` (the simulation),
//! `blip` and `isolation` (the socket runs), `server` (their servers and
//! clients), `policies` (the policies they compare), `table` and `plot`
//! (the output).

mod args;
mod blip;
mod brooker;
mod isolation;
mod plot;
mod policies;
mod server;
mod table;

use clap::Parser;

use args::{Cli, Command};

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

/// Any error, printed by `main`.
pub(crate) type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use crate::args::Strategy;
    use crate::{brooker, table};

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
        assert_eq!(table::sparkline(&[0, 1, 4, 8], 8), " ▁▄█");
    }
}
