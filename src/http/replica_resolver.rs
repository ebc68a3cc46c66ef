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
//! addresses it handed out, in the order hyper tries them. The two copies
//! of a hedged attempt have a slot each (the race polls the hedge under
//! a mark the resolver reads), so each copy is judged on the addresses
//! its own connection was given (see `watch`). Every address
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
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::engine::RetryPolicy;

mod watch;

use watch::LookUp;
pub(super) use watch::{Judged, Watch};

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
        // Read now, inside the request's task (and, for a hedge, inside
        // the race's poll of it): the future may be polled elsewhere.
        let host = name.as_str().to_owned();
        let key = self.policy.replicas.table.key(&host);
        let look_up = LookUp::now(key);
        let port = look_up.as_ref().and_then(LookUp::port);
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
            let watch = look_up.as_ref().and_then(LookUp::watch);
            let now = policy.clock.now();
            let table = &policy.replicas.table;
            let (order, probe) = table.order_at(key, &resolved, now, watch.is_some());
            if order.is_empty() {
                return Err(format!("{host} resolved to no address").into());
            }
            if let Some((watch, copy)) = watch {
                watch.note(&policy, copy, &order, probe);
            }
            let addrs: Addrs = Box::new(order.into_iter());
            Ok(addrs)
        })
    }
}
