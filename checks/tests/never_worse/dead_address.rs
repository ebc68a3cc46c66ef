//! The dead-address cases, over real sockets (a refused connection cannot
//! be scripted on the paused clock above): a name whose look-up answers
//! with addresses where nothing listens beside one that answers, as the
//! system resolver answers (no port), through reqwest-retry over plain
//! reqwest and through `RetryMiddleware` with the replica resolver,
//! compared call by call: where theirs succeeds ours succeeds, within
//! their time + the same slack as above.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};

#[path = "../support/replicas.rs"]
mod replicas;

use replicas::{dead, Lookup};

use super::{ATTEMPTS, SLACK};

/// Each call's success and time, one call after another.
async fn calls(client: &ClientWithMiddleware, url: &str, n: usize) -> Vec<(bool, Duration)> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let ok = client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        out.push((ok, start.elapsed()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_dead_addresses_is_never_worse() {
    let (addrs, _servers) = replicas::replicas().await;
    let port = addrs[0].port();
    let url = format!("http://svc.test:{port}/items");
    let cases: [(&str, Vec<IpAddr>); 3] = [
        ("one of two gone", vec![dead(4, port).ip(), addrs[0].ip()]),
        (
            "three of four gone",
            vec![
                dead(4, port).ip(),
                dead(5, port).ip(),
                addrs[1].ip(),
                dead(6, port).ip(),
            ],
        ),
        (
            "one of four gone, last",
            vec![
                addrs[0].ip(),
                addrs[1].ip(),
                addrs[2].ip(),
                dead(7, port).ip(),
            ],
        ),
    ];
    for (name, answer) in cases {
        let lookup = Lookup::new(&answer);
        let theirs = ClientBuilder::new(
            reqwest::Client::builder()
                .dns_resolver(lookup.clone())
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        )
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(ATTEMPTS - 1),
        ))
        .build();
        let policy = RetryPolicy::builder().seed(7).build().unwrap();
        let ours = ClientBuilder::new(
            reqwest::Client::builder()
                .dns_resolver(policy.replica_resolver().lookup_with(lookup.clone()))
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        )
        .with(RetryMiddleware::new(policy))
        .build();
        let (t, o) = (calls(&theirs, &url, 20).await, calls(&ours, &url, 20).await);
        let worse: Vec<String> = t
            .iter()
            .zip(&o)
            .enumerate()
            .filter(|(_, (t, o))| t.0 && (!o.0 || o.1 > t.1 + SLACK))
            .map(|(i, (t, o))| format!("call {i}: theirs {t:?}, ours {o:?}"))
            .collect();
        println!(
            "{name}: theirs {}/20, ours {}/20, worse {}",
            t.iter().filter(|c| c.0).count(),
            o.iter().filter(|c| c.0).count(),
            worse.len()
        );
        assert!(worse.is_empty(), "{name}: {worse:#?}");
        assert!(o.iter().all(|c| c.0), "{name}: ours {o:?}");
    }
}
