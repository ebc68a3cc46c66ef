//! Tracing: a span per logical operation, an event per attempt.
//!
//! Alone in its own test binary: tracing caches per-callsite interest
//! process-wide, so a test without a subscriber running on another thread
//! could hide these events.

mod support;

use std::sync::{Arc, Mutex};

use reqwest_safe_retry::{ManualClock, RetryReport};
use support::{client, policy};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<EventFields>>>);

/// One event's fields, as (name, value) pairs.
type EventFields = Vec<(String, String)>;

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

#[tokio::test]
async fn one_event_per_attempt_with_the_resend_count() {
    let events = Events::default();
    let subscriber = tracing_subscriber::registry().with(events.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(
        response
            .extensions()
            .get::<RetryReport>()
            .unwrap()
            .attempts(),
        3
    );

    let events = events.0.lock().unwrap().clone();
    let attempts: Vec<_> = events
        .iter()
        .filter(|e| {
            e.iter()
                .any(|(k, v)| k == "message" && v == "attempt finished")
        })
        .collect();
    assert_eq!(attempts.len(), 3);
    let field = |e: &EventFields, name: &str| {
        e.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    for (i, e) in attempts.iter().enumerate() {
        assert_eq!(field(e, "http.request.resend_count"), i.to_string());
        assert_eq!(field(e, "outcome"), "503");
        assert_eq!(field(e, "class"), "transient");
    }
    assert_eq!(field(attempts[2], "stop_reason"), "attempts_exhausted");
    assert_ne!(field(attempts[0], "delay_ms"), "0");
}
