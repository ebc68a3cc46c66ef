//! Does one bad replica take its host down? Three replicas of one service
//! behind one name (127.0.0.1, .2 and .3, one port), the first broken, 8
//! calls in flight, each caller waiting 3 s at most; the same calls
//! through reqwest-retry, through `RetryMiddleware` without the replica
//! resolver, and with it. Then a name whose first address is dead (nothing
//! listens there), reqwest alone beside them. Each in both resolver modes:
//! the name pinned to its addresses (with ports), and the name in the
//! hosts file, resolved by the system resolver (no port in its answer);
//! the example adds the hosts lines and removes them when it ends (root).
//! Prints the tables in BENCHMARKS.md.
//!
//! ```sh
//! cargo run -p reqwest-safe-retry-checks --example replicas
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};

const CALLS: usize = 300;
const IN_FLIGHT: usize = 8;
const WAIT: Duration = Duration::from_secs(3);

#[path = "../tests/support/replicas.rs"]
mod servers;

#[path = "../tests/support/hosts.rs"]
mod hosts;

use servers::{Replica, ANSWERS_503, HEALTHY, RESETS};

/// The names of the system resolver's mode, in the hosts file.
const THREE: &str = "three.replicas.safe-retry.test";
const DEAD_FIRST: &str = "dead-first.replicas.safe-retry.test";

/// Three replicas, the first doing `broken`.
async fn replicas(broken: u8) -> (Vec<SocketAddr>, Vec<Replica>) {
    let (addrs, all) = servers::replicas().await;
    all[0].set(broken);
    (addrs, all)
}

#[derive(Clone, Copy, Debug)]
enum Client {
    ReqwestAlone,
    ReqwestRetry,
    Before,
    WithResolver,
}

/// How the name finds its addresses.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Pinned with ports: reqwest's `resolve_to_addrs`, or the replica
    /// resolver's `pin`.
    Pinned,
    /// The system resolver reads the hosts file.
    System,
}

/// A reqwest client builder that finds `name`'s addresses as `mode` says,
/// without the replica resolver.
fn builder(mode: Mode, name: &str, addrs: &[SocketAddr]) -> reqwest::ClientBuilder {
    match mode {
        Mode::Pinned => reqwest::Client::builder().resolve_to_addrs(name, addrs),
        Mode::System => reqwest::Client::builder(),
    }
}

fn client(kind: Client, mode: Mode, name: &str, addrs: &[SocketAddr]) -> ClientWithMiddleware {
    match kind {
        Client::ReqwestAlone => {
            let http = builder(mode, name, addrs).timeout(WAIT).build().unwrap();
            ClientBuilder::new(http).build()
        }
        Client::ReqwestRetry => {
            let http = builder(mode, name, addrs).timeout(WAIT).build().unwrap();
            let policy = ExponentialBackoff::builder().build_with_max_retries(2);
            ClientBuilder::new(http)
                .with(RetryTransientMiddleware::new_with_policy(policy))
                .build()
        }
        Client::Before => {
            let http = builder(mode, name, addrs).build().unwrap();
            let policy = RetryPolicy::builder().deadline(WAIT).build().unwrap();
            ClientBuilder::new(http)
                .with(RetryMiddleware::new(policy))
                .build()
        }
        Client::WithResolver => {
            let policy = RetryPolicy::builder().deadline(WAIT).build().unwrap();
            let resolver = match mode {
                Mode::Pinned => policy.replica_resolver().pin(name, addrs),
                Mode::System => policy.replica_resolver(),
            };
            let http = reqwest::Client::builder()
                .dns_resolver(resolver)
                .build()
                .unwrap();
            ClientBuilder::new(http)
                .with(RetryMiddleware::new(policy))
                .build()
        }
    }
}

/// Successes and each call's time.
async fn run(client: ClientWithMiddleware, url: String) -> (usize, Vec<Duration>) {
    let url = Arc::new(url);
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (client, next, url) = (client.clone(), next.clone(), url.clone());
        set.spawn(async move {
            let mut out = (0, Vec::new());
            while next.fetch_add(1, Ordering::SeqCst) < CALLS {
                let start = Instant::now();
                let ok = tokio::time::timeout(WAIT, client.get(url.as_str()).send())
                    .await
                    .is_ok_and(|r| r.is_ok_and(|r| r.status() == 200));
                out.0 += usize::from(ok);
                out.1.push(start.elapsed());
            }
            out
        });
    }
    let (mut ok, mut times) = (0, Vec::new());
    while let Some(r) = set.join_next().await {
        let (o, t) = r.unwrap();
        ok += o;
        times.extend(t);
    }
    times.sort();
    (ok, times)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Pinned => "pinned",
        Mode::System => "system",
    }
}

const CLIENTS: [(Client, &str); 4] = [
    (Client::ReqwestAlone, "reqwest alone"),
    (Client::ReqwestRetry, "reqwest-retry 0.9"),
    (Client::Before, "`RetryMiddleware`, no resolver"),
    (
        Client::WithResolver,
        "`RetryMiddleware` + `replica_resolver()`",
    ),
];

/// One row: `kind` in `mode` against `servers` at `addrs` (the broken one
/// first, or the dead one).
async fn row(label: &str, kind: (Client, &str), mode: Mode, name: &str, addrs: &[SocketAddr]) {
    let port = addrs[addrs.len() - 1].port();
    let (ok, times) = run(
        client(kind.0, mode, name, addrs),
        format!("http://{name}:{port}/items"),
    )
    .await;
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    print!(
        "| {label} | {} | {} | {ok}/{CALLS} | {} | {} |",
        mode_name(mode),
        kind.1,
        ms(p(0.5)),
        ms(p(0.99)),
    );
}

#[tokio::main]
async fn main() {
    let mut entries: Vec<(String, &str)> = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        .into_iter()
        .map(|ip| (ip.to_owned(), THREE))
        .collect();
    entries.extend(
        ["127.0.0.4", "127.0.0.1", "127.0.0.2", "127.0.0.3"]
            .into_iter()
            .map(|ip| (ip.to_owned(), DEAD_FIRST)),
    );
    let lines: Vec<(&str, &str)> = entries.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    let _hosts = hosts::add(&lines);

    println!("| the broken replica | resolver | client | succeeded | p50 | p99 | attempts | on the broken replica |");
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for (broken, label) in [
        (RESETS, "reads each request, then resets"),
        (ANSWERS_503, "answers every request 503"),
    ] {
        for mode in [Mode::Pinned, Mode::System] {
            for kind in &CLIENTS[1..] {
                let (addrs, servers) = replicas(broken).await;
                row(label, *kind, mode, THREE, &addrs).await;
                let counts: Vec<usize> = servers.iter().map(Replica::requests).collect();
                let all: usize = counts.iter().sum();
                println!(
                    " {all} | {} ({:.0} %) |",
                    counts[0],
                    100.0 * counts[0] as f64 / all.max(1) as f64
                );
            }
        }
    }
    println!();
    println!("| the name | resolver | client | succeeded | p50 | p99 | attempts |");
    println!("|---|---|---|---:|---:|---:|---:|");
    for mode in [Mode::Pinned, Mode::System] {
        for kind in &CLIENTS {
            let (mut addrs, servers) = replicas(HEALTHY).await;
            addrs.insert(0, servers::dead(4, addrs[0].port()));
            row("first address dead", *kind, mode, DEAD_FIRST, &addrs).await;
            let all: usize = servers.iter().map(Replica::requests).sum();
            println!(" {all} |");
        }
    }
}
