//! Does one bad replica take its host down? Three replicas of one service
//! behind one name (`svc.test` on 127.0.0.1, .2 and .3, one port), the
//! first broken, 8 calls in flight, each caller waiting 3 s at most; the
//! same calls through reqwest-retry, through `RetryMiddleware` without the
//! replica resolver, and with it. Prints the table in BENCHMARKS.md.
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

use servers::{Replica, ANSWERS_503, RESETS};

/// Three replicas, the first doing `broken`.
async fn replicas(broken: u8) -> (Vec<SocketAddr>, Vec<Replica>) {
    let (addrs, all) = servers::replicas().await;
    all[0].set(broken);
    (addrs, all)
}

#[derive(Clone, Copy, Debug)]
enum Client {
    ReqwestRetry,
    Before,
    WithResolver,
}

fn client(kind: Client, addrs: &[SocketAddr]) -> ClientWithMiddleware {
    match kind {
        Client::ReqwestRetry => {
            let http = reqwest::Client::builder()
                .resolve_to_addrs("svc.test", addrs)
                .timeout(WAIT)
                .build()
                .unwrap();
            let policy = ExponentialBackoff::builder().build_with_max_retries(2);
            ClientBuilder::new(http)
                .with(RetryTransientMiddleware::new_with_policy(policy))
                .build()
        }
        Client::Before => {
            let http = reqwest::Client::builder()
                .resolve_to_addrs("svc.test", addrs)
                .build()
                .unwrap();
            let policy = RetryPolicy::builder().deadline(WAIT).build().unwrap();
            ClientBuilder::new(http)
                .with(RetryMiddleware::new(policy))
                .build()
        }
        Client::WithResolver => {
            let policy = RetryPolicy::builder().deadline(WAIT).build().unwrap();
            let http = reqwest::Client::builder()
                .dns_resolver(policy.replica_resolver().pin("svc.test", addrs))
                .build()
                .unwrap();
            ClientBuilder::new(http)
                .with(RetryMiddleware::new(policy))
                .build()
        }
    }
}

/// Successes and each call's time.
async fn run(client: ClientWithMiddleware) -> (usize, Vec<Duration>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (client, next) = (client.clone(), next.clone());
        set.spawn(async move {
            let mut out = (0, Vec::new());
            while next.fetch_add(1, Ordering::SeqCst) < CALLS {
                let start = Instant::now();
                let ok = tokio::time::timeout(WAIT, client.get("http://svc.test/items").send())
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

#[tokio::main]
async fn main() {
    println!("| the broken replica | client | succeeded | p50 | p99 | attempts | on the broken replica |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (broken, label) in [
        (RESETS, "reads each request, then resets"),
        (ANSWERS_503, "answers every request 503"),
    ] {
        for (kind, name) in [
            (Client::ReqwestRetry, "reqwest-retry 0.9"),
            (Client::Before, "`RetryMiddleware`, no resolver"),
            (
                Client::WithResolver,
                "`RetryMiddleware` + `replica_resolver()`",
            ),
        ] {
            let (addrs, servers) = replicas(broken).await;
            let (ok, times) = run(client(kind, &addrs)).await;
            let counts: Vec<usize> = servers.iter().map(Replica::requests).collect();
            let all: usize = counts.iter().sum();
            let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
            println!(
                "| {label} | {name} | {ok}/{CALLS} | {} | {} | {all} | {} ({:.0} %) |",
                ms(p(0.5)),
                ms(p(0.99)),
                counts[0],
                100.0 * counts[0] as f64 / all.max(1) as f64
            );
        }
    }
}
