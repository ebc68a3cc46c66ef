//! The `metrics` feature: what the policy counts reaches the installed
//! recorder, under the documented names, as it happens.
//!
//! The crate's tests build it with `metrics` (a dev-dependency on itself),
//! so the README's `cargo test` runs this. One test: the recorder is global
//! to the process.
#![cfg(feature = "metrics")]

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use reqwest_safe_retry::{metric_names as names, ManualClock, RetryMiddleware, RetryPolicy};
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
    let own = policy.metrics().snapshot();
    let counter = |name: &str| match published.get(name) {
        Some((MetricKind::Counter, described, DebugValue::Counter(n))) => {
            assert!(described, "{name} has a description");
            *n
        }
        None => 0,
        other => panic!("{name}: {other:?}"),
    };
    // Each published counter is the snapshot's field of the same name.
    for (name, expected) in [
        (names::CALLS, own.calls),
        (names::FIRST_ATTEMPT_FAILURES, own.first_attempt_failures),
        (names::RETRIES, own.retries),
        (names::FINAL_FAILURES, own.final_failures),
        (names::BUDGET_REJECTIONS, own.budget_rejections),
        (names::ADMISSIONS, own.admissions),
        (names::PROBES, own.probes),
        (names::WAITS, own.waits),
        (names::RETRY_AFTER_HONOURED, own.retry_after_honoured),
        (names::DEADLINE_GIVE_UPS, own.deadline_give_ups),
        (names::THROTTLED, own.throttled),
        (names::RATE_LIMIT_WAITS, own.rate_limit_waits),
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
    assert_eq!(attempts, [1.0, 3.0], "one value per finished call");
}
