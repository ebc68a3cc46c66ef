//! What only the Redis store has: it refuses a server that can lose keys
//! unless told otherwise, its epochs keep going up when the server's clock
//! goes back, its key prefix is checked, and its claims start its sweeps.
mod support;

use std::time::Duration;

use support::{redis_records, redis_store, redis_url, unique, Harness};
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, RedisStore};

fn claim<'a>(key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        scope: "s",
        key,
        fingerprint: Fingerprint([1; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(60),
    }
}

/// The machine's Redis keeps nothing on disk (`appendonly no`): `connect`
/// refuses it and says why and what to do; `connect_volatile` takes it.
#[tokio::test]
async fn a_redis_that_can_lose_keys_is_refused_by_default() {
    redis_store(&unique("tr")).await; // reachable at all
    let mut conn = redis_store(&unique("tr")).await.connection();
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = RedisStore::connect(&redis_url()).await;
    if aof.get(1).map(String::as_str) == Some("no") {
        let err = refused.expect_err("a Redis without AOF was accepted");
        let text = err.to_string();
        assert!(text.contains("appendonly"), "{text}");
        assert!(text.contains("connect_volatile"), "{text}");
        assert!(!err.is_transient(), "retrying cannot help: {text}");
    }
    assert!(RedisStore::connect_volatile(&redis_url()).await.is_ok());
}

/// Epochs keep going up when the server's clock goes back: the store's
/// high-water mark, set here far ahead of the clock (as earlier claims
/// under a clock since set back would have left it), is exceeded.
#[tokio::test]
async fn epochs_go_up_when_the_clock_goes_back() {
    let store = redis_store(&unique("tr")).await;
    let ahead: u64 = 9_000_000_000_000_000; // year 2255, in microseconds
    let _: () = redis::cmd("SET")
        .arg(format!("{}:epoch", store.prefix()))
        .arg(ahead)
        .query_async(&mut store.connection())
        .await
        .unwrap();
    let ClaimOutcome::Claimed { epoch, .. } = store.claim(claim("k")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    assert!(epoch > ahead, "{epoch} after {ahead}");
}

#[tokio::test]
async fn a_prefix_must_be_a_plain_name() {
    let store = redis_store(&unique("tr")).await;
    for bad in ["", "a:b", "a b", "a*", &"x".repeat(65)] {
        assert!(store.clone().with_prefix(bad).is_err(), "{bad:?}");
    }
    assert!(store.with_prefix("payments-v2.keys_1").is_ok());
}

/// A store left to sweep by itself: its claims start the sweeps, the first
/// marking an expired record in progress seen stale, a later one (a time
/// to live after the mark) deleting it. No `spawn_sweeper` needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_start_the_sweeps() {
    let h = Harness::redis().await;
    let cleanup = h.cleanup();
    let store = h.redis.clone().unwrap();
    assert!(matches!(
        store.claim(claim("old")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // Its owner is gone: expired, in progress, never extended.
    h.advance(Duration::from_secs(120)).await;
    let sweeping = store.clone().sweep_every(Some(Duration::from_millis(1)));
    for (step, key) in ["a", "b"].into_iter().enumerate() {
        // The next sweep is due a millisecond after the last.
        tokio::time::sleep(Duration::from_millis(5)).await;
        sweeping.claim(claim(key)).await.unwrap();
        if step == 0 {
            // Wait (bounded) for the task that claim started to mark it,
            // then let a time to live pass since the mark.
            for _ in 0..500 {
                if marked_stale(&store, "old").await {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(marked_stale(&store, "old").await, "no sweep marked it");
            assert_eq!(redis_records(&store).await, 2, "the first sweep only marks");
            h.advance(Duration::from_secs(120)).await;
        }
    }
    for _ in 0..500 {
        if redis_records(&store).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        redis_records(&store).await,
        2,
        "only the two live claims are left"
    );
    cleanup.run().await;
}

/// Whether a sweep or a claim marked `key`'s lease seen stale.
async fn marked_stale(store: &RedisStore, key: &str) -> bool {
    let marked: Option<String> = redis::cmd("HGET")
        .arg(store.record_key("s", key))
        .arg("stale")
        .query_async(&mut store.connection())
        .await
        .unwrap();
    marked.is_some_and(|m| m != "0")
}
