//! The store lives inside the connection budget the user sized: behind a
//! PgBouncer whose pool is the application's pool, or under a role's
//! `CONNECTION LIMIT` of that size, the application's own pool still opens
//! every connection it was configured to open, and every payment is
//! answered.
mod pg_fleet;
mod support;

use std::time::Duration;

use pg_fleet::{app_pool, keyed_then_opens, role, store_on, Payments, PgBouncer};

/// The application's pool, and the pooler's (or the role's) budget.
const POOL: u32 = 4;

/// An upper bound on what each test waits for, not a timing check.
const WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_in_session_mode_the_app_pool_opens_all_its_connections() {
    let bouncer = PgBouncer::start("session", POOL);
    let store = store_on(app_pool(&bouncer.url(), POOL).await).await;
    // A keyed request in each mode, then the application opens every
    // connection its pool was sized for.
    assert!(
        keyed_then_opens(&store, POOL, WITHIN).await,
        "the app pool waited for the store's connections"
    );
    let payments = Payments::new(&store, Duration::ZERO).await;
    assert_eq!(payments.finish().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_in_session_mode_every_payment_is_answered() {
    let bouncer = PgBouncer::start("session", POOL);
    let store = store_on(app_pool(&bouncer.url(), POOL).await).await;
    let payments = Payments::new(&store, Duration::ZERO).await;
    let created = payments.run(16, 2, WITHIN).await;
    assert_eq!(created, 32, "payments answered 201 within {WITHIN:?}");
    assert!(
        keyed_then_opens(&store, POOL, WITHIN).await,
        "the app pool waited for the store's connections"
    );
    assert_eq!(payments.finish().await, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_roles_connection_limit_every_payment_is_answered() {
    let url = role(
        "tower_idem_limited",
        &format!("CONNECTION LIMIT {POOL}"),
        &[],
    )
    .await;
    let store = store_on(app_pool(&url, POOL).await).await;
    // A handler that works 300 ms in its transaction.
    let payments = Payments::new(&store, Duration::from_millis(300)).await;
    let created = payments.run(16, 2, WITHIN).await;
    assert_eq!(created, 32, "payments answered 201 within {WITHIN:?}");
    assert!(
        keyed_then_opens(&store, POOL, WITHIN).await,
        "the app pool waited for the store's connections"
    );
    assert_eq!(payments.finish().await, 32);
}
