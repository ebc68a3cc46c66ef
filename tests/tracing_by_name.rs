//! A subscriber that listens to the operation's span by its name alone
//! still gets it, with its fields: the middleware decides whether to build
//! the span by asking whether tracing is in use at all, not with a probe
//! callsite of its own (which a filter by span name would turn down).
//!
//! Alone in its own binary: tracing caches per-callsite interest
//! process-wide.

use std::sync::{Arc, Mutex};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Answers 200 without a socket.
struct Canned;

#[async_trait::async_trait]
impl Middleware for Canned {
    async fn handle(
        &self,
        _: Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        Ok(Response::from(http::Response::new("ok")))
    }
}

/// Fields as (name, value) pairs.
type Fields = Vec<(String, String)>;

/// Every span's id, name and fields as they were at the end.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(u64, String, Fields)>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        let name = attrs.metadata().name().to_owned();
        self.0.lock().unwrap().push((id.into_u64(), name, fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, _, fields)) = spans.iter_mut().find(|(i, _, _)| *i == id.into_u64()) {
            values.record(&mut Collect(fields));
        }
    }
}

#[tokio::test]
async fn a_filter_by_span_name_gets_the_span_and_its_fields() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(
        spans
            .clone()
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

    let spans = spans.0.lock().unwrap();
    assert_eq!(spans.len(), 1, "one span: the operation's");
    let (_, name, fields) = &spans[0];
    assert_eq!(name, "retry");
    let field = |name: &str| {
        fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
    };
    assert_eq!(field("http.request.method"), "POST");
    assert_eq!(field("url.path"), "/pay");
    assert_eq!(field("idempotency_key").len(), 36);
    assert_eq!(field("http.request.resend_count"), "0");
    assert_eq!(field("stop_reason"), "success");
}
