//! The hedge race: a second copy of an attempt, sent once the host's hedge
//! delay has passed without an answer, paid for by the host's hedge budget
//! and the retry admission; the first answer that is not a transient
//! failure wins.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::Next;

use crate::decisions::{
    Admission, AttemptRecord, AttemptResult, Grant, HedgeConfig, RetryKind, RetryRequest,
};
use crate::engine::{AttemptContext, RetryPolicy, Signal, Verdict};
use crate::vocabulary::replay::{self, BodySource, Handle};
use crate::vocabulary::{BoxFuture, Partition, Route};

use super::deadline_header::stamp_headers;
use super::judge::Judge;
use super::replica_resolver::{Judged, Watch};

/// A request's hedging: its settings, its host, and the hedges it sent
/// (counted by the attempts' races, which only share it).
#[derive(Debug)]
pub(super) struct Hedging {
    pub(super) config: HedgeConfig,
    /// The admission partition, which is also the hedger's host.
    pub(super) partition: Partition,
    /// The host the request is sent to, whose series count its hedges.
    pub(super) host: u64,
    /// The request's route within it: a paced route gets no hedge.
    pub(super) route: Route,
    pub(super) sent: AtomicU32,
    /// Of those, the ones whose answer, a response of the host, was used.
    pub(super) won: AtomicU32,
}

/// What hedging an attempt needs: when it started (its latency is
/// recorded for its host), and the second copy, when the host has a hedge
/// delay that ends before the attempt's timeout and the request can be
/// copied (`copy` gives the copy and, when its streamed body replays a
/// buffer, the buffer: the hedge is not sent once that has lost the
/// body's start). Kept out of line, so that the unhedged attempt's code
/// stays as it was.
#[inline(never)]
pub(super) fn plan_hedge<'a, 'h>(
    policy: &'a RetryPolicy,
    hedging: &'h Hedging,
    copy: impl FnOnce() -> Option<(Request, Option<Handle>)>,
    extensions: &Extensions,
    next: &Next<'a>,
    ctx: AttemptContext,
    timeout: Option<Duration>,
) -> Hedge<'a, 'h> {
    let started = policy.clock.now();
    let mut replay = None;
    let copy = policy
        .hedger
        .delay(&hedging.config, hedging.partition)
        .filter(|delay| timeout.is_none_or(|t| *delay < t))
        .and_then(|delay| {
            let (request, buffer) = copy()?;
            replay = buffer;
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
        replay,
        copy,
    }
}

/// One attempt, timed for its host's latencies, and perhaps hedged.
pub(super) struct Hedge<'a, 'h> {
    policy: &'a RetryPolicy,
    hedging: &'h Hedging,
    started: Instant,
    /// The buffer the copy's streamed body replays, if it has one.
    replay: Option<Handle>,
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
    First = 0,
    Hedge = 1,
}

type Answer = reqwest_middleware::Result<Response>;

impl Hedge<'_, '_> {
    /// Records the first copy's latency, from its start to now, for its
    /// host: an answer's, or a lower bound when it lost to the hedge.
    fn record_latency(&self) {
        let now = self.policy.clock.now();
        let latency = now.saturating_duration_since(self.started);
        self.policy
            .hedger
            .record(self.hedging.partition, latency, now);
    }

    /// Asks the host's hedge budget, then the retry admission: the grant
    /// the hedge is sent under, or `None` (the budget's hedge given back
    /// when the admission refuses). A hedge asks once and never waits.
    fn admit(&self) -> Option<Grant> {
        let policy = self.policy;
        let now = policy.clock.now();
        if !policy.hedger.spend(self.hedging.partition, now) {
            return None;
        }
        let ask = RetryRequest::new(RetryKind::Hedge, Duration::ZERO).on_route(self.hedging.route);
        if let Admission::Admit(grant) = policy.admission.admit(self.hedging.partition, ask, now) {
            return Some(grant);
        }
        policy.hedger.refund(self.hedging.partition, now);
        None
    }

    /// The race, boxed: only a hedged request pays for its state, and the
    /// attempt awaits it as it awaits an unhedged send.
    #[inline(never)]
    pub(super) fn boxed_race<'f>(
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
    /// wait, else the later one). A copy whose body could not follow the
    /// other's, and a hedge that ended in an error, drop out: their
    /// failure is the answer only when no other is left. The other copy is
    /// dropped: its request is abandoned and its connection closed, not
    /// reused. The attempt judges the answer returned as any other (the
    /// classifiers are asked about it once more).
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
        // The copy is sent with what is left of the attempt's time, and
        // not at all when its body can no longer follow the first copy's
        // (the buffer has lost the body's start): it would cost the host
        // a request and the budget a hedge, and could only fail.
        let elapsed = policy.clock.now().saturating_duration_since(self.started);
        let left = copy.timeout.map(|t| t.saturating_sub(elapsed));
        let lost = self.replay.as_ref().is_some_and(|r| r.lost().is_some());
        let grant = match left {
            _ if lost => None,
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
        replay::fill(&mut request, extensions.get::<BodySource>());
        stamp_headers(policy, &mut request, &ctx, left);
        policy.metrics.hedged(self.hedging.host);
        self.hedging.sent.fetch_add(1, Ordering::Relaxed);
        // With the replica resolver, each copy's look-ups are noted in a
        // slot of its own (the hedge is polled under its mark), and each
        // copy is judged on its own addresses as it ends.
        let mark = Watch::hedge_mark(policy);
        let mut judged: [Option<Judged>; 2] = [None, None];
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
                let hedge = second
                    .as_mut()
                    .map(|f| Watch::as_hedge(mark, || f.as_mut().poll(cx)));
                if let Some(Poll::Ready(answer)) = hedge {
                    return Poll::Ready((Which::Hedge, answer));
                }
                Poll::Pending
            })
            .await;
            judged[which as usize] =
                Watch::copy_ended(policy, mark, which == Which::Hedge, &answer);
            let verdict = verdict(&answer);
            // A copy whose body could not follow the other's (the buffer
            // lost the body's start, while the other copy reads the
            // caller's stream) says nothing of the host.
            let not_kept = answer.as_ref().err().is_some_and(replay::not_kept);
            let result = if not_kept {
                AttemptResult::Other
            } else {
                verdict.result()
            };
            match which {
                Which::First => {
                    first = None;
                    self.record_latency();
                    first_seen = Some((result, judge.signal(&answer, verdict)));
                }
                Which::Hedge => {
                    second = None;
                    hedge_result = result;
                    hedge_signal = judge.signal(&answer, verdict);
                }
            }
            let in_flight = first.is_some() || second.is_some();
            // A copy that could not go on (its body not kept), or a hedge
            // that failed before any answer of the host (an error, not a
            // response), drops out of the race: the other copy's answer,
            // in flight or held, is the attempt's.
            if not_kept || (which == Which::Hedge && answer.is_err()) {
                if in_flight {
                    continue;
                }
                if let Some(held) = held.take() {
                    break held;
                }
                break (which, answer, verdict);
            }
            // A transient failure of one copy waits for the other.
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
        // The answer returned is its copy's, for the replica table too;
        // a copy dropped in flight ends its probes with no verdict.
        Watch::returned(mark, judged[winner as usize]);
        // The hedge won when its answer, a response of the host, is the
        // one used, unless both copies failed transiently (the attempt
        // failed; nobody won). A hedge that failed (an error) never won.
        let won = winner == Which::Hedge
            && answer.is_ok()
            && !matches!(verdict, Verdict::Transient { .. });
        if won {
            policy.metrics.hedge_won(self.hedging.host);
            self.hedging.won.fetch_add(1, Ordering::Relaxed);
        }
        // The engine records the answer returned. The hedge's grant is
        // closed with the other answer, so that each answer the host gave
        // (and what it said of the host's rate) reaches the admission once:
        // the hedge's when the first copy's is returned, the first copy's
        // when the hedge's is (or the hedge's result alone when the first
        // copy never answered).
        let route = self.hedging.route;
        let host = self.hedging.host;
        let max_hold = policy.settings.max_retry_after;
        let record = AttemptRecord::new(ctx.attempt(), Some(grant), hedge_result).on_route(route);
        let record = match (winner, first_seen) {
            (Which::First, _) => {
                hedge_signal.onto(record, || policy.metrics.throttled(host), max_hold)
            }
            (Which::Hedge, Some((result, signal))) => signal.onto(
                AttemptRecord::new(ctx.attempt(), Some(grant), result).on_route(route),
                || policy.metrics.throttled(host),
                max_hold,
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
