//! The safety rule: what may be retried at all.

mod support;

use std::sync::atomic::Ordering;

use http::Method;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RequestOptions, RetryReport, StopReason};
use support::{client, faulty_server, policy, refused_addr, Fault};

fn unkeyed() -> RequestOptions {
    RequestOptions::new().no_idempotency_key()
}

/// Sends `method` with a body to a server that fails with `fault`; returns
/// the error as reqwest made it, the report, and how many requests the
/// server read.
async fn send_to(
    fault: Fault,
    method: Method,
    options: RequestOptions,
) -> (reqwest_middleware::Error, RetryReport, usize) {
    let (addr, count) = faulty_server(fault).await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .attempt_timeout(support::ms(100))
            .build()
            .unwrap(),
    );
    let (err, report) = support::send_failing(
        c.request(method, format!("http://{addr}/"))
            .with_extension(options)
            .body("charge"),
    )
    .await;
    (err, report, count.load(Ordering::SeqCst))
}

#[tokio::test]
async fn an_unkeyed_post_is_not_retried_after_a_5xx() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let response = c
        .post(server.uri())
        .with_extension(unkeyed())
        .body("charge")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_unkeyed_post_is_not_retried_after_a_reset() {
    let (_, report, received) = send_to(Fault::Reset, Method::POST, unkeyed()).await;
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);
    assert_eq!(received, 1);
}

#[tokio::test]
async fn an_unkeyed_patch_is_not_retried_after_a_timeout() {
    let (err, report, received) = send_to(Fault::Hang, Method::PATCH, unkeyed()).await;
    assert!(err.is_timeout());
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);
    assert_eq!(received, 1);
}

#[tokio::test]
async fn an_unkeyed_post_is_retried_after_a_refused_connection() {
    let addr = refused_addr().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).build().unwrap());
    let (err, report) =
        support::send_failing(c.post(format!("http://{addr}/")).with_extension(unkeyed())).await;
    assert!(err.is_connect());
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(recorder.sent().len(), 3);
    assert_eq!(report.idempotency_key(), None);
}

#[tokio::test]
async fn a_keyed_post_is_retried_after_a_reset() {
    let (_, report, received) = send_to(Fault::Reset, Method::POST, RequestOptions::new()).await;
    assert!(report.idempotency_key().is_some());
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(received, 3);
}

#[tokio::test]
async fn idempotent_methods_are_retried_without_a_key() {
    let (_, report, received) = send_to(Fault::Reset, Method::PUT, RequestOptions::new()).await;
    assert_eq!(report.idempotency_key(), None);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(received, 3);
}

#[tokio::test]
async fn with_no_replay_buffer_a_streaming_body_is_sent_once_and_the_report_says_why() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).body_replay_limit(0).build().unwrap());
    let chunks: Vec<Result<&'static [u8], std::io::Error>> =
        vec![Ok(b"part one, "), Ok(b"part two")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let response = c.put(server.uri()).body(body).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotCloneable);
    assert_eq!(report.attempts(), 1);
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, b"part one, part two");
}

#[tokio::test]
async fn the_streaming_body_guard_stops_before_any_backoff_or_admission() {
    // The safety rule itself stops a stream, before the engine decides on a
    // retry: no delay is drawn, nothing sleeps, nothing is admitted.
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock).body_replay_limit(0).build().unwrap();
    let (c, _) = client(p.clone());
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![Ok(b"stream")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let response = c.post(server.uri()).body(body).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotCloneable);
    assert!(report.delays().is_empty());
    assert!(clock.sleeps().is_empty());
    let m = p.metrics().snapshot();
    assert_eq!((m.retries, m.admissions, m.waits), (0, 0, 0));
}
