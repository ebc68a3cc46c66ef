//! The reqwest-middleware adapter onto the engine: the attempt loop, nothing
//! else.
//!
//! ```no_run
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport};
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! let response = client.post("http://payments.internal/payments").send().await?;
//! let report = response.extensions().get::<RetryReport>().unwrap();
//! println!("{} attempts, key {:?}", report.attempts(), report.idempotency_key());
//! # Ok(()) }
//! ```

use http::{Extensions, HeaderValue, Method};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::classify::{
    self, server_verdict, AttemptOutcome, Class, Classifier, DefaultClassifier, TransportFailure,
};
use crate::engine::{shorter, trace_attempt, AttemptContext, Limits, Run, Step, Verdict};
use crate::error::{KeyError, RetryError};
use crate::idempotency::{is_idempotent, IdempotencyKey};
use crate::options::{KeyChoice, RequestOptions};
use crate::policy::RetryPolicy;
use crate::report::{RetryReport, StopReason};
use crate::retry_after;

/// Retries requests as the [`RetryPolicy`] says. Add it to a
/// `reqwest_middleware::ClientBuilder`; clones of the client share it, its
/// budget and its counters.
#[derive(Debug, Clone)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
}

impl RetryMiddleware {
    /// A middleware using `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryMiddleware { policy }
    }

    /// The policy, for its budget and counters.
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
        self.attempts(request, key, &options, extensions, next)
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

    async fn attempts(
        &self,
        template: Request,
        key: Option<IdempotencyKey>,
        options: &RequestOptions,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let policy = &self.policy;
        let limits = Limits {
            max_attempts: options.max_attempts.unwrap_or(policy.settings.max_attempts),
            deadline: options.deadline.or(policy.settings.deadline),
            attempt_timeout: options.attempt_timeout.or(policy.settings.attempt_timeout),
        };
        let caller_timeout = template.timeout().copied();
        let mut run = Run::start(policy, limits);
        run.report.idempotency_key = key.as_ref().map(|k| k.as_str().to_owned());
        let repeatable = is_idempotent(template.method()) || key.is_some();
        let mut request = template;
        loop {
            let ctx = run.context();
            // A copy for the next attempt; `None` when the body is a stream,
            // which is sent once, or when no attempt can follow this one.
            let spare = if ctx.attempt() < limits.max_attempts {
                request.try_clone()
            } else {
                None
            };
            *request.timeout_mut() = shorter(caller_timeout, ctx.timeout());
            self.stamp_headers(&mut request, &ctx);
            let method = request.method().clone();

            let result = next.clone().run(request, extensions).await;
            let cloneable = spare.is_some() || ctx.attempt() >= limits.max_attempts;
            let verdict = self.judge(
                &method,
                key.is_some(),
                repeatable,
                cloneable,
                options,
                &result,
            );
            let step = run.decide(verdict);
            trace_attempt(&ctx, &AttemptLabel(&result), verdict, step);
            let reason = match (step, spare) {
                (Step::Retry(delay), Some(spare)) => {
                    run.sleep(delay).await;
                    request = spare;
                    continue;
                }
                // With no copy, `judge` never calls the outcome transient, or
                // the attempts are used up; this arm keeps that promise
                // without a panic.
                (Step::Retry(_), None) => StopReason::BodyNotCloneable,
                (Step::Stop(reason), _) => reason,
            };
            let report = run.finish(reason);
            return match result {
                Ok(mut response) => {
                    response.extensions_mut().insert(report);
                    Ok(response)
                }
                Err(error) => Err(reqwest_middleware::Error::Middleware(anyhow::Error::new(
                    RetryError::new(report, error),
                ))),
            };
        }
    }

    /// Sends the attempt number and the time left downstream, when asked to.
    fn stamp_headers(&self, request: &mut Request, ctx: &AttemptContext) {
        let settings = &self.policy.settings;
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

    /// Classifies one attempt and applies the safety rule.
    fn judge(
        &self,
        method: &Method,
        keyed: bool,
        repeatable: bool,
        cloneable: bool,
        options: &RequestOptions,
        result: &reqwest_middleware::Result<Response>,
    ) -> Verdict {
        let policy = &self.policy;
        let attempt = AttemptOutcome {
            method,
            carried_key: keyed,
            result: result.as_ref(),
        };
        let failure = result.as_ref().err().map(classify::transport_failure);
        let user = options
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
            (None, Some(false)) => return Verdict::Stop(StopReason::ServerSaidNo),
            (None, Some(true)) => Class::Transient,
            (None, None) => DefaultClassifier
                .classify(&attempt)
                .unwrap_or(Class::Permanent),
        };
        let verdict = match class {
            Class::Success => Verdict::Success,
            Class::Permanent => Verdict::Stop(StopReason::Permanent),
            // The safety rule: a non-idempotent request without a key is
            // repeated only when the failure proves it never reached the
            // server.
            Class::Transient if !repeatable && failure != Some(TransportFailure::Connect) => {
                Verdict::Stop(StopReason::NotIdempotent)
            }
            Class::Transient if !cloneable => Verdict::Stop(StopReason::BodyNotCloneable),
            Class::Transient => Verdict::Transient {
                retry_after: result
                    .as_ref()
                    .ok()
                    .and_then(|r| retry_after::from_headers(r.headers(), policy.clock.wall())),
                timed_out: failure == Some(TransportFailure::Timeout),
            },
        };
        verdict
    }
}

/// The error for a request refused before anything was sent.
fn refused(report: RetryReport, error: KeyError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(anyhow::Error::new(RetryError::new(
        report,
        reqwest_middleware::Error::middleware(error),
    )))
}

/// An attempt's status or transport-error kind, formatted only if a
/// subscriber records the event.
struct AttemptLabel<'a>(&'a reqwest_middleware::Result<Response>);

impl std::fmt::Display for AttemptLabel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ok(r) => f.write_str(r.status().as_str()),
            Err(e) => f.write_str(classify::transport_failure(e).name()),
        }
    }
}
