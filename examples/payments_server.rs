//! A small payments API protected by `tower-idempotency`.
//!
//! ```text
//! cargo run --example payments_server -- --listen 127.0.0.1:3000 --store memory --work-ms 0
//! cargo run --example payments_server -- --store postgres://postgres@127.0.0.1:5432/test
//!
//! curl -i -X POST localhost:3000/payments -H 'Idempotency-Key: k1' \
//!      -H 'content-type: application/json' -d '{"account":"A","amount":10}'
//! curl -i 'localhost:3000/payments?account=A'
//! ```
//!
//! * `POST /payments` takes `{"account": string, "amount": integer}`, requires an
//!   `Idempotency-Key` header and answers `201 {"id", "account", "amount"}`.
//!   A retry with the same key and body replays the answer
//!   (`Idempotent-Replayed: true`) without creating a second payment.
//! * `GET /payments?account=A` lists the payments (of one account).
//!
//! With `--store postgres://...` the idempotency table and a `payments` table
//! are created at start, and each payment row is inserted in the same
//! transaction that completes its idempotency key: either both commit or
//! neither does.

use std::io::Write;
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
use tower_idempotency::{
    spawn_sweeper, IdempotencyContext, IdempotencyLayer, IdempotencyStore, MemoryStore,
    PostgresStore, StoredResponse,
};

#[derive(Parser, Debug)]
#[command(about = "Payments API with Idempotency-Key support")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: String,
    /// `memory`, or a PostgreSQL URL (`postgres://user@host:port/db`).
    #[arg(long, default_value = "memory")]
    store: String,
    /// Simulated processing time per payment, in milliseconds.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
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
}

fn internal(err: impl std::fmt::Display) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response()
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
            let payment = Payment {
                id: next_id.fetch_add(1, Ordering::SeqCst),
                account: new.account,
                amount: new.amount,
            };
            payments
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(payment.clone());
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
                // Complete the idempotency key in the payment's transaction:
                // the payment and its replayable response commit together.
                let stored = StoredResponse::json(201, body.clone());
                if !store.complete_in_tx(&mut tx, &ctx, &stored).await? {
                    // Our claim was taken over after the lock timeout: another
                    // attempt owns this key now, so do not commit a payment.
                    tx.rollback().await?;
                    return Ok(json_response(
                        StatusCode::CONFLICT,
                        r#"{"error":"request superseded by a retry"}"#.to_owned(),
                    ));
                }
                tx.commit().await?;
                Ok(json_response(StatusCode::CREATED, body))
            }
            .await;
            result.unwrap_or_else(internal)
        }
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
                Err(err) => internal(err),
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (backend, store): (Backend, Arc<dyn IdempotencyStore>) = if args.store == "memory" {
        let backend = Backend::Memory {
            payments: Mutex::new(Vec::new()),
            next_id: AtomicI64::new(1),
        };
        (backend, Arc::new(MemoryStore::new()))
    } else if args.store.starts_with("postgres://") || args.store.starts_with("postgresql://") {
        let store = PostgresStore::connect(&args.store).await?;
        store.migrate().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS payments (
                 id         bigserial   PRIMARY KEY,
                 account    text        NOT NULL,
                 amount     bigint      NOT NULL,
                 created_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .execute(store.pool())
        .await?;
        (Backend::Postgres(store.clone()), Arc::new(store))
    } else {
        return Err(format!(
            "--store must be `memory` or a postgres:// URL, got {:?}",
            args.store
        )
        .into());
    };
    let _sweeper = spawn_sweeper(store.clone(), Duration::from_secs(600));

    let idempotency = IdempotencyLayer::from_arc(store)
        // Scope keys by caller. Derive this from *authenticated* identity in
        // a real service; here an optional `x-api-key` header stands in.
        .scope_with(|parts| {
            parts
                .headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("anonymous")
                .to_owned()
        });
    let state = AppState {
        backend: Arc::new(backend),
        work: Duration::from_millis(args.work_ms),
    };
    let app = Router::new()
        .route("/payments", get(list_payments).post(create_payment))
        .with_state(state)
        .layer(idempotency);

    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", listener.local_addr()?)?;
    stdout.flush()?;
    axum::serve(listener, app).await?;
    Ok(())
}
