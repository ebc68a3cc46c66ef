//! The MemoryStore layer's own cost per request, without sockets.
//!
//! ```text
//! cargo run --release -p tower-idempotency --example layer_cost -- --rounds 7
//! ```
//!
//! Sends keyed `POST`s (fresh key each) straight into an axum router with a
//! trivial handler, with and without `IdempotencyLayer` over `MemoryStore`,
//! from 1 and from 32 tasks on a 2-worker runtime. Each round runs both
//! variants back to back (order alternating), so the difference is paired;
//! prints the median time per request of each and the median per-round
//! difference: what the layer adds, in nanoseconds, with no HTTP parsing or
//! socket in the way.
//!
//! On a machine whose speed swings, count instructions instead (callgrind
//! counts the same for the same binary and input, whatever else runs):
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/layer_cost --only layer --tasks 1 --requests 20001
//! # per request = (count at 20 001 - count at 1) / 20 000; `--only bare` for the handler alone
//! # `--bearer TOKEN`: every request carries that credential (keys scoped by its digest)
//! ```

mod support;
use support::median;

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use clap::Parser;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[derive(Parser, Debug)]
struct Args {
    /// Requests per task per measurement.
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Concurrent tasks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    tasks: Vec<usize>,
    /// Run one variant once (the first task count, the first round only)
    /// and print its time: for counting its instructions under callgrind,
    /// where a paired run would count both.
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// Every request carries `Authorization: Bearer <this>` (one caller),
    /// as most production traffic does: the layer then scopes keys by the
    /// credential's digest instead of the anonymous scope.
    #[arg(long)]
    bearer: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    /// The handler without the layer.
    Bare,
    /// The handler behind the layer over `MemoryStore`.
    Layer,
}

async fn pay(
    _body: Bytes,
) -> (
    StatusCode,
    [(header::HeaderName, &'static str); 1],
    &'static str,
) {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"id":"pay_1","status":"paid"}"#,
    )
}

/// The router as a server runs it: `axum::serve` hands each connection
/// `Router::with_state(())`, which turns every handler into its route once.
/// A router called without it builds the handler's route, and applies each
/// layer again, on every request (a boxed clone of the handler and of the
/// layer, and the layer's service), a cost no server pays: until issue 33
/// this example measured it, and counted ~450 instructions of axum's (five
/// allocations) as the layer's.
fn router(layer: bool) -> Router {
    let r = Router::new().route("/pay", post(pay));
    let r = if layer {
        r.layer(IdempotencyLayer::new(MemoryStore::new()))
    } else {
        r
    };
    r.with_state(())
}

/// Wall time per request over `tasks` tasks sending `per_task` each.
async fn run(app: Router, tasks: usize, per_task: usize, bearer: Option<&str>) -> Duration {
    let authorization = bearer.map(|token| format!("Bearer {token}"));
    let prefix = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let app = app.clone();
            let prefix = prefix.clone();
            let authorization = authorization.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let mut request = Request::post("/pay")
                        .header("idempotency-key", format!("{prefix}-{t}-{i}"))
                        .header(header::CONTENT_TYPE, "application/json");
                    if let Some(value) = &authorization {
                        request = request.header(header::AUTHORIZATION, value);
                    }
                    let request = request
                        .body(Body::from(r#"{"amount":1234,"currency":"eur"}"#))
                        .expect("a valid request");
                    let response = app.clone().oneshot(request).await.expect("infallible");
                    assert_eq!(response.status(), StatusCode::CREATED);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    start.elapsed() / (tasks * per_task) as u32
}

fn main() {
    let args = Args::parse();
    let bearer = args.bearer.as_deref();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(only) = args.only {
        let tasks = args.tasks.first().copied().unwrap_or(1).max(1);
        let per_task = (args.requests / tasks).max(1);
        let took = rt.block_on(run(router(only == Only::Layer), tasks, per_task, bearer));
        println!("{only:?}: {} ns per request", took.as_nanos());
        return;
    }
    println!("| tasks | no layer ns/req | memory ns/req | added ns (median of rounds) | ratio |");
    println!("|---:|---:|---:|---:|---:|");
    for &tasks in &args.tasks {
        let per_task = (args.requests / tasks).max(1);
        let (mut base, mut layer, mut added, mut ratio) = (vec![], vec![], vec![], vec![]);
        for round in 0..args.rounds {
            // A fresh store per measurement, like the load generator.
            let (b, l) = rt.block_on(async {
                if round % 2 == 0 {
                    let b = run(router(false), tasks, per_task, bearer).await;
                    (b, run(router(true), tasks, per_task, bearer).await)
                } else {
                    let l = run(router(true), tasks, per_task, bearer).await;
                    (run(router(false), tasks, per_task, bearer).await, l)
                }
            });
            let (b, l) = (b.as_nanos() as f64, l.as_nanos() as f64);
            base.push(b);
            layer.push(l);
            added.push(l - b);
            ratio.push(b / l);
        }
        println!(
            "| {tasks} | {:.0} | {:.0} | {:.0} | {:.3} |",
            median(base),
            median(layer),
            median(added),
            median(ratio)
        );
    }
}
