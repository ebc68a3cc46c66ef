//! Instructions per call through a middleware chain that ends in a canned
//! `200 ok` (no socket): a count that does not move with the machine's load,
//! for paired comparisons on a shared machine.
//!
//! ```sh
//! cargo bench --bench instructions --no-run
//! # per call = (count at 20 001 calls − count at 1 call) / 20 000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/instructions-* <chain> <get|post> 20001
//! ```
//!
//! Chains: `canned` (no middleware), `reqwest-retry`, `safe-retry`
//! (`RetryMiddleware` with the default policy), `safe-retry-no-deadline`
//! (the same without a deadline: no per-request timeout), `keygen` (no chain: one
//! `IdempotencyKey::generate` per call).

mod support;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::{IdempotencyKey, KeyGenerator, RetryMiddleware, RetryPolicy};
use support::{block_on, without_deadline, Canned};

fn chain(name: &str) -> Option<ClientWithMiddleware> {
    let builder = ClientBuilder::new(reqwest::Client::new());
    Some(match name {
        "canned" => builder.with(Canned).build(),
        "reqwest-retry" => builder
            .with(RetryTransientMiddleware::new_with_policy(
                ExponentialBackoff::builder().build_with_max_retries(2),
            ))
            .with(Canned)
            .build(),
        "safe-retry" => builder
            .with(RetryMiddleware::new(RetryPolicy::default()))
            .with(Canned)
            .build(),
        "safe-retry-no-deadline" => builder.with(without_deadline()).with(Canned).build(),
        _ => return None,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--bench") || args.len() < 3 {
        // `cargo bench` runs every bench target: this one is run by hand.
        eprintln!(
            "usage: instructions <canned|reqwest-retry|safe-retry|safe-retry-no-deadline|keygen> \
             <get|post> <calls>"
        );
        return;
    }
    let calls: u64 = args[2].parse().expect("a number of calls");
    let post = args[1] == "post";
    // reqwest's timeout needs a runtime's timer; no task is spawned.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _guard = rt.enter();
    if args[0] == "keygen" {
        for _ in 0..calls {
            std::hint::black_box(IdempotencyKey::generate(KeyGenerator::UuidV4));
        }
        return;
    }
    let client = chain(&args[0]).expect("a known chain");
    for _ in 0..calls {
        let request = if post {
            client.post("http://127.0.0.1:9/x").body("{}")
        } else {
            client.get("http://127.0.0.1:9/x")
        };
        let response = block_on(request.send()).expect("the canned response");
        std::hint::black_box(response.status());
    }
}
