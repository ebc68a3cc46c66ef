//! Counters a service can scrape.

mod support;

use reqwest_safe_retry::time::ManualClock;
use support::{client, policy};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn counters_follow_what_happened() {
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::path("/flaky"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::path("/flaky"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::path("/down"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::path("/ok"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let p = policy(&clock).build().unwrap();
    let (c, _) = client(p.clone());
    c.get(format!("{}/ok", server.uri())).send().await.unwrap();
    c.get(format!("{}/flaky", server.uri()))
        .send()
        .await
        .unwrap();
    c.get(format!("{}/down", server.uri()))
        .send()
        .await
        .unwrap();
    let m = p.metrics().snapshot();
    assert_eq!(m.calls, 3);
    // The 503 with Retry-After is a throttling answer, counted apart.
    assert_eq!(m.first_attempt_failures, 1);
    assert_eq!(m.throttled, 1);
    assert_eq!(m.retries, 3);
    assert_eq!(m.final_failures, 1);
    assert_eq!(m.retry_after_honoured, 1);
    assert_eq!(m.budget_rejections, 0);
    assert_eq!(m.deadline_give_ups, 0);
    // One call with 1 attempt, one with 2, one with 3.
    assert_eq!(&m.attempts_per_call[..4], &[1, 1, 1, 0]);
}
