//! A small payments API protected by `tower-idempotency`.
//!
//! ```text
//! cargo run --example payments_server -- --listen 127.0.0.1:3000 --store memory --work-ms 0
//! cargo run --example payments_server -- --store postgres://postgres@127.0.0.1:5432/test
//! cargo run --example payments_server -- --store redis://127.0.0.1:6379
//! cargo run --example payments_server -- --store memory --after-effect-ms 400
//!
//! curl -i localhost:3000/payments -H 'Idempotency-Key: k1' \
//!      --json '{"account":"A","amount":10}'
//! curl -i 'localhost:3000/payments?account=A'
//! ```
//!
//! * `POST /payments` takes `{"account": string, "amount": integer}`, requires an
//!   `Idempotency-Key` header and answers `201 {"id", "account", "amount"}`.
//!   A retry with the same key and body replays the answer
//!   (`Idempotent-Replayed: true`) without creating a second payment.
//! * `GET /payments?account=A` lists the payments (of one account).
//!
//! Keys are scoped by the layer's default, the request's `Authorization`
//! header (a digest of it, never the secret): two callers with different
//! credentials never share a key, a response or a 422.
//!
//! `--after-effect-ms N` makes the handler record the payment first and then
//! wait N ms before answering: a slow downstream after the charge, the case a
//! client's attempt timeout hits. The layer keeps the handler running when
//! the client hangs up, and answers the retry with 409 and then the replay.
//!
//! The layer's warnings go to stderr (`RUST_LOG` overrides the `warn` level).
//! Start-up failures print one line and exit with status 1.
//!
//! With `--store postgres://...` the idempotency table and a `payments` table
//! are created at start, and each payment row is inserted in the same
//! transaction that completes its idempotency key: either both commit or
//! neither does.
//!
//! With `--store redis://...` the keys are in Redis (shared by every
//! instance pointed at it) and the payments in the process, as with
//! `memory`; the handler checks that it still holds its key right before
//! recording a payment. A Redis that can lose keys (no append-only file)
//! is used with a warning: `RedisStore::connect` would refuse it.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use clap::Parser;
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use tower_idempotency::{
    spawn_sweeper, IdempotencyContext, IdempotencyLayer, IdempotencyStore, MemoryStore,
    PostgresStore, RedisStore, StoredResponse,
};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(about = "Payments API with Idempotency-Key support")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: String,
    /// `memory`, a PostgreSQL URL (`postgres://user@host:port/db`) or a
    /// Redis URL (`redis://host:port`).
    #[arg(long, default_value = "memory")]
    store: String,
    /// Simulated processing time per payment, in milliseconds.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
    /// Time the handler waits after recording a payment, before answering.
    #[arg(long, default_value_t = 0)]
    after_effect_ms: u64,
}

#[derive(Deserialize)]
struct NewPayment {
    account: String,
    amount: i64,
}

#[derive(Serialize, Clone)]
struct Payment {
    id: i64,
    account: String,
    amount: i64,
}

#[derive(Deserialize)]
struct ListQuery {
    account: Option<String>,
}

enum Backend {
    Memory {
        payments: Mutex<Vec<Payment>>,
        next_id: AtomicI64,
    },
    Postgres(PostgresStore),
}

#[derive(Clone)]
struct AppState {
    backend: Arc<Backend>,
    work: Duration,
    after_effect: Duration,
}

/// A database error: the payment's transaction did not commit (the key is
/// completed in the same transaction, so a commit that did happen shows as
/// the replay on the retry). Nothing was charged: ask for a retry.
fn unavailable(err: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %err, "payments database unavailable");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!("payments database unavailable: {err}"),
    )
        .into_response()
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn create_payment(
    State(state): State<AppState>,
    Extension(ctx): Extension<IdempotencyContext>,
    Json(new): Json<NewPayment>,
) -> Response {
    if !state.work.is_zero() {
        tokio::time::sleep(state.work).await;
    }
    match &*state.backend {
        Backend::Memory { payments, next_id } => {
            // Right before the effect: another instance sharing the store
            // could have taken the key over if this one lost it.
            if !ctx.still_held() {
                return unavailable("this request no longer holds its idempotency key");
            }
            let payment = Payment {
                id: next_id.fetch_add(1, Ordering::SeqCst),
                account: new.account,
                amount: new.amount,
            };
            payments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(payment.clone());
            after_effect(state.after_effect).await;
            // The layer stores this response and completes the key.
            (StatusCode::CREATED, Json(payment)).into_response()
        }
        Backend::Postgres(store) => {
            let result: Result<Response, Box<dyn std::error::Error + Send + Sync>> = async {
                let mut tx = store.pool().begin().await?;
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO payments (account, amount) VALUES ($1, $2) RETURNING id",
                )
                .bind(&new.account)
                .bind(new.amount)
                .fetch_one(&mut *tx)
                .await?;
                let payment = Payment {
                    id,
                    account: new.account,
                    amount: new.amount,
                };
                let body = serde_json::to_string(&payment)?;
                // Complete the idempotency key in the payment's transaction
                // and commit: the payment and its replayable response commit
                // together, and the layer has nothing left to store.
                let stored = StoredResponse::json(201, body.clone());
                if !store.commit_completed(tx, &ctx, &stored).await? {
                    // Our claim was taken over after the lock timeout: another
                    // attempt owns this key now; the payment was rolled back.
                    return Ok(json_response(
                        StatusCode::CONFLICT,
                        r#"{"error":"request superseded by a retry"}"#.to_owned(),
                    ));
                }
                after_effect(state.after_effect).await;
                Ok(json_response(StatusCode::CREATED, body))
            }
            .await;
            result.unwrap_or_else(unavailable)
        }
    }
}

/// The slow downstream after the charge.
async fn after_effect(wait: Duration) {
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

async fn list_payments(State(state): State<AppState>, Query(q): Query<ListQuery>) -> Response {
    match &*state.backend {
        Backend::Memory { payments, .. } => {
            let payments = payments.lock().unwrap_or_else(|p| p.into_inner());
            let list: Vec<Payment> = payments
                .iter()
                .filter(|p| q.account.as_deref().is_none_or(|a| a == p.account))
                .cloned()
                .collect();
            Json(list).into_response()
        }
        Backend::Postgres(store) => {
            let rows: Result<Vec<(i64, String, i64)>, sqlx::Error> = sqlx::query_as(
                "SELECT id, account, amount FROM payments \
                 WHERE $1::text IS NULL OR account = $1 ORDER BY id",
            )
            .bind(q.account)
            .fetch_all(store.pool())
            .await;
            match rows {
                Ok(rows) => Json(
                    rows.into_iter()
                        .map(|(id, account, amount)| Payment {
                            id,
                            account,
                            amount,
                        })
                        .collect::<Vec<_>>(),
                )
                .into_response(),
                Err(err) => unavailable(err),
            }
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "payments_server: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until the listener fails; every error is a sentence for a person.
async fn run(args: Args) -> Result<(), String> {
    let (backend, store): (Backend, Arc<dyn IdempotencyStore>) = if args.store == "memory" {
        let backend = Backend::Memory {
            payments: Mutex::new(Vec::new()),
            next_id: AtomicI64::new(1),
        };
        (backend, Arc::new(MemoryStore::new()))
    } else if args.store.starts_with("postgres://") || args.store.starts_with("postgresql://") {
        let store = connect_postgres(&args.store)
            .await
            .map_err(|e| format!("cannot reach PostgreSQL at {}: {e}", args.store))?;
        (Backend::Postgres(store.clone()), Arc::new(store))
    } else if args.store.starts_with("redis://") || args.store.starts_with("rediss://") {
        let backend = Backend::Memory {
            payments: Mutex::new(Vec::new()),
            next_id: AtomicI64::new(1),
        };
        (backend, Arc::new(connect_redis(&args.store).await?))
    } else {
        return Err(format!(
            "--store must be `memory`, a postgres:// URL or a redis:// URL, got {:?}",
            args.store
        ));
    };
    let _sweeper = spawn_sweeper(store.clone(), Duration::from_secs(600));

    // The layer's default scope: a digest of the Authorization header.
    let idempotency = IdempotencyLayer::builder_from_arc(store)
        // Validation statuses, as by default, and this handler's 503: it is
        // answered only when the payment's transaction did not commit, so a
        // retry may run the handler again.
        .release_statuses([
            StatusCode::BAD_REQUEST,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::SERVICE_UNAVAILABLE,
        ])
        .build()
        .map_err(|e| format!("invalid idempotency settings: {e}"))?;
    let state = AppState {
        backend: Arc::new(backend),
        work: Duration::from_millis(args.work_ms),
        after_effect: Duration::from_millis(args.after_effect_ms),
    };
    let app = Router::new()
        .route("/payments", get(list_payments).post(create_payment))
        .with_state(state)
        .layer(idempotency);

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => format!("address {} in use", args.listen),
            _ => format!("cannot listen on {}: {e}", args.listen),
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("serving on {addr} failed: {e}"))
}

/// Connects, applies the migrations and creates the `payments` table; gives
/// up after 10 s rather than waiting on an unreachable server.
/// The Redis store at `url`; one that can lose keys with a warning.
async fn connect_redis(url: &str) -> Result<RedisStore, String> {
    match RedisStore::connect(url).await {
        Ok(store) => Ok(store),
        Err(err) if !err.is_transient() && err.to_string().contains("connect_volatile") => {
            tracing::warn!("{err}; running anyway (this example keeps its payments in memory too)");
            RedisStore::connect_volatile(url)
                .await
                .map_err(|e| format!("cannot reach Redis at {url}: {e}"))
        }
        Err(err) => Err(format!("cannot reach Redis at {url}: {err}")),
    }
}

async fn connect_postgres(url: &str) -> Result<PostgresStore, String> {
    let setup = async {
        // One plain connection first: a refused or misconfigured server
        // answers at once with its real error, where the pool would retry
        // until its acquire timeout.
        let probe = sqlx::postgres::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let _ = probe.close().await;
        let store = PostgresStore::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS payments (
                 id         bigserial   PRIMARY KEY,
                 account    text        NOT NULL,
                 amount     bigint      NOT NULL,
                 created_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .execute(store.pool())
        .await
        .map_err(|e| e.to_string())?;
        Ok(store)
    };
    tokio::time::timeout(Duration::from_secs(10), setup)
        .await
        .unwrap_or_else(|_| Err("no answer within 10 s".to_owned()))
}
