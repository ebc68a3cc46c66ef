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
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use http::{Extensions, HeaderValue};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::admission::{
    Admission, AttemptRecord, AttemptResult, Grant, Partition, RetryKind, RetryRequest,
};
use crate::classify::{self, server_verdict, Class, Classifier, DefaultClassifier, HttpAttempt};
use crate::engine::{shorter, Attempt, AttemptContext, Limits, Outcome, Run, Signal, Verdict};
use crate::error::{CircuitOpen, KeyError, RetryError};
use crate::hedge::HedgeConfig;
use crate::idempotency::{IdempotencyKey, SharedKey};
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

impl Middleware for RetryMiddleware {
    // Written out rather than with `#[async_trait]`: the options, the key
    // and the limits are settled before the future is built, so the boxed
    // future holds the request once and nothing it no longer needs.
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        request: Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> BoxFuture<'async_trait, reqwest_middleware::Result<Response>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        let policy = &self.policy;
        let settings = &policy.settings;
        let options = extensions.get::<RequestOptions>();
        let (key, key_header) = match self.choose_key(&request, options) {
            Ok(key) => key,
            Err(e) => {
                let mut report = RetryReport::new();
                report.stop_reason = StopReason::Permanent;
                if let Some(slot) = extensions.get::<ReportSlot>() {
                    slot.fill(report.clone());
                }
                return Box::pin(std::future::ready(Err(refused(report, e))));
            }
        };
        let limits = Limits {
            max_attempts: options
                .and_then(|o| o.max_attempts)
                .unwrap_or(settings.max_attempts),
            deadline: options.and_then(|o| o.deadline).or(settings.deadline),
            attempt_timeout: options
                .and_then(|o| o.attempt_timeout)
                .or(settings.attempt_timeout),
        };
        let classifier = options.and_then(|o| o.classifier.clone());
        // Built only where someone may listen: once a subscriber has been
        // set (the span then asks it, by its own name and target), or where
        // a logger would print the span's fields (tracing's `log` feature).
        // With neither, building it would only format fields for nobody.
        // `has_been_set` is tracing's own test for eliding trace points when
        // tracing is not in use (what its macros expand to).
        let span = if tracing::dispatcher::has_been_set() || log::log_enabled!(log::Level::Info) {
            tracing::info_span!(
                "retry",
                http.request.method = %request.method(),
                server.address = request.url().host_str().unwrap_or_default(),
                url.path = request.url().path(),
                idempotency_key = key.as_ref().map(SharedKey::as_str),
                http.request.resend_count = tracing::field::Empty,
                stop_reason = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        // Admission is per host unless the request names its partition.
        let partition = options
            .and_then(|o| o.partition)
            .unwrap_or_else(|| Partition::of_url(request.url()));
        if let Some(breaker) = &policy.breaker {
            if !breaker.allow(partition, policy.clock.now()) {
                // Refused locally and at once: no attempt, no retry; a
                // handler's inbound layer answers its caller "do not retry".
                policy.metrics.circuit_refused();
                crate::propagation::note_stop(StopReason::CircuitOpen, 0);
                let mut report = RetryReport::new();
                report.attempts = 0;
                report.stop_reason = StopReason::CircuitOpen;
                report.partition = partition;
                report.idempotency_key = key;
                if let Some(slot) = extensions.get::<ReportSlot>() {
                    slot.fill(report.clone());
                }
                return Box::pin(std::future::ready(Err(refused(report, CircuitOpen))));
            }
        }
        // Hedged only when the safety rule lets the request be sent twice:
        // then each first attempt earns its host's hedge budget its share.
        let keyed = key.is_some();
        let hedge = match options.and_then(|o| o.hedge) {
            Some(choice) => choice,
            None => settings.hedge,
        }
        .filter(|config| config.may_hedge(request.method(), keyed));
        if let Some(config) = &hedge {
            policy.hedger.first_attempt(config, partition);
        }
        let mut run = Run::start(policy, limits, partition);
        run.traced = !span.is_disabled();
        // Moved, not copied: the report owns the key.
        run.report.idempotency_key = key;
        let mut attempts = HttpAttempts {
            judge: Judge {
                policy,
                classifier,
                keyed: run.report.idempotency_key.is_some(),
                max_attempts: limits.max_attempts,
            },
            hedging: hedge.map(|config| {
                Box::new(Hedging {
                    config,
                    partition,
                    sent: AtomicU32::new(0),
                    won: AtomicU32::new(0),
                })
            }),
            key_header,
            caller_timeout: request.timeout().copied(),
            request: Some(request),
            extensions,
            next,
        };
        // An async block, not an `async fn`: it keeps the run and the
        // attempts in place instead of a second copy of each.
        let call = async move {
            let (result, mut report) = run.drive(&mut attempts).await;
            if let Some(hedging) = &attempts.hedging {
                let count = |n: &AtomicU32| u16::try_from(n.load(Ordering::Relaxed));
                report.hedges = count(&hedging.sent).unwrap_or(u16::MAX);
                report.hedge_wins = count(&hedging.won).unwrap_or(u16::MAX);
            }
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
        };
        // With no subscriber listening, no span is entered on every poll.
        if span.is_disabled() {
            Box::pin(call)
        } else {
            Box::pin(call.instrument(span))
        }
    }
}

/// The future `Middleware::handle` returns (what `#[async_trait]` writes).
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl RetryMiddleware {
    /// The request's key: a caller's own, kept as it is in the request's
    /// headers, or one chosen as the options and policy say, with the header
    /// value every attempt is to carry.
    fn choose_key(
        &self,
        request: &Request,
        options: Option<&RequestOptions>,
    ) -> Result<(Option<SharedKey>, Option<HeaderValue>), KeyError> {
        let settings = &self.policy.settings;
        let mut existing = request.headers().get_all(&settings.key_header).iter();
        if let Some(first) = existing.next() {
            if existing.next().is_some() {
                // Which of two keys a server reads is its own choice (the
                // server half refuses them): refused before it is sent.
                return Err(KeyError::new("the key header must appear only once"));
            }
            // A key the caller already set is kept, never overwritten.
            return IdempotencyKey::from_header(first).map(|key| (Some(key.into()), None));
        }
        let key = match options.map_or(&KeyChoice::Auto, |o| &o.key) {
            KeyChoice::Skip => return Ok((None, None)),
            KeyChoice::Use(key) => SharedKey::from(key.clone()),
            KeyChoice::Auto if settings.key_methods.contains(request.method()) => {
                SharedKey::generate(settings.key_generator)
            }
            KeyChoice::Auto => return Ok((None, None)),
        };
        let value = key.header_value(settings.key_format)?;
        Ok((Some(key), Some(value)))
    }
}

/// One logical HTTP operation: the request for the next attempt and what
/// each attempt needs.
struct HttpAttempts<'a> {
    judge: Judge<'a>,
    /// Hedging, when this request may be hedged (boxed: a request that is
    /// not carries one pointer for it).
    hedging: Option<Box<Hedging>>,
    /// The key header each attempt adds to the request it sends (`None`
    /// when there is no key, or when the caller's request carries its own):
    /// the copy kept for the next attempt then holds the caller's headers
    /// alone, and copying it copies no header the caller did not set.
    key_header: Option<HeaderValue>,
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

    // The request is prepared before the future is built, so the future
    // holds only the send in flight and what the verdict needs.
    fn attempt(&mut self, ctx: AttemptContext) -> impl Future<Output = Outcome<Self::Output>> {
        let sending = match self.request.take() {
            None => None,
            Some(mut request) => Some({
                // A copy for the next attempt; `None` when the body is a
                // stream, which is sent once, or when no attempt can follow
                // this one.
                let last = ctx.attempt() >= self.judge.max_attempts;
                self.request = if last { None } else { request.try_clone() };
                let cloneable = last || self.request.is_some();
                // reqwest keeps the timeout in an extension map that it
                // allocates on the first write: write only a timeout the
                // request lacks.
                let timeout = shorter(self.caller_timeout, ctx.timeout());
                if timeout != self.caller_timeout {
                    *request.timeout_mut() = timeout;
                }
                if let Some(value) = &self.key_header {
                    let name = self.judge.policy.settings.key_header.clone();
                    request.headers_mut().insert(name, value.clone());
                }
                stamp_headers(self.judge.policy, &mut request, &ctx, timeout);
                let method = request.method().clone();
                // Planned before the send borrows the extensions: the copy
                // sent as the hedge needs its own.
                let hedge = self.hedging.as_deref().map(|hedging| {
                    plan_hedge(
                        self.judge.policy,
                        hedging,
                        &request,
                        self.extensions,
                        &self.next,
                        ctx,
                        timeout,
                    )
                });
                let response = self.next.clone().run(request, self.extensions);
                let response = match hedge {
                    None => response,
                    Some(hedge) => hedge.boxed_race(response, &self.judge, &method, cloneable),
                };
                (method, cloneable, response)
            }),
        };
        let judge = &self.judge;
        async move {
            let Some((method, cloneable, response)) = sending else {
                return Outcome::stop(
                    Err(reqwest_middleware::Error::middleware(NothingToResend)),
                    StopReason::BodyNotCloneable,
                );
            };
            let result = response.await;
            let verdict = judge.verdict(&method, cloneable, &result);
            let signal = judge.signal(&result, verdict);
            Outcome::new(result, verdict).with_signal(signal)
        }
    }

    fn label(&self, value: &Self::Output, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match value {
            Ok(r) => f.write_str(r.status().as_str()),
            Err(e) => f.write_str(classify::transport_failure(e).name()),
        }
    }
}

/// A request's hedging: its settings, its host, and the hedges it sent
/// (counted by the attempts' races, which only share it).
#[derive(Debug)]
struct Hedging {
    config: HedgeConfig,
    /// The admission partition, which is also the hedger's host.
    partition: Partition,
    sent: AtomicU32,
    /// Of those, the ones whose answer was used.
    won: AtomicU32,
}

/// What hedging an attempt needs: when it started (its latency is
/// recorded for its host), and the second copy, when the host has a hedge
/// delay that ends before the attempt's timeout and the request can be
/// copied. Kept out of line, so that the unhedged attempt's code stays as
/// it was.
#[inline(never)]
fn plan_hedge<'a, 'h>(
    policy: &'a RetryPolicy,
    hedging: &'h Hedging,
    request: &Request,
    extensions: &Extensions,
    next: &Next<'a>,
    ctx: AttemptContext,
    timeout: Option<Duration>,
) -> Hedge<'a, 'h> {
    let started = policy.clock.now();
    let copy = policy
        .hedger
        .delay(&hedging.config, hedging.partition)
        .filter(|delay| timeout.is_none_or(|t| *delay < t))
        .and_then(|delay| {
            let request = request.try_clone()?;
            Some(HedgeCopy {
                delay,
                request,
                extensions: extensions.clone(),
                next: next.clone(),
                timeout,
                ctx,
            })
        });
    Hedge {
        policy,
        hedging,
        started,
        copy,
    }
}

/// One attempt, timed for its host's latencies, and perhaps hedged.
struct Hedge<'a, 'h> {
    policy: &'a RetryPolicy,
    hedging: &'h Hedging,
    started: Instant,
    copy: Option<HedgeCopy<'a>>,
}

/// The second copy of an attempt, sent if the first is not answered within
/// `delay`.
struct HedgeCopy<'a> {
    delay: Duration,
    request: Request,
    extensions: Extensions,
    next: Next<'a>,
    /// The attempt's timeout, which the copy shares: it is sent with what
    /// is left of it.
    timeout: Option<Duration>,
    ctx: AttemptContext,
}

/// Which copy of a hedged attempt answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    First,
    Hedge,
}

type Answer = reqwest_middleware::Result<Response>;

impl Hedge<'_, '_> {
    /// Records the first copy's latency, from its start to now, for its
    /// host: an answer's, or a lower bound when it lost to the hedge.
    fn record_latency(&self) {
        let now = self.policy.clock.now();
        let latency = now.saturating_duration_since(self.started);
        self.policy.hedger.record(self.hedging.partition, latency);
    }

    /// Asks the host's hedge budget, then the retry admission: the grant
    /// the hedge is sent under, or `None` (the budget's hedge given back
    /// when the admission refuses). A hedge asks once and never waits.
    fn admit(&self) -> Option<Grant> {
        let policy = self.policy;
        if !policy.hedger.spend(self.hedging.partition) {
            return None;
        }
        let ask = RetryRequest::new(RetryKind::Hedge, Duration::ZERO);
        if let Admission::Admit(grant) =
            policy
                .admission
                .admit(self.hedging.partition, ask, policy.clock.now())
        {
            return Some(grant);
        }
        policy.hedger.refund(self.hedging.partition);
        None
    }

    /// The race, boxed: only a hedged request pays for its state, and the
    /// attempt awaits it as it awaits an unhedged send.
    #[inline(never)]
    fn boxed_race<'f>(
        self,
        first: BoxFuture<'f, Answer>,
        judge: &'f Judge<'_>,
        method: &http::Method,
        cloneable: bool,
    ) -> BoxFuture<'f, Answer>
    where
        Self: 'f,
    {
        Box::pin(self.race(first, judge, method.clone(), cloneable))
    }

    /// Waits for the first copy, sends the second once the hedge delay has
    /// passed without an answer (and the budget and the admission allow
    /// it), and returns the first answer that is not a transient failure
    /// (when both fail so, the one whose Retry-After asks for the longer
    /// wait, else the later one). The other copy is dropped: its
    /// request is abandoned and its connection closed, not reused. The
    /// attempt judges the answer returned as any other (the classifiers are
    /// asked about it once more).
    async fn race(
        mut self,
        mut first: BoxFuture<'_, Answer>,
        judge: &Judge<'_>,
        method: http::Method,
        cloneable: bool,
    ) -> Answer {
        let policy = self.policy;
        let verdict = |result: &Answer| judge.verdict(&method, cloneable, result);
        let Some(copy) = self.copy.take() else {
            let answer = first.await;
            self.record_latency();
            return answer;
        };
        // The hedge delay starts once the first copy has been polled: a
        // sleeper that moves a manual clock as it is asked (`ManualClock`)
        // then charges no delay to an answer that was ready at once.
        let mut sleep = None;
        let early = poll_fn(|cx| {
            if let Poll::Ready(answer) = first.as_mut().poll(cx) {
                return Poll::Ready(Some(answer));
            }
            let sleep = sleep.get_or_insert_with(|| policy.sleeper.sleep(copy.delay));
            sleep.as_mut().poll(cx).map(|()| None)
        })
        .await;
        drop(sleep);
        if let Some(answer) = early {
            self.record_latency();
            return answer;
        }
        // The copy is sent with what is left of the attempt's time.
        let elapsed = policy.clock.now().saturating_duration_since(self.started);
        let left = copy.timeout.map(|t| t.saturating_sub(elapsed));
        let grant = match left {
            Some(left) if left.is_zero() => None,
            _ => self.admit(),
        };
        let Some(grant) = grant else {
            let answer = first.await;
            self.record_latency();
            return answer;
        };
        let HedgeCopy {
            mut request,
            mut extensions,
            next,
            ctx,
            ..
        } = copy;
        if left.is_some() {
            *request.timeout_mut() = left;
        }
        stamp_headers(policy, &mut request, &ctx, left);
        policy.metrics.hedged();
        self.hedging.sent.fetch_add(1, Ordering::Relaxed);
        let mut first = Some(first);
        let mut second = Some(next.run(request, &mut extensions));
        let mut hedge_result = AttemptResult::Other;
        let mut hedge_signal = Signal::default();
        // The first copy's transient answer while the hedge was still out:
        // what it said of the host, and the answer itself, kept in case it
        // asked for the longer wait.
        let mut first_seen: Option<(AttemptResult, Signal)> = None;
        let mut held: Option<(Which, Answer, Verdict)> = None;
        let (winner, answer, verdict) = loop {
            let (which, answer) = poll_fn(|cx| {
                if let Some(Poll::Ready(answer)) = first.as_mut().map(|f| f.as_mut().poll(cx)) {
                    return Poll::Ready((Which::First, answer));
                }
                if let Some(Poll::Ready(answer)) = second.as_mut().map(|f| f.as_mut().poll(cx)) {
                    return Poll::Ready((Which::Hedge, answer));
                }
                Poll::Pending
            })
            .await;
            let verdict = verdict(&answer);
            match which {
                Which::First => {
                    first = None;
                    self.record_latency();
                    first_seen = Some((verdict.result(), judge.signal(&answer, verdict)));
                }
                Which::Hedge => {
                    second = None;
                    hedge_result = verdict.result();
                    hedge_signal = judge.signal(&answer, verdict);
                }
            }
            // A transient failure of one copy waits for the other.
            let in_flight = first.is_some() || second.is_some();
            if !(in_flight && matches!(verdict, Verdict::Transient { .. })) {
                break (which, answer, verdict);
            }
            held = Some((which, answer, verdict));
        };
        // Both copies failed: the answer returned is the one that asked
        // for the longer wait, so the retry honours the host's longer
        // Retry-After whichever copy carried it (the later one on a tie).
        let (winner, answer, verdict) = match held {
            Some((which, held, held_verdict))
                if matches!(verdict, Verdict::Transient { .. })
                    && hint(held_verdict) > hint(verdict) =>
            {
                (which, held, held_verdict)
            }
            _ => (winner, answer, verdict),
        };
        if first.take().is_some() {
            // The first copy lost: its latency was at least this long.
            self.record_latency();
        }
        drop(second);
        // The hedge won when its answer is the one used, unless both
        // copies failed transiently (the attempt failed; nobody won).
        let won = winner == Which::Hedge && !matches!(verdict, Verdict::Transient { .. });
        if won {
            policy.metrics.hedge_won();
            self.hedging.won.fetch_add(1, Ordering::Relaxed);
        }
        // The engine records the answer returned. The hedge's grant is
        // closed with the other answer, so that each answer the host gave
        // (and what it said of the host's rate) reaches the admission once:
        // the hedge's when the first copy's is returned, the first copy's
        // when the hedge's is (or the hedge's result alone when the first
        // copy never answered).
        let record = AttemptRecord::new(ctx.attempt(), Some(grant), hedge_result);
        let record = match (winner, first_seen) {
            (Which::First, _) => hedge_signal.onto(record, &policy.metrics),
            (Which::Hedge, Some((result, signal))) => signal.onto(
                AttemptRecord::new(ctx.attempt(), Some(grant), result),
                &policy.metrics,
            ),
            (Which::Hedge, None) => record,
        };
        policy
            .admission
            .record(self.hedging.partition, record, policy.clock.now());
        answer
    }
}

/// The wait a transient verdict asks for (none for any other verdict).
fn hint(verdict: Verdict) -> Option<std::time::Duration> {
    match verdict {
        Verdict::Transient { retry_after, .. } => retry_after,
        _ => None,
    }
}

/// What an attempt's verdict needs: the policy, the request's own
/// classifier, whether the request carries a key, and how many attempts
/// it may make.
struct Judge<'a> {
    policy: &'a RetryPolicy,
    /// The request's own classifier, asked before the policy's.
    classifier: Option<Arc<dyn Classifier>>,
    keyed: bool,
    /// Beside `keyed`, where it costs the future no room of its own.
    max_attempts: u32,
}

impl Judge<'_> {
    /// What the answer says about its host's rate, whatever the verdict:
    /// a throttling answer (429, or 503 with Retry-After) and the
    /// rate-limit fields.
    fn signal(&self, result: &reqwest_middleware::Result<Response>, verdict: Verdict) -> Signal {
        let Ok(response) = result else {
            return Signal::default();
        };
        let headers = response.headers();
        let status = response.status().as_u16();
        // The wall clock is read only when a date may need it: most
        // answers are neither throttling nor carry rate-limit fields.
        let wall = || self.policy.clock.wall();
        let retry_after = match verdict {
            Verdict::Transient { retry_after, .. } => retry_after,
            _ if status == 429 || status == 503 => retry_after::from_headers(headers, wall()),
            _ => None,
        };
        let rate_limit = if crate::rate_limit::has_fields(headers) {
            crate::rate_limit::from_headers(headers, wall())
        } else {
            None
        };
        Signal {
            // A 503 that says "later" (a Retry-After of more than zero;
            // a date in the past says "now").
            throttled: status == 429
                || (status == 503 && retry_after.is_some_and(|d| !d.is_zero())),
            retry_after,
            rate_limit,
        }
    }

    /// Classifies one attempt and applies the safety rule.
    fn verdict(
        &self,
        method: &http::Method,
        cloneable: bool,
        result: &reqwest_middleware::Result<Response>,
    ) -> Verdict {
        let policy = self.policy;
        // The common case first: a 1xx-3xx and no classifier but the
        // default, which calls it a success (as `safety::judge` does).
        if let Ok(r) = result {
            if r.status().as_u16() < 400
                && self.classifier.is_none()
                && policy.classifiers.is_empty()
            {
                return Verdict::Success;
            }
        }
        let attempt = HttpAttempt {
            method,
            carried_key: self.keyed,
            result: result.as_ref(),
        };
        let failure = result.as_ref().err().map(classify::transport_failure);
        let user = self
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
/// The time left is what this attempt is waited for (`waited`: the
/// attempt's timeout, which is the call's time left or less), not the
/// whole call's: past it this attempt is abandoned, so work on it is work
/// nobody waits for. A value the request already carries that is smaller
/// (an application passing on its caller's) is kept.
// Inlined into the attempt as it was before the hedge became its second
// caller: out of line it costs every attempt a call (~45 instructions).
#[inline(always)]
fn stamp_headers(
    policy: &RetryPolicy,
    request: &mut Request,
    ctx: &AttemptContext,
    waited: Option<std::time::Duration>,
) {
    let settings = &policy.settings;
    if let Some(name) = &settings.attempt_header {
        request
            .headers_mut()
            .insert(name.clone(), HeaderValue::from(ctx.attempt()));
    }
    if let (Some(name), Some(_), Some(left)) = (&settings.deadline_header, ctx.time_left(), waited)
    {
        let carried = crate::propagation::time_left_in(request.headers(), name);
        if carried.is_none_or(|carried| left < carried) {
            let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            request
                .headers_mut()
                .insert(name.clone(), HeaderValue::from(ms));
        }
    }
}

/// The error for a request refused before anything was sent.
fn refused(
    report: RetryReport,
    error: impl std::error::Error + Send + Sync + 'static,
) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(anyhow::Error::new(RetryError::new(
        report,
        reqwest_middleware::Error::middleware(error),
    )))
}
