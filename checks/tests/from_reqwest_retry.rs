//! The README's "Coming from reqwest-retry": the same scenarios through
//! reqwest-retry 0.9 (`RetryTransientMiddleware` with an
//! `ExponentialBackoff` of two retries) and through this crate (three
//! attempts), side by side, so each difference the README claims is shown
//! here, with the cases where both agree.
//!
//! reqwest-retry sleeps for real; its bounds are zero here, so it never
//! waits. Ours runs on a manual clock.

mod support;

use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::{
    ManualClock, ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy, RetryReport, StopReason,
};
use support::{answering_with, refused_addr};
use wiremock::{MockServer, ResponseTemplate};

/// reqwest-retry with two retries (three attempts) and no waiting.
fn theirs() -> ClientWithMiddleware {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::ZERO, Duration::ZERO)
        .build_with_max_retries(2);
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build()
}

/// This crate with three attempts (the default), on a manual clock.
fn ours(clock: &ManualClock) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .manual_clock(clock)
        .seed(7)
        .build()
        .unwrap();
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

/// How many requests `method` to a server answering `template` costs
/// through reqwest-retry, and through ours (with our report).
async fn attempts(
    method: &str,
    options: RequestOptions,
    template: ResponseTemplate,
) -> (usize, usize, RetryReport) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let server = answering_with(template.clone()).await;
    theirs()
        .request(method.clone(), server.uri())
        .send()
        .await
        .unwrap();
    let their_count = requests(&server).await;

    let server = answering_with(template).await;
    let clock = ManualClock::new();
    let response = ours(&clock)
        .request(method, server.uri())
        .with_extension(options)
        .send()
        .await
        .unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (their_count, requests(&server).await, report)
}

#[tokio::test]
async fn both_retry_the_ordinary_transient_answers() {
    for status in [408, 429, 500, 502, 503, 504] {
        let (theirs, ours, _) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (3, 3), "{status}");
    }
    // And neither retries a plain 4xx, or a success.
    for status in [200, 400, 404, 422] {
        let (theirs, ours, _) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (1, 1), "{status}");
    }
}

#[tokio::test]
async fn a_5xx_that_names_a_lasting_condition_is_permanent_here() {
    for status in [501, 505, 506, 507, 508, 510, 511] {
        let (theirs, ours, report) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (3, 1), "{status}");
        assert_eq!(report.stop_reason(), StopReason::Permanent);
    }
}

#[tokio::test]
async fn a_post_without_a_key_and_an_extension_method_are_not_retried_here() {
    let no_key = RequestOptions::new().no_idempotency_key();
    let (theirs, ours, report) = attempts("POST", no_key, ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 1), "a blind POST retry could pay twice");
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);

    // A method outside RFC 9110's idempotent set, with no key by default.
    let (theirs, ours, report) =
        attempts("PURGE", RequestOptions::new(), ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 1));
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);

    // A POST with the key this crate attaches is retried by both.
    let (theirs, ours, report) =
        attempts("POST", RequestOptions::new(), ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 3));
    assert!(report.idempotency_key().is_some());
}

#[tokio::test]
async fn conflict_too_early_and_a_temporary_413_are_transient_here() {
    // 409 to a keyed request: the original is still in progress.
    let (theirs, ours, _) =
        attempts("POST", RequestOptions::new(), ResponseTemplate::new(409)).await;
    assert_eq!((theirs, ours), (1, 3), "409");
    let (theirs, ours, _) =
        attempts("GET", RequestOptions::new(), ResponseTemplate::new(425)).await;
    assert_eq!((theirs, ours), (1, 3), "425");
    let temporary = ResponseTemplate::new(413).insert_header("Retry-After", "1");
    let (theirs, ours, _) = attempts("PUT", RequestOptions::new(), temporary).await;
    assert_eq!((theirs, ours), (1, 3), "413 with Retry-After");
    // Without Retry-After, 413 is permanent for both.
    let (theirs, ours, _) =
        attempts("PUT", RequestOptions::new(), ResponseTemplate::new(413)).await;
    assert_eq!((theirs, ours), (1, 1), "413");
}

#[tokio::test]
async fn retry_after_is_honoured_here() {
    let busy = ResponseTemplate::new(503).insert_header("Retry-After", "2");
    // reqwest-retry waits its own backoff (zero here), whatever the server
    // asked for: three attempts well inside the 4 s it asked for.
    let server = answering_with(busy.clone()).await;
    let started = Instant::now();
    theirs().get(server.uri()).send().await.unwrap();
    assert_eq!(requests(&server).await, 3);
    assert!(started.elapsed() < Duration::from_secs(2));

    let (_, ours, report) = attempts("GET", RequestOptions::new(), busy).await;
    assert_eq!(ours, 3);
    assert_eq!(report.retry_after_honoured(), 2);
    assert!(report.delays().iter().all(|d| *d >= Duration::from_secs(2)));
}

#[tokio::test]
async fn a_transport_error_comes_back_unchanged_here() {
    let url = format!("http://{}/", refused_addr().await);
    let their_err = theirs().get(&url).send().await.unwrap_err();
    // Wrapped in RetryError: reqwest's predicates no longer see it.
    assert!(their_err.is_middleware());
    assert!(!their_err.is_connect());
    assert!(
        their_err.to_string().contains("after 2 retries"),
        "{their_err}"
    );

    let clock = ManualClock::new();
    let slot = ReportSlot::new();
    let our_err = ours(&clock)
        .get(&url)
        .with_extension(slot.clone())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(our_err, reqwest_middleware::Error::Reqwest(_)));
    assert!(our_err.is_connect());
    // What RetryError::WithRetries counted is in the report.
    let report = slot.take().unwrap();
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
}

#[tokio::test]
async fn a_streamed_body_is_sent_once_here_and_not_at_all_there() {
    fn streamed() -> reqwest::Body {
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("{\"amount\":"), Ok("1}")];
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    }
    let server = answering_with(ResponseTemplate::new(503)).await;
    let err = theirs()
        .put(server.uri())
        .body(streamed())
        .send()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not cloneable"), "{err}");
    assert_eq!(requests(&server).await, 0, "refused before sending");

    let server = answering_with(ResponseTemplate::new(503)).await;
    let clock = ManualClock::new();
    let response = ours(&clock)
        .put(server.uri())
        .body(streamed())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotCloneable);
    assert_eq!(requests(&server).await, 1, "sent once");
}
