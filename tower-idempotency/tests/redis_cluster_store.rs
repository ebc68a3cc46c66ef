//! What only the cluster's layout has, on the binary's shared cluster:
//! records spread over many buckets and every master, the sweep walks
//! every bucket (an expired record in progress is marked, then deleted,
//! wherever it lives), and a key's epochs go up from its bucket's mark.
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::{cluster_records, Harness};
use tower_idempotency::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore};

fn claim<'a>(key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        scope: "s",
        key,
        fingerprint: Fingerprint([1; 32]),
        lock_timeout: Duration::from_secs(5),
        ttl: Duration::from_secs(60),
    }
}

/// The hash tag of a cluster record's key (`{b17}`).
fn tag(record: &str) -> &str {
    let start = record.find('{').expect("a hash tag");
    let end = record.find('}').expect("a hash tag");
    &record[start..=end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_walks_every_bucket_on_every_master() {
    let h = Harness::redis_cluster().await;
    let cleanup = h.cleanup();
    let (store, urls) = h.cluster.clone().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for key in &keys {
        assert!(matches!(
            store.claim(claim(key)).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
    let tags: BTreeSet<String> = keys
        .iter()
        .map(|k| tag(&store.record_key("s", k)).to_owned())
        .collect();
    assert!(tags.len() >= 20, "40 keys in {} buckets", tags.len());
    let on_masters = support::cluster::shared()
        .await
        .masters()
        .into_iter()
        .filter(|port| {
            support::cluster::cli(*port, &["keys", &format!("{}:*:r:*", store.prefix())])
                .lines()
                .any(|l| !l.is_empty())
        })
        .count();
    assert_eq!(on_masters, 3, "the records are on every master");

    // Every owner gone: expired, in progress. The first sweep marks them
    // all, the next (a time to live after the mark) deletes them all.
    h.advance(Duration::from_secs(120)).await;
    assert_eq!(
        store.sweep_expired().await.unwrap(),
        0,
        "the first sweep marks"
    );
    assert_eq!(cluster_records(&urls, store.prefix()).await, 40);
    h.advance(Duration::from_secs(120)).await;
    assert_eq!(store.sweep_expired().await.unwrap(), 40);
    assert_eq!(cluster_records(&urls, store.prefix()).await, 0);
    cleanup.run().await;
}

/// A key's epochs come from its bucket's mark: set far ahead of the
/// clock (as earlier claims under a clock since set back would have left
/// it), the next claim's epoch is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_go_up_from_the_buckets_mark_when_the_clock_goes_back() {
    let h = Harness::redis_cluster().await;
    let cleanup = h.cleanup();
    let (store, _) = h.cluster.clone().unwrap();
    let record = store.record_key("s", "k");
    let epoch_key = format!("{}:{}:epoch", store.prefix(), tag(&record));
    let ahead: u64 = 9_000_000_000_000_000; // year 2255, in microseconds
    let _: () = redis::cmd("SET")
        .arg(&epoch_key)
        .arg(ahead)
        .query_async(&mut store.connection())
        .await
        .unwrap();
    let ClaimOutcome::Claimed { epoch, .. } = store.claim(claim("k")).await.unwrap() else {
        panic!("a new key is claimed")
    };
    assert!(epoch > ahead, "{epoch} after {ahead}");
    cleanup.run().await;
}
