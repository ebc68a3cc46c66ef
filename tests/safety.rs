//! The safety rule: what may be retried at all.

mod support;

use std::sync::atomic::Ordering;

use reqwest_safe_retry::{ManualClock, RequestOptions, RetryError, RetryReport, StopReason};
use support::{client, faulty_server, policy, refused_addr, Fault};

fn unkeyed() -> RequestOptions {
    RequestOptions::new().no_idempotency_key()
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
    let (addr, count) = faulty_server(Fault::Reset).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let err = c
        .post(format!("http://{addr}/"))
        .with_extension(unkeyed())
        .body("charge")
        .send()
        .await
        .unwrap_err();
    let e = RetryError::from_middleware(&err).unwrap();
    assert_eq!(e.report().stop_reason(), StopReason::NotIdempotent);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unkeyed_patch_is_not_retried_after_a_timeout() {
    let (addr, count) = faulty_server(Fault::Hang).await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .attempt_timeout(support::ms(100))
            .build()
            .unwrap(),
    );
    let err = c
        .patch(format!("http://{addr}/"))
        .with_extension(unkeyed())
        .send()
        .await
        .unwrap_err();
    let e = RetryError::from_middleware(&err).unwrap();
    assert!(e.is_timeout());
    assert_eq!(e.report().stop_reason(), StopReason::NotIdempotent);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unkeyed_post_is_retried_after_a_refused_connection() {
    let addr = refused_addr().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).build().unwrap());
    let err = c
        .post(format!("http://{addr}/"))
        .with_extension(unkeyed())
        .send()
        .await
        .unwrap_err();
    let e = RetryError::from_middleware(&err).unwrap();
    assert_eq!(e.report().stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(recorder.sent().len(), 3);
    assert_eq!(e.report().idempotency_key(), None);
}

#[tokio::test]
async fn a_keyed_post_is_retried_after_a_reset() {
    let (addr, count) = faulty_server(Fault::Reset).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let err = c
        .post(format!("http://{addr}/"))
        .body("charge")
        .send()
        .await
        .unwrap_err();
    let e = RetryError::from_middleware(&err).unwrap();
    assert_eq!(e.report().stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn idempotent_methods_are_retried_without_a_key() {
    let (addr, count) = faulty_server(Fault::Reset).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let err = c
        .put(format!("http://{addr}/"))
        .body("state")
        .send()
        .await
        .unwrap_err();
    let e = RetryError::from_middleware(&err).unwrap();
    assert_eq!(e.report().stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_streaming_body_is_sent_once_and_the_report_says_why() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
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
