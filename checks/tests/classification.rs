//! Every classification row of the contract, for statuses and transport
//! errors.

mod support;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{Class, HttpAttempt, RequestOptions, RetryReport, StopReason};
use support::{client, faulty_server, ms, policy, refused_addr, Fault};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn get_report(status: u16) -> (u16, RetryReport, usize) {
    let server = support::answering(status).await;
    let clock = ManualClock::new();
    let (client, _) = client(policy(&clock).max_attempts(3).build().unwrap());
    let response = client.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    let received = server.received_requests().await.unwrap().len();
    (response.status().as_u16(), report, received)
}

#[tokio::test]
async fn success_statuses_pass_through_untouched() {
    for status in [200, 201, 204, 302, 304] {
        let (got, report, received) = get_report(status).await;
        assert_eq!(got, status);
        assert_eq!(received, 1, "{status}");
        assert_eq!(report.attempts(), 1);
        assert_eq!(report.stop_reason(), StopReason::Success);
    }
}

#[tokio::test]
async fn transient_statuses_are_retried_until_attempts_run_out() {
    for status in [408, 425, 429, 500, 502, 503, 504] {
        let (got, report, received) = get_report(status).await;
        assert_eq!(got, status, "the caller gets the last response unchanged");
        assert_eq!(received, 3, "{status} is transient");
        assert_eq!(report.attempts(), 3);
        assert_eq!(report.delays().len(), 2);
        assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    }
}

#[tokio::test]
async fn permanent_statuses_fail_at_once() {
    for status in [400, 401, 403, 404, 409, 413, 422, 501, 505, 507] {
        let (got, report, received) = get_report(status).await;
        assert_eq!(got, status);
        assert_eq!(received, 1, "{status} is permanent");
        assert_eq!(report.stop_reason(), StopReason::Permanent);
        assert!(report.delays().is_empty());
    }
}

#[tokio::test]
async fn payload_too_large_with_retry_after_is_temporary() {
    // RFC 9110 §15.5.14: the server says when to come back.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(413).insert_header("Retry-After", "2"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let (client, _) = client(policy(&clock).build().unwrap());
    let response = client.post(server.uri()).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 201);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 2);
    assert!(
        report.delays()[0] >= std::time::Duration::from_secs(2),
        "the hint is a floor"
    );
    let keys: Vec<_> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.headers["idempotency-key"].clone())
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same key on the retry");

    // An unreadable hint is no hint: permanent.
    let server =
        support::answering_with(ResponseTemplate::new(413).insert_header("Retry-After", "later"))
            .await;
    let response = client.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Permanent);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn conflict_on_a_keyed_request_means_in_progress() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(409))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let (client, _) = client(policy(&clock).build().unwrap());
    let response = client.post(server.uri()).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 201);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 2);
    assert!(report.idempotency_key().is_some());
}

#[tokio::test]
async fn server_verdict_wins_over_the_table() {
    // 503 is transient by the table, but the server says no.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503).insert_header("Stripe-Should-Retry", "false"))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let response = c.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);

    // 400 is permanent by the table, but the server says yes.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(400).insert_header("Stripe-Should-Retry", "true"))
        .mount(&server)
        .await;
    let response = c.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn a_verdict_header_on_a_success_is_not_read() {
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    for (status, verdict) in [(200, "false"), (201, "true")] {
        let server = support::answering_with(
            ResponseTemplate::new(status).insert_header("Stripe-Should-Retry", verdict),
        )
        .await;
        let response = c.post(server.uri()).body("{}").send().await.unwrap();
        let report = response.extensions().get::<RetryReport>().unwrap();
        assert_eq!(report.stop_reason(), StopReason::Success, "{status}");
        assert_eq!(server.received_requests().await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn the_verdict_header_name_is_configurable() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503).insert_header("X-Should-Retry", "false"))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .server_verdict_header("x-should-retry")
            .build()
            .unwrap(),
    );
    let response = c.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
}

#[tokio::test]
async fn a_client_classifier_extends_the_table() {
    let server = support::answering(404).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .classifier(|a: &HttpAttempt<'_>| match a.status() {
            Some(s) if s == 404 => Some(Class::Transient),
            _ => None,
        })
        .build()
        .unwrap();
    let (c, _) = client(p);
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);

    // The table still decides what the classifier has no opinion on.
    let other = support::answering(400).await;
    c.get(other.uri()).send().await.unwrap();
    assert_eq!(other.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_request_classifier_wins_over_the_client_one() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .classifier(|_: &HttpAttempt<'_>| Some(Class::Transient))
        .build()
        .unwrap();
    let (c, _) = client(p);
    let response = c
        .get(server.uri())
        .with_extension(
            RequestOptions::new().classifier(|_: &HttpAttempt<'_>| Some(Class::Permanent)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Permanent);
}

/// Sends a GET to `url` with a 200 ms attempt timeout; returns the report,
/// whether the last error was a timeout, and whether it was a connect error.
async fn failed_get(url: String) -> (RetryReport, bool, bool) {
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).attempt_timeout(ms(200)).build().unwrap());
    let (err, report) = support::send_failing(c.get(url)).await;
    // The transport error comes back as reqwest made it.
    assert!(
        matches!(err, reqwest_middleware::Error::Reqwest(_)),
        "{err:?}"
    );
    (report, err.is_timeout(), err.is_connect())
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    let addr = refused_addr().await;
    let (report, timeout, connect) = failed_get(format!("http://{addr}/")).await;
    assert!(connect && !timeout);
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
}

#[tokio::test]
async fn a_reset_after_the_request_was_sent_is_transient() {
    let (addr, count) = faulty_server(Fault::Reset).await;
    let (report, _, connect) = failed_get(format!("http://{addr}/")).await;
    assert!(!connect);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_connection_closed_before_any_response_is_transient() {
    let (addr, count) = faulty_server(Fault::Close).await;
    let (report, _, _) = failed_get(format!("http://{addr}/")).await;
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_response_cut_short_is_transient() {
    let (addr, count) = faulty_server(Fault::CutShort).await;
    let (report, _, _) = failed_get(format!("http://{addr}/")).await;
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_per_attempt_timeout_is_transient() {
    let (addr, count) = faulty_server(Fault::Hang).await;
    let (report, timeout, _) = failed_get(format!("http://{addr}/")).await;
    assert!(timeout);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_redirect_policy_error_is_permanent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(302).insert_header("Location", "/elsewhere"))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::custom(|a| {
            a.error("redirects are refused")
        }))
        .build()
        .unwrap();
    let (c, _) = support::client_with(no_redirects, policy(&clock).build().unwrap());
    let (err, report) = support::send_failing(c.get(server.uri())).await;
    assert!(err.is_redirect(), "{err:?}");
    assert_eq!(report.stop_reason(), StopReason::Permanent);
    assert_eq!(report.attempts(), 1);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}
