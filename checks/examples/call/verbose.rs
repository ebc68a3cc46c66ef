//! `-v` and `--retry-trace`: what each attempt sent and received, as
//! curl's `-v` prints it (`>` request, `<` response, `*` information),
//! and one line per attempt from the middleware's own `tracing` events (an
//! event per attempt inside a span per logical operation).

use std::fmt::{self, Write as _};

use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Prints one line per attempt on stderr, each starting with `prefix`.
pub(super) fn install(prefix: &'static str) {
    let subscriber = tracing_subscriber::registry().with(Attempts(prefix));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The per-attempt lines, with their prefix.
struct Attempts(&'static str);

/// The key of a logical operation, kept on its span.
struct Key(String);

#[derive(Default)]
struct Fields {
    attempt: u64,
    outcome: String,
    delay_ms: u64,
    stop_reason: String,
    key: String,
    message: String,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "attempt" => self.attempt = value,
            "delay_ms" => self.delay_ms = value,
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "stop_reason" => self.stop_reason = value.to_owned(),
            "idempotency_key" => self.key = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let target = match field.name() {
            "outcome" => &mut self.outcome,
            "message" => &mut self.message,
            _ => return,
        };
        let _ = write!(target, "{value:?}");
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Attempts {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (false, Some(span)) = (fields.key.is_empty(), ctx.span(id)) {
            span.extensions_mut().insert(Key(fields.key));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message != "attempt finished" {
            return;
        }
        let key = ctx
            .event_scope(event)
            .and_then(|scope| {
                scope
                    .into_iter()
                    .find_map(|span| span.extensions().get::<Key>().map(|k| k.0.clone()))
            })
            .unwrap_or_else(|| "none".to_owned());
        let outcome = if fields.outcome.bytes().all(|b| b.is_ascii_digit()) {
            fields.outcome
        } else {
            format!("{} error", fields.outcome)
        };
        let next = if fields.stop_reason.is_empty() {
            format!("retry in {} ms", fields.delay_ms)
        } else {
            format!("stop: {}", fields.stop_reason)
        };
        eprintln!(
            "{}attempt {}: {outcome}, {next}, key {key}",
            self.0, fields.attempt
        );
    }
}

/// `-v`'s middleware, below the retries: each attempt's request and
/// response headers on stderr, as curl prints them.
pub(super) struct Headers;

#[async_trait::async_trait]
impl Middleware for Headers {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        eprint!("{}", request_head(&request));
        let result = next.run(request, extensions).await;
        match &result {
            Ok(response) => eprint!("{}", response_head(response)),
            Err(e) => eprintln!("* {}", super::errors::chain(e)),
        }
        result
    }
}

/// `> GET /path HTTP/1.1`, `> Host: …`, a line per header, `>`.
fn request_head(request: &Request) -> String {
    let url = request.url();
    let mut target = url.path().to_owned();
    if let Some(query) = url.query() {
        target = format!("{target}?{query}");
    }
    let mut out = format!("> {} {target} {:?}\n", request.method(), request.version());
    let host = url.host_str().unwrap_or_default();
    let _ = match url.port() {
        Some(port) => writeln!(out, "> Host: {host}:{port}"),
        None => writeln!(out, "> Host: {host}"),
    };
    for (name, value) in request.headers() {
        let _ = writeln!(
            out,
            "> {name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        );
    }
    out.push_str(">\n");
    out
}

/// `< HTTP/1.1 200 OK`, a line per header, `<`.
fn response_head(response: &Response) -> String {
    let status = response.status();
    let reason = status.canonical_reason().unwrap_or_default();
    let mut out = format!("< {:?} {} {reason}\n", response.version(), status.as_str());
    for (name, value) in response.headers() {
        let _ = writeln!(
            out,
            "< {name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        );
    }
    out.push_str("<\n");
    out
}
