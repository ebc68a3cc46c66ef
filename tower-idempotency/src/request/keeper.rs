//! Keeping the leases of running handlers alive: one ticker per layer and
//! runtime instead of a timer per request.
//!
//! A request registers its lease when its handler starts and unregisters
//! it once its claim is settled (a slot in a sharded slab: a short lock, no
//! allocation once the slab has grown). Every `heartbeat_every` the ticker
//! starts one task per registered lease to extend it. Extensions are
//! independent: a store call that stalls holds back only its own lease
//! (whose next extension waits for it, as the per-request timer did), never
//! another one; an earlier keeper that extended leases one after another let
//! a lease lapse behind a stalled call, and a retry ran that handler twice
//! (`tests/stalled_extension.rs`).
//!
//! The ticker is a task of its own, so a handler that blocks its worker
//! thread keeps its lease: the ticker and the extensions run on another
//! worker (`tests/blocking_handler.rs`). Leases are extended on the runtime
//! that registered them (one ticker per runtime, so a runtime shutting down
//! takes only its own requests' leases along); a ticker with nothing to
//! extend stops, and the next registration starts it again.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::memory::KeyHash;
use crate::store::{Fingerprint, IdempotencyStore, LeaseToken};

/// `d` in nanoseconds, saturating below [`HELD_FOREVER`].
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).map_or(HELD_FOREVER - 1, |n| n.min(HELD_FOREVER - 1))
}

/// Slab shards: registrations on different threads rarely meet on a lock.
const SHARDS: usize = 8;

/// A claim this server holds: what extending its lease needs. Shared by
/// the request, the keeper and the handler's
/// [`IdempotencyContext`](crate::IdempotencyContext) (one allocation).
pub(crate) struct Kept {
    pub(crate) scope: Cow<'static, str>,
    pub(crate) key: String,
    pub(crate) lease: LeaseToken,
    /// The fingerprint of the request that claimed it.
    pub(crate) fingerprint: Fingerprint,
    /// The claim's fencing epoch.
    pub(crate) epoch: u64,
    /// When the claim was sent to the store: `held_for` counts from here.
    claimed_at: Instant,
    /// The lock timeout the claim was made with.
    lock_timeout: Duration,
    /// Nanoseconds after `claimed_at` until which the lease is surely
    /// ours: a lock timeout after the sending of the last claim or
    /// extension the store accepted. [`HELD_FOREVER`]: no lease to lose
    /// (the transactional mode's row lock); 0: lost.
    held_for: AtomicU64,
    /// Woken when the store says the lease is no longer ours.
    lost_now: Notify,
    /// An extension is under way: the next tick leaves this lease alone.
    extending: AtomicBool,
    /// The store said the lease is no longer ours: extending stops.
    lost: AtomicBool,
    /// The handler completed the key in its own transaction.
    completed_in_tx: AtomicBool,
    /// ... and that transaction committed: the layer has nothing to store.
    committed_by_handler: AtomicBool,
    /// The key's hashes in the layer's `MemoryStore`, from the claim: the
    /// completion does not hash the key again (unused with other stores).
    pub(crate) memory_hash: KeyHash,
    /// The layer stores the response and commits in a transaction of its
    /// own (PostgreSQL's transactional mode): the handler must not.
    pub(crate) layer_commits: bool,
}

/// [`Kept::held_for`] of a claim that has no lease to lose.
const HELD_FOREVER: u64 = u64::MAX;

impl Kept {
    /// A claim held for as long as the request runs (the transactional
    /// mode's, whose row lock is its fence, or a context made by hand).
    pub(crate) fn new(scope: Cow<'static, str>, key: String, lease: LeaseToken) -> Self {
        Self {
            scope,
            key,
            lease,
            fingerprint: Fingerprint([0; 32]),
            epoch: 0,
            claimed_at: Instant::now(),
            lock_timeout: Duration::ZERO,
            held_for: AtomicU64::new(HELD_FOREVER),
            lost_now: Notify::new(),
            extending: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            completed_in_tx: AtomicBool::new(false),
            committed_by_handler: AtomicBool::new(false),
            memory_hash: KeyHash::default(),
            layer_commits: false,
        }
    }

    /// The same, claimed by a request with `fingerprint`.
    pub(crate) fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// The same, with the claim's fencing `epoch`.
    pub(crate) fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    /// The same, a lease claimed with a request sent at `claimed_at` under
    /// `lock_timeout`: held for a lock timeout from then, and for a lock
    /// timeout after each extension the store accepts.
    pub(crate) fn leased(mut self, claimed_at: Instant, lock_timeout: Duration) -> Self {
        self.claimed_at = claimed_at;
        self.lock_timeout = lock_timeout;
        self.held_for = AtomicU64::new(nanos(lock_timeout));
        self
    }

    /// Until when the lease is surely ours; `None`: for as long as the
    /// request runs.
    pub(crate) fn held_until(&self) -> Option<Instant> {
        match self.held_for.load(Ordering::Acquire) {
            HELD_FOREVER => None,
            held => Some(self.claimed_at + Duration::from_nanos(held)),
        }
    }

    /// Whether the lease is surely ours now.
    pub(crate) fn still_held(&self) -> bool {
        self.held_until().is_none_or(|at| Instant::now() < at)
    }

    /// Resolves once the lease may be lost: a lock timeout after the last
    /// claim or extension the store accepted was sent, or when the store
    /// says it is lost. Never, for a claim with no lease to lose.
    pub(crate) async fn lost(&self) {
        loop {
            let told = self.lost_now.notified();
            tokio::pin!(told);
            // Registered before the check, so no telling is missed.
            told.as_mut().enable();
            if !self.still_held() {
                return;
            }
            match self.held_until() {
                // Looked at again when the deadline comes: an extension
                // may have moved it.
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = told => {}
                    }
                }
                None => told.await,
            }
        }
    }

    /// The store accepted an extension sent at `sent`: the lease is ours
    /// for a lock timeout from then. (Never after it was found lost: no
    /// extension starts then, and only one runs at a time.)
    fn renewed(&self, sent: Instant) {
        let held = nanos(sent.saturating_duration_since(self.claimed_at) + self.lock_timeout);
        let _ = self
            .held_for
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != HELD_FOREVER && held > now).then_some(held)
            });
    }

    /// The store said the lease is no longer ours.
    fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
        if self.held_for.load(Ordering::Acquire) != HELD_FOREVER {
            self.held_for.store(0, Ordering::Release);
        }
        self.lost_now.notify_waiters();
    }

    /// Notes that the handler completed the key in its own transaction, so
    /// the layer's own completion finding the key completed is no lost
    /// lease.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only the transactional mode calls it
    pub(crate) fn note_completed_in_tx(&self) {
        self.completed_in_tx.store(true, Ordering::Release);
    }

    /// See [`Kept::note_completed_in_tx`].
    pub(crate) fn completed_in_tx(&self) -> bool {
        self.completed_in_tx.load(Ordering::Acquire)
    }

    /// Notes that the handler's transaction that completed the key has
    /// committed: the layer stores nothing and asks the store nothing.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only `commit_completed` calls it
    pub(crate) fn note_committed_by_handler(&self) {
        self.committed_by_handler.store(true, Ordering::Release);
    }

    /// See [`Kept::note_committed_by_handler`].
    pub(crate) fn committed_by_handler(&self) -> bool {
        self.committed_by_handler.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Shard {
    /// Each lease with the runtime that extends it.
    slots: Vec<Option<(Id, Arc<Kept>)>>,
    free: Vec<usize>,
}

/// The leases of one layer's running handlers, and their tickers.
pub(crate) struct LeaseKeeper {
    store: Arc<dyn IdempotencyStore>,
    every: Duration,
    shards: [Mutex<Shard>; SHARDS],
    /// The runtimes that have a ticker running.
    tickers: Mutex<Vec<Id>>,
}

impl fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseKeeper")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section below leaves its data consistent (no code in
    // them can panic half-way), so a poisoned lock is still good.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl LeaseKeeper {
    pub(crate) fn new(store: Arc<dyn IdempotencyStore>, every: Duration) -> Self {
        Self {
            store,
            every,
            shards: Default::default(),
            tickers: Mutex::new(Vec::new()),
        }
    }

    /// Extends `kept`'s lease every `heartbeat_every` (the first time at most
    /// that long from now) until the returned guard is dropped.
    ///
    /// `Keeping::started_ticker` says whether this started the runtime's
    /// ticker: the caller must then yield once before it runs a handler that
    /// may block its thread. A task spawned from a worker waits in that
    /// worker's LIFO slot, which no other worker steals from: a handler
    /// blocking the thread would hold the new ticker back, and with it every
    /// lease of the runtime. Once the ticker has been polled it waits on its
    /// timer, which any worker drives.
    pub(crate) fn keep(self: &Arc<Self>, kept: Arc<Kept>, runtime: &Handle) -> Keeping {
        let id = runtime.id();
        // Lease tokens are unique per claim: their low bits spread the
        // registrations over the shards without a shared counter.
        let shard = (kept.lease.0.as_u64_pair().1 as usize) % SHARDS;
        let slot = {
            let mut s = lock(&self.shards[shard]);
            match s.free.pop() {
                Some(slot) => {
                    s.slots[slot] = Some((id, kept));
                    slot
                }
                None => {
                    s.slots.push(Some((id, kept)));
                    s.slots.len() - 1
                }
            }
        };
        // After the insertion: a ticker that stops for want of leases
        // decides so under this lock, after looking at every shard, so
        // either it saw this lease or this finds it gone and starts one.
        let mut tickers = lock(&self.tickers);
        let started_ticker = !tickers.contains(&id);
        if started_ticker {
            tickers.push(id);
            drop(tickers);
            // The guard exists before the task is first polled: a ticker
            // dropped unpolled (its runtime shutting down) still takes its
            // runtime off the list.
            let ticking = Ticking {
                keeper: Arc::downgrade(self),
                runtime: id,
                stopped: false,
            };
            drop(runtime.spawn(tick(ticking, self.every)));
        }
        Keeping {
            keeper: self.clone(),
            shard,
            slot,
            started_ticker,
        }
    }

    /// Whether `runtime` has any lease registered.
    fn any_on(&self, runtime: Id) -> bool {
        self.shards.iter().any(|shard| {
            lock(shard)
                .slots
                .iter()
                .flatten()
                .any(|(id, _)| *id == runtime)
        })
    }

    /// Starts the extension of every lease of `runtime` that needs one;
    /// `false` (and the ticker is unregistered) when it has none.
    fn extend_due(&self, runtime: Id) -> bool {
        let mut due = Vec::new();
        let mut any = false;
        for shard in &self.shards {
            for (id, kept) in lock(shard).slots.iter().flatten() {
                if *id != runtime {
                    continue;
                }
                any = true;
                if !kept.lost.load(Ordering::Relaxed)
                    && !kept.extending.swap(true, Ordering::AcqRel)
                {
                    due.push(kept.clone());
                }
            }
        }
        if !any {
            let mut tickers = lock(&self.tickers);
            // Looked at again under the tickers' lock (see `keep`).
            if self.any_on(runtime) {
                return true;
            }
            tickers.retain(|id| *id != runtime);
            return false;
        }
        for kept in due {
            drop(tokio::spawn(extend(self.store.clone(), kept)));
        }
        true
    }
}

/// Registration of a lease; dropping it stops the extensions.
pub(crate) struct Keeping {
    keeper: Arc<LeaseKeeper>,
    shard: usize,
    slot: usize,
    /// This registration started its runtime's ticker (see
    /// [`LeaseKeeper::keep`]).
    pub(crate) started_ticker: bool,
}

impl Drop for Keeping {
    fn drop(&mut self) {
        let mut s = lock(&self.keeper.shards[self.shard]);
        if let Some(entry) = s.slots.get_mut(self.slot) {
            *entry = None;
            s.free.push(self.slot);
        }
    }
}

/// Unregisters a ticker whose task is dropped (its runtime shuts down)
/// rather than stopped, so the runtime's next lease starts a new one.
struct Ticking {
    keeper: Weak<LeaseKeeper>,
    runtime: Id,
    stopped: bool,
}

impl Drop for Ticking {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if let Some(keeper) = self.keeper.upgrade() {
            lock(&keeper.tickers).retain(|id| *id != self.runtime);
        }
    }
}

/// The ticker of one runtime: ends when the keeper is gone or has no lease
/// of this runtime left.
async fn tick(mut ticking: Ticking, every: Duration) {
    let runtime = ticking.runtime;
    loop {
        tokio::time::sleep(every).await;
        let Some(keeper) = ticking.keeper.upgrade() else {
            ticking.stopped = true;
            return;
        };
        if !keeper.extend_due(runtime) {
            ticking.stopped = true;
            return;
        }
    }
}

/// Extends one lease; stops extending it once the store says it is lost.
async fn extend(store: Arc<dyn IdempotencyStore>, kept: Arc<Kept>) {
    // However this ends (answered, panicked, or dropped with its runtime),
    // the next tick may try again.
    let _extending = Extending(&kept);
    // Before the request leaves: the store's lock time is no earlier.
    let sent = Instant::now();
    // Through the `dyn`: the blanket impl for `Arc` would box a second future.
    match (*store)
        .extend_lease(&kept.scope, &kept.key, kept.lease)
        .await
    {
        Ok(true) => kept.renewed(sent),
        Ok(false) => {
            // Completed by the handler in its own transaction, settled a
            // moment ago, or taken over after extensions kept failing.
            tracing::debug!(key = kept.key, "idempotency lease no longer held");
            kept.mark_lost();
        }
        Err(err) => {
            tracing::warn!(error = %err, key = kept.key, "extending an idempotency lease failed")
        }
    }
}

/// Clears [`Kept::extending`] when an extension ends, in whatever way.
struct Extending<'a>(&'a Kept);

impl Drop for Extending<'_> {
    fn drop(&mut self) {
        self.0.extending.store(false, Ordering::Release);
    }
}
