//! The replica-aware resolver: new connections to a host name with
//! several addresses go to a healthy one, and each attempt learns which
//! address it was given.
//!
//! ```
//! use std::net::SocketAddr;
//! use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
//!
//! let policy = RetryPolicy::default();
//! let replicas: Vec<SocketAddr> =
//!     ["127.0.0.1:8080", "127.0.0.2:8080"].map(|a| a.parse().unwrap()).to_vec();
//! let http = reqwest::Client::builder()
//!     // The system resolver's answers, or a fixed list for a name.
//!     .dns_resolver(policy.replica_resolver().pin("svc.test", &replicas))
//!     .build()
//!     .unwrap();
//! let client = reqwest_middleware::ClientBuilder::new(http)
//!     .with(RetryMiddleware::new(policy))
//!     .build();
//! # drop(client);
//! ```
//!
//! # How an attempt knows its address
//!
//! A response names the address that answered
//! ([`reqwest::Response::remote_addr`]); a connection reset or refused
//! before any response does not. reqwest resolves a name when it opens a
//! new connection, inside the future of the request that needs it, so the
//! resolver reads a task-local slot the attempt set up and writes there the
//! addresses it handed out, in the order hyper tries them. Every address
//! is handed out (healthy ones first), so a refused connection falls
//! through to the next address inside one attempt, as without the
//! resolver. A failure before any answer is attributed to the first
//! address handed out, the one hyper tried first; a connection refused on
//! every address, to each of them. A request that reused a pooled
//! connection and failed before an answer is not attributed (its host
//! still is). While an address of a name is out of service, the attempts
//! to that name ask for `Connection: close`, so that no pooled connection
//! leads back to it; keep-alive resumes once every address is healthy.
//!
//! # Ports
//!
//! Addresses are kept and compared as the connection used them: a system
//! look-up answers without a port, and the URL's port (else its scheme's
//! default) is the one the connection goes to, as reqwest and hyper do.
//! A pinned address keeps its own port unless the URL names one: the
//! URL's port then applies to every pinned address (two pinned addresses
//! that differ only by port are then one).

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::decisions::NameKey;
use crate::engine::{Clock, Elsewhere, Replicas, RetryPolicy};
use crate::signals::{transport_failure, TransportFailure};
use crate::vocabulary::{lock, BoxFuture};

tokio::task_local! {
    /// The call in flight, when the policy's table is read by a resolver.
    static WATCH: Arc<Watch>;
}

/// One call's part in the replica table: the host it goes to, and the slot
/// where the resolver notes the address the current attempt's new
/// connection was given. It lives in a task-local around the whole call,
/// so that the attempt loop's future carries nothing for it.
pub(super) struct Watch {
    host: NameKey,
    /// The port the URL names, or its scheme's default, and whether the
    /// URL names it: what a looked-up address's port becomes.
    port: Option<(u16, bool)>,
    state: Mutex<Seen>,
}

/// What a watched call has seen so far.
#[derive(Default)]
struct Seen {
    /// The addresses the resolver gave the current attempt's connection,
    /// in the order hyper tries them.
    given: Vec<SocketAddr>,
    /// The probes the current attempt's connections went out as: each
    /// ends when the attempt does, whatever becomes of it.
    probes: Vec<Probe>,
    /// The address each attempt went to, for the report: the first
    /// inline, so a call of one attempt allocates nothing for it.
    first: Option<SocketAddr>,
    rest: Vec<Option<SocketAddr>>,
    attempts: u32,
}

impl Seen {
    fn current(&mut self) -> Option<&mut Option<SocketAddr>> {
        match self.attempts {
            0 => None,
            1 => Some(&mut self.first),
            _ => self.rest.last_mut(),
        }
    }
}

/// A `reqwest` DNS resolver that hands each new connection every address
/// of its name in the order the policy's [`crate::replicas::ReplicaTable`] gives: a
/// due probe first, the healthy addresses in turn, the ones that failed
/// recently last, so that hyper connects to a healthy one and falls
/// through to the next when a connection is refused. An address that
/// failed is probed now and then until it recovers; never all of a name's
/// addresses are out of service.
///
/// Obtain it from [`RetryPolicy::replica_resolver`] and install it with
/// `reqwest::ClientBuilder::dns_resolver`. Names resolve through the
/// system resolver (as reqwest does by default, again for each new
/// connection), to a fixed list given with [`ReplicaResolver::pin`], or
/// through another resolver given with [`ReplicaResolver::lookup_with`].
/// Without it nothing changes: addresses are neither chosen nor
/// attributed.
#[derive(Clone)]
pub struct ReplicaResolver {
    policy: RetryPolicy,
    pinned: Arc<HashMap<String, Vec<SocketAddr>>>,
    /// Where names that are not pinned resolve: the system resolver when
    /// `None`.
    lookup: Option<Arc<dyn Resolve>>,
}

impl fmt::Debug for ReplicaResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaResolver")
            .field("pinned", &self.pinned)
            .field(
                "lookup",
                &self.lookup.as_ref().map_or("system", |_| "custom"),
            )
            .finish_non_exhaustive()
    }
}

/// A probe of an ejected address, under way in an attempt: it ends when
/// dropped (the attempt ended, was dropped by its caller, or lost a hedge
/// race), unless a verdict on the address ended it first.
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

impl RetryPolicy {
    /// A resolver that shares this policy's per-host state: install it
    /// with `reqwest::ClientBuilder::dns_resolver(..)` on the client this
    /// policy's middleware wraps, and a failure of one address sends the
    /// retry to another (see [`ReplicaResolver`]).
    pub fn replica_resolver(&self) -> ReplicaResolver {
        self.replicas
            .installed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        ReplicaResolver {
            policy: self.clone(),
            pinned: Arc::default(),
            lookup: None,
        }
    }
}

impl ReplicaResolver {
    /// Resolves `name` to `addrs` instead of asking the system resolver
    /// (tests, static discovery). The port of each address is used unless
    /// the URL names one.
    #[must_use]
    pub fn pin(mut self, name: &str, addrs: &[SocketAddr]) -> Self {
        Arc::make_mut(&mut self.pinned).insert(pin_key(name), addrs.to_vec());
        self
    }

    /// Resolves names that are not pinned through `resolver` (another
    /// `reqwest` resolver: hickory-dns, service discovery, a test's)
    /// instead of the system resolver. Its answers are read as the system
    /// resolver's are: an address without a port (port 0) takes the URL's.
    #[must_use]
    pub fn lookup_with(mut self, resolver: impl Resolve + 'static) -> Self {
        self.lookup = Some(Arc::new(resolver));
        self
    }
}

/// The address a connection to `addr` really goes to: the URL's port when
/// the URL names one or the look-up gave none, as hyper sets it.
fn effective(addr: SocketAddr, port: Option<(u16, bool)>) -> SocketAddr {
    match port {
        Some((port, explicit)) if explicit || addr.port() == 0 => SocketAddr::new(addr.ip(), port),
        _ => addr,
    }
}

/// A pinned name's key: lowercase, without a trailing dot.
fn pin_key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Resolve for ReplicaResolver {
    fn resolve(&self, name: Name) -> Resolving {
        // Read now, inside the request's task: the future may be polled
        // elsewhere. Held weakly, so that a connection still being made
        // after its call ended does not keep the call's probes alive.
        let host = name.as_str().to_owned();
        let key = self.policy.replicas.table.key(&host);
        let watch = WATCH
            .try_with(|w| (w.host == key).then(|| Arc::downgrade(w)))
            .ok()
            .flatten();
        let port = watch.as_ref().and_then(Weak::upgrade).and_then(|w| w.port);
        let pinned = self.pinned.get(&pin_key(&host)).cloned();
        let lookup = self.lookup.clone();
        let policy = self.policy.clone();
        Box::pin(async move {
            let looked_up: Vec<SocketAddr> = match (pinned, lookup) {
                (Some(addrs), _) => addrs,
                (None, Some(lookup)) => lookup.resolve(name).await?.collect(),
                (None, None) => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            let mut resolved: Vec<SocketAddr> = Vec::with_capacity(looked_up.len());
            for addr in looked_up {
                let addr = effective(addr, port);
                if !resolved.contains(&addr) {
                    resolved.push(addr);
                }
            }
            let watch = watch.as_ref().and_then(Weak::upgrade);
            let now = policy.clock.now();
            let table = &policy.replicas.table;
            let (order, probe) = table.order_at(key, &resolved, now, watch.is_some());
            if order.is_empty() {
                return Err(format!("{host} resolved to no address").into());
            }
            if let Some(watch) = watch {
                let probe = probe.map(|id| Probe {
                    replicas: Arc::clone(&policy.replicas),
                    clock: Arc::clone(&policy.clock),
                    host: key,
                    addr: order[0],
                    id,
                });
                let mut seen = lock(&watch.state);
                seen.given.clone_from(&order);
                seen.probes.extend(probe);
            }
            let addrs: Addrs = Box::new(order.into_iter());
            Ok(addrs)
        })
    }
}

impl Watch {
    /// The watch of a call to `request`'s host, when the policy's table
    /// is read by a resolver and the request names a host.
    pub(super) fn of(policy: &RetryPolicy, request: &reqwest::Request) -> Option<Arc<Watch>> {
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
    pub(super) fn call<'a, T: Send + 'a>(
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
    pub(super) fn prepare(policy: &RetryPolicy, request: &mut reqwest::Request) -> bool {
        if policy.replicas.in_use().is_none() {
            return false;
        }
        WATCH
            .try_with(|watch| {
                {
                    let mut seen = lock(&watch.state);
                    seen.given.clear();
                    // A probe of the attempt before ends with it.
                    seen.probes.clear();
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

    /// What the attempt's result says of the address it went to: the
    /// address (the answer's, else the one its new connection was given),
    /// and, when it failed and another address of the host is healthy,
    /// how the next attempt goes there. A throttling answer (429, 503 with
    /// Retry-After) says "overload", not "this machine is broken": it
    /// counts neither way.
    pub(super) fn attribute(
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
    pub(super) fn addresses() -> Option<Box<[Option<SocketAddr>]>> {
        WATCH
            .try_with(|watch| {
                let seen = std::mem::take(&mut *lock(&watch.state));
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
        let (addr, given, _probes) = {
            let mut seen = lock(&self.state);
            let given = std::mem::take(&mut seen.given);
            let probes = std::mem::take(&mut seen.probes);
            let addr = match result {
                Ok(r) => r.remote_addr().or(given.first().copied()),
                Err(_) => given.first().copied(),
            };
            if let Some(slot) = seen.current() {
                *slot = addr;
            }
            (addr?, given, probes)
        };
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
            for a in &given {
                table.failed_at(self.host, *a, now);
            }
        } else {
            table.failed_at(self.host, addr, now);
        }
        table
            .healthy_besides_at(self.host, addr, now)
            .then_some(how)
    }
}
