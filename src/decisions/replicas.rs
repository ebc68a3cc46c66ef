//! Replicas: which of a host name's addresses a new connection goes to,
//! and whether a failure was one address's or the host's.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Instant;
//! use reqwest_safe_retry::replicas::ReplicaTable;
//!
//! let table = ReplicaTable::default();
//! let addrs: Vec<SocketAddr> =
//!     ["127.0.0.1:80", "127.0.0.2:80", "127.0.0.3:80"].map(|a| a.parse().unwrap()).to_vec();
//! let now = Instant::now();
//! // New connections are spread over the healthy addresses…
//! let first = table.pick("svc.test", &addrs, now).unwrap();
//! // …and one that failed comes last: it gets no new connection while
//! // another address is healthy.
//! table.failed("svc.test", first, now);
//! assert!(table.healthy_besides("svc.test", first, now));
//! for _ in 0..10 {
//!     assert_ne!(table.pick("svc.test", &addrs, now), Some(first));
//! }
//! ```
//!
//! # Why
//!
//! A host name with several addresses is several machines. When one of them
//! resets every connection or answers every request 503, a retry that goes
//! back to it fails again, and the host's admission sees an outage where
//! two machines of three are fine. hyper moves to the next address only
//! when connecting fails, and the system resolver hands the addresses out
//! in the same order every time, so without help every new connection
//! starts at the same first address. Envoy answers this with outlier
//! ejection and a previous-hosts retry predicate, gRPC by picking another
//! subchannel; here the resolver asks this table.
//!
//! # The rules
//!
//! - A new connection is handed every address of its name, in order: a due
//!   probe first (below), then the healthy addresses starting at the next
//!   in turn (so connections spread), then the ones out of service, the
//!   fewest failures first. hyper tries them in that order, so a refused
//!   connection falls through to the next address inside one attempt, as
//!   it does without this table; an ejected address is tried only when
//!   every healthy one refused.
//! - A failure attributed to an address (a reset, a refused connection, a
//!   timeout, a 5xx from it) ejects it: no new connection goes to it for
//!   [`FIRST_EJECTION`], doubling with each failure in a row up to
//!   [`MAX_EJECTION`]. Then one connection probes it: a success brings it
//!   back, a failure ejects it again for longer. A probe whose attempt
//!   ends with no verdict on it (dropped by its caller, a lost hedge race,
//!   answered by another address) ends all the same: the address is due
//!   for another probe [`FIRST_EJECTION`] later. A probe nobody ends (its
//!   resolver used without the middleware) lapses after [`MAX_EJECTION`].
//! - Never all: an address is not ejected when no other address of its
//!   name would be left in service; it then stays in turn, and a host
//!   whose every address fails is an outage for the admission, as before.
//! - A failure is one replica's, not the host's, while another address of
//!   the name is healthy (not ejected, no failure since its last success):
//!   the engine then retries elsewhere, at once for a failure at the
//!   connection level, and neither the admission nor the breaker counts it
//!   against the host.
//!
//! - Addresses are compared as the connection used them, port included:
//!   a look-up's port-less answer takes the URL's port before it reaches
//!   the table. Each look-up replaces the name's addresses on its port
//!   (known ones keep their record, new ones start healthy and in turn,
//!   gone ones are forgotten); a name used on several ports keeps each
//!   port's addresses apart, within [`MAX_ADDRS`].
//!
//! The table is bounded ([`MAX_NAMES`] names, the idlest dropped first;
//! [`MAX_ADDRS`] addresses a name) and takes instants from its caller: no
//! clock, no I/O.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::vocabulary::lock;

/// The first ejection of an address that failed.
pub(super) const FIRST_EJECTION: Duration = Duration::from_secs(1);
/// The longest ejection.
pub(super) const MAX_EJECTION: Duration = Duration::from_secs(30);
/// The most names kept; the one unused the longest makes room.
pub(super) const MAX_NAMES: usize = 1024;
/// The most addresses kept for one name (the first ones resolved).
pub(super) const MAX_ADDRS: usize = 64;

/// One address of a name, and how it has fared.
#[derive(Debug, Clone)]
struct Addr {
    addr: SocketAddr,
    /// Failures since its last success.
    strikes: u32,
    /// No new connection before this, unless as a probe.
    ejected_until: Option<Instant>,
    /// A probe went to it and has not ended yet: its number, and when it
    /// started (a probe nobody ends lapses after [`MAX_EJECTION`]).
    probing: Option<(u64, Instant)>,
}

impl Addr {
    fn new(addr: SocketAddr) -> Self {
        Addr {
            addr,
            strikes: 0,
            ejected_until: None,
            probing: None,
        }
    }

    fn probing(&self, now: Instant) -> bool {
        self.probing
            .is_some_and(|(_, since)| now.saturating_duration_since(since) < MAX_EJECTION)
    }

    fn ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|u| u > now) || self.probing(now)
    }

    /// In service and with no failure since its last success.
    fn healthy(&self, now: Instant) -> bool {
        self.strikes == 0 && !self.ejected(now)
    }
}

#[derive(Debug)]
struct Name {
    addrs: Vec<Addr>,
    /// The next healthy address in turn.
    cursor: usize,
    used: Instant,
}

/// The health of every address of every name a client resolved through a
/// [`crate::replicas::ReplicaResolver`], shared by the resolver and the policy's
/// calls. Thread-safe and bounded in memory.
#[derive(Default)]
pub struct ReplicaTable {
    names: Mutex<HashMap<NameKey, Name>>,
    /// Addresses kept with a failure since their last success: while
    /// there are none (the usual case), an answer or a degraded check
    /// takes no lock.
    struck: AtomicUsize,
    /// The number of the next probe.
    probes: AtomicU64,
    /// Seeded per table: names are kept by a digest, made without an
    /// allocation on every answer.
    hasher: RandomState,
}

/// A name's key in a [`ReplicaTable`]: a digest of the name, lowercase and
/// without a trailing dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct NameKey(u64);

impl fmt::Debug for ReplicaTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaTable")
            .field("names", &lock(&self.names).len())
            .finish()
    }
}

impl ReplicaTable {
    /// The key of `name`: lowercase, without a trailing dot.
    pub(crate) fn key(&self, name: &str) -> NameKey {
        let name = name.trim_end_matches('.');
        let mut h = self.hasher.build_hasher();
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            h.write(name.to_ascii_lowercase().as_bytes());
        } else {
            // A URL's host is already lowercase: hashed as it is.
            h.write(name.as_bytes());
        }
        NameKey(h.finish())
    }

    /// The address a new connection to `name` goes to, among `resolved`
    /// (what the name resolves to now): the first of [`ReplicaTable::order`],
    /// a due probe marked as under way. `None` when `resolved` is empty.
    pub fn pick(&self, name: &str, resolved: &[SocketAddr], now: Instant) -> Option<SocketAddr> {
        self.order_at(self.key(name), resolved, now, true)
            .0
            .first()
            .copied()
    }

    /// Every address of `name` among `resolved`, in the order a new
    /// connection should try them: a due probe first (marked as under way),
    /// then the healthy addresses from the next in turn, then those out of
    /// service, the fewest failures in a row first. Empty when `resolved`
    /// is.
    pub fn order(&self, name: &str, resolved: &[SocketAddr], now: Instant) -> Vec<SocketAddr> {
        self.order_at(self.key(name), resolved, now, true).0
    }

    /// [`ReplicaTable::order`] by key; a probe is chosen only when
    /// `may_probe` (someone will end it), and its number is returned.
    pub(crate) fn order_at(
        &self,
        k: NameKey,
        resolved: &[SocketAddr],
        now: Instant,
        may_probe: bool,
    ) -> (Vec<SocketAddr>, Option<u64>) {
        if resolved.is_empty() {
            return (Vec::new(), None);
        }
        let mut names = lock(&self.names);
        if !names.contains_key(&k) && names.len() >= MAX_NAMES {
            let idlest = names.iter().min_by_key(|(_, n)| n.used).map(|(k, _)| *k);
            if let Some(idlest) = idlest {
                if let Some(gone) = names.remove(&idlest) {
                    let struck = gone.addrs.iter().filter(|a| a.strikes > 0).count();
                    self.struck.fetch_sub(struck, Ordering::Relaxed);
                }
            }
        }
        let entry = names.entry(k).or_insert_with(|| Name {
            addrs: Vec::new(),
            cursor: 0,
            used: now,
        });
        entry.used = now;
        // What the name resolves to now, on this port: known addresses
        // keep their record, new ones start healthy, gone ones are
        // forgotten. Other ports' addresses are another look-up's.
        let before = entry.addrs.iter().filter(|a| a.strikes > 0).count();
        entry.addrs.retain(|a| {
            resolved.contains(&a.addr) || resolved.iter().all(|r| r.port() != a.addr.port())
        });
        let after = entry.addrs.iter().filter(|a| a.strikes > 0).count();
        self.struck.fetch_sub(before - after, Ordering::Relaxed);
        for addr in resolved {
            if entry.addrs.len() >= MAX_ADDRS {
                break;
            }
            if !entry.addrs.iter().any(|a| a.addr == *addr) {
                entry.addrs.push(Addr::new(*addr));
            }
        }
        let addrs = &mut entry.addrs;
        let mut order = Vec::with_capacity(resolved.len().min(MAX_ADDRS));
        let mut probe = None;
        // A probe: an ejected address whose time is up, not already probed.
        if may_probe {
            if let Some(a) = addrs.iter_mut().find(|a| {
                resolved.contains(&a.addr)
                    && !a.probing(now)
                    && a.strikes > 0
                    && a.ejected_until.is_some_and(|u| u <= now)
            }) {
                let id = self.probes.fetch_add(1, Ordering::Relaxed);
                a.probing = Some((id, now));
                order.push(a.addr);
                probe = Some(id);
            }
        }
        let n = addrs.len();
        let start = entry.cursor % n;
        let turn = (0..n).map(|i| (start + i) % n);
        let wanted = |a: &Addr| resolved.contains(&a.addr) && !order.contains(&a.addr);
        let healthy: Vec<usize> = turn
            .clone()
            .filter(|&i| addrs[i].healthy(now) && wanted(&addrs[i]))
            .collect();
        let mut rest: Vec<usize> = turn
            .filter(|&i| !addrs[i].healthy(now) && wanted(&addrs[i]))
            .collect();
        rest.sort_by_key(|&i| (addrs[i].ejected(now), addrs[i].strikes));
        // The next connection starts after the first address chosen in
        // turn, so that connections spread.
        if let Some(&first) = healthy.first().or(rest.first()) {
            if order.is_empty() {
                entry.cursor = first + 1;
            }
        }
        order.extend(healthy.iter().chain(&rest).map(|&i| addrs[i].addr));
        (order, probe)
    }

    /// The probe numbered `probe` of `addr` of `name` ended with no verdict
    /// on the address (its attempt was dropped, lost a hedge race, or was
    /// answered by another address): it is due for another probe
    /// [`FIRST_EJECTION`] after `now`. A probe already ended, or another
    /// probe since, is left alone.
    pub(crate) fn probe_ended_at(&self, name: NameKey, addr: SocketAddr, probe: u64, now: Instant) {
        let mut names = lock(&self.names);
        let Some(a) = names
            .get_mut(&name)
            .and_then(|n| n.addrs.iter_mut().find(|a| a.addr == addr))
        else {
            return;
        };
        if a.probing.is_some_and(|(id, _)| id == probe) {
            a.probing = None;
            a.ejected_until = now.checked_add(FIRST_EJECTION);
        }
    }

    /// A failure attributed to `addr` of `name` at `now`: it is ejected,
    /// unless no other address of the name would be left in service.
    pub fn failed(&self, name: &str, addr: SocketAddr, now: Instant) {
        self.failed_at(self.key(name), addr, now);
    }

    pub(crate) fn failed_at(&self, name: NameKey, addr: SocketAddr, now: Instant) {
        let mut names = lock(&self.names);
        let Some(entry) = names.get_mut(&name) else {
            return;
        };
        let others_in_service = entry
            .addrs
            .iter()
            .filter(|a| a.addr != addr && !a.ejected(now))
            .count();
        let Some(a) = entry.addrs.iter_mut().find(|a| a.addr == addr) else {
            return;
        };
        if a.strikes == 0 {
            self.struck.fetch_add(1, Ordering::Relaxed);
        }
        a.strikes = a.strikes.saturating_add(1);
        a.probing = None;
        if others_in_service > 0 {
            let doubling = a.strikes.saturating_sub(1).min(16);
            let ejection = FIRST_EJECTION
                .saturating_mul(1 << doubling)
                .min(MAX_EJECTION);
            a.ejected_until = now.checked_add(ejection);
        } else {
            a.ejected_until = None;
        }
    }

    /// A success from `addr` of `name`: it is healthy again.
    pub fn succeeded(&self, name: &str, addr: SocketAddr) {
        self.succeeded_at(self.key(name), addr);
    }

    pub(crate) fn succeeded_at(&self, name: NameKey, addr: SocketAddr) {
        if self.struck.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut names = lock(&self.names);
        let Some(entry) = names.get_mut(&name) else {
            return;
        };
        if let Some(a) = entry.addrs.iter_mut().find(|a| a.addr == addr) {
            if a.strikes > 0 || a.probing.is_some() {
                if a.strikes > 0 {
                    self.struck.fetch_sub(1, Ordering::Relaxed);
                }
                *a = Addr::new(addr);
            }
        }
    }

    /// Whether `addr` is one of `name`'s addresses and another of them is
    /// healthy at `now` (in service, no failure since its last success):
    /// then a failure of `addr` is that replica's, and the next attempt
    /// goes elsewhere.
    pub fn healthy_besides(&self, name: &str, addr: SocketAddr, now: Instant) -> bool {
        self.healthy_besides_at(self.key(name), addr, now)
    }

    pub(crate) fn healthy_besides_at(&self, name: NameKey, addr: SocketAddr, now: Instant) -> bool {
        // An address not of this name (the answer of a redirect to another
        // host) says nothing of this name's replicas.
        lock(&self.names).get(&name).is_some_and(|n| {
            n.addrs.iter().any(|a| a.addr == addr)
                && n.addrs.iter().any(|a| a.addr != addr && a.healthy(now))
        })
    }

    /// Whether any address of `name` is ejected or being probed at `now`:
    /// then connections to it are not kept alive, so that no pooled
    /// connection leads back to the address that failed.
    pub fn degraded(&self, name: &str, now: Instant) -> bool {
        self.degraded_at(self.key(name), now)
    }

    pub(crate) fn degraded_at(&self, name: NameKey, now: Instant) -> bool {
        // Out of service implies a failure since the last success.
        if self.struck.load(Ordering::Relaxed) == 0 {
            return false;
        }
        lock(&self.names)
            .get(&name)
            .is_some_and(|n| n.addrs.iter().any(|a| a.strikes > 0 || a.ejected(now)))
    }

    /// Names kept now (at most 1 024, the idlest dropped first).
    pub fn len(&self) -> usize {
        lock(&self.names).len()
    }

    /// Whether no name is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
