//! The `metrics` feature: what the policy counts reaches the installed
//! recorder, under the documented names, as it happens.
//!
//! The crate's tests build it with `metrics` (a dev-dependency on itself),
//! so the README's `cargo test` runs this. One test: the recorder is global
//! to the process.
#![cfg(feature = "metrics")]

use std::collections::HashMap;

use http::Extensions;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use reqwest_middleware::{Middleware, Next};
use reqwest_safe_retry::{
    metric_names as names, HedgeConfig, ManualClock, MetricsSnapshot, RetryMiddleware, RetryPolicy,
};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn every_counter_and_the_attempts_histogram_reach_the_recorder() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    reqwest_safe_retry::describe_metrics();

    // A POST that gets two 503s with Retry-After, then a 201; a GET that
    // gets a 404 (permanent, a final failure).
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(7)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy.clone()))
        .build();
    let paid = client.post(server.uri()).body("{}").send().await.unwrap();
    assert_eq!(paid.status(), 201);
    let missing = client.get(server.uri()).send().await.unwrap();
    assert_eq!(missing.status(), 404);

    // A second policy, hedging: its second GET's first copy never answers,
    // the hedge (sent at once: the manual clock's sleeps end at once) does.
    let hedging = RetryPolicy::builder()
        .manual_clock(&clock)
        .hedge(HedgeConfig {
            min_samples: 1,
            max_extra_load: 1.0,
            ..HedgeConfig::default()
        })
        .build()
        .unwrap();
    let stalls = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(hedging.clone()))
        .with(SecondNeverAnswers::default())
        .build();
    for _ in 0..2 {
        let r = stalls.get("http://stalls.test/").send().await.unwrap();
        assert_eq!(r.status(), 200);
    }

    let published: HashMap<String, (MetricKind, bool, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _unit, description, value)| {
            (
                key.key().name().to_owned(),
                (key.kind(), description.is_some(), value),
            )
        })
        .collect();
    let (own, hedged) = (policy.metrics().snapshot(), hedging.metrics().snapshot());
    assert_eq!((hedged.hedges, hedged.hedge_wins), (1, 1));
    let counter = |name: &str| match published.get(name) {
        Some((MetricKind::Counter, described, DebugValue::Counter(n))) => {
            assert!(described, "{name} has a description");
            *n
        }
        None => 0,
        other => panic!("{name}: {other:?}"),
    };
    // Each published counter is the snapshot's field of the same name,
    // summed over the two policies.
    let both = |field: fn(&MetricsSnapshot) -> u64| field(&own) + field(&hedged);
    for (name, expected) in [
        (names::CALLS, both(|m| m.calls)),
        (
            names::FIRST_ATTEMPT_FAILURES,
            both(|m| m.first_attempt_failures),
        ),
        (names::RETRIES, both(|m| m.retries)),
        (names::FINAL_FAILURES, both(|m| m.final_failures)),
        (names::BUDGET_REJECTIONS, both(|m| m.budget_rejections)),
        (names::ADMISSIONS, both(|m| m.admissions)),
        (names::PROBES, both(|m| m.probes)),
        (names::WAITS, both(|m| m.waits)),
        (
            names::RETRY_AFTER_HONOURED,
            both(|m| m.retry_after_honoured),
        ),
        (names::DEADLINE_GIVE_UPS, both(|m| m.deadline_give_ups)),
        (names::THROTTLED, both(|m| m.throttled)),
        (names::RATE_LIMIT_WAITS, both(|m| m.rate_limit_waits)),
        (names::HEDGES, both(|m| m.hedges)),
        (names::HEDGE_WINS, both(|m| m.hedge_wins)),
    ] {
        assert_eq!(counter(name), expected, "{name}");
    }
    // And the calls above did count: the 503s with Retry-After are
    // throttling answers, counted apart from the 404's failure.
    assert_eq!(
        (
            own.calls,
            own.first_attempt_failures,
            own.throttled,
            own.retries,
            own.retry_after_honoured,
            own.final_failures
        ),
        (2, 1, 2, 2, 2, 1)
    );

    let Some((MetricKind::Histogram, true, DebugValue::Histogram(values))) =
        published.get(names::ATTEMPTS)
    else {
        panic!("{:?}", published.get(names::ATTEMPTS));
    };
    let mut attempts: Vec<f64> = values.iter().map(|v| v.0).collect();
    attempts.sort_by(f64::total_cmp);
    assert_eq!(
        attempts,
        [1.0, 1.0, 1.0, 3.0],
        "one value per finished call"
    );
}

/// The end of a chain that answers `200` at once, except its second
/// request, which it never answers.
#[derive(Default)]
struct SecondNeverAnswers(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl Middleware for SecondNeverAnswers {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            std::future::pending::<()>().await;
        }
        Ok(reqwest::Response::from(http::Response::new("ok")))
    }
}
