//! The cost of one retry decision: a delay with each jitter mode, an
//! admission (token bucket and adaptive), each under contention, and a whole
//! retry turn of the engine (classify → delay → deadline → admission) with a
//! sleeper that returns at once; and the `middleware` group: a whole `get().send()` through a
//! middleware chain ending in a canned `200 ok` (no socket), to price each
//! retry middleware's success path alone, for a GET and a keyed POST; and
//! the `key_generation` group: what a fresh key costs.
//!
//! `cargo bench --bench decision`

mod support;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::{SmallRng, StdRng};
use rand::SeedableRng;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, Partition, RetryAdmission, RetryKind,
    RetryRequest, TokenBucket, TokenBucketConfig,
};
use reqwest_safe_retry::keys::KeyGenerator;
use reqwest_safe_retry::retry::{retry, Backoff, Outcome};
use reqwest_safe_retry::time::{BoxFuture, Sleeper};
use reqwest_safe_retry::{IdempotencyKey, Jitter, RetryMiddleware, RetryPolicy};
use support::{block_on, without_deadline, Canned};

fn backoff(jitter: Jitter) -> Backoff {
    Backoff::from_parts(
        Duration::from_millis(100),
        Duration::from_secs(10),
        2.0,
        jitter,
    )
    .expect("valid backoff")
}

const MODES: [Jitter; 5] = [
    Jitter::None,
    Jitter::Full,
    Jitter::Equal,
    Jitter::Decorrelated,
    Jitter::Proportional(0.2),
];

fn delays(c: &mut Criterion) {
    let mut group = c.benchmark_group("delay");
    for jitter in MODES {
        let b = backoff(jitter);
        // SmallRng is what a policy uses when not seeded.
        let mut rng = SmallRng::seed_from_u64(7);
        group.bench_function(BenchmarkId::new("small_rng", jitter.name()), |bench| {
            let mut n = 0u32;
            let mut prev = b.base();
            bench.iter(|| {
                n = (n + 1) & 15; // retries 0..15: below and at the cap
                prev = b.delay(black_box(n), prev, &mut rng);
                black_box(prev)
            });
        });
    }
    // StdRng (ChaCha12) is what `.seed(n)` installs.
    let b = backoff(Jitter::Full);
    let mut rng = StdRng::seed_from_u64(7);
    group.bench_function(BenchmarkId::new("std_rng", "full"), |bench| {
        let mut n = 0u32;
        bench.iter(|| {
            n = (n + 1) & 15;
            black_box(b.delay(black_box(n), b.base(), &mut rng))
        });
    });
    group.bench_function("ceiling", |bench| {
        let mut n = 0u32;
        bench.iter(|| {
            n = (n + 1) & 15;
            black_box(b.ceiling(black_box(n)))
        });
    });
    group.finish();
}

/// A bucket so large that no benchmark run empties it, or an empty one.
fn bucket(capacity: f64) -> TokenBucket {
    TokenBucket::new(TokenBucketConfig {
        capacity,
        ..TokenBucketConfig::default()
    })
    .expect("valid budget")
}

fn adaptive(capacity: f64) -> AdaptiveAdmission {
    AdaptiveAdmission::new(AdaptiveConfig {
        capacity,
        ..AdaptiveConfig::default()
    })
    .expect("valid admission")
}

const RETRY: RetryRequest = RetryRequest::new(RetryKind::Transient, Duration::ZERO);

fn admitted(a: &dyn RetryAdmission, now: Instant) -> bool {
    matches!(a.admit(Partition::SINGLE, RETRY, now), Admission::Admit(_))
}

fn budget(c: &mut Criterion) {
    let mut group = c.benchmark_group("budget");
    let now = Instant::now();
    type Pair = (
        &'static str,
        Box<dyn RetryAdmission>,
        Box<dyn RetryAdmission>,
    );
    let strategies: [Pair; 2] = [
        (
            "token_bucket",
            Box::new(bucket(1e11)),
            Box::new(bucket(0.001)),
        ),
        (
            "adaptive",
            Box::new(adaptive(1e11)),
            Box::new(adaptive(0.001)),
        ),
    ];
    for (name, full, empty) in &strategies {
        group.bench_function(BenchmarkId::new("admit_ok", name), |b| {
            b.iter(|| black_box(admitted(full.as_ref(), now)))
        });
        // Drained: the token bucket refuses, the adaptive admission answers
        // "wait" (after one probe).
        admitted(empty.as_ref(), now);
        admitted(empty.as_ref(), now);
        group.bench_function(BenchmarkId::new("admit_empty", name), |b| {
            b.iter(|| black_box(admitted(empty.as_ref(), now)))
        });
        group.bench_function(BenchmarkId::new("first_attempt", name), |b| {
            b.iter(|| full.first_attempt(Partition::SINGLE, now))
        });
    }
    group.finish();
}

/// `threads` threads each do `iters` (admit + first attempt) pairs on one
/// shared admission; the time is the wall time of the slowest, so
/// criterion's "time per iteration" is the time per pair per thread.
fn contended(admission: &Arc<dyn RetryAdmission>, threads: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(threads + 1);
    let now = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let admission = admission.clone();
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for _ in 0..iters {
                    black_box(admitted(admission.as_ref(), now));
                    admission.first_attempt(Partition::SINGLE, now);
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Leaving the scope joins every thread.
        start
    })
    .elapsed()
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("budget_contention");
    let strategies: [(&str, Arc<dyn RetryAdmission>); 2] = [
        ("token_bucket", Arc::new(bucket(1e11))),
        ("adaptive", Arc::new(adaptive(1e11))),
    ];
    for (name, admission) in &strategies {
        for threads in [1usize, 2, 4] {
            // Elements = pairs done by all threads together.
            group.throughput(Throughput::Elements(threads as u64));
            group.bench_function(
                BenchmarkId::new(format!("admit+first_attempt/{name}"), threads),
                |b| b.iter_custom(|iters| contended(admission, threads, iters)),
            );
        }
    }
    group.finish();
}

/// A sleeper that does not sleep.
struct NoSleep;

impl Sleeper for NoSleep {
    fn sleep(&self, _duration: Duration) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }
}

fn engine(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    for (name, budget) in [("no_budget", false), ("budget", true)] {
        let builder = RetryPolicy::builder()
            .sleeper(NoSleep)
            .max_attempts(u32::MAX)
            .no_deadline();
        let builder = if budget {
            builder.adaptive_admission(AdaptiveConfig {
                capacity: 1e11,
                ..AdaptiveConfig::default()
            })
        } else {
            builder.no_budget()
        };
        let policy = builder.build().expect("valid policy");
        // One logical operation with one success: the success path.
        group.bench_function(BenchmarkId::new("success_first_try", name), |b| {
            b.iter(|| block_on(retry(&policy, |_| async { Outcome::success(1u8) })))
        });
        // One transient failure, one retry decision, one success.
        group.bench_function(BenchmarkId::new("one_retry", name), |b| {
            b.iter(|| {
                block_on(retry(&policy, |ctx| async move {
                    if ctx.attempt() == 1 {
                        Outcome::transient(0u8)
                    } else {
                        Outcome::success(1u8)
                    }
                }))
            })
        });
    }
    group.finish();
}

fn middleware(c: &mut Criterion) {
    let mut group = c.benchmark_group("middleware");
    let canned = || ClientBuilder::new(reqwest::Client::new());
    let chains: [(&str, ClientWithMiddleware); 4] = [
        ("canned_only", canned().with(Canned).build()),
        (
            "retry_middleware",
            canned()
                .with(RetryMiddleware::new(RetryPolicy::default()))
                .with(Canned)
                .build(),
        ),
        (
            "retry_middleware_no_deadline",
            canned().with(without_deadline()).with(Canned).build(),
        ),
        (
            "reqwest_retry_transient",
            canned()
                .with(RetryTransientMiddleware::new_with_policy(
                    ExponentialBackoff::builder().build_with_max_retries(2),
                ))
                .with(Canned)
                .build(),
        ),
    ];
    // Interleaved by chain: a GET (no key) and a POST (which
    // `RetryMiddleware` keys: key generation and the header included).
    for (name, client) in &chains {
        group.bench_function(BenchmarkId::new("get", name), |b| {
            b.iter(|| {
                let response = block_on(client.get("http://127.0.0.1:9/x").send()).expect("canned");
                black_box(response.status())
            })
        });
        group.bench_function(BenchmarkId::new("post", name), |b| {
            b.iter(|| {
                let response = block_on(client.post("http://127.0.0.1:9/x").body("{}").send())
                    .expect("canned");
                black_box(response.status())
            })
        });
    }
    group.finish();
}

/// A fresh key as the crate makes it (one `getrandom` system call, then
/// its text) against `uuid`'s own `new_v4` formatted by `uuid`.
fn key_generation(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_generation");
    group.bench_function("idempotency_key_generate_v4", |b| {
        b.iter(|| black_box(IdempotencyKey::generate(KeyGenerator::UuidV4)))
    });
    group.bench_function("uuid_new_v4_syscall", |b| {
        b.iter(|| black_box(uuid::Uuid::new_v4().hyphenated().to_string()))
    });
    group.bench_function("idempotency_key_generate_v7", |b| {
        b.iter(|| black_box(IdempotencyKey::generate(KeyGenerator::UuidV7)))
    });
    group.finish();
}

criterion_group!(
    benches,
    delays,
    budget,
    contention,
    engine,
    middleware,
    key_generation
);
criterion_main!(benches);
