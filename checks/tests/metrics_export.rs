//! The `metrics` feature: what the policy counts reaches the installed
//! recorder, under the documented names, as it happens.
//!
//! The crate's tests build it with `metrics` (a dev-dependency on itself),
//! so the README's `cargo test` runs this. One test installs the global
//! recorder; the other uses a local one.
#![cfg(feature = "metrics")]

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use http::Extensions;
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use reqwest_middleware::{Middleware, Next};
use reqwest_safe_retry::admission::{AdaptiveConfig, Partition};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::observability::{metric_names as names, MetricsSnapshot};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RequestOptions, RetryMiddleware, RetryPolicy};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn every_counter_and_the_attempts_histogram_reach_the_recorder() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

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
    let (hedging, stalls) = hedging_stalls(&clock);
    for _ in 0..2 {
        let r = stalls.get("http://stalls.test/").send().await.unwrap();
        assert_eq!(r.status(), 200);
    }

    let published = snapshotter.snapshot().into_vec();
    let (own, hedged) = (policy.metrics().snapshot(), hedging.metrics().snapshot());
    assert_eq!((hedged.hedges, hedged.hedge_wins), (1, 1));
    let label = |key: &CompositeKey, name: &str| {
        key.key()
            .labels()
            .find(|l| l.key() == name)
            .map(|l| l.value().to_owned())
    };
    // Every counter, summed over its hosts; each series labelled with its
    // host (or with none: the series of generic operations).
    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut hosts: BTreeSet<(String, String)> = BTreeSet::new();
    for (key, _unit, description, value) in &published {
        let name = key.key().name();
        assert!(description.is_some(), "{name} has a description");
        let address = label(key, names::SERVER_ADDRESS);
        let port = label(key, names::SERVER_PORT);
        assert_eq!(address.is_some(), port.is_some(), "{key:?}");
        if let (Some(a), Some(p)) = (address, port) {
            hosts.insert((a, p));
        }
        if let (MetricKind::Counter, DebugValue::Counter(n)) = (key.kind(), value) {
            *counters.entry(name.to_owned()).or_default() += n;
        }
    }
    let port = server.address().port().to_string();
    assert_eq!(
        hosts,
        BTreeSet::from([
            ("127.0.0.1".to_owned(), port.clone()),
            ("stalls.test".to_owned(), "80".to_owned()),
            ("_other".to_owned(), "_other".to_owned()),
        ]),
        "the hosts called, and the shared label of the hosts past the bound"
    );
    // Each published counter is the snapshot's field of the same name,
    // summed over the two policies; every one is there, at zero or not.
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
        (names::CIRCUIT_REJECTIONS, both(|m| m.circuit_rejections)),
    ] {
        assert_eq!(counters.get(name), Some(&expected), "{name}");
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

    // One sample of attempts per finished call, under the call's host.
    let mut attempts: Vec<(String, f64)> = Vec::new();
    // One sample of duration per attempt, with OpenTelemetry's attributes.
    let mut durations: BTreeSet<Vec<(String, String)>> = BTreeSet::new();
    let mut samples = 0;
    for (key, unit, _, value) in &published {
        let DebugValue::Histogram(values) = value else {
            continue;
        };
        let host = label(key, names::SERVER_ADDRESS).unwrap_or_default();
        match key.key().name() {
            names::ATTEMPTS => {
                attempts.extend(values.iter().map(|v| (host.clone(), v.0)));
            }
            names::REQUEST_DURATION => {
                assert_eq!(*unit, Some(Unit::Seconds));
                samples += values.len();
                let mut labels: Vec<(String, String)> = key
                    .key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                labels.sort();
                durations.insert(labels);
            }
            other => panic!("{other}"),
        }
    }
    attempts.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    assert_eq!(
        attempts,
        [
            ("127.0.0.1".to_owned(), 1.0),
            ("stalls.test".to_owned(), 1.0),
            ("stalls.test".to_owned(), 1.0),
            ("127.0.0.1".to_owned(), 3.0),
        ],
        "one value per finished call"
    );
    assert_eq!(samples, 6, "one duration per attempt");
    let attrs = |pairs: &[(&str, &str)]| {
        let mut v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    };
    let local = [
        (names::SERVER_ADDRESS, "127.0.0.1"),
        (names::SERVER_PORT, port.as_str()),
    ];
    let with = |more: &[(&'static str, &'static str)]| {
        let mut all = local.to_vec();
        all.extend_from_slice(more);
        attrs(&all)
    };
    assert_eq!(
        durations,
        BTreeSet::from([
            with(&[
                (names::METHOD, "POST"),
                (names::STATUS_CODE, "503"),
                (names::ERROR_TYPE, "503")
            ]),
            with(&[(names::METHOD, "POST"), (names::STATUS_CODE, "201")]),
            with(&[
                (names::METHOD, "GET"),
                (names::STATUS_CODE, "404"),
                (names::ERROR_TYPE, "404")
            ]),
            attrs(&[
                (names::SERVER_ADDRESS, "stalls.test"),
                (names::SERVER_PORT, "80"),
                (names::METHOD, "GET"),
                (names::STATUS_CODE, "200")
            ]),
        ])
    );
}

/// A client calling many hosts: its series label at most as many hosts as
/// the admission keeps partitions for, plus the one `_other` label the
/// rest share, and nothing is lost (every call is counted).
#[test]
fn host_labels_are_bounded_by_the_admissions_partitions() {
    const BOUND: usize = 32;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A recorder of this test's own (the other test installs the global
    // one): the calls run on this thread, inside its scope.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let policy = RetryPolicy::builder()
                .adaptive_admission(AdaptiveConfig {
                    max_partitions: BOUND,
                    ..AdaptiveConfig::default()
                })
                .build()
                .unwrap();
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(RetryMiddleware::new(policy.clone()))
                .with(support::canned::Canned)
                .build();
            for i in 0..10 * BOUND {
                let url = format!("http://host-{i}.test:{}/", 8000 + i % 3);
                client.get(url).send().await.unwrap();
            }
            // A method of no RFC: labelled `_OTHER`, as OpenTelemetry says,
            // so made-up methods cannot grow the label's values either.
            let purge = reqwest::Method::from_bytes(b"PURGE").unwrap();
            client
                .request(purge, "http://host-0.test:8000/")
                .send()
                .await
                .unwrap();
            assert_eq!(policy.metrics().snapshot().calls, 10 * BOUND as u64 + 1);
        });
    });
    let mut addresses = BTreeSet::new();
    let mut calls = 0;
    let mut durations = 0;
    let mut methods = BTreeSet::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let address = key
            .key()
            .labels()
            .find(|l| l.key() == names::SERVER_ADDRESS)
            .map(|l| l.value().to_owned());
        match (key.key().name(), value) {
            (names::CALLS, DebugValue::Counter(n)) => {
                calls += n;
                addresses.extend(address);
            }
            (names::REQUEST_DURATION, DebugValue::Histogram(v)) => {
                durations += v.len();
                methods.extend(
                    key.key()
                        .labels()
                        .filter(|l| l.key() == names::METHOD)
                        .map(|l| l.value().to_owned()),
                );
            }
            _ => {}
        }
    }
    assert_eq!(calls, 10 * BOUND as u64 + 1, "every call counted");
    assert_eq!(durations, 10 * BOUND + 1, "every attempt timed");
    assert_eq!(
        methods,
        BTreeSet::from(["GET".to_owned(), "_OTHER".to_owned()])
    );
    assert_eq!(addresses.len(), BOUND + 1, "{addresses:?}");
    assert!(addresses.contains(names::OTHER_HOSTS));
}

/// Every series carries the host a request was sent to, whatever
/// partition its admission used: a call to host-b admitted under host-a's
/// partition, or under a name two hosts share, is host-b's (its call, its
/// retry, its attempts, each attempt's duration, its hedge).
#[test]
fn series_label_the_host_sent_to_not_the_partition() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let clock = ManualClock::new();
            let policy = RetryPolicy::builder().manual_clock(&clock).build().unwrap();
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(RetryMiddleware::new(policy))
                .with(FirstToHostBFails::default())
                .build();
            let host_a = Partition::of_url(&"http://host-a.test/".parse().unwrap());
            let shared = Partition::named("shared");
            for (url, partition) in [
                ("http://host-a.test/", None),
                ("http://host-b.test/", Some(host_a)),
                ("http://host-c.test/", Some(shared)),
                ("http://host-d.test/", Some(shared)),
            ] {
                let options = partition
                    .map_or_else(RequestOptions::new, |p| RequestOptions::new().partition(p));
                let r = client.get(url).with_extension(options).send().await;
                assert_eq!(r.unwrap().status(), 200, "{url}");
            }
            // Hedged: host-f's first copy never answers, its hedge does.
            let (_, stalls) = hedging_stalls(&clock);
            let hedged = RequestOptions::new().partition(Partition::named("hedged"));
            for url in ["http://host-e.test/", "http://host-f.test/"] {
                let r = stalls.get(url).with_extension(hedged.clone()).send().await;
                assert_eq!(r.unwrap().status(), 200, "{url}");
            }
        });
    });
    // Samples (a counter's count, a histogram's values) by host and name.
    let mut seen: HashMap<(String, &str), u64> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let Some(host) = key
            .key()
            .labels()
            .find(|l| l.key() == names::SERVER_ADDRESS)
        else {
            continue;
        };
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(v) => v.len() as u64,
            DebugValue::Gauge(_) => continue,
        };
        let name = [
            names::CALLS,
            names::RETRIES,
            names::ATTEMPTS,
            names::REQUEST_DURATION,
            names::HEDGES,
            names::HEDGE_WINS,
        ]
        .into_iter()
        .find(|name| *name == key.key().name());
        if let (Some(name), 1..) = (name, n) {
            *seen.entry((host.value().to_owned(), name)).or_default() += n;
        }
    }
    let mut expected = HashMap::new();
    let hosts = ["a", "b", "c", "d", "e", "f"].map(|h| format!("host-{h}.test"));
    for host in hosts {
        for name in [names::CALLS, names::ATTEMPTS, names::REQUEST_DURATION] {
            expected.insert((host.clone(), name), 1);
        }
    }
    // host-b's 503 and its 200: two attempts timed, one retry.
    expected.insert(("host-b.test".to_owned(), names::REQUEST_DURATION), 2);
    expected.insert(("host-b.test".to_owned(), names::RETRIES), 1);
    expected.insert(("host-f.test".to_owned(), names::HEDGES), 1);
    expected.insert(("host-f.test".to_owned(), names::HEDGE_WINS), 1);
    assert_eq!(seen, expected);
}

/// The end of a chain that answers `503` to the first request sent to
/// `host-b.test`, and `200` to every other.
#[derive(Default)]
struct FirstToHostBFails(std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl Middleware for FirstToHostBFails {
    async fn handle(
        &self,
        request: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let to_b = request.url().host_str() == Some("host-b.test");
        let mut response = http::Response::new("ok");
        if to_b && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        }
        Ok(reqwest::Response::from(response))
    }
}

/// Some exporters (push-based ones, OpenTelemetry bridges) emit a series
/// only once it has been written to: building a policy writes a zero to
/// every counter, so each exists before its first event.
#[test]
fn building_a_policy_writes_a_zero_to_every_counter() {
    let touched = Arc::new(Mutex::new(BTreeSet::new()));
    let recorder = Touched(touched.clone());
    metrics::with_local_recorder(&recorder, || RetryPolicy::builder().build().unwrap());
    let touched = touched.lock().unwrap();
    for name in [
        names::CALLS,
        names::FIRST_ATTEMPT_FAILURES,
        names::RETRIES,
        names::FINAL_FAILURES,
        names::BUDGET_REJECTIONS,
        names::ADMISSIONS,
        names::PROBES,
        names::WAITS,
        names::RETRY_AFTER_HONOURED,
        names::DEADLINE_GIVE_UPS,
        names::THROTTLED,
        names::RATE_LIMIT_WAITS,
        names::HEDGES,
        names::HEDGE_WINS,
        names::CIRCUIT_REJECTIONS,
    ] {
        for host in ["", names::OTHER_HOSTS] {
            assert!(
                touched.contains(&(name.to_owned(), host.to_owned())),
                "{name} {host:?}"
            );
        }
    }
}

/// A recorder that keeps which counters were written to (by name and
/// `server.address`), and nothing else.
struct Touched(Arc<Mutex<BTreeSet<(String, String)>>>);

struct TouchedCounter(Arc<Mutex<BTreeSet<(String, String)>>>, (String, String));

impl metrics::CounterFn for TouchedCounter {
    fn increment(&self, _: u64) {
        self.0.lock().unwrap().insert(self.1.clone());
    }
    fn absolute(&self, _: u64) {
        self.0.lock().unwrap().insert(self.1.clone());
    }
}

impl metrics::Recorder for Touched {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let host = key
            .labels()
            .find(|l| l.key() == names::SERVER_ADDRESS)
            .map_or(String::new(), |l| l.value().to_owned());
        let id = (key.name().to_owned(), host);
        metrics::Counter::from_arc(Arc::new(TouchedCounter(self.0.clone(), id)))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// The end of a chain that answers `200` at once, except its second
/// request, which it never answers.
/// A policy that hedges every GET at once (on the manual clock the hedge
/// delay ends as soon as it starts), over a client whose second request
/// never answers: that request's hedge wins.
fn hedging_stalls(clock: &ManualClock) -> (RetryPolicy, reqwest_middleware::ClientWithMiddleware) {
    let hedging = RetryPolicy::builder()
        .manual_clock(clock)
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
    (hedging, stalls)
}

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
