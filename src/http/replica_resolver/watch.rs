//! The watch of one call: where the resolver notes the addresses (and
//! probes) each new connection of the call's current attempt was given,
//! one list a copy of the attempt, and how an attempt's answer is then
//! attributed to an address.
//!
//! # The two copies of a hedged attempt
//!
//! A hedge runs in the same task as its first copy, each on a connection
//! of its own. The race polls the hedge inside a scope that marks it
//! ([`Watch::as_hedge`]), so the resolver writes the hedge's addresses and
//! probe in the hedge's slot, never over the first copy's. Each copy that
//! ends inside the race is judged at once on its own addresses (a failure
//! before any answer blames the address its own connection tried first;
//! its probes end with that verdict); a copy dropped as the race's loser
//! ends its probes with no verdict. The attempt's address and the
//! "elsewhere" decision are then those of the copy whose answer the race
//! returned, decided once both copies are judged.

use std::mem::take;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use crate::decisions::NameKey;
use crate::engine::{Clock, Elsewhere, Replicas, RetryPolicy};
use crate::signals::{transport_failure, TransportFailure};
use crate::vocabulary::{lock, BoxFuture};

tokio::task_local! {
    /// The call in flight, when the policy's table is read by a resolver.
    static WATCH: Arc<Watch>;
    /// Set while the race polls a hedge: the watch (by address) whose
    /// hedge slot the hedge's look-ups write to.
    static HEDGE: usize;
}

/// The first copy's slot, and the hedge's.
const FIRST: usize = 0;
const HEDGE_COPY: usize = 1;

/// One call's part in the replica table: the host it goes to, and the
/// slots where the resolver notes the addresses the current attempt's new
/// connections were given. It lives in a task-local around the whole
/// call, so that the attempt loop's future carries nothing for it.
pub(crate) struct Watch {
    host: NameKey,
    /// The port the URL names, or its scheme's default, and whether the
    /// URL names it: what a looked-up address's port becomes.
    port: Option<(u16, bool)>,
    state: Mutex<Seen>,
}

/// What a watched call has seen so far.
#[derive(Default)]
struct Seen {
    /// What the current attempt's (first) copy was handed.
    copy: Slot,
    /// What its hedge was handed, and the race's verdict on the copy
    /// whose answer it returned: boxed, made once the attempt is hedged,
    /// so that an unhedged attempt carries one word for it.
    hedge: Option<Box<Hedged>>,
    /// The address each attempt went to, for the report: the first
    /// inline, so a call of one attempt allocates nothing for it.
    first: Option<SocketAddr>,
    rest: Vec<Option<SocketAddr>>,
    attempts: u32,
}

/// What one copy of an attempt was handed.
#[derive(Default)]
struct Slot {
    /// The addresses the resolver gave the copy's connection, in the
    /// order hyper tries them.
    given: Vec<SocketAddr>,
    /// The probes its connections went out as: each ends with the copy's
    /// verdict, or when the copy ends without one.
    probes: Vec<Probe>,
}

/// A hedged attempt's hedge, and the race's verdict.
#[derive(Default)]
struct Hedged {
    slot: Slot,
    judged: Option<Judged>,
}

impl Seen {
    /// `copy`'s slot (the hedge's made when first asked for).
    fn slot(&mut self, copy: usize) -> &mut Slot {
        match copy {
            FIRST => &mut self.copy,
            _ => &mut self.hedge.get_or_insert_with(Box::default).slot,
        }
    }

    fn current(&mut self) -> Option<&mut Option<SocketAddr>> {
        match self.attempts {
            0 => None,
            1 => Some(&mut self.first),
            _ => self.rest.last_mut(),
        }
    }
}

/// What one copy's answer said of its address: the address (the answer's,
/// else the one its connection tried first) and, when the answer was a
/// failure of that address, how a retry goes elsewhere.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judged {
    addr: Option<SocketAddr>,
    failure: Option<Elsewhere>,
}

/// A probe of an ejected address, under way in an attempt: it ends when
/// dropped (the copy that made it ended, was dropped by its caller, or
/// lost a hedge race), unless a verdict on the address ended it first.
struct Probe {
    replicas: Arc<Replicas>,
    clock: Arc<dyn Clock>,
    host: NameKey,
    addr: SocketAddr,
    id: u64,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let now = self.clock.now();
        self.replicas
            .table
            .probe_ended_at(self.host, self.addr, self.id, now);
    }
}

/// A look-up made inside a watched call: the call's watch, held weakly
/// (a connection still being made after its call ended does not keep the
/// call's probes alive), and the copy whose connection it is for.
pub(crate) struct LookUp {
    watch: Weak<Watch>,
    copy: usize,
}

impl LookUp {
    /// The look-up of a connection to `host` made now, inside the
    /// request's task, when a call to that host is watched.
    pub(crate) fn now(host: NameKey) -> Option<LookUp> {
        WATCH
            .try_with(|w| {
                let hedge = HEDGE.try_with(|h| *h == Arc::as_ptr(w) as usize);
                (w.host == host).then(|| LookUp {
                    watch: Arc::downgrade(w),
                    copy: if hedge.unwrap_or(false) {
                        HEDGE_COPY
                    } else {
                        FIRST
                    },
                })
            })
            .ok()
            .flatten()
    }

    /// The port the call's URL names (or its scheme's default), and
    /// whether it names it, while the call lasts.
    pub(crate) fn port(&self) -> Option<(u16, bool)> {
        self.watch.upgrade().and_then(|w| w.port)
    }

    /// The call's watch while the call lasts, and the copy's slot in it.
    pub(crate) fn watch(&self) -> Option<(Arc<Watch>, usize)> {
        Some((self.watch.upgrade()?, self.copy))
    }
}

impl Watch {
    /// Notes in `copy`'s slot the addresses its connection was given, and
    /// the probe it went out as (of the first address, numbered `probe`).
    pub(crate) fn note(
        &self,
        policy: &RetryPolicy,
        copy: usize,
        order: &[SocketAddr],
        probe: Option<u64>,
    ) {
        let probe = probe.map(|id| Probe {
            replicas: Arc::clone(&policy.replicas),
            clock: Arc::clone(&policy.clock),
            host: self.host,
            addr: order[0],
            id,
        });
        let mut seen = lock(&self.state);
        let slot = seen.slot(copy);
        slot.given.clear();
        slot.given.extend_from_slice(order);
        slot.probes.extend(probe);
    }
}

/// The mark of a hedge of a watched call (see [`Watch::as_hedge`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HedgeMark(usize);

impl Watch {
    /// The watch of a call to `request`'s host, when the policy's table
    /// is read by a resolver and the request names a host.
    pub(crate) fn of(policy: &RetryPolicy, request: &reqwest::Request) -> Option<Arc<Watch>> {
        let table = policy.replicas.in_use()?;
        let url = request.url();
        Some(Arc::new(Watch {
            host: table.key(url.host_str()?),
            port: url
                .port_or_known_default()
                .map(|p| (p, url.port().is_some())),
            state: Mutex::default(),
        }))
    }

    /// Runs `call`, watched when there is a watch.
    pub(crate) fn call<'a, T: Send + 'a>(
        watch: Option<Arc<Watch>>,
        call: BoxFuture<'a, T>,
    ) -> BoxFuture<'a, T> {
        match watch {
            None => call,
            Some(watch) => Box::pin(WATCH.scope(watch, call)),
        }
    }

    /// Prepares an attempt: false when the call is not watched. While an
    /// address of the host is out of service, the attempt asks for its
    /// connection to be closed after it.
    // Inline: without a resolver (the default) an attempt pays one test.
    #[inline]
    pub(crate) fn prepare(policy: &RetryPolicy, request: &mut reqwest::Request) -> bool {
        policy.replicas.in_use().is_some() && Self::prepare_watched(policy, request)
    }

    /// [`Watch::prepare`] with a resolver in use.
    fn prepare_watched(policy: &RetryPolicy, request: &mut reqwest::Request) -> bool {
        WATCH
            .try_with(|watch| {
                {
                    let mut seen = lock(&watch.state);
                    seen.copy.given.clear();
                    // A probe of the attempt before ends with it.
                    seen.copy.probes.clear();
                    seen.hedge = None;
                    seen.attempts += 1;
                    if seen.attempts > 1 {
                        seen.rest.push(None);
                    }
                }
                if policy
                    .replicas
                    .table
                    .degraded_at(watch.host, policy.clock.now())
                {
                    request.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
            })
            .is_ok()
    }

    /// The mark the race polls a hedge under, when the call is watched.
    pub(crate) fn hedge_mark(policy: &RetryPolicy) -> Option<HedgeMark> {
        policy.replicas.in_use()?;
        WATCH.try_with(|w| HedgeMark(Arc::as_ptr(w) as usize)).ok()
    }

    /// Runs `poll` (a poll of a hedge) so that the connections it opens
    /// are noted as the hedge's.
    pub(crate) fn as_hedge<R>(mark: Option<HedgeMark>, poll: impl FnOnce() -> R) -> R {
        match mark {
            Some(HedgeMark(watch)) => HEDGE.sync_scope(watch, poll),
            None => poll(),
        }
    }

    /// A copy of a hedged attempt ended with `result` (marked or not):
    /// judged now on the addresses its own connection was given, and its
    /// probes ended. `None` when the call is not watched.
    pub(crate) fn copy_ended(
        policy: &RetryPolicy,
        mark: Option<HedgeMark>,
        hedge: bool,
        result: &reqwest_middleware::Result<reqwest::Response>,
    ) -> Option<Judged> {
        mark?;
        let copy = if hedge { HEDGE_COPY } else { FIRST };
        WATCH
            .try_with(|watch| {
                let Slot {
                    given,
                    probes: _ended,
                } = take(lock(&watch.state).slot(copy));
                let addr = answered_by(result, &given);
                let failure = addr.and_then(|a| watch.verdict(policy, a, &given, result));
                Judged { addr, failure }
            })
            .ok()
    }

    /// The race returned the answer of the copy judged `judged`: that is
    /// the attempt's. A copy still in flight (the loser, dropped) ends its
    /// probes with no verdict.
    pub(crate) fn returned(mark: Option<HedgeMark>, judged: Option<Judged>) {
        if mark.is_none() {
            return;
        }
        let _ = WATCH.try_with(|watch| {
            let _ended = {
                let mut seen = lock(&watch.state);
                let first = take(&mut seen.copy);
                let hedge = seen.hedge.get_or_insert_with(Box::default);
                hedge.judged = judged;
                (first, take(&mut hedge.slot))
            };
        });
    }

    /// What the attempt's result says of the address it went to: the
    /// address (the answer's, else the one its new connection was given),
    /// and, when it failed and another address of the host is healthy,
    /// how the next attempt goes there. A throttling answer (429, 503 with
    /// Retry-After) says "overload", not "this machine is broken": it
    /// counts neither way. A hedged attempt's answer was judged by the
    /// race, with the copy that gave it.
    pub(crate) fn attribute(
        policy: &RetryPolicy,
        result: &reqwest_middleware::Result<reqwest::Response>,
    ) -> Option<Elsewhere> {
        WATCH
            .try_with(|watch| watch.attribute_to(policy, result))
            .ok()
            .flatten()
    }

    /// The address each attempt of the watched call went to, `None` when
    /// no address is known for any.
    pub(crate) fn addresses() -> Option<Box<[Option<SocketAddr>]>> {
        WATCH
            .try_with(|watch| {
                let seen = take(&mut *lock(&watch.state));
                if seen.first.is_none() && seen.rest.iter().all(Option::is_none) {
                    return None;
                }
                let mut all = Vec::with_capacity(1 + seen.rest.len());
                all.push(seen.first);
                all.extend(seen.rest);
                Some(all.into_boxed_slice())
            })
            .ok()
            .flatten()
    }

    fn attribute_to(
        &self,
        policy: &RetryPolicy,
        result: &reqwest_middleware::Result<reqwest::Response>,
    ) -> Option<Elsewhere> {
        // The attempt's probes end when this returns, whatever it says:
        // a verdict on a probed address ends its probe first.
        let (addr, given, judged, _probes) = {
            let mut seen = lock(&self.state);
            let Slot { given, probes } = take(&mut seen.copy);
            let judged = seen.hedge.take().and_then(|h| h.judged);
            let addr = judged.map_or_else(|| answered_by(result, &given), |j| j.addr);
            if let Some(slot) = seen.current() {
                *slot = addr;
            }
            (addr?, given, judged, probes)
        };
        let how = match judged {
            Some(judged) => judged.failure,
            None => self.verdict(policy, addr, &given, result),
        }?;
        let now = policy.clock.now();
        policy
            .replicas
            .table
            .healthy_besides_at(self.host, addr, now)
            .then_some(how)
    }

    /// The table's verdict on `addr` (of `given`, the addresses the
    /// connection was handed) from `result`: a success, a failure (how a
    /// retry would go elsewhere), or nothing.
    fn verdict(
        &self,
        policy: &RetryPolicy,
        addr: SocketAddr,
        given: &[SocketAddr],
        result: &reqwest_middleware::Result<reqwest::Response>,
    ) -> Option<Elsewhere> {
        let mut refused_everywhere = false;
        let failure = match result {
            Ok(r) => {
                let status = r.status().as_u16();
                let throttled = status == 429
                    || (status == 503 && r.headers().contains_key(http::header::RETRY_AFTER));
                if throttled {
                    return None;
                }
                (status >= 500).then_some(Elsewhere::AfterBackoff)
            }
            Err(e) => match transport_failure(e) {
                // hyper tried every address handed out before giving up.
                TransportFailure::Connect => {
                    refused_everywhere = true;
                    Some(Elsewhere::AtOnce)
                }
                TransportFailure::Interrupted => Some(Elsewhere::AtOnce),
                TransportFailure::Timeout => Some(Elsewhere::AfterBackoff),
                TransportFailure::TlsRejected | TransportFailure::Other => return None,
            },
        };
        let table = &policy.replicas.table;
        let Some(how) = failure else {
            table.succeeded_at(self.host, addr);
            return None;
        };
        let now = policy.clock.now();
        if refused_everywhere {
            for a in given {
                table.failed_at(self.host, *a, now);
            }
        } else {
            table.failed_at(self.host, addr, now);
        }
        Some(how)
    }
}

/// The address `result` came from: the answer's, else the first one its
/// connection was given (the one hyper tried first).
fn answered_by(
    result: &reqwest_middleware::Result<reqwest::Response>,
    given: &[SocketAddr],
) -> Option<SocketAddr> {
    match result {
        Ok(r) => r.remote_addr().or(given.first().copied()),
        Err(_) => given.first().copied(),
    }
}
