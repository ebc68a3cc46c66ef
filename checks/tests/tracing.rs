//! Tracing: a span per logical operation, an event per attempt.
//!
//! One test function alone in its own binary: tracing caches per-callsite
//! interest process-wide, so a test without a subscriber running on another
//! thread could hide these events.

mod support;

use reqwest_safe_retry::retry::{retry, Outcome};
use reqwest_safe_retry::time::ManualClock;
use support::spans::{field, Fields, Seen};
use support::{client, policy};
use tracing_subscriber::layer::SubscriberExt;

fn attempt_events(seen: &Seen) -> Vec<Fields> {
    let events = std::mem::take(&mut *seen.events.lock().unwrap());
    events
        .into_iter()
        .filter(|e| field(e, "message") == "attempt finished")
        .collect()
}

fn last_retry_span(seen: &Seen) -> Fields {
    let spans = seen.spans.lock().unwrap();
    let (_, _, fields) = spans.iter().rev().find(|(_, n, _)| n == "retry").unwrap();
    fields.clone()
}

#[tokio::test]
async fn a_span_per_operation_and_an_event_per_attempt() {
    let seen = Seen::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));

    // Through the middleware: three 503s.
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    c.get(format!("{}/orders?token=secret", server.uri()))
        .send()
        .await
        .unwrap();
    let attempts = attempt_events(&seen);
    assert_eq!(attempts.len(), 3);
    for (i, e) in attempts.iter().enumerate() {
        assert_eq!(field(e, "attempt"), (i + 1).to_string());
        assert_eq!(field(e, "http.request.resend_count"), i.to_string());
        assert_eq!(field(e, "outcome"), "503");
        assert_eq!(field(e, "class"), "transient");
    }
    assert_ne!(field(&attempts[0], "delay_ms"), "0");
    assert_eq!(field(&attempts[2], "stop_reason"), "attempts_exhausted");
    let span = last_retry_span(&seen);
    assert_eq!(field(&span, "http.request.method"), "GET");
    assert_eq!(field(&span, "url.path"), "/orders");
    // The attributes the published metrics are labelled with, by the
    // same OpenTelemetry names.
    assert_eq!(field(&span, "server.address"), "127.0.0.1");
    let port = server.address().port().to_string();
    assert_eq!(field(&span, "server.port"), port);
    assert_eq!(field(&span, "http.request.resend_count"), "2");
    assert_eq!(field(&span, "stop_reason"), "attempts_exhausted");
    assert!(
        !format!("{span:?}").contains("secret"),
        "the query string is not logged"
    );

    // A transport error names its kind.
    let addr = support::refused_addr().await;
    c.get(format!("http://{addr}/")).send().await.unwrap_err();
    let attempts = attempt_events(&seen);
    assert_eq!(field(&attempts[0], "outcome"), "connect");

    // The generic engine traces the same way.
    let p = policy(&clock).build().unwrap();
    retry(&p, |ctx| async move {
        if ctx.attempt() < 2 {
            Outcome::transient(())
        } else {
            Outcome::success(())
        }
    })
    .await;
    let attempts = attempt_events(&seen);
    assert_eq!(attempts.len(), 2);
    assert_eq!(field(&attempts[1], "class"), "success");
    let span = last_retry_span(&seen);
    assert_eq!(field(&span, "http.request.resend_count"), "1");
    assert_eq!(field(&span, "stop_reason"), "success");
}
