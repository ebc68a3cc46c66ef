//! The reqwest-middleware adapter onto the engine: one HTTP attempt, which
//! the engine's loop drives.
//!
//! ```no_run
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReportExt};
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! let response = client.post("http://payments.internal/payments").send().await?;
//! let report = response.retry_report().unwrap();
//! println!("{} attempts, key {:?}", report.attempts(), report.idempotency_key());
//! # Ok(()) }
//! ```

use std::fmt;

use http::{Extensions, HeaderValue};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::admission::RetryKind;
use crate::classify::{self, server_verdict, Class, Classifier, DefaultClassifier, HttpAttempt};
use crate::engine::{shorter, Attempt, AttemptContext, Limits, Outcome, Run, Verdict};
use crate::error::{KeyError, RetryError};
use crate::idempotency::IdempotencyKey;
use crate::options::{KeyChoice, RequestOptions};
use crate::policy::RetryPolicy;
use crate::report::{ReportSlot, RetryReport, StopReason};
use crate::retry_after;
use crate::safety::{self, Judgement};

/// Retries requests as the [`RetryPolicy`] says. Add it to a
/// `reqwest_middleware::ClientBuilder`; clones of the client share it, its
/// retry admission and its counters.
#[derive(Debug, Clone)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
}

impl RetryMiddleware {
    /// A middleware using `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryMiddleware { policy }
    }

    /// The policy, for its admission and counters.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let options = extensions
            .get::<RequestOptions>()
            .cloned()
            .unwrap_or_default();
        let key = match self.attach_key(&mut request, &options) {
            Ok(key) => key,
            Err(e) => {
                let mut report = RetryReport::new();
                report.stop_reason = StopReason::Permanent;
                if let Some(slot) = extensions.get::<ReportSlot>() {
                    slot.fill(report.clone());
                }
                return Err(refused(report, e));
            }
        };
        let span = tracing::info_span!(
            "retry",
            http.request.method = %request.method(),
            server.address = request.url().host_str().unwrap_or_default(),
            url.path = request.url().path(),
            idempotency_key = key.as_ref().map(IdempotencyKey::as_str),
            http.request.resend_count = tracing::field::Empty,
            stop_reason = tracing::field::Empty,
        );
        let policy = &self.policy;
        let limits = Limits {
            max_attempts: options.max_attempts.unwrap_or(policy.settings.max_attempts),
            deadline: options.deadline.or(policy.settings.deadline),
            attempt_timeout: options.attempt_timeout.or(policy.settings.attempt_timeout),
        };
        let mut attempts = HttpAttempts {
            policy,
            options: &options,
            keyed: key.is_some(),
            max_attempts: limits.max_attempts,
            caller_timeout: request.timeout().copied(),
            request: Some(request),
            extensions,
            next,
        };
        async move {
            let mut run = Run::start(policy, limits);
            run.report.idempotency_key = key.as_ref().map(|k| k.as_str().to_owned());
            let (result, report) = run.drive(&mut attempts).await;
            if let Some(slot) = attempts.extensions.get::<ReportSlot>() {
                slot.fill(report.clone());
            }
            // A transport error goes back as it came, so the caller's
            // `is_timeout()`, `is_connect()`, `status()` and `url()` keep
            // working; the report is in the slot.
            result.map(|mut response| {
                response.extensions_mut().insert(report);
                response
            })
        }
        .instrument(span)
        .await
    }
}

impl RetryMiddleware {
    /// Keeps a caller's key, or attaches one as the options and policy say.
    fn attach_key(
        &self,
        request: &mut Request,
        options: &RequestOptions,
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        let settings = &self.policy.settings;
        if let Some(existing) = request.headers().get(&settings.key_header) {
            // A key the caller already set is kept, never overwritten.
            return IdempotencyKey::from_header(existing).map(Some);
        }
        let key = match &options.key {
            KeyChoice::Skip => return Ok(None),
            KeyChoice::Use(key) => key.clone(),
            KeyChoice::Auto if settings.key_methods.contains(request.method()) => {
                IdempotencyKey::generate(settings.key_generator)
            }
            KeyChoice::Auto => return Ok(None),
        };
        let value = key.header_value(settings.key_format)?;
        request
            .headers_mut()
            .insert(settings.key_header.clone(), value);
        Ok(Some(key))
    }
}

/// One logical HTTP operation: the request for the next attempt and what
/// each attempt needs.
struct HttpAttempts<'a> {
    policy: &'a RetryPolicy,
    options: &'a RequestOptions,
    keyed: bool,
    max_attempts: u32,
    caller_timeout: Option<std::time::Duration>,
    /// The request the next attempt sends; `None` once a body that cannot
    /// be copied has been sent.
    request: Option<Request>,
    extensions: &'a mut Extensions,
    next: Next<'a>,
}

/// The error of an attempt that had no request left to send. The safety
/// rule stops a stream after its one attempt, so this is a guard only.
#[derive(Debug)]
struct NothingToResend;

impl fmt::Display for NothingToResend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body cannot be sent twice")
    }
}

impl std::error::Error for NothingToResend {}

impl Attempt for HttpAttempts<'_> {
    type Output = reqwest_middleware::Result<Response>;

    async fn attempt(&mut self, ctx: AttemptContext) -> Outcome<Self::Output> {
        let Some(mut request) = self.request.take() else {
            return Outcome::stop(
                Err(reqwest_middleware::Error::middleware(NothingToResend)),
                StopReason::BodyNotCloneable,
            );
        };
        // A copy for the next attempt; `None` when the body is a stream,
        // which is sent once, or when no attempt can follow this one.
        let last = ctx.attempt() >= self.max_attempts;
        self.request = if last { None } else { request.try_clone() };
        let cloneable = last || self.request.is_some();
        *request.timeout_mut() = shorter(self.caller_timeout, ctx.timeout());
        stamp_headers(self.policy, &mut request, &ctx);
        let method = request.method().clone();
        let result = self.next.clone().run(request, self.extensions).await;
        let verdict = self.verdict(&method, cloneable, &result);
        Outcome::new(result, verdict)
    }

    fn label(&self, value: &Self::Output, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match value {
            Ok(r) => f.write_str(r.status().as_str()),
            Err(e) => f.write_str(classify::transport_failure(e).name()),
        }
    }
}

impl HttpAttempts<'_> {
    /// Classifies one attempt and applies the safety rule.
    fn verdict(
        &self,
        method: &http::Method,
        cloneable: bool,
        result: &reqwest_middleware::Result<Response>,
    ) -> Verdict {
        let policy = self.policy;
        let attempt = HttpAttempt {
            method,
            carried_key: self.keyed,
            result: result.as_ref(),
        };
        let failure = result.as_ref().err().map(classify::transport_failure);
        let user = self
            .options
            .classifier
            .iter()
            .chain(policy.classifiers.iter())
            .find_map(|c| c.classify(&attempt));
        // 1xx–3xx pass through untouched: a verdict header on a success is
        // not read.
        let verdict_header = match (result, &policy.settings.verdict_header) {
            (Ok(r), Some(name)) if r.status().as_u16() >= 400 => server_verdict(r.headers(), name),
            _ => None,
        };
        let class = match (user, verdict_header) {
            (Some(class), _) => class,
            (None, Some(false)) => return Verdict::stop(StopReason::ServerSaidNo),
            (None, Some(true)) => Class::Transient,
            (None, None) => DefaultClassifier
                .classify(&attempt)
                .unwrap_or(Class::Permanent),
        };
        let facts = safety::Attempt {
            method,
            keyed: self.keyed,
            failure,
            cloneable,
        };
        match safety::judge(facts, class) {
            Judgement::Success => Verdict::Success,
            Judgement::Stop { reason, failed } => Verdict::Stop { reason, failed },
            Judgement::Retry => {
                let response = result.as_ref().ok();
                let kind = if failure == Some(classify::TransportFailure::Timeout) {
                    RetryKind::Timeout
                } else if response.is_some_and(|r| r.status().as_u16() == 429) {
                    RetryKind::Throttled
                } else {
                    RetryKind::Transient
                };
                Verdict::Transient {
                    retry_after: response
                        .and_then(|r| retry_after::from_headers(r.headers(), policy.clock.wall())),
                    kind,
                }
            }
        }
    }
}

/// Sends the attempt number and the time left downstream, when asked to.
fn stamp_headers(policy: &RetryPolicy, request: &mut Request, ctx: &AttemptContext) {
    let settings = &policy.settings;
    if let Some(name) = &settings.attempt_header {
        request
            .headers_mut()
            .insert(name.clone(), HeaderValue::from(ctx.attempt()));
    }
    if let (Some(name), Some(left)) = (&settings.deadline_header, ctx.time_left()) {
        let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        request
            .headers_mut()
            .insert(name.clone(), HeaderValue::from(ms));
    }
}

/// The error for a request refused before anything was sent.
fn refused(report: RetryReport, error: KeyError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(anyhow::Error::new(RetryError::new(
        report,
        reqwest_middleware::Error::middleware(error),
    )))
}
