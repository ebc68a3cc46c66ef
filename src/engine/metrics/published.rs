//! What the `metrics` feature publishes: the names, their labels, and one
//! set of handles per host, registered at zero when the host is first seen.
//!
//! ```
//! use reqwest_safe_retry::observability::metric_names as names;
//!
//! // OpenTelemetry's name for the duration of an HTTP request (one
//! // attempt); an exporter following Prometheus's naming renders it
//! // `http_client_request_duration_seconds`.
//! assert_eq!(names::REQUEST_DURATION, "http.client.request.duration");
//! assert_eq!(names::RETRIES, "reqwest_safe_retry.retries");
//! ```
//!
//! The handles of a host are made once, when its first call starts, and
//! kept: a publication is then a lookup in a sharded map and an atomic add,
//! whether or not a recorder is installed. The hosts that get labels of
//! their own are bounded (the admission's partition bound); the rest share
//! the `_other` label.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Unit};

use crate::vocabulary::{lock, DigestState};

/// The names the `metrics` feature publishes under, their labels, and the
/// histogram buckets to render them with.
///
/// The names follow OpenTelemetry's rules: `http.client.request.duration`
/// is the semantic conventions' own metric (a histogram in seconds, one
/// sample per attempt sent, i.e. per HTTP request, resends included); the
/// retry-specific ones are in this crate's namespace, lowercase and
/// dot-separated, counters without a `_total` suffix and the unit in the
/// metadata ([`crate::observability::describe_metrics`]), not in the name. An exporter
/// following Prometheus's naming adds both: metrics-exporter-prometheus
/// with `.with_recommended_naming(true)` renders `RETRIES` as
/// `reqwest_safe_retry_retries_total` and `REQUEST_DURATION` as
/// `http_client_request_duration_seconds`, as OpenTelemetry's Prometheus
/// exporter does.
///
/// Every series carries the host it was sent to:
/// [`SERVER_ADDRESS`](names::SERVER_ADDRESS) and
/// [`SERVER_PORT`](names::SERVER_PORT) from the request's URL (`_other` for
/// hosts past the bound, see [`crate::RetryPolicyBuilder::build`]); a
/// generic [`crate::retry::retry`] operation, which has no host, has neither
/// label. The duration histogram adds [`METHOD`](names::METHOD), and
/// [`STATUS_CODE`](names::STATUS_CODE) or [`ERROR_TYPE`](names::ERROR_TYPE)
/// (both for a 4xx or 5xx). Each counter is the [`crate::observability::MetricsSnapshot`]
/// field its doc names, split by host.
pub mod names {
    /// Histogram, seconds: the duration of each attempt (OpenTelemetry's
    /// `http.client.request.duration`; a hedged attempt is one sample, its
    /// first answer's).
    pub const REQUEST_DURATION: &str = "http.client.request.duration";
    /// Counter: logical calls started (`calls`).
    pub const CALLS: &str = "reqwest_safe_retry.calls";
    /// Histogram: attempts per finished call, 1 for a call that was not
    /// retried (`attempts_per_call`).
    pub const ATTEMPTS: &str = "reqwest_safe_retry.call.attempts";
    /// Counter: calls that ended without success (`final_failures`).
    pub const FINAL_FAILURES: &str = "reqwest_safe_retry.call.failures";
    /// Counter: calls whose first attempt did not succeed, a throttling
    /// answer not included (`first_attempt_failures`).
    pub const FIRST_ATTEMPT_FAILURES: &str = "reqwest_safe_retry.first_attempt.failures";
    /// Counter: retries made, attempts after the first (`retries`).
    pub const RETRIES: &str = "reqwest_safe_retry.retries";
    /// Counter: retries refused by admission, or still waiting for it when
    /// the wait reached its bound (`budget_rejections`).
    pub const BUDGET_REJECTIONS: &str = "reqwest_safe_retry.retry.refusals";
    /// Counter: retries admitted and sent (`admissions`).
    pub const ADMISSIONS: &str = "reqwest_safe_retry.retry.admissions";
    /// Counter: of the admissions, the probes sent while failures continued
    /// (`probes`).
    pub const PROBES: &str = "reqwest_safe_retry.retry.probes";
    /// Counter: retries that had to wait for admission (`waits`).
    pub const WAITS: &str = "reqwest_safe_retry.retry.admission_waits";
    /// Counter: delays set by a server's Retry-After
    /// (`retry_after_honoured`).
    pub const RETRY_AFTER_HONOURED: &str = "reqwest_safe_retry.retry_after.honoured";
    /// Counter: throttling answers, 429 or 503 with Retry-After
    /// (`throttled`).
    pub const THROTTLED: &str = "reqwest_safe_retry.throttled";
    /// Counter: attempts that waited for a paced host's rate or a spent
    /// quota's reset (`rate_limit_waits`).
    pub const RATE_LIMIT_WAITS: &str = "reqwest_safe_retry.pacing.waits";
    /// Counter: calls given up because another attempt would not fit the
    /// deadline, or refused because not even the first would
    /// (`deadline_give_ups`).
    pub const DEADLINE_GIVE_UPS: &str = "reqwest_safe_retry.deadline.give_ups";
    /// Counter: hedges sent, second copies of a slow attempt (`hedges`).
    pub const HEDGES: &str = "reqwest_safe_retry.hedges";
    /// Counter: of the hedges, those whose answer was used (`hedge_wins`).
    pub const HEDGE_WINS: &str = "reqwest_safe_retry.hedge.wins";
    /// Counter: calls the circuit breaker refused without an attempt
    /// (`circuit_rejections`).
    pub const CIRCUIT_REJECTIONS: &str = "reqwest_safe_retry.breaker.refusals";

    /// Label: the host of the request's URL (OpenTelemetry's attribute).
    pub const SERVER_ADDRESS: &str = "server.address";
    /// Label: the port of the request's URL, the scheme's default when it
    /// names none.
    pub const SERVER_PORT: &str = "server.port";
    /// Label of the duration: the method, `_OTHER` for one RFC 9110 and
    /// RFC 5789 do not define (OpenTelemetry's rule).
    pub const METHOD: &str = "http.request.method";
    /// Label of the duration: the answer's status code.
    pub const STATUS_CODE: &str = "http.response.status_code";
    /// Label of the duration: the transport failure (`connect`, `timeout`,
    /// `interrupted`, `tls_rejected`, `other`), or the status code of a
    /// 4xx or 5xx.
    pub const ERROR_TYPE: &str = "error.type";
    /// The host labels shared by the hosts past the bound.
    pub const OTHER_HOSTS: &str = "_other";

    /// Buckets for [`REQUEST_DURATION`], in seconds: OpenTelemetry's
    /// advice for `http.client.request.duration`.
    pub const DURATION_BUCKETS: &[f64] = &[
        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];
    /// Buckets for [`ATTEMPTS`].
    pub const ATTEMPTS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0];
}

/// The counters, in the order of [`COUNTERS`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Count {
    Calls,
    FirstAttemptFailures,
    Retries,
    FinalFailures,
    BudgetRejections,
    Admissions,
    Probes,
    Waits,
    Throttled,
    RateLimitWaits,
    RetryAfterHonoured,
    DeadlineGiveUps,
    Hedges,
    HedgeWins,
    CircuitRejections,
}

// One counter for each `Count`: `counters[what as usize]` is in bounds.
const _: () = assert!(Count::CircuitRejections as usize + 1 == COUNTERS.len());

/// Each counter's name and description, in the order of [`Count`].
const COUNTERS: [(&str, &str); 15] = [
    (names::CALLS, "Logical calls started"),
    (
        names::FIRST_ATTEMPT_FAILURES,
        "Calls whose first attempt did not succeed (throttling answers apart)",
    ),
    (names::RETRIES, "Retries made (attempts after the first)"),
    (names::FINAL_FAILURES, "Calls that ended without success"),
    (
        names::BUDGET_REJECTIONS,
        "Retries refused by admission (or still waiting at the wait's bound)",
    ),
    (names::ADMISSIONS, "Retries admitted and sent"),
    (
        names::PROBES,
        "Admitted retries sent as probes while failures continued",
    ),
    (names::WAITS, "Retries that waited for admission"),
    (
        names::THROTTLED,
        "Throttling answers (429, or 503 with Retry-After)",
    ),
    (
        names::RATE_LIMIT_WAITS,
        "Attempts that waited for a paced host's rate or a quota's reset",
    ),
    (
        names::RETRY_AFTER_HONOURED,
        "Delays set by a server's Retry-After",
    ),
    (
        names::DEADLINE_GIVE_UPS,
        "Calls given up because another attempt would not fit the deadline",
    ),
    (
        names::HEDGES,
        "Hedges sent: second copies of an attempt slower than its host's usual latency",
    ),
    (names::HEDGE_WINS, "Hedges whose answer was used"),
    (
        names::CIRCUIT_REJECTIONS,
        "Calls the circuit breaker refused without an attempt",
    ),
];

/// Describes every published metric (its meaning and unit) to the
/// installed recorder: exporters show the descriptions as `# HELP` lines,
/// and one following Prometheus's naming takes the unit suffix
/// (`_seconds`) from them. Building a policy calls it; call it again after
/// installing a recorder later.
pub fn describe_metrics() {
    metrics::with_recorder(|r| {
        for (name, help) in COUNTERS {
            r.describe_counter(name.into(), Some(Unit::Count), help.into());
        }
        r.describe_histogram(
            names::ATTEMPTS.into(),
            Some(Unit::Count),
            "Attempts per finished call".into(),
        );
        r.describe_histogram(
            names::REQUEST_DURATION.into(),
            Some(Unit::Seconds),
            "Duration of HTTP client requests (each attempt)".into(),
        );
    });
}

/// The metadata every published metric is registered with.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// An attempt's outcome, as the duration's labels say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Status(u16),
    Failed(&'static str),
}

/// The handles of one host (or of the calls that have none).
pub(super) struct Series {
    host: Vec<Label>,
    counters: [Counter; COUNTERS.len()],
    attempts: Histogram,
    /// The duration histograms seen so far, by method and answer: a few.
    durations: Vec<(&'static str, Answer, Histogram)>,
}

impl Series {
    /// Registers every counter (at zero) and the attempts histogram of a
    /// host with the current recorder.
    fn register(host: Vec<Label>) -> Series {
        metrics::with_recorder(|r| {
            let counters = COUNTERS.map(|(name, _)| {
                let counter = r.register_counter(&Key::from_parts(name, host.clone()), &METADATA);
                // Present in the scrape before the first event.
                counter.increment(0);
                counter
            });
            let key = Key::from_parts(names::ATTEMPTS, host.clone());
            Series {
                attempts: r.register_histogram(&key, &METADATA),
                counters,
                host,
                durations: Vec::new(),
            }
        })
    }

    pub(super) fn count(&self, what: Count) {
        self.counters[what as usize].increment(1);
    }

    pub(super) fn attempts(&self, n: u32) {
        self.attempts.record(f64::from(n));
    }

    pub(super) fn duration(&mut self, method: &'static str, answer: Answer, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some((.., h)) = self
            .durations
            .iter()
            .find(|(m, a, _)| *m == method && *a == answer)
        {
            return h.record(seconds);
        }
        let mut labels = self.host.clone();
        labels.push(Label::new(names::METHOD, method));
        let error = match answer {
            Answer::Status(code) => {
                labels.push(Label::new(names::STATUS_CODE, code.to_string()));
                (code >= 400).then(|| code.to_string())
            }
            Answer::Failed(kind) => Some(kind.to_owned()),
        };
        if let Some(error) = error {
            labels.push(Label::new(names::ERROR_TYPE, error));
        }
        let key = Key::from_parts(names::REQUEST_DURATION, labels);
        let h = metrics::with_recorder(|r| r.register_histogram(&key, &METADATA));
        h.record(seconds);
        self.durations.push((method, answer, h));
    }
}

type Shard = HashMap<u64, Series, DigestState>;

/// Shards of the host map (by the digest's top bits): a power of two.
const SHARD_BITS: u32 = 4;

/// The series of one policy: one per host up to the bound, one for the
/// hosts past it, one for the calls without a host.
pub(super) struct Published {
    shards: Box<[Mutex<Shard>]>,
    hosts: AtomicUsize,
    bound: usize,
    other: Mutex<Series>,
    hostless: Mutex<Series>,
}

impl Published {
    /// Describes the metrics and registers the series that exist before
    /// any call, at zero: those of the calls without a host, and those of
    /// the hosts past `bound`.
    pub(super) fn new(bound: usize) -> Self {
        describe_metrics();
        let other = |key| Label::new(key, names::OTHER_HOSTS);
        Published {
            shards: (0..1 << SHARD_BITS)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            hosts: AtomicUsize::new(0),
            bound,
            other: Mutex::new(Series::register(vec![
                other(names::SERVER_ADDRESS),
                other(names::SERVER_PORT),
            ])),
            hostless: Mutex::new(Series::register(Vec::new())),
        }
    }

    /// Runs `f` on the series of `host`, a partition's digest (0: a call
    /// with no host). A host not seen yet gets series of its own, labelled
    /// with `url`'s host and port, while the bound allows; past it, or
    /// with no `url` to name it, it shares the `_other` series.
    pub(super) fn with(&self, host: u64, url: Option<&reqwest::Url>, f: impl FnOnce(&mut Series)) {
        if host == 0 {
            return f(&mut lock(&self.hostless));
        }
        // Top bits: below the shard count by construction.
        #[allow(clippy::cast_possible_truncation)]
        let mut shard = lock(&self.shards[(host >> (64 - SHARD_BITS)) as usize]);
        if let Some(series) = shard.get_mut(&host) {
            return f(series);
        }
        let Some(url) = url else {
            drop(shard);
            return f(&mut lock(&self.other));
        };
        if self.hosts.fetch_add(1, Ordering::Relaxed) >= self.bound {
            self.hosts.fetch_sub(1, Ordering::Relaxed);
            drop(shard);
            return f(&mut lock(&self.other));
        }
        let address = url.host_str().unwrap_or_default();
        // `api.example.com.` is `api.example.com`, as for the partition.
        let address = address.strip_suffix('.').unwrap_or(address);
        let port = url
            .port_or_known_default()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let labels = vec![
            Label::new(names::SERVER_ADDRESS, address.to_owned()),
            Label::new(names::SERVER_PORT, port),
        ];
        f(shard
            .entry(host)
            .or_insert_with(|| Series::register(labels)));
    }
}
