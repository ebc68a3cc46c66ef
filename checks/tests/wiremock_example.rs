use std::time::Duration;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport, StopReason};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn a_payment_survives_two_503s_with_one_key() {
    // The server fails twice, asking for 2 s each time, then succeeds.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/payments"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "2"))
        .up_to_n_times(2)
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/payments"))
        .respond_with(ResponseTemplate::new(201).set_body_string("paid"))
        .expect(1)
        .mount(&server)
        .await;

    // A manual clock: sleeps return at once, move the clock and are
    // recorded. A seed makes every jittered delay reproducible.
    let clock = ManualClock::new();
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(42)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();

    let response = client
        .post(format!("{}/payments", server.uri()))
        .body(r#"{"amount":1200}"#)
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::Success);
    // Retry-After is a floor, with jitter on top (20 % of it, at most 2 s).
    assert_eq!(report.delays(), clock.sleeps());
    assert_eq!(report.retry_after_honoured(), 2);
    for delay in report.delays() {
        assert!(*delay >= Duration::from_secs(2) && *delay <= Duration::from_millis(2400));
    }
    // One key on every attempt: the server can tell a retry from a new
    // payment.
    let key = report.idempotency_key().unwrap();
    let received = server.received_requests().await.unwrap();
    let keys: Vec<_> = received
        .iter()
        .map(|r| r.headers["idempotency-key"].to_str().unwrap())
        .collect();
    assert_eq!(keys, [key, key, key]);
}
