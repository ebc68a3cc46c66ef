//! The OpenTelemetry route of docs/observability.md, end to end: the
//! `retry` span through tracing-opentelemetry, the `metrics` facade through
//! metrics-exporter-opentelemetry, both read back from the OpenTelemetry
//! SDK's in-memory exporters, i.e. what an OTLP exporter would be handed.
//!
//! One test function alone in its own binary: it installs the global
//! `metrics` recorder, and tracing caches per-callsite interest
//! process-wide (see tests/tracing.rs).
#![cfg(feature = "metrics")]

/// The set-up docs/observability.md shows (tests/readme.rs checks that the
/// page holds this file).
#[path = "support/opentelemetry.rs"]
mod setup;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData};
use opentelemetry_sdk::metrics::InMemoryMetricExporter;
use opentelemetry_sdk::trace::InMemorySpanExporter;
use reqwest_safe_retry::observability::metric_names as names;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

fn attr<'a>(attributes: impl IntoIterator<Item = &'a KeyValue>, key: &str) -> Option<Value> {
    attributes
        .into_iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

/// The one metric named `name` in the last export; two under one name
/// would be two OpenTelemetry instruments a backend would not merge.
fn metric<'a>(exported: &'a [&'a Metric], name: &str) -> &'a Metric {
    let found: Vec<_> = exported.iter().filter(|m| m.name() == name).collect();
    assert_eq!(found.len(), 1, "{name}: {} instruments", found.len());
    found[0]
}

/// The value of a counter's series for the server at `port` (a label of
/// the `metrics` facade is a string, so is the attribute it becomes).
fn counted(exported: &[&Metric], name: &str, port: &Value) -> u64 {
    let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric(exported, name).data() else {
        panic!("{name} is not a u64 sum");
    };
    assert!(sum.is_monotonic(), "{name} is a counter");
    let points: Vec<_> = sum
        .data_points()
        .filter(|p| attr(p.attributes(), names::SERVER_PORT).as_ref() == Some(port))
        .collect();
    assert_eq!(points.len(), 1, "{name}: one series for the host");
    points[0].value()
}

#[tokio::test]
async fn the_retry_span_and_the_metrics_reach_the_opentelemetry_exporters() {
    // Spans: tracing -> tracing-opentelemetry -> the SDK -> the exporter;
    // metrics: the `metrics` facade -> the bridge -> the SDK -> the
    // exporter. Installed before the policy is built.
    let spans = InMemorySpanExporter::default();
    let exported = InMemoryMetricExporter::default();
    let (tracer_provider, meter_provider) =
        setup::install(spans.clone(), exported.clone()).unwrap();

    // A 503, then a 200.
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(7)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let answer = client
        .get(format!("{}/orders", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let port = i64::from(server.address().port());

    // The span of the logical operation, as the SDK exported it.
    tracer_provider.force_flush().unwrap();
    let finished = spans.get_finished_spans().unwrap();
    let retry: Vec<_> = finished.iter().filter(|s| s.name == "retry").collect();
    assert_eq!(retry.len(), 1, "one span per logical operation");
    let span = retry[0];
    let resend_count = attr(&span.attributes, "http.request.resend_count");
    assert_eq!(resend_count, Some(Value::I64(1)));
    assert_eq!(
        attr(&span.attributes, "http.request.method"),
        Some(Value::from("GET"))
    );
    assert_eq!(
        attr(&span.attributes, "server.address"),
        Some(Value::from("127.0.0.1"))
    );
    assert_eq!(
        attr(&span.attributes, "server.port"),
        Some(Value::I64(port))
    );
    assert_eq!(
        attr(&span.attributes, "stop_reason"),
        Some(Value::from("success"))
    );
    // Each attempt is a span event, with its own resend count.
    let attempts: Vec<_> = span
        .events
        .iter()
        .filter(|e| e.name == "attempt finished")
        .collect();
    assert_eq!(attempts.len(), 2);
    for (i, (event, outcome)) in attempts.iter().zip(["503", "200"]).enumerate() {
        let resends = i64::try_from(i).unwrap();
        assert_eq!(
            attr(&event.attributes, "http.request.resend_count"),
            Some(Value::I64(resends))
        );
        assert_eq!(
            attr(&event.attributes, "outcome"),
            Some(Value::from(outcome))
        );
    }

    // The metrics, as the SDK exported them.
    let label = Value::from(port.to_string());
    meter_provider.force_flush().unwrap();
    let batches = exported.get_finished_metrics().unwrap();
    let last = batches.last().expect("an export");
    let metrics: Vec<&Metric> = last
        .scope_metrics()
        .flat_map(|scope| scope.metrics())
        .collect();

    // Each attempt's duration: OpenTelemetry's HTTP client histogram, in
    // seconds, with the crate's buckets, one series per answer.
    let duration = metric(&metrics, names::REQUEST_DURATION);
    assert_eq!(duration.unit(), "s");
    let AggregatedMetrics::F64(MetricData::Histogram(histogram)) = duration.data() else {
        panic!("the duration is not an f64 histogram");
    };
    let mut answers: Vec<(Option<Value>, Option<Value>, u64)> = histogram
        .data_points()
        .map(|p| {
            let bounds: Vec<f64> = p.bounds().collect();
            assert_eq!(bounds, names::DURATION_BUCKETS);
            assert_eq!(
                attr(p.attributes(), names::SERVER_PORT).as_ref(),
                Some(&label)
            );
            assert_eq!(
                attr(p.attributes(), names::METHOD),
                Some(Value::from("GET"))
            );
            let status = attr(p.attributes(), names::STATUS_CODE);
            (status, attr(p.attributes(), names::ERROR_TYPE), p.count())
        })
        .collect();
    answers.sort_by_key(|(status, ..)| status.as_ref().map(Value::to_string));
    assert_eq!(
        answers,
        [
            (Some(Value::from("200")), None, 1),
            (Some(Value::from("503")), Some(Value::from("503")), 1),
        ]
    );

    // Attempts per call: one call, two attempts.
    let AggregatedMetrics::F64(MetricData::Histogram(attempts)) =
        metric(&metrics, names::ATTEMPTS).data()
    else {
        panic!("the attempts are not an f64 histogram");
    };
    let call = attempts
        .data_points()
        .find(|p| attr(p.attributes(), names::SERVER_PORT).as_ref() == Some(&label))
        .expect("the host's attempts");
    assert_eq!((call.count(), call.sum()), (1, 2.0));

    // The retry counters: every one exported for the host, at zero where
    // nothing happened.
    let expected = [
        (names::CALLS, 1),
        (names::RETRIES, 1),
        (names::FIRST_ATTEMPT_FAILURES, 1),
        (names::ADMISSIONS, 1),
        (names::FINAL_FAILURES, 0),
        (names::BUDGET_REJECTIONS, 0),
        (names::PROBES, 0),
        (names::WAITS, 0),
        (names::RETRY_AFTER_HONOURED, 0),
        (names::THROTTLED, 0),
        (names::RATE_LIMIT_WAITS, 0),
        (names::DEADLINE_GIVE_UPS, 0),
        (names::HEDGES, 0),
        (names::HEDGE_WINS, 0),
        (names::CIRCUIT_REJECTIONS, 0),
    ];
    for (name, value) in expected {
        assert_eq!(counted(&metrics, name, &label), value, "{name}");
    }
}
