//! Throughput and added latency of the idempotency stores.
//!
//! ```text
//! cargo bench --bench stores                 # full run
//! cargo bench --bench stores -- --quick      # a few seconds
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench --bench stores
//! ```
//!
//! Prints two tables:
//! * store operations: `claim` + `complete` of fresh keys, per second, with the
//!   mean latency of one claim+complete pair, at 1, 8 and 32 concurrent tasks;
//! * added latency: mean time per request through an axum router with a
//!   trivial `POST` handler, with and without the layer (fresh key per
//!   request, so every request claims and completes).
//!
//! PostgreSQL rows go to a private table that is dropped at the end; without a
//! reachable database the PostgreSQL rows are skipped with a message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::routing::post;
use axum::{Extension, Router};
use tower::ServiceExt;
use tower_idempotency::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyLayer, IdempotencyStore,
    IdempotencyTransaction, MemoryStore, PostgresStore, StoredResponse,
};

const CONCURRENCY: [usize; 3] = [1, 8, 32];

async fn store_ops(
    store: Arc<dyn IdempotencyStore>,
    tasks: usize,
    total: usize,
) -> (f64, Duration) {
    let per_task = total / tasks;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        let run = run.clone();
        handles.push(tokio::spawn(async move {
            let response = StoredResponse::json(201, r#"{"id":1}"#);
            for i in 0..per_task {
                let key = format!("{run}-{t}-{i}");
                let outcome = store
                    .claim(ClaimRequest {
                        scope: "bench",
                        key: &key,
                        fingerprint: Fingerprint([7; 32]),
                        lock_timeout: Duration::from_secs(30),
                        ttl: Duration::from_secs(3600),
                    })
                    .await
                    .expect("claim");
                let ClaimOutcome::Claimed { lease, .. } = outcome else {
                    panic!("fresh key not claimed")
                };
                store
                    .complete("bench", &key, lease, &response)
                    .await
                    .expect("complete");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let elapsed = start.elapsed();
    let ops = (per_task * tasks) as f64;
    (
        ops / elapsed.as_secs_f64(),
        elapsed * tasks as u32 / (per_task * tasks) as u32,
    )
}

fn router(layer: Option<IdempotencyLayer>) -> Router {
    let r = Router::new().route(
        "/payments",
        post(|| async { (axum::http::StatusCode::CREATED, "{}") }),
    );
    match layer {
        Some(layer) => r.layer(layer),
        None => r,
    }
}

async fn request_latency(app: Router, tasks: usize, total: usize) -> Duration {
    let per_task = total / tasks;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let app = app.clone();
        let run = run.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let request = Request::post("/payments")
                    .header("idempotency-key", format!("{run}-{t}-{i}"))
                    .body(Body::from(r#"{"account":"A","amount":1}"#))
                    .expect("request");
                let response = app.clone().oneshot(request).await.expect("infallible");
                assert_eq!(response.status(), 201);
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    // Mean time one request took, as seen by its task.
    start.elapsed() * tasks as u32 / (per_task * tasks) as u32
}

/// A handler that writes one row: in its own transaction (`tx` = None) or
/// through the layer's transaction (transactional mode).
async fn insert_row(
    State(pool): State<sqlx::PgPool>,
    tx: Option<Extension<IdempotencyTransaction>>,
) -> (axum::http::StatusCode, &'static str) {
    let sql = "INSERT INTO tower_idem_bench_effects (note) VALUES ('x')";
    match tx {
        Some(Extension(tx)) => {
            let mut conn = tx.lock().await.expect("transaction");
            sqlx::query(sql).execute(&mut **conn).await.expect("insert");
        }
        None => {
            let mut own = pool.begin().await.expect("begin");
            sqlx::query(sql).execute(&mut *own).await.expect("insert");
            own.commit().await.expect("commit");
        }
    }
    (axum::http::StatusCode::CREATED, "{}")
}

/// Requests per second of a PostgreSQL handler that writes one row: without
/// the layer, with the two-phase layer, and in the transactional mode.
/// Variants run interleaved, three rounds each, so that the ratios are paired
/// (absolute rates swing with the machine's load).
async fn handler_writes(store: &PostgresStore, total: usize) {
    sqlx::query("CREATE TABLE IF NOT EXISTS tower_idem_bench_effects (id bigserial, note text)")
        .execute(store.pool())
        .await
        .expect("effects table");
    let app = |layer: Option<IdempotencyLayer>| {
        let r = Router::new()
            .route("/payments", post(insert_row))
            .with_state(store.pool().clone());
        match layer {
            Some(layer) => r.layer(layer),
            None => r,
        }
    };
    let variants = [
        ("no layer", app(None)),
        ("two-phase", app(Some(IdempotencyLayer::new(store.clone())))),
        (
            "transactional",
            app(Some(
                IdempotencyLayer::transactional(store.clone())
                    .build()
                    .expect("settings"),
            )),
        ),
    ];
    println!();
    println!("PostgreSQL handler writing one row: requests/s (3 interleaved rounds)");
    println!(
        "{:<14} {:>6} {:>8} {:>12} {:>14}",
        "variant", "tasks", "requests", "req/s", "vs no layer"
    );
    for tasks in [1, 32] {
        let mut spent = [Duration::ZERO; 3];
        for _ in 0..3 {
            for (i, (_, router)) in variants.iter().enumerate() {
                spent[i] += request_latency(router.clone(), tasks, total).await * total as u32
                    / tasks as u32;
            }
        }
        let rate = |d: Duration| (3 * total) as f64 / d.as_secs_f64();
        let base = rate(spent[0]);
        for (i, (name, _)) in variants.iter().enumerate() {
            let r = rate(spent[i]);
            println!(
                "{name:<14} {tasks:>6} {:>8} {r:>12.0} {:>14.2}",
                3 * total,
                r / base
            );
        }
    }
    sqlx::query("DROP TABLE IF EXISTS tower_idem_bench_effects")
        .execute(store.pool())
        .await
        .expect("drop effects table");
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 1 } else { 5 };
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let table = format!("tower_idem_bench_{}", std::process::id());

    let mut stores: Vec<(&str, Arc<dyn IdempotencyStore>, usize)> =
        vec![("memory", Arc::new(MemoryStore::new()), 20_000 * scale)];
    let mut pg = None;
    match PostgresStore::connect(&url).await {
        Ok(store) => {
            let store = store.with_table(&table).expect("table name");
            store.migrate().await.expect("migrate");
            stores.push(("postgres", Arc::new(store.clone()), 1_000 * scale));
            pg = Some(store);
        }
        Err(err) => println!("skipping PostgreSQL ({err}); start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"),
    }

    println!("store operations (claim + complete of a fresh key)");
    println!(
        "{:<10} {:>6} {:>8} {:>14} {:>16}",
        "store", "tasks", "ops", "claims/s", "mean latency"
    );
    for (name, store, total) in &stores {
        for tasks in CONCURRENCY {
            let (rate, latency) = store_ops(store.clone(), tasks, *total).await;
            println!("{name:<10} {tasks:>6} {total:>8} {rate:>14.0} {latency:>16.2?}");
        }
    }

    println!();
    println!("request latency through axum (fresh key per request)");
    println!(
        "{:<10} {:>6} {:>8} {:>14} {:>14} {:>12}",
        "store", "tasks", "requests", "without layer", "with layer", "added"
    );
    for (name, store, total) in &stores {
        for tasks in CONCURRENCY {
            let base = request_latency(router(None), tasks, *total).await;
            let layer = IdempotencyLayer::from_arc(store.clone());
            let with = request_latency(router(Some(layer)), tasks, *total).await;
            let added = with.saturating_sub(base);
            println!("{name:<10} {tasks:>6} {total:>8} {base:>14.2?} {with:>14.2?} {added:>12.2?}");
        }
    }

    if let Some(store) = &pg {
        handler_writes(store, if quick { 300 } else { 1_500 }).await;
    }

    if let Some(store) = pg {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(store.pool())
            .await
            .expect("drop bench table");
    }
}
