//! What only the Redis store has: it refuses a server that can lose keys
//! unless told otherwise, its epochs keep going up when the server's clock
//! goes back, its key prefix is checked, its claims start its sweeps, it
//! reads the records an earlier version wrote, and Redis expires a
//! completed record, never one in progress.
mod support;

use std::time::Duration;

use support::{drop_redis_keys, redis_records, redis_store, redis_url, unique, Harness};
use tower_idempotency::{
    ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken, RedisStore,
    StoredResponse,
};

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

/// The server's clock in milliseconds, as the scripts read it.
async fn redis_now_ms(store: &RedisStore) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut store.connection())
        .await
        .unwrap();
    secs * 1000 + micros / 1000
}

/// Writes `fields` into the record of `key` by hand, as an earlier
/// version of the store would have.
async fn write_record(store: &RedisStore, key: &str, fields: &[(&str, Vec<u8>)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(store.record_key("s", key));
    for (field, value) in fields {
        cmd.arg(*field).arg(value.as_slice());
    }
    let _: () = cmd.query_async(&mut store.connection()).await.unwrap();
}

/// How long Redis keeps `key`'s record (ms; -1 for ever, -2 gone).
async fn pttl(store: &RedisStore, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(store.record_key("s", key))
        .query_async(&mut store.connection())
        .await
        .unwrap()
}

/// A record in progress written by the previous layout (its claim wrote
/// `stale` 0; completing then deleted `lease`, `locked` and `stale`, which
/// now stay) is completed and replayed; a completed one of that layout is
/// replayed: a rolling upgrade reads what the old version wrote.
#[tokio::test]
async fn records_of_the_previous_layout_are_read() {
    let store = redis_store(&unique("tr")).await;
    let now = redis_now_ms(&store).await;
    let lease = LeaseToken::new_random();
    let text = |n: u64| n.to_string().into_bytes();
    write_record(
        &store,
        "running",
        &[
            ("fp", vec![1; 32]),
            ("st", b"p".to_vec()),
            ("lease", lease.to_string().into_bytes()),
            ("locked", text(now)),
            ("stale", b"0".to_vec()),
            ("exp", text(now + 60_000)),
            ("ttl", b"60000".to_vec()),
            ("epoch", text(now * 1000)),
        ],
    )
    .await;
    let response = StoredResponse::new(201, vec![("x-a".into(), "1".into())], &b"paid"[..]);
    assert!(store
        .complete("s", "running", lease, &response)
        .await
        .unwrap());
    let replay = ClaimOutcome::Completed {
        response: response.clone(),
        fingerprint_matches: true,
    };
    assert_eq!(store.claim(claim("running")).await.unwrap(), replay);

    write_record(
        &store,
        "done",
        &[
            ("fp", vec![1; 32]),
            ("st", b"c".to_vec()),
            ("exp", text(now + 60_000)),
            ("ttl", b"60000".to_vec()),
            ("epoch", text(now * 1000)),
            ("code", b"201".to_vec()),
            ("headers", br#"[["x-a","1"]]"#.to_vec()),
            ("body", b"paid".to_vec()),
        ],
    )
    .await;
    assert_eq!(store.claim(claim("done")).await.unwrap(), replay);
    drop_redis_keys(&store).await;
}

/// A completed record is kept by Redis until the expiry its claim set (a
/// completion reads no clock of its own) and no longer: completed after
/// that expiry, it is gone at once, and the key is new again.
#[tokio::test]
async fn a_completed_record_expires_in_redis_at_its_records_expiry() {
    let h = Harness::redis().await;
    let cleanup = h.cleanup();
    let store = h.redis.clone().unwrap();
    let response = StoredResponse::new(201, vec![], &b"paid"[..]);
    let ClaimOutcome::Claimed { lease, .. } = store.claim(claim("k")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    h.advance(Duration::from_secs(20)).await;
    assert!(store.complete("s", "k", lease, &response).await.unwrap());
    let left = pttl(&store, "k").await;
    assert!((35_000..=40_000).contains(&left), "kept {left} ms");

    let ClaimOutcome::Claimed { lease, .. } = store.claim(claim("late")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    h.advance(Duration::from_secs(61)).await;
    assert!(store.complete("s", "late", lease, &response).await.unwrap());
    assert_eq!(pttl(&store, "late").await, -2, "kept past its expiry");
    assert!(matches!(
        store.claim(claim("late")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    cleanup.run().await;
}

/// A claim that takes over a record Redis still holds with an expiry (a
/// completed one past its own, kept by the previous layout a millisecond
/// longer) leaves nothing of it: no response fields, and no expiry in
/// Redis, since a record in progress is only ever cut off by the sweep.
#[tokio::test]
async fn a_claim_taking_over_a_record_redis_holds_clears_its_expiry() {
    let store = redis_store(&unique("tr")).await;
    let now = redis_now_ms(&store).await;
    write_record(
        &store,
        "k",
        &[
            ("fp", vec![2; 32]),
            ("st", b"c".to_vec()),
            ("exp", (now - 1).to_string().into_bytes()),
            ("code", b"201".to_vec()),
            ("headers", b"[]".to_vec()),
            ("body", b"old".to_vec()),
        ],
    )
    .await;
    let _: () = redis::cmd("PEXPIRE")
        .arg(store.record_key("s", "k"))
        .arg(60_000)
        .query_async(&mut store.connection())
        .await
        .unwrap();
    assert!(matches!(
        store.claim(claim("k")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert_eq!(pttl(&store, "k").await, -1, "a record in progress expired");
    let body: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(store.record_key("s", "k"))
        .arg("body")
        .query_async(&mut store.connection())
        .await
        .unwrap();
    assert_eq!(body, None, "the last owner's response was kept");
    drop_redis_keys(&store).await;
}

/// The sweep's index holds a record while it is in progress, due at its
/// expiry (the sweep looks at nothing earlier), and no longer once it is
/// completed or released.
#[tokio::test]
async fn the_index_holds_a_record_in_progress_until_its_expiry() {
    let store = redis_store(&unique("tr")).await;
    let index = format!("{}:in_progress", store.prefix());
    let record = store.record_key("s", "k");
    let due = || async {
        let score: Option<u64> = redis::cmd("ZSCORE")
            .arg(&index)
            .arg(&record)
            .query_async(&mut store.connection())
            .await
            .unwrap();
        score
    };
    let ClaimOutcome::Claimed { lease, .. } = store.claim(claim("k")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    let exp: Option<u64> = redis::cmd("HGET")
        .arg(&record)
        .arg("exp")
        .query_async(&mut store.connection())
        .await
        .unwrap();
    assert!(exp.is_some());
    assert_eq!(due().await, exp, "due at its expiry");
    let response = StoredResponse::new(201, vec![], &b"paid"[..]);
    assert!(store.complete("s", "k", lease, &response).await.unwrap());
    assert_eq!(due().await, None, "a completed record stays in the index");
    let _: () = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut store.connection())
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(claim("k")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    assert!(due().await.is_some());
    assert!(store.release("s", "k", lease).await.unwrap());
    assert_eq!(due().await, None, "a released record stays in the index");
    drop_redis_keys(&store).await;
}
