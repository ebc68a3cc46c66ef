//! One retry layer in a stack: a tier whose call upstream gave up answers
//! "do not retry", and a caller using this crate makes one attempt at that
//! hop, so the upstream sees the tier's attempts, not their product.

mod support;

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_safe_retry::{
    GiveUp, InheritDeadlineLayer, ManualClock, ReportSlot, RetryReport, StopReason,
};
use support::{client, policy};
use wiremock::ResponseTemplate;

#[derive(Clone)]
struct Tier {
    client: ClientWithMiddleware,
    upstream: String,
}

/// Passes the upstream's status on; with no answer at all, `GiveUp`'s.
async fn forward(State(tier): State<Tier>) -> Response {
    let slot = ReportSlot::new();
    match tier
        .client
        .get(&tier.upstream)
        .with_extension(slot.clone())
        .send()
        .await
    {
        Ok(response) => response.status().into_response(),
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
        .route("/", get(forward))
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
