//! A subscriber that listens to the operation's span by its name alone
//! still gets it, with its fields: the middleware decides whether to build
//! the span by asking whether tracing is in use at all, not with a probe
//! callsite of its own (which a filter by span name would turn down).
//!
//! Alone in its own binary: tracing caches per-callsite interest
//! process-wide.

mod support;

use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use support::canned::Canned;
use support::spans::{field, Seen};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

#[tokio::test]
async fn a_filter_by_span_name_gets_the_span_and_its_fields() {
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(
        seen.clone()
            .with_filter(filter_fn(|meta| meta.name() == "retry")),
    );
    let _guard = tracing::subscriber::set_default(subscriber);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(RetryPolicy::default()))
        .with(Canned)
        .build();
    let response = client
        .post("http://canned.invalid/pay")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let spans = seen.spans.lock().unwrap();
    assert_eq!(spans.len(), 1, "one span: the operation's");
    let (_, name, fields) = &spans[0];
    assert_eq!(name, "retry");
    let field = |name: &str| field(fields, name);
    assert_eq!(field("http.request.method"), "POST");
    assert_eq!(field("url.path"), "/pay");
    assert_eq!(field("idempotency_key").len(), 36);
    assert_eq!(field("http.request.resend_count"), "0");
    assert_eq!(field("stop_reason"), "success");
}
