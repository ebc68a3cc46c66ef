//! A fallback a user depends on says so at `warn`, once per episode: the
//! lease pool that cannot open a connection (a role's `CONNECTION LIMIT`
//! taken by the application's pool) leaves the heartbeat to the main pool,
//! and says so once, not at every extension.
mod pg_fleet;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_fleet::{app_pool, role, store_on};
use support::{app, spawn_waiting};
use tower_idempotency::IdempotencyLayer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Counts the events about the lease pool: at `warn`, and at any level.
#[derive(Default)]
struct LeasePoolEvents {
    warn: AtomicUsize,
    all: AtomicUsize,
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

struct Counting(Arc<LeasePoolEvents>);

impl Subscriber for Counting {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains("lease pool") {
            self.0.all.fetch_add(1, Ordering::SeqCst);
            if *event.metadata().level() == Level::WARN {
                self.0.warn.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

// One thread: every task of the test, the store's included, logs to the
// subscriber set here.
#[tokio::test]
async fn the_lease_pools_fallback_warns_once_per_episode() {
    let events = Arc::new(LeasePoolEvents::default());
    let _guard = tracing::subscriber::set_default(Counting(events.clone()));
    let url = role("tower_idem_limit_one", "CONNECTION LIMIT 1", &[]).await;
    // The application's pool takes the role's only connection.
    let store = store_on(app_pool(&url, 1).await).await;
    let layer = IdempotencyLayer::builder(store.clone())
        .heartbeat_every(Duration::from_millis(20))
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let started = state.started.notified();
    let running = spawn_waiting(&router, "k", "a");
    started.await;
    // Three extensions the lease pool could not make (an upper bound on
    // the wait, not a timing check).
    let three = async {
        while events.all.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), three)
        .await
        .expect("the heartbeat ran");
    assert_eq!(
        events.warn.load(Ordering::SeqCst),
        1,
        "one warning an episode"
    );
    state.proceed.notify_one();
    assert_eq!(running.await.unwrap().status, 201);
    let drop = format!("DROP TABLE {}", store.table());
    sqlx::raw_sql(&drop).execute(store.pool()).await.unwrap();
}
