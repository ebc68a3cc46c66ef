//! One HTTP attempt, as the engine's loop drives it: the request copied
//! for the next attempt, the key and deadline headers stamped, the send
//! (perhaps hedged), and the verdict on the answer.

use std::fmt;
use std::future::Future;

use http::{Extensions, HeaderValue};
use reqwest::{Request, Response};
use reqwest_middleware::Next;

use crate::engine::{shorter, Attempt, AttemptContext, Outcome};
use crate::signals::transport_failure;
use crate::vocabulary::replay::{self, BodySource};
use crate::vocabulary::{is_idempotent, StopReason};

use super::deadline_header::stamp_headers;
use super::hedge_race::{plan_hedge, Hedging};
use super::judge::Judge;
use super::replica_resolver::Watch;

/// One logical HTTP operation: the request for the next attempt and what
/// each attempt needs.
pub(super) struct HttpAttempts<'a> {
    pub(super) judge: Judge<'a>,
    /// Hedging, when this request may be hedged (boxed: a request that is
    /// not carries one pointer for it).
    pub(super) hedging: Option<Box<Hedging>>,
    /// The key header each attempt adds to the request it sends (`None`
    /// when there is no key, or when the caller's request carries its own):
    /// the copy kept for the next attempt then holds the caller's headers
    /// alone, and copying it copies no header the caller did not set.
    pub(super) key_header: Option<HeaderValue>,
    /// The request the next attempt sends; `None` once a body that cannot
    /// be copied has been sent.
    pub(super) request: Option<Request>,
    pub(super) extensions: &'a mut Extensions,
    pub(super) next: Next<'a>,
}

/// The watch of one logical call to `request`'s host, for the replica
/// table, when a resolver reads it (see `replica_resolver`).
pub(super) fn watch_of(
    policy: &crate::engine::RetryPolicy,
    request: &Request,
) -> Option<std::sync::Arc<Watch>> {
    Watch::of(policy, request)
}

/// The address each attempt of the watched call in flight went to.
pub(super) fn addresses_seen() -> Option<Box<[Option<std::net::SocketAddr>]>> {
    Watch::addresses()
}

/// Runs `call` under its watch, if any.
pub(super) fn watched<'a, T: Send + 'a>(
    watch: Option<std::sync::Arc<Watch>>,
    call: crate::vocabulary::BoxFuture<'a, T>,
) -> crate::vocabulary::BoxFuture<'a, T> {
    Watch::call(watch, call)
}

/// The judge of a request's attempts: `policy`, the request's own
/// `classifier`, whether it carries a key, how many attempts it may make.
#[inline]
pub(super) fn judge<'a>(
    policy: &'a crate::engine::RetryPolicy,
    classifier: Option<std::sync::Arc<dyn crate::signals::Classifier>>,
    keyed: bool,
    max_attempts: u32,
    request: &Request,
) -> Judge<'a> {
    #[cfg(not(feature = "metrics"))]
    let _ = request;
    Judge {
        policy,
        classifier,
        keyed,
        max_attempts,
        #[cfg(feature = "metrics")]
        method: method_label(request.method()),
        replay: None,
    }
}

/// A request's hedging, under `config`, to `host` (its admission
/// `partition`) on `route`: no hedge sent yet.
#[inline]
pub(super) fn hedging(
    config: crate::decisions::HedgeConfig,
    partition: crate::vocabulary::Partition,
    host: u64,
    route: crate::vocabulary::Route,
) -> Box<Hedging> {
    Box::new(Hedging {
        config,
        partition,
        host,
        route,
        sent: std::sync::atomic::AtomicU32::new(0),
        won: std::sync::atomic::AtomicU32::new(0),
    })
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

impl HttpAttempts<'_> {
    /// The request attempt number `attempt` sends, and whether it can be
    /// sent again (a hedge or a retry may follow); `None` once a body that
    /// cannot be copied has been sent.
    ///
    /// The request kept is the caller's, with only the caller's headers.
    /// A body reqwest can copy (bytes, or none) is sent as reqwest's copy
    /// (`try_clone`: the method, URL, headers, body, version and every
    /// extension, private ones too), and the request stays where it is for
    /// the next attempt: no request is moved in or out of the kept place.
    /// Otherwise the request kept is sent and a copy kept for the next
    /// attempt: a stream wrapped to be kept (`replay`) and replayed, or made
    /// afresh by the caller's `BodySource`; none when the body is a stream
    /// that is not kept (the replay buffer is off), which is sent once, or
    /// when no attempt can follow this one.
    fn next_request(&mut self, attempt: u32) -> Option<(Request, bool)> {
        let last = attempt >= self.judge.max_attempts;
        let source = self.extensions.get::<BodySource>();
        let kept = self.request.as_mut()?;
        if source.is_none() {
            if !last || self.hedging.is_some() {
                let policy = self.judge.policy;
                let limits = replay::Limits {
                    limit: policy.settings.replay_limit,
                    repeatable: self.judge.keyed || is_idempotent(kept.method()),
                    cap: policy.settings.replay_cap,
                    memory: &policy.replay_memory,
                };
                replay::prepare(limits, kept, &mut self.judge.replay);
            }
            if !last {
                if let Some(mut copy) = kept.try_clone() {
                    // The copy sent takes the caller's header map, with its
                    // room for the headers an attempt adds (a copied map has
                    // none, and would grow), and the request kept takes the
                    // copy's, which no attempt writes.
                    std::mem::swap(copy.headers_mut(), kept.headers_mut());
                    return Some((copy, true));
                }
            }
        }
        let mut request = self.request.take()?;
        replay::fill(&mut request, source);
        self.request = if last {
            None
        } else {
            replay::copy(&mut request, source, self.judge.replay.as_ref())
        };
        Some((request, last || self.request.is_some()))
    }
}

impl Attempt for HttpAttempts<'_> {
    type Output = reqwest_middleware::Result<Response>;

    // The request is prepared before the future is built, so the future
    // holds only the send in flight and what the verdict needs.
    fn attempt(&mut self, ctx: AttemptContext) -> impl Future<Output = Outcome<Self::Output>> {
        let sending = match self.next_request(ctx.attempt()) {
            None => None,
            Some((mut request, cloneable)) => Some({
                // The caller's own timeout: each copy keeps the one it had.
                let caller_timeout = request.timeout().copied();
                // reqwest keeps the timeout in an extension map that it
                // allocates on the first write: write only a timeout the
                // request lacks.
                let timeout = shorter(caller_timeout, ctx.timeout());
                if timeout != caller_timeout {
                    *request.timeout_mut() = timeout;
                }
                if let Some(value) = &self.key_header {
                    let name = self.judge.policy.settings.key_header.clone();
                    request.headers_mut().insert(name, value.clone());
                }
                stamp_headers(self.judge.policy, &mut request, &ctx, timeout);
                let watched = Watch::prepare(self.judge.policy, &mut request);
                let method = request.method().clone();
                // Planned before the send borrows the extensions: the copy
                // sent as the hedge needs its own.
                let hedge = self.hedging.as_deref().map(|hedging| {
                    let source = self.extensions.get::<BodySource>();
                    let replay = self.judge.replay.as_ref();
                    plan_hedge(
                        self.judge.policy,
                        hedging,
                        || {
                            // A source makes the copy's body when the
                            // hedge is sent (never for one that is not),
                            // afresh: no buffer can fail it.
                            let copy = replay::copy(&mut request, source, replay)?;
                            Some((copy, replay.filter(|_| source.is_none()).cloned()))
                        },
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
                (method, cloneable, response, watched)
            }),
        };
        let judge = &self.judge;
        async move {
            let Some((method, cloneable, response, watched)) = sending else {
                return Outcome::stop(
                    Err(reqwest_middleware::Error::middleware(NothingToResend)),
                    StopReason::BodyNotCloneable,
                );
            };
            let result = response.await;
            let verdict = judge.verdict(&method, cloneable, &result);
            let mut signal = judge.signal(&result, verdict);
            if watched {
                signal.elsewhere = Watch::attribute(judge.policy, &result);
            }
            Outcome::new(result, verdict).with_signal(signal)
        }
    }

    fn label(&self, value: &Self::Output, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match value {
            Ok(r) => f.write_str(r.status().as_str()),
            Err(e) => f.write_str(transport_failure(e).name()),
        }
    }

    #[cfg(feature = "metrics")]
    fn took(&self, value: &Self::Output, host: u64, elapsed: std::time::Duration) {
        let answer = match value {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(transport_failure(e).name()),
        };
        let method = METHODS
            .get(usize::from(self.judge.method))
            .copied()
            .unwrap_or("_OTHER");
        let metrics = &self.judge.policy.metrics;
        metrics.attempt_took(host, method, answer, elapsed);
    }
}

/// The methods OpenTelemetry labels by name (RFC 9110's and PATCH); any
/// other is `_OTHER`, so a client sending made-up methods cannot grow the
/// label's values.
#[cfg(feature = "metrics")]
const METHODS: [&str; 10] = [
    "_OTHER", "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// `method`'s index in [`METHODS`] (0, `_OTHER`, for another).
#[cfg(feature = "metrics")]
pub(super) fn method_label(method: &reqwest::Method) -> u8 {
    let i = METHODS.iter().position(|m| *m == method.as_str());
    // Fewer than 256 methods: the index fits.
    #[allow(clippy::cast_possible_truncation)]
    i.map_or(0, |i| i as u8)
}
