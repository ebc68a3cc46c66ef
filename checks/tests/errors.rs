//! Drop-in errors: a transport error comes back as reqwest made it, so the
//! caller's existing error handling keeps working, and the report is still
//! reachable through a slot.

mod support;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{ReportSlot, RequestOptions, RetryError, RetryReportExt, StopReason};
use support::{client, faulty_server, ms, policy, refused_addr, Fault};

/// What a caller's error handling looks at.
fn predicates(err: &reqwest_middleware::Error) -> (bool, bool, Option<u16>, Option<String>) {
    (
        err.is_timeout(),
        err.is_connect(),
        err.status().map(|s| s.as_u16()),
        err.url().map(|u| u.to_string()),
    )
}

/// The same request through a plain reqwest client (no middleware).
async fn plain(url: &str) -> reqwest_middleware::Error {
    let c = reqwest::Client::builder().timeout(ms(100)).build().unwrap();
    reqwest_middleware::Error::Reqwest(c.get(url).send().await.unwrap_err())
}

#[tokio::test]
async fn a_transport_error_answers_every_predicate_as_without_the_middleware() {
    let (hang, _) = faulty_server(Fault::Hang).await;
    let refused = refused_addr().await;
    for (url, kind) in [
        (format!("http://{hang}/orders"), "timeout"),
        (format!("http://{refused}/orders"), "connect"),
    ] {
        let clock = ManualClock::new();
        let (c, _) = client(policy(&clock).attempt_timeout(ms(100)).build().unwrap());
        let (err, report) = support::send_failing(c.get(&url)).await;
        assert!(
            matches!(err, reqwest_middleware::Error::Reqwest(_)),
            "{kind}: the original variant, not a wrapper: {err:?}"
        );
        let want = predicates(&plain(&url).await);
        assert_eq!(predicates(&err), want, "{kind}");
        assert!(
            want.0 || want.1,
            "{kind}: the case is a timeout or a connect error"
        );
        assert_eq!(want.3.as_deref(), Some(url.as_str()));
        // The report is still reachable.
        assert_eq!(report.attempts(), 3, "{kind}");
        assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
        assert_eq!(report.delays().len(), 2);
    }
}

#[tokio::test]
async fn the_slot_and_the_extension_trait_report_a_success_too() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let slot = ReportSlot::new();
    let response = c
        .post(server.uri())
        .with_extension(slot.clone())
        .send()
        .await
        .unwrap();
    let report = response.retry_report().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(slot.get().as_ref(), Some(report));
    // Without a slot nothing is kept anywhere: the response carries it.
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(response.retry_report().unwrap().attempts(), 1);
}

#[tokio::test]
async fn a_refused_key_is_still_a_retry_error_and_fills_the_slot() {
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).build().unwrap());
    let (err, report) = support::send_failing(
        c.post("http://127.0.0.1:9/")
            .header("Idempotency-Key", "two words"),
    )
    .await;
    let e = RetryError::from_middleware(&err).expect("nothing was sent: our error");
    assert_eq!(e.report().attempts(), 0);
    assert_eq!(report.attempts(), 0);
    assert!(recorder.sent().is_empty());
}

#[tokio::test]
async fn the_report_serializes_with_milliseconds_and_the_elapsed_time() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .backoff(ms(100), ms(100))
            .jitter(reqwest_safe_retry::Jitter::None)
            .build()
            .unwrap(),
    );
    let response = c
        .post(server.uri())
        .with_extension(
            RequestOptions::new()
                .idempotency_key(reqwest_safe_retry::IdempotencyKey::new("order-7").unwrap()),
        )
        .send()
        .await
        .unwrap();
    let report = response.retry_report().unwrap();
    assert_eq!(report.elapsed(), ms(200));
    let json = serde_json::to_value(report).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "attempts": 3,
            "delays_ms": [100.0, 100.0],
            "admission_wait_ms": 0.0,
            "rate_limit_wait_ms": 0.0,
            "elapsed_ms": 200.0,
            "idempotency_key": "order-7",
            "stop_reason": "attempts_exhausted",
            "retry_after_honoured": 0,
        })
    );
}
