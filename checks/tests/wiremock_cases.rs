use std::time::Duration;

use reqwest_middleware::ClientWithMiddleware;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{
    RequestOptions, RetryMiddleware, RetryPolicy, RetryReportExt, StopReason,
};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A client whose sleeps return at once and are recorded on `clock`.
fn client(clock: &ManualClock) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .manual_clock(clock)
        .seed(42)
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

/// `status` with `headers` the first time, then 200.
async fn once_then_ok(status: u16, headers: &[(&str, &str)]) -> MockServer {
    let server = MockServer::start().await;
    let mut first = ResponseTemplate::new(status);
    for (name, value) in headers {
        first = first.insert_header(*name, *value);
    }
    Mock::given(method("GET"))
        .respond_with(first)
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn a_retry_after_date_is_measured_against_the_servers_own_date() {
    // Three seconds after the response's `Date`, whatever this machine's
    // clock says: the server's clock against the server's clock.
    let server = once_then_ok(
        503,
        &[
            ("Date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("Retry-After", "Sun, 06 Nov 1994 08:49:40 GMT"),
        ],
    )
    .await;
    let clock = ManualClock::new();
    let response = client(&clock).get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let report = response.retry_report().unwrap();
    assert_eq!(report.retry_after_honoured(), 1);
    // A floor, with up to 20 % jitter on top.
    let slept = clock.sleeps()[0];
    assert!(slept >= Duration::from_secs(3) && slept <= Duration::from_millis(3_600));
}

#[tokio::test]
async fn a_429_then_success_waits_its_retry_after() {
    let server = once_then_ok(429, &[("Retry-After", "1")]).await;
    let clock = ManualClock::new();
    let response = client(&clock).get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let report = response.retry_report().unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert!(clock.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn a_hint_longer_than_the_deadline_ends_the_call_at_once() {
    // The server asks for 10 s; the caller gave the call 2 s. Sleeping
    // 10 s would end past the deadline, so the call ends now, with the
    // server's answer, and the report says why.
    let server = once_then_ok(503, &[("Retry-After", "10")]).await;
    let clock = ManualClock::new();
    let response = client(&clock)
        .get(server.uri())
        .with_extension(RequestOptions::new().deadline(Duration::from_secs(2)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let report = response.retry_report().unwrap();
    assert_eq!(report.stop_reason(), StopReason::RetryAfterTooLong);
    assert_eq!(report.attempts(), 1);
    assert!(clock.sleeps().is_empty(), "nothing slept");
    // The report's one line, for a log or a failing test's message:
    // "1 attempt in …, stopped: retry_after_too_long".
    let line = report.to_string();
    assert!(line.starts_with("1 attempt in "), "{line}");
    assert!(line.ends_with("stopped: retry_after_too_long"), "{line}");
}
