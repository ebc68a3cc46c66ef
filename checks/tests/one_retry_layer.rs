//! One retry layer in a stack: a tier whose call upstream gave up answers
//! "do not retry", and a caller using this crate makes one attempt at that
//! hop, so the upstream sees the tier's attempts, not their product.

mod support;

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_safe_retry::deadline::{GiveUp, InheritDeadlineLayer};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{ReportSlot, RetryReport, StopReason};
use support::{client, policy};
use wiremock::ResponseTemplate;

#[derive(Clone)]
struct Tier {
    client: ClientWithMiddleware,
    upstream: String,
}

/// Headers that belong to one hop, or that the client sets itself.
fn passed_on(name: &axum::http::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection" | "transfer-encoding" | "host" | "content-length" | "request-timeout-ms"
    )
}

/// As `examples/tier` does: the method, the headers (a key among them) and
/// the body go on; the upstream's status and headers come back; with no
/// answer at all, `GiveUp`'s.
async fn forward(
    State(tier): State<Tier>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut request = tier.client.request(method, &tier.upstream).body(body);
    for (name, value) in &headers {
        if passed_on(name) {
            request = request.header(name, value);
        }
    }
    let slot = ReportSlot::new();
    match request.with_extension(slot.clone()).send().await {
        Ok(response) => {
            let mut out = HeaderMap::new();
            for (name, value) in response.headers() {
                if passed_on(name) {
                    out.append(name, value.clone());
                }
            }
            (response.status(), out).into_response()
        }
        Err(_) => match slot.take().and_then(|r| GiveUp::for_report(&r)) {
            Some(give_up) => give_up.into_response(),
            None => StatusCode::BAD_GATEWAY.into_response(),
        },
    }
}

/// A tier in front of `upstream`, its client on a manual clock, with or
/// without the inbound layer.
async fn tier(upstream: String, layered: bool) -> SocketAddr {
    let (client, _) = client(policy(&ManualClock::new()).no_budget().build().unwrap());
    let router = Router::new()
        .fallback(forward)
        .with_state(Tier { client, upstream });
    let router = if layered {
        router.layer(InheritDeadlineLayer::new())
    } else {
        router
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// Calls a tier in front of `upstream` once with this crate's client: the
/// report, the status and the verdict the caller got.
async fn through(upstream: String, layered: bool) -> (RetryReport, StatusCode, Option<String>) {
    let addr = tier(upstream, layered).await;
    let (caller, _) = client(policy(&ManualClock::new()).no_budget().build().unwrap());
    let response = caller.get(format!("http://{addr}/")).send().await.unwrap();
    let verdict = response
        .headers()
        .get("stripe-should-retry")
        .map(|v| v.to_str().unwrap().to_owned());
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (report, response.status(), verdict)
}

#[tokio::test]
async fn a_caller_does_not_retry_a_tier_that_gave_up() {
    let database = support::answering_with(ResponseTemplate::new(503)).await;
    let (report, status, verdict) = through(database.uri(), true).await;
    assert_eq!(status, 503);
    assert_eq!(verdict.as_deref(), Some("false"));
    assert_eq!(report.attempts(), 1, "one attempt at this hop");
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
    assert_eq!(database.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn without_the_layer_the_retries_multiply() {
    // The control: the same tier without the layer answers a plain 503,
    // and its caller retries it; the database sees 3 × 3.
    let database = support::answering_with(ResponseTemplate::new(503)).await;
    let (report, status, verdict) = through(database.uri(), false).await;
    assert_eq!(status, 503);
    assert_eq!(verdict, None);
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(database.received_requests().await.unwrap().len(), 9);
}

#[tokio::test]
async fn a_tier_with_no_answer_to_pass_on_says_why_it_gave_up() {
    let refused = support::refused_addr().await;
    let (report, status, verdict) = through(format!("http://{refused}/"), true).await;
    // The tier's three connect attempts failed: 503, do not retry.
    assert_eq!(status, 503);
    assert_eq!(verdict.as_deref(), Some("false"));
    assert_eq!(report.attempts(), 1);
}

/// A caller using this crate calls the outermost of three tiers in front of
/// a database answering `answer`, once: the requests the database saw, and
/// the caller's report.
async fn three_tiers_deep(method: Method, answer: ResponseTemplate) -> (usize, RetryReport) {
    let database = support::answering_with(answer).await;
    let mut upstream = database.uri();
    for _ in 0..3 {
        upstream = format!("http://{}/", tier(upstream, true).await);
    }
    let (caller, _) = client(policy(&ManualClock::new()).no_budget().build().unwrap());
    let response = caller.request(method, upstream).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (database.received_requests().await.unwrap().len(), report)
}

#[tokio::test]
async fn an_upstreams_retry_verdict_is_not_each_tiers_own() {
    // The database says "retry": the innermost tier does, three times, and
    // gives up; the tiers above must not pass the "retry" on (3^4 = 81).
    let told_to_retry = ResponseTemplate::new(503).insert_header("stripe-should-retry", "true");
    let (requests, report) = three_tiers_deep(Method::GET, told_to_retry).await;
    assert_eq!(requests, 3, "the innermost tier's attempts");
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
}

#[tokio::test]
async fn a_keyed_409_does_not_multiply() {
    // This crate's client retries a 409 to a keyed request (a POST carries
    // a key, which each tier passes on), so a tier that gave up on it says
    // so.
    let (requests, report) = three_tiers_deep(Method::POST, ResponseTemplate::new(409)).await;
    assert!(report.idempotency_key().is_some());
    assert_eq!((requests, report.attempts()), (3, 1), "409");
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
}

#[tokio::test]
async fn a_413_with_retry_after_does_not_multiply() {
    // This crate's client retries a 413 with Retry-After (RFC 9110
    // §15.5.14), waiting it out (on the manual clocks here).
    let temporary = ResponseTemplate::new(413).insert_header("retry-after", "1");
    let (requests, report) = three_tiers_deep(Method::PUT, temporary).await;
    assert_eq!((requests, report.attempts()), (3, 1), "413");
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
}
