//! The `metrics` feature as a Prometheus server sees it: the scrape of
//! metrics-exporter-prometheus (with Prometheus's recommended naming and
//! the buckets the README gives), before any call and after a few, and the
//! Grafana dashboard shipped in `dashboards/`, whose every query must name
//! series that scrape has.
//!
//! The recorder is global to the process: both tests share one scrape.
#![cfg(feature = "metrics")]

use std::collections::{BTreeMap, BTreeSet};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use reqwest_safe_retry::observability::metric_names as names;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use tokio::sync::OnceCell;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Two scrapes: just after the policy is built, and after the calls.
struct Scrapes {
    before: Scrape,
    after: Scrape,
    /// The wiremock server's port.
    port: String,
}

/// A scrape, read: each series' `# TYPE`, and each sample's value by its
/// name and sorted labels.
#[derive(Debug, Default)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<(String, Vec<(String, String)>), f64>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                scrape.types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut labels: Vec<(String, String)> = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            labels.sort();
            scrape
                .samples
                .insert((name.to_owned(), labels), value.parse().unwrap());
        }
        scrape
    }

    /// The value of `name` with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.samples.get(&(name.to_owned(), labels)).copied()
    }

    /// Every sample name (`_bucket`, `_sum`, `_count` included).
    fn names(&self) -> BTreeSet<&str> {
        self.samples.keys().map(|(n, _)| n.as_str()).collect()
    }

    /// Every label name of the samples of `name`.
    fn label_names(&self) -> BTreeSet<&str> {
        self.samples
            .keys()
            .flat_map(|(_, labels)| labels.iter().map(|(k, _)| k.as_str()))
            .collect()
    }
}

/// The Prometheus name of a counter: dots to underscores, `_total`.
fn counter(name: &str) -> String {
    format!("{}_total", name.replace('.', "_"))
}

async fn scrapes() -> &'static Scrapes {
    static SCRAPES: OnceCell<Scrapes> = OnceCell::const_new();
    SCRAPES.get_or_init(take_scrapes).await
}

async fn take_scrapes() -> Scrapes {
    // What the README tells a Prometheus user to install.
    let handle = PrometheusBuilder::new()
        .with_recommended_naming(true)
        .set_buckets_for_metric(
            Matcher::Full(names::REQUEST_DURATION.to_owned()),
            names::DURATION_BUCKETS,
        )
        .unwrap()
        .set_buckets_for_metric(
            Matcher::Full(names::ATTEMPTS.to_owned()),
            names::ATTEMPTS_BUCKETS,
        )
        .unwrap()
        .install_recorder()
        .unwrap();
    let clock = ManualClock::new();
    let policy = RetryPolicy::builder()
        .manual_clock(&clock)
        .seed(3)
        .build()
        .unwrap();
    let before = Scrape::parse(&handle.render());

    // A POST that gets two 503s with Retry-After, then a 201; a GET that
    // gets a 404.
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
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let paid = client.post(server.uri()).body("{}").send().await.unwrap();
    assert_eq!(paid.status(), 201);
    let missing = client.get(server.uri()).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let text = handle.render();
    println!("{text}");
    Scrapes {
        before,
        after: Scrape::parse(&text),
        port: server.address().port().to_string(),
    }
}

/// Every counter the crate documents, by its constant.
const COUNTERS: [&str; 15] = [
    names::CALLS,
    names::FIRST_ATTEMPT_FAILURES,
    names::RETRIES,
    names::FINAL_FAILURES,
    names::BUDGET_REJECTIONS,
    names::ADMISSIONS,
    names::PROBES,
    names::WAITS,
    names::RETRY_AFTER_HONOURED,
    names::THROTTLED,
    names::RATE_LIMIT_WAITS,
    names::DEADLINE_GIVE_UPS,
    names::HEDGES,
    names::HEDGE_WINS,
    names::CIRCUIT_REJECTIONS,
];

#[tokio::test]
async fn the_scrape_has_every_series_with_prometheus_names_types_and_labels() {
    let Scrapes {
        before,
        after,
        port,
    } = scrapes().await;
    let other = [
        ("server_address", names::OTHER_HOSTS),
        ("server_port", names::OTHER_HOSTS),
    ];
    let host = [
        ("server_address", "127.0.0.1"),
        ("server_port", port.as_str()),
    ];
    for name in COUNTERS {
        let total = counter(name);
        assert!(total.starts_with("reqwest_safe_retry_"), "{total}");
        // Registered at zero when the policy was built: a rate() over it
        // exists before the first event.
        for scrape in [before, after] {
            assert_eq!(
                scrape.types.get(&total).map(String::as_str),
                Some("counter")
            );
            assert_eq!(scrape.value(&total, &other), Some(0.0), "{total}");
            assert_eq!(scrape.value(&total, &[]), Some(0.0), "{total}, no host");
        }
        // And at zero, or counted, for the host called.
        assert!(after.value(&total, &host).is_some(), "{total} of the host");
    }
    let count = |name| after.value(&counter(name), &host);
    assert_eq!(count(names::CALLS), Some(2.0));
    assert_eq!(count(names::RETRIES), Some(2.0));
    assert_eq!(count(names::THROTTLED), Some(2.0));
    assert_eq!(count(names::RETRY_AFTER_HONOURED), Some(2.0));
    assert_eq!(count(names::FINAL_FAILURES), Some(1.0));
    assert_eq!(count(names::BUDGET_REJECTIONS), Some(0.0));

    // The attempts per call: a histogram with buckets, per host.
    let attempts = names::ATTEMPTS.replace('.', "_");
    assert_eq!(
        after.types.get(&attempts).map(String::as_str),
        Some("histogram")
    );
    let bucket = |le: &str| {
        let mut labels = host.to_vec();
        labels.push(("le", le));
        after.value(&format!("{attempts}_bucket"), &labels)
    };
    for scrape in [before, after] {
        let count = format!("{attempts}_count");
        assert_eq!(
            scrape.value(&count, &other),
            Some(0.0),
            "at zero from the build"
        );
        assert_eq!(scrape.value(&count, &[]), Some(0.0), "no host: at zero too");
    }
    assert_eq!(bucket("1"), Some(1.0), "the GET");
    assert_eq!(bucket("3"), Some(2.0), "and the POST");
    assert_eq!(bucket("+Inf"), Some(2.0));
    assert_eq!(after.value(&format!("{attempts}_sum"), &host), Some(4.0));

    // The duration of each attempt, OpenTelemetry's: in seconds, with the
    // semantic conventions' attributes.
    let duration = "http_client_request_duration_seconds";
    assert_eq!(
        after.types.get(duration).map(String::as_str),
        Some("histogram")
    );
    let of = |more: &[(&'static str, &'static str)]| {
        let mut labels = host.to_vec();
        labels.extend_from_slice(more);
        after.value(&format!("{duration}_count"), &labels)
    };
    let post = ("http_request_method", "POST");
    let get = ("http_request_method", "GET");
    let status = |code| ("http_response_status_code", code);
    let error = |code| ("error_type", code);
    assert_eq!(of(&[post, status("503"), error("503")]), Some(2.0));
    assert_eq!(of(&[post, status("201")]), Some(1.0));
    assert_eq!(of(&[get, status("404"), error("404")]), Some(1.0));
    let mut labels = host.to_vec();
    labels.extend([post, status("201"), ("le", "0.005")]);
    assert_eq!(
        after.value(&format!("{duration}_bucket"), &labels),
        Some(1.0),
        "rendered as buckets (a manual clock: no time passes)"
    );
    // No series with a name the crate does not document.
    let documented: BTreeSet<String> = COUNTERS
        .iter()
        .map(|n| counter(n))
        .chain(
            ["_bucket", "_sum", "_count"]
                .iter()
                .flat_map(|s| [format!("{attempts}{s}"), format!("{duration}{s}")]),
        )
        .collect();
    for name in after.names() {
        assert!(documented.contains(name), "{name} is not documented");
    }
}

/// Every query of the shipped Grafana dashboard names only series the
/// scrape has, and groups only by labels it has.
#[tokio::test]
async fn every_dashboard_query_names_a_series_of_the_scrape() {
    let Scrapes { after, .. } = scrapes().await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dashboards/reqwest-safe-retry.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    let names = after.names();
    let labels = after.label_names();
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let (metrics, grouped) = promql_names(expr);
        assert!(!metrics.is_empty(), "no series in {expr}");
        for metric in metrics {
            assert!(names.contains(metric.as_str()), "{metric} of {expr}");
            used.insert(metric);
        }
        for label in grouped {
            assert!(labels.contains(label.as_str()), "label {label} of {expr}");
        }
    }
    // The panels the issue asks for.
    for wanted in [
        "reqwest_safe_retry_retries_total",
        "reqwest_safe_retry_calls_total",
        "reqwest_safe_retry_call_attempts_bucket",
        "reqwest_safe_retry_retry_refusals_total",
        "reqwest_safe_retry_pacing_waits_total",
        "reqwest_safe_retry_breaker_refusals_total",
        "reqwest_safe_retry_hedges_total",
        "http_client_request_duration_seconds_bucket",
    ] {
        assert!(used.contains(wanted), "no panel plots {wanted}");
    }
}

/// Every `expr` in the dashboard's JSON, panels and variables alike.
fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    ("query", serde_json::Value::Object(q)) => {
                        if let Some(serde_json::Value::String(e)) = q.get("query") {
                            out.push(e.clone());
                        }
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// A PromQL tokenizer just good enough for a dashboard: the metric names
/// (identifiers of this crate's two prefixes) an expression reads, and the
/// label names in its `by (...)` clauses. Strings, `$variables` and
/// `[ranges]` are skipped.
fn promql_names(expr: &str) -> (Vec<String>, Vec<String>) {
    let mut metrics = Vec::new();
    let mut grouped = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || "_{}".contains(chars[i])) {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.starts_with("reqwest_safe_retry_") || word.starts_with("http_client_") {
                metrics.push(word.clone());
            }
            if word == "by" {
                let rest: String = chars[i..].iter().collect();
                let open = rest.find('(').unwrap();
                let close = rest.find(')').unwrap();
                grouped.extend(
                    rest[open + 1..close]
                        .split(',')
                        .map(|l| l.trim().to_owned())
                        .filter(|l| !l.is_empty()),
                );
            }
            continue;
        } else {
            i += 1;
        }
    }
    (metrics, grouped)
}
