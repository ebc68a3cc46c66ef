//! A claim repeated with its own lease token (after its answer was lost
//! with its connection) is claimed; another token is not.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

use crate::store::{ClaimOutcome, ClaimRequest, Fingerprint, LeaseToken};

use super::PostgresStore;

#[tokio::test]
async fn a_claim_finding_its_own_token_is_claimed_again() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let table = format!("tower_idem_own_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::new(pool).with_table(&table).unwrap();
    store.migrate().await.unwrap();
    let req = ClaimRequest {
        scope: "s",
        key: "k",
        fingerprint: Fingerprint([1; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(3600),
    };
    let lease = LeaseToken::new_random();
    let mut conn = store.pool().acquire().await.unwrap();
    let claimed = |outcome: &ClaimOutcome| match outcome {
        ClaimOutcome::Claimed { lease: got, epoch } => (*got == lease).then_some(*epoch),
        _ => None,
    };
    let (first, _) = store.claim_on(&mut conn, req, lease).await.unwrap();
    let (again, _) = store.claim_on(&mut conn, req, lease).await.unwrap();
    let first = claimed(&first).expect("claimed");
    let again = claimed(&again).expect("claimed again, with its own token");
    assert!(again > first, "epochs only go up");
    let (other, _) = store
        .claim_on(&mut conn, req, LeaseToken::new_random())
        .await
        .unwrap();
    assert!(
        matches!(other, ClaimOutcome::InProgress { .. }),
        "{other:?}"
    );
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&mut *conn)
        .await
        .unwrap();
}
