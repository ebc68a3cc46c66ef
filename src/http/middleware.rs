//! The reqwest-middleware adapter onto the engine: it settles a request's
//! key, limits and hedging, then lets the engine's loop drive its
//! attempts.
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

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{Extensions, HeaderValue};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::engine::{
    deadline, InheritedDeadline, KeyChoice, Limits, RequestOptions, RetryPolicy, Run,
};
use crate::vocabulary::{
    BoxFuture, IdempotencyKey, KeyError, Partition, ReportSlot, RetryReport, Route, SharedKey,
    StopReason,
};

use super::attempt::{self, HttpAttempts};
use super::error::{CircuitOpen, DeadlineSpent, RetryError};

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
        // A call made while serving a request ends when its caller stops
        // waiting.
        let limits = deadline::bound(Limits {
            max_attempts: options
                .and_then(|o| o.max_attempts)
                .unwrap_or(settings.max_attempts),
            deadline: options.and_then(|o| o.deadline).or(settings.deadline),
            attempt_timeout: options
                .and_then(|o| o.attempt_timeout)
                .or(settings.attempt_timeout),
        });
        let classifier = options.and_then(|o| o.classifier.clone());
        // Built only where someone may listen (`engine::listened`): the span
        // then asks the subscriber, by its own name and target. With
        // nobody, building it would only format fields for nobody.
        // `None` where nobody listens: no span to make, nor to drop.
        let listened = crate::engine::listened();
        let span = listened
            .then(|| {
                tracing::info_span!(
                    "retry",
                    http.request.method = %request.method(),
                    server.address = request.url().host_str().unwrap_or_default(),
                    // `i64`: tracing-opentelemetry exports it as an integer.
                    server.port = request.url().port_or_known_default().map(i64::from),
                    url.path = request.url().path(),
                    idempotency_key = key.as_ref().map(SharedKey::as_str),
                    http.request.resend_count = tracing::field::Empty,
                    stop_reason = tracing::field::Empty,
                )
            })
            .filter(|span| !span.is_disabled());
        // Admission is per host unless the request names its partition;
        // pacing is per route.
        let (host, route) = of_url(request.url());
        // A limit belongs to whoever met it: the caller's credential
        // scopes the route (a keyed digest, never the token).
        // A request with no headers of its own (a GET's usual case) asks
        // its empty map nothing, here and for its key (`choose_key`).
        let headers = request.headers();
        let credential = if headers.is_empty() {
            None
        } else {
            headers.get(http::header::AUTHORIZATION)
        };
        let route = match credential {
            Some(credential) => route.for_caller(credential.as_bytes()),
            None => route,
        };
        let partition = options.and_then(|o| o.partition).unwrap_or(host);
        // The window guards retries and inherited deadlines. A caller's
        // own per-request deadline is a budget to use: shorter than the
        // window, it still sends its first attempt, within that deadline
        // (as reqwest's own timeout would); no retry follows it.
        let own = options.and_then(|o| o.deadline);
        let window = if own.is_some() && own == limits.deadline {
            Duration::ZERO
        } else {
            settings.min_attempt_window
        };
        if limits.leave_no_room(window) {
            // No attempt without its window, not even one with a zero
            // timeout: reqwest's timer may fire after the request left.
            // Asked before the breaker, whose half-open probe it would
            // otherwise spend.
            policy
                .metrics
                .deadline_refused(host.id(), Some(request.url()));
            let report = refusal(StopReason::Deadline, partition, key, extensions);
            return Box::pin(std::future::ready(Err(refused(report, DeadlineSpent))));
        }
        if let Some(breaker) = &policy.breaker {
            if !breaker.allow(partition, policy.clock.now()) {
                // Refused locally and at once: no attempt, no retry; a
                // handler's inbound layer answers its caller "do not retry".
                policy.metrics.circuit_refused(host.id(), request.url());
                let report = refusal(StopReason::CircuitOpen, partition, key, extensions);
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
            policy
                .hedger
                .first_attempt(config, partition, policy.clock.now());
        }
        let watch = attempt::watch_of(policy, &request);
        // Counted under the host it is sent to, whatever admits it.
        let mut run = Run::start(policy, limits, partition, Some((host, request.url())));
        run.route = route;
        run.traced = span.is_some();
        run.listened = listened;
        // Moved, not copied: the report owns the key.
        run.report.idempotency_key = key;
        let mut attempts = HttpAttempts {
            judge: attempt::judge(
                policy,
                classifier,
                run.report.idempotency_key.is_some(),
                limits.max_attempts,
                &request,
            ),
            hedging: hedge.map(|config| attempt::hedging(config, partition, host.id(), route)),
            key_header,
            request: Some(request),
            extensions,
            next,
        };
        // An async block, not an `async fn`: it keeps the run and the
        // attempts in place instead of a second copy of each.
        let call = async move {
            let result = run.drive(&mut attempts).await;
            // Moved out of the run, which ends here: no copy, no empty
            // report left behind to drop.
            let mut report = run.report;
            if attempts.judge.policy.replicas.in_use().is_some() {
                report.addresses = attempt::addresses_seen();
            }
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
        let call: BoxFuture<'_, _> = match span {
            None => Box::pin(call),
            Some(span) => Box::pin(call.instrument(span)),
        };
        attempt::watched(watch, call)
    }
}
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
        let headers = request.headers();
        let mut existing = if headers.is_empty() {
            None
        } else {
            Some(headers.get_all(&settings.key_header).iter())
        };
        if let Some(first) = existing.as_mut().and_then(Iterator::next) {
            if existing.and_then(|mut more| more.next()).is_some() {
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
            // Inside a handler serving a keyed request, derived from its
            // key: the same call of a handler that runs again gets the
            // same key.
            KeyChoice::Auto if settings.key_methods.contains(request.method()) => {
                InheritedDeadline::current()
                    .and_then(|scope| scope.next_key())
                    .unwrap_or_else(|| SharedKey::generate(settings.key_generator))
            }
            KeyChoice::Auto => return Ok((None, None)),
        };
        let value = key.header_value(settings.key_format)?;
        Ok((Some(key), Some(value)))
    }
}

/// The longest URL (up to its path) a thread remembers, in bytes.
const REMEMBERED_URL: usize = 512;

thread_local! {
    /// The URL (up to its path) this thread asked [`of_url`] about last,
    /// with its partition and route.
    static LAST: RefCell<(String, Partition, Route)> =
        const { RefCell::new((String::new(), Partition::SINGLE, Route::WHOLE)) };
}

/// The partition ([`Partition::of_url`]) and the route ([`Route::of_url`])
/// of `url`, remembered for the URL this thread asked about last: a client
/// calls the same endpoint again and again, and the two digests cost more
/// than comparing the URL with the last one (a keyed SipHash of the
/// authority, a walk over the path's segments).
///
/// The URL up to its path (scheme, user, host, port and path, as `Url`
/// serializes them, which is canonical) is all that either digest reads,
/// so the same text gives the same pair; a query or a fragment changes
/// neither and is left out of the comparison.
fn of_url(url: &reqwest::Url) -> (Partition, Route) {
    let text = url.as_str();
    // The serialization ends `?query#fragment`, each part when present.
    let tail = url.fragment().map_or(0, |f| f.len() + 1) + url.query().map_or(0, |q| q.len() + 1);
    let key = text.get(..text.len().saturating_sub(tail)).unwrap_or(text);
    let compute = || (Partition::of_url(url), Route::of_url(url));
    if key.len() > REMEMBERED_URL {
        // Not kept: a thread holds at most this much for the last URL.
        return compute();
    }
    // Neither a thread being torn down nor a borrow already taken (nothing
    // here calls back in) can make this fail; if one did, the digests are
    // made afresh.
    LAST.try_with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return compute();
        };
        if last.0 != key {
            let (partition, route) = compute();
            last.0.clear();
            last.0.push_str(key);
            last.1 = partition;
            last.2 = route;
        }
        (last.1, last.2)
    })
    .unwrap_or_else(|_| compute())
}

/// The report of a call refused before its first attempt, for `reason`:
/// left in the caller's [`ReportSlot`], and noted in the inherited scope
/// (its layer answers "do not retry").
fn refusal(
    reason: StopReason,
    partition: Partition,
    key: Option<SharedKey>,
    extensions: &Extensions,
) -> RetryReport {
    let mut report = deadline::refusal(reason, partition);
    report.idempotency_key = key;
    if let Some(slot) = extensions.get::<ReportSlot>() {
        slot.fill(report.clone());
    }
    report
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each URL, asked in turn and again, gets what the digests give it:
    /// URLs that differ only in what one digest reads (the scheme, the
    /// port, a user, a trailing dot, the path) never share the remembered
    /// pair, and a query or a fragment does not change it.
    #[test]
    fn the_remembered_digests_are_the_digests_of_the_url_asked() {
        let long = "a".repeat(600);
        let urls = [
            "https://api.example.com/items/17",
            "https://api.example.com/items/17?page=2",
            "https://api.example.com/items/17#top",
            "https://api.example.com/items/18",
            "https://api.example.com/items",
            "https://api.example.com/items/",
            "https://api.example.com:8443/items/17",
            "http://api.example.com/items/17",
            "https://api.example.com./items/17",
            "https://user@api.example.com/items/17",
            "https://other.example.com/items/17",
            "http://127.0.0.1:9/x",
            "http://[::1]:9/x",
            "https://api.example.com/orders/17",
            // Longer than a thread remembers: made afresh each time.
            &format!("https://api.example.com/{long}/1"),
            &format!("https://api.example.com/{long}/2"),
        ];
        let urls: Vec<reqwest::Url> = urls.iter().map(|u| u.parse().unwrap()).collect();
        for _ in 0..2 {
            for (i, a) in urls.iter().enumerate() {
                for b in &urls[i..] {
                    for url in [a, a, b, a] {
                        let expected = (Partition::of_url(url), Route::of_url(url));
                        assert_eq!(of_url(url), expected, "{url}");
                    }
                }
            }
        }
        // A thread keeps at most about REMEMBERED_URL bytes, however long
        // the URLs it asked about (a String grows at most twofold).
        let huge: reqwest::Url = format!("https://api.example.com/{}", "b".repeat(5000))
            .parse()
            .unwrap();
        assert_eq!(
            of_url(&huge),
            (Partition::of_url(&huge), Route::of_url(&huge))
        );
        let kept = LAST.with(|last| last.borrow().0.capacity());
        assert!(kept <= 2 * REMEMBERED_URL, "{kept}");
        // The pairs above are not all one: the test can tell them apart.
        let distinct: std::collections::HashSet<_> = urls.iter().map(of_url).collect();
        assert!(distinct.len() >= 9, "{}", distinct.len());
    }
}
