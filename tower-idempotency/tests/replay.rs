//! A completed key with the same fingerprint replays the stored response.
mod support;
use support::{app, post, req, send, Harness};

both_stores!(
    replay_is_identical,
    replay_keeps_non_2xx_final_responses,
    replayed_headers_are_byte_for_byte,
    a_record_of_the_format_before_replays
);

async fn replay_is_identical(h: Harness) {
    let (router, state) = app(h.layer());
    let first = send(&router, post("pay-1", r#"{"amount":10}"#)).await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let again = send(&router, post("pay-1", r#"{"amount":10}"#)).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(again.headers["idempotent-replayed"], "true");
        // Only the configured headers (content-type) are stored.
        assert!(again.headers.get("x-extra").is_none());
    }
    assert_eq!(state.runs(), 1, "{}", h.name);
}

async fn replay_keeps_non_2xx_final_responses(h: Harness) {
    // A 4xx outside the release statuses (400, 415, 422) is a final answer:
    // stored and replayed.
    let (router, state) = app(h.layer());
    let make = || {
        req(
            "POST",
            "/payments",
            Some("bad-1"),
            "x",
            &[("x-status", "404")],
        )
    };
    assert_eq!(send(&router, make()).await.status, 404);
    let again = send(&router, make()).await;
    assert_eq!(again.status, 404);
    assert!(again.replayed());
    assert_eq!(state.runs(), 1);
}

/// A `MemoryStore` given to the layer by type is claimed and completed by
/// direct calls, the completion finding the record by the hash the claim
/// computed: every one of many keys is replayed, none run twice.
#[tokio::test]
async fn a_memory_store_given_by_type_replays_every_key() {
    use tower_idempotency::{IdempotencyLayer, MemoryStore};
    let store = MemoryStore::new();
    let (router, state) = app(IdempotencyLayer::new(store.clone()));
    let keys: Vec<String> = (0..200).map(|i| format!("pay-{i}")).collect();
    for key in &keys {
        let first = send(&router, post(key, key)).await;
        assert_eq!(first.status, 201, "{key}");
        assert!(!first.replayed(), "{key}");
    }
    for key in &keys {
        let again = send(&router, post(key, key)).await;
        assert!(again.replayed(), "{key}: {} {:?}", again.status, again.body);
    }
    assert_eq!(state.runs(), keys.len());
    assert_eq!(store.len(), keys.len());
}

/// Configured header values that are not visible ASCII (UTF-8 in a file
/// name or a `Location`, a Latin-1 byte) as the handler sent them.
fn sent_headers() -> Vec<(http::HeaderName, http::HeaderValue)> {
    use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION};
    let value = |bytes: &[u8]| http::HeaderValue::from_bytes(bytes).unwrap();
    vec![
        (CONTENT_TYPE, value(b"application/pdf")),
        (
            CONTENT_DISPOSITION,
            value("attachment; filename=\"résumé.pdf\"".as_bytes()),
        ),
        (LOCATION, value("/fichiers/résumé.pdf".as_bytes())),
        (LOCATION, value(b"/latin-1/r\xe9sum\xe9")),
    ]
}

/// A router whose handler answers with [`sent_headers`], under `layer`
/// (which stores those headers); and the number of runs.
fn pdf_app(
    layer: tower_idempotency::IdempotencyLayer,
) -> (axum::Router, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = move || {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut response = axum::response::Response::new(axum::body::Body::from("%PDF"));
            *response.status_mut() = http::StatusCode::CREATED;
            for (name, value) in sent_headers() {
                response.headers_mut().append(name, value);
            }
            response
        }
    };
    let router = axum::Router::new()
        .route("/payments", axum::routing::post(handler))
        .layer(layer);
    (router, runs)
}

/// Sends one keyed request three times: every replay carries the stored
/// headers' values byte for byte, as the first caller got them.
async fn assert_replayed_byte_for_byte(layer: tower_idempotency::IdempotencyLayer, name: &str) {
    use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION};
    let (router, runs) = pdf_app(layer);
    let first = send(&router, post("pdf-1", "")).await;
    assert_eq!(first.status, 201, "{name}");
    for _ in 0..2 {
        let again = send(&router, post("pdf-1", "")).await;
        assert!(again.replayed(), "{name}: {again:?}");
        for header in [CONTENT_TYPE, CONTENT_DISPOSITION, LOCATION] {
            let sent: Vec<_> = sent_headers()
                .into_iter()
                .filter(|(n, _)| *n == header)
                .map(|(_, v)| v)
                .collect();
            let replayed: Vec<_> = again.headers.get_all(&header).iter().cloned().collect();
            assert_eq!(replayed, sent, "{name}: {header} not replayed as sent");
        }
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "{name}");
}

async fn replayed_headers_are_byte_for_byte(h: Harness) {
    use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION};
    let layer = h
        .builder()
        .stored_headers([CONTENT_TYPE, CONTENT_DISPOSITION, LOCATION])
        .build()
        .unwrap();
    assert_replayed_byte_for_byte(layer, h.name).await;
}

/// The same through a `MemoryStore` given by type (the layer's direct path,
/// which keeps the handler's header values itself).
#[tokio::test]
async fn a_memory_store_given_by_type_replays_headers_byte_for_byte() {
    use http::header::{CONTENT_DISPOSITION, CONTENT_TYPE, LOCATION};
    use tower_idempotency::{IdempotencyLayer, MemoryStore};
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .stored_headers([CONTENT_TYPE, CONTENT_DISPOSITION, LOCATION])
        .build()
        .unwrap();
    assert_replayed_byte_for_byte(layer, "memory by type").await;
}

/// A record the version before wrote (header values as JSON strings only)
/// is replayed by this one: a rolling upgrade loses no stored header. The
/// shared stores' record is rewritten in the old format by hand; the
/// memory store holds no record across versions.
async fn a_record_of_the_format_before_replays(h: Harness) {
    let (router, state) = app(h.layer());
    assert_eq!(send(&router, post("old-1", "x")).await.status, 201);
    let (scope, old) = (
        h.stored_scope(""),
        r#"[["content-type","text/x-old; charset=utf-8"]]"#,
    );
    if let Some(pg) = &h.pg {
        let sql = format!(
            "UPDATE {} SET headers = $3::jsonb WHERE scope = $1 AND key = $2",
            pg.table()
        );
        let done = sqlx::query(&sql).bind(&scope).bind("old-1").bind(old);
        assert_eq!(done.execute(pg.pool()).await.unwrap().rows_affected(), 1);
    } else if let Some(redis) = &h.redis {
        let _: () = redis::cmd("HSET")
            .arg(redis.record_key(&scope, "old-1"))
            .arg("headers")
            .arg(old)
            .query_async(&mut redis.connection())
            .await
            .unwrap();
    } else {
        return;
    }
    let again = send(&router, post("old-1", "x")).await;
    assert!(again.replayed(), "{}: {again:?}", h.name);
    assert_eq!(
        again.headers["content-type"], "text/x-old; charset=utf-8",
        "{}",
        h.name
    );
    assert_eq!(state.runs(), 1, "{}", h.name);
}
