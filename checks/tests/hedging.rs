//! Hedged requests (issue 17), on tokio's paused clock: a server below the
//! middleware answers each request after a scripted latency, so the hedge
//! delay, the budget, the winner and the cancelled copy are checked to the
//! microsecond with no real sleeping.

#[path = "support/ledger.rs"]
mod ledger;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use ledger::Ledger;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_safe_retry::admission::{
    AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, GrantSource,
    Partition, RetryAdmission, RetryKind, RetryRequest, Route, TokenBucketConfig,
};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::replay::BodySource;
use reqwest_safe_retry::{
    RequestOptions, RetryMiddleware, RetryPolicy, RetryPolicyBuilder, RetryReport, RetryReportExt,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// The scripted "status" of a request that fails below the retry layer
/// with an error (a middleware's), before any answer of the host.
const LOCAL_ERROR: u16 = 0;

/// What the server saw of one request.
#[derive(Debug, Clone)]
struct Arrival {
    at: Duration,
    method: http::Method,
    headers: http::HeaderMap,
    timeout: Option<Duration>,
    /// `Some(true)` answered, `Some(false)` dropped before its answer,
    /// `None` still in flight.
    answered: Option<bool>,
}

/// A server that answers each request after the next scripted latency with
/// the next scripted status (200 and `fast` once the script is spent).
#[derive(Clone)]
struct Server {
    origin: Instant,
    fast: Duration,
    script: Arc<Mutex<VecDeque<(Duration, u16)>>>,
    seen: Arc<Mutex<Vec<Arrival>>>,
}

impl Server {
    fn new(fast: Duration) -> Self {
        Server {
            origin: Instant::now(),
            fast,
            script: Arc::default(),
            seen: Arc::default(),
        }
    }

    /// The next requests' latencies and statuses, in arrival order.
    fn then(&self, answers: &[(Duration, u16)]) {
        self.script.lock().unwrap().extend(answers.iter().copied());
    }

    fn seen(&self) -> Vec<Arrival> {
        self.seen.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Marks an arrival dropped unless it was answered.
struct Answering {
    seen: Arc<Mutex<Vec<Arrival>>>,
    index: usize,
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut seen = self.seen.lock().unwrap();
        seen[self.index].answered.get_or_insert(false);
    }
}

#[async_trait::async_trait]
impl Middleware for Server {
    async fn handle(
        &self,
        req: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let (latency, status) = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((self.fast, 200));
        let index = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(Arrival {
                at: self.origin.elapsed(),
                method: req.method().clone(),
                headers: req.headers().clone(),
                timeout: req.timeout().copied(),
                answered: None,
            });
            seen.len() - 1
        };
        let guard = Answering {
            seen: self.seen.clone(),
            index,
        };
        tokio::time::sleep(latency).await;
        self.seen.lock().unwrap()[guard.index].answered = Some(true);
        if status == LOCAL_ERROR {
            let error = std::io::Error::other("failed below the retry layer");
            return Err(reqwest_middleware::Error::middleware(error));
        }
        let mut response = http::Response::builder().status(status);
        if status == 429 {
            response = response.header("retry-after", "2");
        }
        let response = response.body(format!("answer {index}")).unwrap();
        Ok(reqwest::Response::from(response))
    }
}

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder().seed(3)
}

fn client(policy: RetryPolicy, server: &Server) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .with(server.clone())
        .build()
}

/// Sends `n` GETs one after another, each answered as the script says.
async fn warm(client: &ClientWithMiddleware, n: usize) {
    for _ in 0..n {
        let r = client.get("http://svc.test/warm").send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
}

fn report(r: &reqwest::Response) -> RetryReport {
    r.retry_report().unwrap().clone()
}

/// The hedge delay the default settings give after 2 ms answers: the upper
/// bound of the histogram bucket holding 2 ms (50 µs × 1.25^17 ≈ 2.22 ms).
fn p95_of_2ms() -> Duration {
    Duration::from_secs_f64(50e-6 * 1.25f64.powi(17))
}

#[tokio::test(start_paused = true)]
async fn a_slow_get_is_hedged_after_its_hosts_p95_and_the_hedge_wins() {
    let server = Server::new(2 * MS);
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    assert_eq!(server.count(), 100, "no hedge while warming up");

    server.then(&[(300 * MS, 200)]);
    let start = Instant::now();
    let r = client.get("http://svc.test/slow").send().await.unwrap();
    let took = start.elapsed();
    let body_report = report(&r);
    assert_eq!(r.text().await.unwrap(), "answer 101", "the hedge's answer");

    let seen = server.seen();
    assert_eq!(seen.len(), 102);
    let (first, hedge) = (&seen[100], &seen[101]);
    let delay = hedge.at - first.at;
    // tokio's timer ticks in whole milliseconds, and never early.
    assert!(
        delay >= p95_of_2ms() && delay < p95_of_2ms() + MS,
        "the hedge goes at the host's p95: {delay:?}"
    );
    assert_eq!(took, delay + 2 * MS, "the first answer wins");
    assert_eq!(first.answered, Some(false), "the slow copy was dropped");
    assert_eq!(hedge.answered, Some(true));
    assert_eq!(body_report.attempts(), 1, "a hedge is not a retry");
    assert_eq!(body_report.hedges(), 1);
    assert_eq!(body_report.hedge_wins(), 1);
    let m = policy.metrics().snapshot();
    assert_eq!((m.hedges, m.hedge_wins, m.retries), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn no_host_is_hedged_before_it_has_enough_samples() {
    let server = Server::new(2 * MS);
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy, &server);
    warm(&client, 99).await;
    server.then(&[(300 * MS, 200)]);
    let r = client.get("http://svc.test/slow").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 100);
    // Another host has no samples of its own.
    warm(&client, 1).await;
    server.then(&[(300 * MS, 200)]);
    let r = client.get("http://other.test/slow").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 102);
}

#[tokio::test(start_paused = true)]
async fn the_first_copy_wins_when_it_answers_first() {
    let server = Server::new(2 * MS);
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    // The first copy answers at 4 ms, the hedge (sent at ~2.2 ms) at 302.
    server.then(&[(4 * MS, 200), (300 * MS, 200)]);
    let start = Instant::now();
    let r = client.get("http://svc.test/x").send().await.unwrap();
    assert_eq!(start.elapsed(), 4 * MS);
    assert_eq!(r.text().await.unwrap(), "answer 100");
    let seen = server.seen();
    assert_eq!(seen[100].answered, Some(true));
    assert_eq!(seen[101].answered, Some(false), "the hedge was dropped");
    let m = policy.metrics().snapshot();
    assert_eq!((m.hedges, m.hedge_wins), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_of_one_copy_waits_for_the_other() {
    let server = Server::new(2 * MS);
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    // The first copy fails at 10 ms while the hedge is in flight; the
    // hedge answers at ~2.2 + 20 ms.
    server.then(&[(10 * MS, 503), (20 * MS, 200)]);
    let r = client.get("http://svc.test/a").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 1));
    // The hedge fails at once; the first copy answers at 30 ms.
    server.then(&[(30 * MS, 200), (MS, 503)]);
    let start = Instant::now();
    let r = client.get("http://svc.test/b").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(start.elapsed(), 30 * MS);
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 0));
    assert_eq!(server.count(), 104, "no retry was needed");
}

/// A hedge that fails on its own side (an error, not an answer of the host)
/// drops out: it is never the call's verdict, and never a win.
#[tokio::test(start_paused = true)]
async fn a_hedge_that_fails_locally_is_never_the_verdict_nor_a_win() {
    let server = Server::new(2 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .max_attempts(1)
        .build()
        .unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    // The hedge fails at once; the first copy answers at 30 ms.
    server.then(&[(30 * MS, 200), (MS, LOCAL_ERROR)]);
    let start = Instant::now();
    let r = client.get("http://svc.test/a").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(start.elapsed(), 30 * MS, "the first copy was awaited");
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 0));
    // The first copy fails transiently at 10 ms, the hedge then fails at
    // ~2.2 + 20 ms: the first copy's answer is the call's.
    server.then(&[(10 * MS, 503), (20 * MS, LOCAL_ERROR)]);
    let r = client.get("http://svc.test/b").send().await.unwrap();
    assert_eq!(r.status(), 503);
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 0));
    let m = policy.metrics().snapshot();
    assert_eq!((m.hedges, m.hedge_wins), (2, 0));
}

/// A body made by a [`BodySource`] is made for a hedge only when the hedge
/// is sent: a file is not opened for a copy that never goes.
#[tokio::test(start_paused = true)]
async fn a_body_source_makes_a_hedges_body_only_when_the_hedge_is_sent() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let server = Server::new(2 * MS);
    let cfg = HedgeConfig {
        idempotent_methods: true,
        ..HedgeConfig::default()
    };
    let client = client(builder().hedge(cfg).build().unwrap(), &server);
    warm(&client, 100).await;
    let made = Arc::new(AtomicUsize::new(0));
    let count = made.clone();
    let source = BodySource::new(move || {
        count.fetch_add(1, SeqCst);
        let chunk = Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"doc"));
        reqwest::Body::wrap_stream(futures_util::stream::iter([chunk]))
    });
    // Answered before the hedge delay: no hedge, one body made.
    server.then(&[(MS, 200)]);
    let put = || {
        client
            .put("http://svc.test/doc")
            .with_extension(source.clone())
    };
    let r = put().send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(made.load(SeqCst), 1);
    // Slow: the hedge is sent, with a body of its own.
    server.then(&[(300 * MS, 200)]);
    let r = put().send().await.unwrap();
    let rep = report(&r);
    assert_eq!((rep.hedges(), rep.hedge_wins()), (1, 1));
    assert_eq!(made.load(SeqCst), 3);
}

/// 600 GETs, one every 10 ms, each first copy failing (503 after 10 ms)
/// and, when `hedged`, each hedge answering 200 at once, under a circuit
/// breaker: how many the breaker refused.
async fn refused_by_the_breaker(hedged: bool) -> usize {
    let server = Server::new(2 * MS);
    // Every first copy is slow: capped, the hedge delay stays below it.
    let cfg = HedgeConfig {
        max_extra_load: 1.0,
        max_delay: 5 * MS,
        ..HedgeConfig::default()
    };
    let policy = builder()
        .hedge(cfg)
        .no_budget()
        .max_attempts(1)
        .circuit_breaker(reqwest_safe_retry::admission::CircuitBreakerConfig::default())
        .build()
        .unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    let options = if hedged {
        RequestOptions::new()
    } else {
        RequestOptions::new().no_hedge()
    };
    let mut refused = 0;
    for i in 0..600 {
        server.script.lock().unwrap().clear();
        server.then(&[(10 * MS, 503), (MS, 200)]);
        let slot = reqwest_safe_retry::ReportSlot::new();
        let answer = client
            .get("http://svc.test/flaky")
            .with_extension(options.clone())
            .with_extension(slot.clone())
            .send()
            .await;
        let report = slot.take().unwrap();
        match report.stop_reason() {
            reqwest_safe_retry::StopReason::CircuitOpen => refused += 1,
            _ if hedged => {
                assert_eq!(answer.unwrap().status(), 200, "call {i}: {report:?}");
                assert_eq!((report.hedges(), report.hedge_wins()), (1, 1));
            }
            _ => {}
        }
        tokio::time::sleep(10 * MS).await;
    }
    refused
}

/// The breaker counts the answer the hedge race returned: a host whose
/// first copies fail but whose hedges succeed is accepting, and is never
/// refused; the same host, unhedged, is.
#[tokio::test(start_paused = true)]
async fn the_breaker_counts_the_answer_the_hedge_race_returned() {
    assert_eq!(refused_by_the_breaker(true).await, 0);
    assert!(refused_by_the_breaker(false).await > 0);
}

#[tokio::test(start_paused = true)]
async fn both_copies_failing_is_one_failed_attempt_then_a_retry() {
    let server = Server::new(2 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .max_attempts(2)
        .build()
        .unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    server.then(&[(10 * MS, 503), (20 * MS, 503), (2 * MS, 200)]);
    let start = Instant::now();
    let r = client.get("http://svc.test/c").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let rep = report(&r);
    assert_eq!(rep.attempts(), 2);
    assert_eq!(rep.hedges(), 1);
    assert_eq!(rep.hedge_wins(), 0);
    // The first copy's 503 did not end the attempt: the hedge's was
    // awaited (answered at ~2.2 + 20 ms), and only then the retry sent.
    let seen = server.seen();
    assert_eq!(seen.len(), 103);
    assert_eq!(seen[100].answered, Some(true));
    assert_eq!(seen[101].answered, Some(true));
    assert!(seen[102].at - seen[100].at >= 22 * MS, "{:?}", seen[102].at);
    assert!(start.elapsed() >= 22 * MS);
}

#[tokio::test(start_paused = true)]
async fn hedges_stay_within_the_extra_load_budget() {
    let server = Server::new(2 * MS);
    // Every request after the warm-up is slower than the (capped) delay,
    // so each would be hedged but for the budget.
    let cfg = HedgeConfig {
        max_delay: 3 * MS,
        ..HedgeConfig::default()
    };
    let policy = builder().hedge(cfg).no_budget().build().unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    let calls = 1000;
    server.then(&vec![(50 * MS, 200); calls * 2]);
    for _ in 0..calls {
        client.get("http://svc.test/slow").send().await.unwrap();
    }
    let hedges = policy.metrics().snapshot().hedges;
    let first_attempts = (100 + calls) as u64;
    // 5 % of the first attempts, and never more.
    assert_eq!(hedges, first_attempts / 20, "{hedges} hedges");
    assert_eq!(server.count() as u64, first_attempts + hedges);
}

#[tokio::test(start_paused = true)]
async fn a_drained_admission_sends_no_hedge() {
    let server = Server::new(2 * MS);
    // A bucket of one retry, and no deposits: the first hedge takes it.
    let admission = AdaptiveConfig {
        capacity: 1.0,
        first_attempt_deposit: 0.0,
        ..AdaptiveConfig::default()
    };
    let policy = builder()
        .hedge(HedgeConfig::default())
        .adaptive_admission(admission)
        .build()
        .unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    server.then(&[
        (300 * MS, 200),
        (2 * MS, 200),
        (300 * MS, 200),
        (2 * MS, 200),
    ]);
    let r = client.get("http://svc.test/1").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 1);
    let r = client.get("http://svc.test/2").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0, "the admission had nothing left");
    assert_eq!(server.count(), 103);
    // The refused hedge was given back to the hedge budget.
    assert_eq!(policy.metrics().snapshot().hedges, 1);
}

#[tokio::test(start_paused = true)]
async fn only_requests_safe_to_send_twice_are_hedged() {
    let server = Server::new(2 * MS);
    let everything = HedgeConfig {
        idempotent_methods: true,
        keyed: true,
        ..HedgeConfig::default()
    };
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    let slow = |server: &Server| server.then(&[(300 * MS, 200)]);

    // An unkeyed POST is never hedged, whatever the settings.
    slow(&server);
    let r = client
        .post("http://svc.test/pay")
        .body("{}")
        .with_extension(RequestOptions::new().no_idempotency_key().hedge(everything))
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    // A keyed POST only when asked for.
    slow(&server);
    let r = client
        .post("http://svc.test/pay")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    // A PUT only when asked for.
    slow(&server);
    let r = client
        .put("http://svc.test/doc")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 103);

    slow(&server);
    let r = client
        .post("http://svc.test/pay")
        .body("{}")
        .with_extension(RequestOptions::new().hedge(everything))
        .send()
        .await
        .unwrap();
    let rep = report(&r);
    assert_eq!(rep.hedges(), 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 105);
    let key = |a: &Arrival| a.headers.get("idempotency-key").cloned();
    assert_eq!(seen[103].method, http::Method::POST);
    assert!(key(&seen[103]).is_some());
    assert_eq!(
        key(&seen[103]),
        key(&seen[104]),
        "both copies carry one key"
    );
    assert_eq!(
        key(&seen[104]).unwrap().to_str().unwrap(),
        rep.idempotency_key().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_turns_hedging_on_or_off_for_itself() {
    let server = Server::new(2 * MS);
    let plain = client(builder().build().unwrap(), &server);
    let on = RequestOptions::new().hedge(HedgeConfig::default());
    for _ in 0..100 {
        plain
            .get("http://svc.test/w")
            .with_extension(on.clone())
            .send()
            .await
            .unwrap();
    }
    server.then(&[(300 * MS, 200)]);
    let r = plain.get("http://svc.test/slow").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0, "the policy does not hedge");
    server.then(&[(300 * MS, 200)]);
    let r = plain
        .get("http://svc.test/slow")
        .with_extension(on)
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 1, "this request does");

    let server = Server::new(2 * MS);
    let hedging = client(
        builder().hedge(HedgeConfig::default()).build().unwrap(),
        &server,
    );
    warm(&hedging, 100).await;
    server.then(&[(300 * MS, 200)]);
    let r = hedging
        .get("http://svc.test/slow")
        .with_extension(RequestOptions::new().no_hedge())
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 101);
}

#[tokio::test(start_paused = true)]
async fn the_hedge_is_sent_with_what_is_left_of_the_attempts_time() {
    let server = Server::new(2 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .attempt_timeout(50 * MS)
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    server.then(&[(300 * MS, 200)]);
    client.get("http://svc.test/slow").send().await.unwrap();
    let seen = server.seen();
    let (first, hedge) = (&seen[100], &seen[101]);
    let delay = hedge.at - first.at;
    assert!(
        delay >= p95_of_2ms() && delay < p95_of_2ms() + MS,
        "{delay:?}"
    );
    assert_eq!(first.timeout, Some(50 * MS));
    assert_eq!(hedge.timeout, Some(50 * MS - delay));
    let left = |a: &Arrival| -> u64 {
        a.headers["request-timeout-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(left(first), 50);
    assert_eq!(left(hedge), (50 * MS - delay).as_millis() as u64);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_the_delay_would_outlast_the_attempt() {
    let server = Server::new(20 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .attempt_timeout(10 * MS)
        .build()
        .unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    server.then(&[(300 * MS, 200)]);
    let r = client.get("http://svc.test/slow").send().await.unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 101);
}

#[tokio::test(start_paused = true)]
async fn the_report_names_hedges_only_when_one_was_sent() {
    let server = Server::new(2 * MS);
    let policy = builder().hedge(HedgeConfig::default()).build().unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    let r = client.get("http://svc.test/x").send().await.unwrap();
    let json = serde_json::to_value(report(&r)).unwrap();
    assert!(json.get("hedges").is_none(), "{json}");
    server.then(&[(300 * MS, 200)]);
    let r = client.get("http://svc.test/x").send().await.unwrap();
    let json = serde_json::to_value(report(&r)).unwrap();
    assert_eq!(json["hedges"], 1, "{json}");
    assert_eq!(json["hedge_wins"], 1, "{json}");
}

#[test]
fn out_of_range_settings_are_refused_by_the_builder() {
    let err = RetryPolicy::builder()
        .hedge(HedgeConfig {
            percentile: 0.0,
            ..HedgeConfig::default()
        })
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "hedge.percentile");
    assert!(RetryPolicy::default().hedge().is_none(), "off by default");
}

/// A keep-alive HTTP/1.1 server on 127.0.0.1: `/race`'s first request gets
/// half a response head and then nothing (until the client closes the
/// connection, which `closed` is told of); every other request is answered
/// at once with its path.
async fn stalling_server() -> (std::net::SocketAddr, Arc<tokio::sync::Notify>) {
    let (addr, closed, _) = stalling_server_counting().await;
    (addr, closed)
}

/// [`stalling_server`], where every `/hang` request stalls too, with the
/// number of stalled connections the client hung up.
async fn stalling_server_counting() -> (
    std::net::SocketAddr,
    Arc<tokio::sync::Notify>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = Arc::new(tokio::sync::Notify::new());
    let races = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hung_up = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (notify, count) = (closed.clone(), hung_up.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (closed, races, hung_up) = (notify.clone(), races.clone(), count.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let first_race = path == "/race"
                        && races.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                    if first_race || path == "/hang" {
                        let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-le").await;
                        // Stalled mid-head until the client hangs up.
                        while let Ok(n) = socket.read(&mut chunk).await {
                            if n == 0 {
                                break;
                            }
                        }
                        hung_up.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        closed.notify_one();
                        return;
                    }
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{}",
                        path.len(),
                        path
                    );
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, closed, hung_up)
}

#[tokio::test]
async fn over_real_sockets_the_hedge_wins_and_the_stalled_copy_is_hung_up() {
    let (addr, closed) = stalling_server().await;
    let cfg = HedgeConfig {
        min_samples: 5,
        min_delay: 20 * MS,
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    let policy = RetryPolicy::builder().hedge(cfg).build().unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let url = |path: &str| format!("http://{addr}{path}");
    for _ in 0..5 {
        let r = client.get(url("/warm")).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "/warm");
    }
    let r = client.get(url("/race")).send().await.unwrap();
    let rep = report(&r);
    assert_eq!(r.text().await.unwrap(), "/race", "the hedge's answer");
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 1));
    // The stalled copy's connection is closed, not kept for reuse; a bound,
    // not a timing: it is hung up as soon as the hedge answers.
    tokio::time::timeout(Duration::from_secs(30), closed.notified())
        .await
        .expect("the stalled copy's connection was hung up");
    let r = client.get(url("/after")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "/after");
}

#[tokio::test(start_paused = true)]
async fn idempotent_methods_and_a_callers_own_key_are_hedged_when_asked() {
    let server = Server::new(2 * MS);
    let cfg = HedgeConfig {
        idempotent_methods: true,
        keyed: true,
        ..HedgeConfig::default()
    };
    let client = client(builder().hedge(cfg).build().unwrap(), &server);
    warm(&client, 100).await;
    server.then(&[(300 * MS, 200)]);
    let r = client
        .put("http://svc.test/doc")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 1);
    server.then(&[(300 * MS, 200)]);
    let r = client
        .post("http://svc.test/pay")
        .header("idempotency-key", "order-7-charge")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 104);
    for copy in &seen[102..] {
        assert_eq!(copy.headers["idempotency-key"], "order-7-charge");
    }
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_with_no_replay_buffer_is_sent_once() {
    // With a buffer, it is hedged from it: tests/replayable_bodies.rs.
    let server = Server::new(2 * MS);
    let cfg = HedgeConfig {
        idempotent_methods: true,
        ..HedgeConfig::default()
    };
    let policy = builder().hedge(cfg).body_replay_limit(0);
    let client = client(policy.build().unwrap(), &server);
    warm(&client, 100).await;
    server.then(&[(300 * MS, 200)]);
    let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>("{}")]);
    let r = client
        .put("http://svc.test/doc")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 101);
}

#[tokio::test(start_paused = true)]
async fn a_requests_settings_out_of_range_are_ignored() {
    let server = Server::new(2 * MS);
    let bad = HedgeConfig {
        percentile: 2.0,
        ..HedgeConfig::default()
    };
    // Off in the policy, and still off.
    let plain = client(builder().build().unwrap(), &server);
    for _ in 0..100 {
        plain
            .get("http://svc.test/w")
            .with_extension(RequestOptions::new().hedge(bad))
            .send()
            .await
            .unwrap();
    }
    server.then(&[(300 * MS, 200)]);
    let r = plain
        .get("http://svc.test/slow")
        .with_extension(RequestOptions::new().hedge(bad))
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    // Turned off for the request, and still off.
    let server = Server::new(2 * MS);
    let hedging = client(
        builder().hedge(HedgeConfig::default()).build().unwrap(),
        &server,
    );
    warm(&hedging, 100).await;
    server.then(&[(300 * MS, 200)]);
    let r = hedging
        .get("http://svc.test/slow")
        .with_extension(RequestOptions::new().no_hedge().hedge(bad))
        .send()
        .await
        .unwrap();
    assert_eq!(report(&r).hedges(), 0);
    assert_eq!(server.count(), 101);
}

#[tokio::test(start_paused = true)]
async fn with_a_deadline_alone_the_hedge_gets_what_is_left_of_it() {
    let server = Server::new(2 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .deadline(Duration::from_secs(1))
        .max_attempts(1)
        .build()
        .unwrap();
    let client = client(policy, &server);
    warm(&client, 100).await;
    server.then(&[(300 * MS, 200)]);
    let r = client.get("http://svc.test/slow").send().await.unwrap();
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 1));
    let seen = server.seen();
    let (first, hedge) = (&seen[100], &seen[101]);
    let delay = hedge.at - first.at;
    assert_eq!(first.timeout, Some(Duration::from_secs(1)));
    assert_eq!(hedge.timeout, Some(Duration::from_secs(1) - delay));
    assert_eq!(
        hedge.headers["request-timeout-ms"],
        (1000 - delay.as_millis()).to_string().as_str()
    );
}

#[tokio::test(start_paused = true)]
async fn the_admission_is_asked_for_each_hedge_and_told_how_it_ended() {
    let server = Server::new(2 * MS);
    let ledger = Arc::new(Ledger::default());
    let policy = builder()
        .hedge(HedgeConfig::default())
        .shared_admission(ledger.clone())
        .build()
        .unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    ledger.records.lock().unwrap().clear();

    // The hedge wins: it is recorded as a success under its grant.
    server.then(&[(300 * MS, 200)]);
    client.get("http://svc.test/1").send().await.unwrap();
    // The first copy wins: the hedge, dropped, is recorded as neither.
    server.then(&[(4 * MS, 200), (300 * MS, 200)]);
    client.get("http://svc.test/2").send().await.unwrap();
    // The hedge is throttled while the first copy is in flight, which then
    // answers: the throttle still reaches the admission.
    server.then(&[(30 * MS, 200), (MS, 429)]);
    client.get("http://svc.test/3").send().await.unwrap();

    assert_eq!(*ledger.asked.lock().unwrap(), [RetryKind::Hedge; 3]);
    let records = ledger.records.lock().unwrap();
    let hedges: Vec<_> = records.iter().filter(|r| r.grant().is_some()).collect();
    let results: Vec<_> = hedges.iter().map(|r| r.result()).collect();
    assert_eq!(
        results,
        [
            AttemptResult::Success,
            AttemptResult::Other,
            AttemptResult::Failure
        ]
    );
    assert!(hedges.iter().all(|r| r.attempt() == 1));
    assert!(!hedges[0].was_throttled() && hedges[2].was_throttled());
    assert_eq!(hedges[2].retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(policy.metrics().snapshot().throttled, 1);
    // And each call's own attempt was recorded once, as before.
    assert_eq!(records.iter().filter(|r| r.grant().is_none()).count(), 3);
}

#[tokio::test]
async fn over_real_sockets_both_copies_end_by_the_attempts_timeout() {
    let (addr, closed, hung_up) = stalling_server_counting().await;
    let cfg = HedgeConfig {
        min_samples: 5,
        min_delay: 20 * MS,
        max_extra_load: 1.0,
        ..HedgeConfig::default()
    };
    let policy = RetryPolicy::builder()
        .hedge(cfg)
        .attempt_timeout(300 * MS)
        .max_attempts(1)
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let url = |path: &str| format!("http://{addr}{path}");
    for _ in 0..5 {
        client.get(url("/warm")).send().await.unwrap();
    }
    // Both copies stall: the call ends with the timeout, as reqwest made
    // it (a bound, not a timing: without the copies' timeouts it would
    // never end).
    let slot = reqwest_safe_retry::ReportSlot::new();
    let call = client.get(url("/hang")).with_extension(slot.clone()).send();
    let err = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the attempt's timeout ends both copies")
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let rep = slot.take().unwrap();
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 0));
    // Both stalled connections were hung up (each tells `closed`).
    let both = async {
        while hung_up.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            closed.notified().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), both)
        .await
        .expect("both stalled copies were hung up");
    assert_eq!(hung_up.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The first copy's throttling answer reaches the admission when the
/// hedge's answer is the one used, as the hedge's does the other way round.
#[tokio::test(start_paused = true)]
async fn a_throttled_first_copy_reaches_the_admission_when_the_hedge_wins() {
    let server = Server::new(2 * MS);
    let ledger = Arc::new(Ledger::default());
    let policy = builder()
        .hedge(HedgeConfig::default())
        .shared_admission(ledger.clone())
        .build()
        .unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    ledger.records.lock().unwrap().clear();
    // The first copy: 429 with Retry-After: 2 at 10 ms; the hedge (sent at
    // the p95, ~2 ms) answers 200 at ~22 ms.
    server.then(&[(10 * MS, 429), (20 * MS, 200)]);
    let r = client.get("http://svc.test/t").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let rep = report(&r);
    assert_eq!((rep.attempts(), rep.hedges(), rep.hedge_wins()), (1, 1, 1));
    assert_eq!(server.seen()[100].answered, Some(true), "the 429 was sent");
    let records = ledger.records.lock().unwrap();
    // Two answers, two records: the hedge's success (the engine's, as the
    // answer used) and the first copy's 429 under the hedge's grant.
    assert_eq!(records.len(), 2, "{records:?}");
    let throttled: Vec<_> = records.iter().filter(|r| r.was_throttled()).collect();
    assert_eq!(throttled.len(), 1, "{records:?}");
    assert_eq!(throttled[0].result(), AttemptResult::Failure);
    assert_eq!(throttled[0].retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(policy.metrics().snapshot().throttled, 1);
}

/// Both copies fail: the retry waits out the longer Retry-After, whichever
/// copy carried it, with an admission that does not pace (so the wait is
/// the engine's floor, not the admission's).
#[tokio::test(start_paused = true)]
async fn both_copies_failing_the_retry_honours_either_copys_retry_after() {
    // (first copy, hedge): the 429 (Retry-After: 2) on either side.
    for script in [
        [(10 * MS, 429), (20 * MS, 503)],
        [(30 * MS, 503), (MS, 429)],
    ] {
        let server = Server::new(2 * MS);
        let policy = builder()
            .hedge(HedgeConfig::default())
            .token_bucket(TokenBucketConfig::default())
            .max_attempts(2)
            .build()
            .unwrap();
        let client = client(policy.clone(), &server);
        warm(&client, 100).await;
        server.then(&script);
        let r = client.get("http://svc.test/b").send().await.unwrap();
        let rep = report(&r);
        assert_eq!(
            (rep.attempts(), rep.hedges()),
            (2, 1),
            "{script:?}: {rep:?}"
        );
        assert_eq!(rep.retry_after_honoured(), 1, "{script:?}: {rep:?}");
        assert!(
            rep.delays()[0] >= Duration::from_secs(2),
            "{script:?}: {rep:?}"
        );
        let seen = server.seen();
        assert_eq!(seen.len(), 103, "{script:?}");
        let last_failure = seen[100..102]
            .iter()
            .zip(&script)
            .map(|(a, (latency, _))| a.at + *latency)
            .max()
            .unwrap();
        assert!(
            seen[102].at >= last_failure + Duration::from_secs(2) - 20 * MS,
            "{script:?}: the retry went {:?} after the failures",
            seen[102].at - last_failure
        );
    }
}

/// The same with the default admission: the first copy's Retry-After holds
/// the retry back.
#[tokio::test(start_paused = true)]
async fn the_first_copys_retry_after_is_honoured_when_both_copies_fail() {
    let server = Server::new(2 * MS);
    let policy = builder()
        .hedge(HedgeConfig::default())
        .max_attempts(2)
        .build()
        .unwrap();
    let client = client(policy.clone(), &server);
    warm(&client, 100).await;
    // The first copy: 429 with Retry-After: 2 at 10 ms; the hedge: 503 at ~22 ms.
    server.then(&[(10 * MS, 429), (20 * MS, 503), (2 * MS, 200)]);
    let r = client.get("http://svc.test/b").send().await.unwrap();
    let rep = report(&r);
    let seen = server.seen();
    assert_eq!(seen.len(), 103, "{rep:?}");
    let throttled_at = seen[100].at + 10 * MS;
    assert!(
        seen[102].at >= throttled_at + Duration::from_secs(2),
        "the retry went {:?} after the server said `Retry-After: 2` ({rep:?})",
        seen[102].at - throttled_at
    );
}

/// A paced route is never hedged: once it has throttled (a 429 with a
/// Retry-After), a hedge to it is refused, though the host's bucket could
/// still pay for it; a hedge to another route of the host, or to another
/// host, is admitted. (A hedge to a route that asked for fewer requests is
/// the one request it surely does not want.)
#[test]
fn a_paced_route_is_never_hedged() {
    let admission = AdaptiveAdmission::new(AdaptiveConfig::default()).unwrap();
    let (paced, calm) = (Partition::named("paced"), Partition::named("calm"));
    let (search, items) = (Route::of_path("/search"), Route::of_path("/items"));
    let now = std::time::Instant::now();
    let hedge = RetryRequest::new(RetryKind::Hedge, Duration::ZERO);
    let admitted = |p, route| {
        matches!(admission.admit(p, hedge.on_route(route), now),
            Admission::Admit(g) if g.source() == GrantSource::Hedge)
    };
    assert!(admitted(paced, search), "the bucket pays for a hedge");
    let throttled = AttemptRecord::new(1, None, AttemptResult::Failure)
        .throttled(Some(Duration::from_secs(1)))
        .too_fast()
        .on_route(search);
    admission.record(paced, throttled, now);
    assert!(
        admission.pace_rate(paced, search).is_some(),
        "the route is paced"
    );
    assert_eq!(
        admission.admit(paced, hedge.on_route(search), now),
        Admission::Refuse
    );
    assert!(admitted(paced, items));
    assert!(admitted(calm, search));
}
