//! What each fuzz target checks on one input. The fuzz targets
//! (`fuzz_targets/`) and the stable test that replays the committed corpus
//! (`tests/fuzz_corpus.rs`) share this file, so CI keeps every input the
//! fuzzer found interesting.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use reqwest_safe_retry::classify::retry_after::parse;
use reqwest_safe_retry::keys::{KeyFormat, MAX_KEY_LEN};
use reqwest_safe_retry::IdempotencyKey;
use tower::{Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// A fixed "now", so every run is reproducible: Sun, 06 Nov 1994 08:49:37 GMT.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777)
}

/// Retry-After without a Date header: never panics, and a value of digits
/// alone is always a hint (an overflowing one is the largest).
pub fn retry_after(data: &[u8]) {
    let value = String::from_utf8_lossy(data);
    let got = parse(&value, None, now());
    let trimmed = value.trim();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        assert!(got.is_some(), "digits are always a hint: {value:?}");
    }
}

/// Retry-After with a Date header (`value \n date`): never panics, and an
/// HTTP-date measured against itself is zero.
pub fn retry_after_with_date(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (value, date) = text.split_once('\n').unwrap_or((&text, ""));
    let _ = parse(value, Some(date), now());
    let is_number = date.trim().bytes().all(|b| b.is_ascii_digit());
    if let (false, Some(d)) = (is_number, parse(date, Some(date), now())) {
        assert_eq!(d, Duration::ZERO, "a date against itself: {date:?}");
    }
}

/// `IdempotencyKey::new`: a key is valid exactly when it is 1 to 255
/// visible ASCII characters, and a valid key always makes a header.
pub fn client_key(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let visible = text.bytes().all(|b| (b'!'..=b'~').contains(&b));
    let should_be_valid = !text.is_empty() && text.len() <= MAX_KEY_LEN && visible;
    match IdempotencyKey::new(text.as_ref()) {
        Ok(key) => {
            assert!(should_be_valid, "accepted {text:?}");
            assert_eq!(key.as_str(), text);
            for format in [KeyFormat::Bare, KeyFormat::StructuredField] {
                key.header_value(format)
                    .expect("a valid key makes a header");
            }
        }
        Err(_) => assert!(!should_be_valid, "refused {text:?}"),
    }
}

/// One request the server target sends.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    method: Method,
    key: Option<HeaderValue>,
    authorization: Option<HeaderValue>,
    body: Bytes,
}

/// Up to four requests, separated by 0xFF; in each, a control byte (method,
/// which headers, "repeat the previous request") and then the key, the
/// Authorization value and the body, separated by 0xFE.
fn requests(data: &[u8]) -> Vec<Sent> {
    const METHODS: [Method; 6] = [
        Method::POST,
        Method::PATCH,
        Method::GET,
        Method::PUT,
        Method::DELETE,
        Method::POST,
    ];
    let mut out: Vec<Sent> = Vec::new();
    for chunk in data.split(|&b| b == 0xFF).take(4) {
        let Some((&control, rest)) = chunk.split_first() else {
            continue;
        };
        if control & 0x80 != 0 {
            if let Some(previous) = out.last().cloned() {
                out.push(previous);
                continue;
            }
        }
        let mut fields = rest.splitn(3, |&b| b == 0xFE);
        let (key, authorization, body) = (
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
        );
        out.push(Sent {
            method: METHODS[usize::from(control) % METHODS.len()].clone(),
            key: (control & 0x10 != 0)
                .then(|| HeaderValue::from_bytes(key).ok())
                .flatten(),
            authorization: (control & 0x20 != 0)
                .then(|| HeaderValue::from_bytes(authorization).ok())
                .flatten(),
            body: Bytes::copy_from_slice(body),
        });
    }
    out
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
    })
}

/// The server layer over a MemoryStore and a handler that counts its runs:
/// never panics; a replay never runs the handler; a keyed POST or PATCH
/// sent again, identical, after the handler answered it, is a replay.
pub fn server_layer(data: &[u8]) {
    let sent = requests(data);
    if sent.is_empty() {
        return;
    }
    runtime().block_on(async {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let handler = tower::service_fn(move |req: Request<Full<Bytes>>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let len = body.map_or(0, |b| b.len());
                let response = Response::builder()
                    .status(201)
                    .header("content-type", "text/plain")
                    .body(Full::new(Bytes::from(format!("{len} bytes"))))
                    .expect("a valid response");
                Ok::<_, Infallible>(response)
            }
        });
        let service = IdempotencyLayer::new(MemoryStore::new()).layer(handler);
        let mut handled: Vec<Sent> = Vec::new();
        for request in sent {
            let mut builder = Request::builder().method(request.method.clone()).uri("/p");
            if let Some(key) = &request.key {
                builder = builder.header("idempotency-key", key);
            }
            if let Some(auth) = &request.authorization {
                builder = builder.header("authorization", auth);
            }
            let req = builder
                .body(Full::new(request.body.clone()))
                .expect("a valid request");
            let before = runs.load(Ordering::SeqCst);
            let Ok(response) = service.clone().oneshot(req).await;
            let ran = runs.load(Ordering::SeqCst) > before;
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            assert!(!(replayed && ran), "a replay ran the handler: {request:?}");
            let covered = request.method == Method::POST || request.method == Method::PATCH;
            if covered && request.key.is_some() && handled.contains(&request) {
                assert!(replayed && !ran, "not replayed: {request:?}");
            }
            if ran && response.status() == 201 && !replayed {
                handled.push(request);
            }
        }
    });
}
