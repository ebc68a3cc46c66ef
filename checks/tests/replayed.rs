//! The client agrees with the server: a response marked
//! `Idempotent-Replayed: true` is the stored outcome of the original
//! operation, final, never retried.

mod support;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryReport, StopReason};
use support::{answering_with, client, policy};
use wiremock::ResponseTemplate;

/// Sends one POST (keyed by default) to a server answering `template`;
/// returns the report and how many requests the server saw.
async fn post_to(template: ResponseTemplate) -> (RetryReport, usize) {
    let server = answering_with(template).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).max_attempts(4).build().unwrap());
    let response = c.post(server.uri()).body("{}").send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (report, server.received_requests().await.unwrap().len())
}

fn replayed(status: u16) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("idempotent-replayed", "true")
        .insert_header("retry-after", "0")
}

#[tokio::test]
async fn a_replayed_failure_stops_at_once_as_permanent() {
    for status in [409, 408, 425, 429, 500, 502, 503, 504] {
        let (report, requests) = post_to(replayed(status)).await;
        assert_eq!(report.attempts(), 1, "{status}");
        assert_eq!(requests, 1, "{status}");
        assert_eq!(report.stop_reason(), StopReason::Permanent, "{status}");
        assert!(report.delays().is_empty(), "{status}");
    }
}

#[tokio::test]
async fn the_same_statuses_without_the_marker_are_retried() {
    // The control: without the marker these are "in progress" or transient.
    for status in [409, 408, 503] {
        let (report, requests) =
            post_to(ResponseTemplate::new(status).insert_header("retry-after", "0")).await;
        assert_eq!(report.attempts(), 4, "{status}");
        assert_eq!(requests, 4, "{status}");
        assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    }
}

#[tokio::test]
async fn a_stored_verdict_header_does_not_make_a_replay_retryable() {
    let (report, requests) =
        post_to(replayed(503).insert_header("stripe-should-retry", "true")).await;
    assert_eq!((report.attempts(), requests), (1, 1));
    assert_eq!(report.stop_reason(), StopReason::Permanent);
}

#[tokio::test]
async fn a_replayed_success_is_a_success() {
    let (report, requests) = post_to(replayed(201)).await;
    assert_eq!((report.attempts(), requests), (1, 1));
    assert_eq!(report.stop_reason(), StopReason::Success);
}
