//! The servers under test: the `POST /pay` handlers (trivial, Redis
//! round trips, PostgreSQL inserts with and without a transaction of their
//! own or the layer's) and the router each mode serves.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use sqlx::postgres::PgPool;
use tower_idempotency::{
    IdempotencyContext, IdempotencyLayer, IdempotencyTransaction, MemoryStore, PostgresStore,
    RedisClusterStore, RedisStore, StoredResponse, IDEMPOTENCY_KEY,
};

use crate::args::Mode;
use crate::stores::PAYMENTS;

/// The handlers' answer body.
const RESPONSE: &str = r#"{"id":"pay_1","status":"paid"}"#;

/// The trivial handler: reads the body, answers `201` with a small JSON body.
async fn pay_plain(_body: Bytes) -> Answer {
    created()
}

/// The trivial handler after a hand-over to a spawned task and back.
async fn pay_spawn(_body: Bytes) -> Answer {
    let _ = tokio::spawn(async {}).await;
    created()
}

/// The trivial handler after two writes to Redis of its own, one round
/// trip each.
async fn pay_redis_floor(
    State(mut conn): State<redis::aio::ConnectionManager>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let key = format!("loadgen:floor:{}", key_of(&headers));
    for value in [&body[..], RESPONSE.as_bytes()] {
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await;
        if let Err(err) = set {
            eprintln!("redis set: {err}");
            return failed();
        }
    }
    created()
}

/// The trivial handler after two round trips to Redis of its own, each a
/// script that does nothing, given the keys and arguments the layer's claim
/// and completion give theirs.
async fn pay_redis_script_floor(
    State((mut conn, script)): State<(redis::aio::ConnectionManager, redis::Script)>,
    headers: HeaderMap,
    _body: Bytes,
) -> Answer {
    let key = format!("loadgen:script-floor:{}", key_of(&headers));
    let claim = script
        .key(&key)
        .key("loadgen:script-floor:epoch")
        .key("loadgen:script-floor:in_progress")
        .arg([1u8; 32].as_slice())
        .arg("6f1c2a8e-0b7d-4c55-9a3e-1f2d3c4b5a69")
        .arg(30_000)
        .arg(60_000)
        .invoke_async::<i64>(&mut conn)
        .await;
    let complete = match claim {
        Ok(_) => {
            script
                .key(&key)
                .key("loadgen:script-floor:in_progress")
                .arg("6f1c2a8e-0b7d-4c55-9a3e-1f2d3c4b5a69")
                .arg(201)
                .arg(r#"[["content-type","application/json"]]"#)
                .arg(RESPONSE)
                .invoke_async::<i64>(&mut conn)
                .await
        }
        Err(err) => Err(err),
    };
    if let Err(err) = complete {
        eprintln!("redis script: {err}");
        return failed();
    }
    created()
}

fn insert_sql() -> String {
    format!("INSERT INTO {PAYMENTS} (key, body) VALUES ($1, $2)")
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

type Answer = (
    StatusCode,
    [(header::HeaderName, &'static str); 1],
    &'static str,
);

fn created() -> Answer {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        RESPONSE,
    )
}

fn failed() -> Answer {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "text/plain")],
        "insert failed",
    )
}

async fn pay_pg(State(pool): State<PgPool>, headers: HeaderMap, body: Bytes) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    match sqlx::query(&insert_sql())
        .bind(key_of(&headers))
        .bind(body)
        .execute(&pool)
        .await
    {
        Ok(_) => created(),
        Err(err) => {
            eprintln!("pg insert: {err}");
            failed()
        }
    }
}

async fn pay_pg_own_tx(State(pool): State<PgPool>, headers: HeaderMap, body: Bytes) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let insert = async {
        let mut tx = pool.begin().await?;
        sqlx::query(&insert_sql())
            .bind(key_of(&headers))
            .bind(body)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    };
    match insert.await {
        Ok(()) => created(),
        Err(err) => {
            eprintln!("pg insert in the handler's transaction: {err}");
            failed()
        }
    }
}

/// Inserts the row and completes the key in one transaction of the
/// handler's own: the row and the stored response commit together.
async fn pay_pg_complete_in_tx(
    State(store): State<PostgresStore>,
    Extension(ctx): Extension<IdempotencyContext>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let response = StoredResponse {
        status: 201,
        headers: vec![(
            "content-type".to_owned(),
            Bytes::from_static(b"application/json"),
        )],
        body: Bytes::from_static(RESPONSE.as_bytes()),
    };
    let insert = async {
        let mut tx = store.pool().begin().await?;
        sqlx::query(&insert_sql())
            .bind(key_of(&headers))
            .bind(body)
            .execute(&mut *tx)
            .await?;
        let completed = store.commit_completed(tx, &ctx, &response).await?;
        Ok::<_, Box<dyn std::error::Error>>(completed)
    };
    match insert.await {
        Ok(true) => created(),
        Ok(false) => {
            eprintln!("commit_completed: the lease was taken over");
            failed()
        }
        Err(err) => {
            eprintln!("pg insert and completion in the handler's transaction: {err}");
            failed()
        }
    }
}

async fn pay_pg_tx(
    Extension(tx): Extension<IdempotencyTransaction>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let body = String::from_utf8_lossy(&body).into_owned();
    let mut conn = match tx.lock().await {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("transaction: {err}");
            return failed();
        }
    };
    match sqlx::query(&insert_sql())
        .bind(key_of(&headers))
        .bind(body)
        .execute(&mut **conn)
        .await
    {
        Ok(_) => created(),
        Err(err) => {
            eprintln!("pg insert in transaction: {err}");
            failed()
        }
    }
}

/// The app `mode` serves: its handler, behind the layer and store it names.
pub(crate) fn router(
    mode: Mode,
    pg: Option<&PostgresStore>,
    redis: Option<&RedisStore>,
    cluster: Option<&RedisClusterStore>,
) -> Result<Router, String> {
    let need = || {
        pg.cloned()
            .ok_or_else(|| "PostgreSQL not connected".to_owned())
    };
    let need_redis = || {
        redis
            .cloned()
            .ok_or_else(|| "Redis not connected".to_owned())
    };
    Ok(match mode {
        Mode::RedisCluster => {
            let store = cluster
                .cloned()
                .ok_or_else(|| "the Redis Cluster not connected".to_owned())?;
            let layer = IdempotencyLayer::builder(store)
                .expiry(Duration::from_secs(60))
                .build()
                .map_err(|e| e.to_string())?;
            Router::new().route("/pay", post(pay_plain)).layer(layer)
        }
        Mode::Redis => {
            let store = need_redis()?;
            let layer = IdempotencyLayer::builder(store)
                .expiry(Duration::from_secs(60))
                .build()
                .map_err(|e| e.to_string())?;
            Router::new().route("/pay", post(pay_plain)).layer(layer)
        }
        Mode::RedisFloor => {
            let store = need_redis()?;
            Router::new()
                .route("/pay", post(pay_redis_floor))
                .with_state(store.connection())
        }
        Mode::RedisScriptFloor => {
            let store = need_redis()?;
            Router::new()
                .route("/pay", post(pay_redis_script_floor))
                .with_state((store.connection(), redis::Script::new("return 1")))
        }
        Mode::None => Router::new().route("/pay", post(pay_plain)),
        Mode::NoneSpawn => Router::new().route("/pay", post(pay_spawn)),
        Mode::Memory => Router::new()
            .route("/pay", post(pay_plain))
            .layer(IdempotencyLayer::new(MemoryStore::new())),
        Mode::PgNone => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg))
                .with_state(store.pool().clone())
        }
        Mode::PgTxNone => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg_own_tx))
                .with_state(store.pool().clone())
        }
        Mode::PgTwoPhase => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg))
                .with_state(store.pool().clone())
                .layer(IdempotencyLayer::new(store))
        }
        Mode::PgTwoPhaseInTx => {
            let store = need()?;
            Router::new()
                .route("/pay", post(pay_pg_complete_in_tx))
                .with_state(store.clone())
                .layer(IdempotencyLayer::new(store))
        }
        Mode::PgTransactional => {
            let store = need()?;
            let layer = IdempotencyLayer::transactional(store)
                .build()
                .map_err(|e| e.to_string())?;
            Router::new().route("/pay", post(pay_pg_tx)).layer(layer)
        }
    })
}
