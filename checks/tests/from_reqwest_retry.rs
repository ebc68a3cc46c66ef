//! The README's "Coming from reqwest-retry": the same scenarios through
//! reqwest-retry 0.9 (`RetryTransientMiddleware` with an
//! `ExponentialBackoff` of two retries) and through this crate (three
//! attempts), side by side, so each difference the README claims is shown
//! here, with the cases where both agree.
//!
//! reqwest-retry sleeps for real; its bounds are zero here, so it never
//! waits. Ours runs on a manual clock. The slow call runs both over a
//! stand-in for the network, with no socket, on tokio's paused clock.

mod support;

use std::time::{Duration, Instant};

use http::Extensions;
use reqwest::Method;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{
    ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy, RetryReport, StopReason,
};
use support::{answering_with, refused_addr};
use wiremock::{MockServer, ResponseTemplate};

/// reqwest-retry with two retries (three attempts) and no waiting.
fn theirs() -> ClientWithMiddleware {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::ZERO, Duration::ZERO)
        .build_with_max_retries(2);
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build()
}

/// This crate with three attempts (the default), on a manual clock.
fn ours(clock: &ManualClock) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .manual_clock(clock)
        .seed(7)
        .build()
        .unwrap();
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

/// How many requests `method` to a server answering `template` costs
/// through reqwest-retry, and through ours (with our report).
async fn attempts(
    method: &str,
    options: RequestOptions,
    template: ResponseTemplate,
) -> (usize, usize, RetryReport) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let server = answering_with(template.clone()).await;
    theirs()
        .request(method.clone(), server.uri())
        .send()
        .await
        .unwrap();
    let their_count = requests(&server).await;

    let server = answering_with(template).await;
    let clock = ManualClock::new();
    let response = ours(&clock)
        .request(method, server.uri())
        .with_extension(options)
        .send()
        .await
        .unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (their_count, requests(&server).await, report)
}

#[tokio::test]
async fn both_retry_the_ordinary_transient_answers() {
    for status in [408, 429, 500, 502, 503, 504] {
        let (theirs, ours, _) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (3, 3), "{status}");
    }
    // And neither retries a plain 4xx, or a success.
    for status in [200, 400, 404, 422] {
        let (theirs, ours, _) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (1, 1), "{status}");
    }
}

#[tokio::test]
async fn a_5xx_that_names_a_lasting_condition_is_permanent_here() {
    for status in [501, 505, 506, 507, 508, 510, 511] {
        let (theirs, ours, report) =
            attempts("GET", RequestOptions::new(), ResponseTemplate::new(status)).await;
        assert_eq!((theirs, ours), (3, 1), "{status}");
        assert_eq!(report.stop_reason(), StopReason::Permanent);
    }
}

#[tokio::test]
async fn a_post_without_a_key_and_an_extension_method_are_not_retried_here() {
    let no_key = RequestOptions::new().no_idempotency_key();
    let (theirs, ours, report) = attempts("POST", no_key, ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 1), "a blind POST retry could pay twice");
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);

    // A method outside RFC 9110's idempotent set, with no key by default.
    let (theirs, ours, report) =
        attempts("PURGE", RequestOptions::new(), ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 1));
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);

    // A POST with the key this crate attaches is retried by both.
    let (theirs, ours, report) =
        attempts("POST", RequestOptions::new(), ResponseTemplate::new(503)).await;
    assert_eq!((theirs, ours), (3, 3));
    assert!(report.idempotency_key().is_some());
}

#[tokio::test]
async fn conflict_too_early_and_a_temporary_413_are_transient_here() {
    // 409 to a keyed request: the original is still in progress.
    let (theirs, ours, _) =
        attempts("POST", RequestOptions::new(), ResponseTemplate::new(409)).await;
    assert_eq!((theirs, ours), (1, 3), "409");
    let (theirs, ours, _) =
        attempts("GET", RequestOptions::new(), ResponseTemplate::new(425)).await;
    assert_eq!((theirs, ours), (1, 3), "425");
    let temporary = ResponseTemplate::new(413).insert_header("Retry-After", "1");
    let (theirs, ours, _) = attempts("PUT", RequestOptions::new(), temporary).await;
    assert_eq!((theirs, ours), (1, 3), "413 with Retry-After");
    // Without Retry-After, 413 is permanent for both.
    let (theirs, ours, _) =
        attempts("PUT", RequestOptions::new(), ResponseTemplate::new(413)).await;
    assert_eq!((theirs, ours), (1, 1), "413");
}

#[tokio::test]
async fn retry_after_is_honoured_here() {
    let busy = ResponseTemplate::new(503).insert_header("Retry-After", "2");
    // reqwest-retry waits its own backoff (zero here), whatever the server
    // asked for: three attempts well inside the 4 s it asked for.
    let server = answering_with(busy.clone()).await;
    let started = Instant::now();
    theirs().get(server.uri()).send().await.unwrap();
    assert_eq!(requests(&server).await, 3);
    assert!(started.elapsed() < Duration::from_secs(2));

    let (_, ours, report) = attempts("GET", RequestOptions::new(), busy).await;
    assert_eq!(ours, 3);
    assert_eq!(report.retry_after_honoured(), 2);
    assert!(report.delays().iter().all(|d| *d >= Duration::from_secs(2)));
}

#[tokio::test]
async fn a_transport_error_comes_back_unchanged_here() {
    let url = format!("http://{}/", refused_addr().await);
    let their_err = theirs().get(&url).send().await.unwrap_err();
    // Wrapped in RetryError: reqwest's predicates no longer see it.
    assert!(their_err.is_middleware());
    assert!(!their_err.is_connect());
    assert!(
        their_err.to_string().contains("after 2 retries"),
        "{their_err}"
    );

    let clock = ManualClock::new();
    let slot = ReportSlot::new();
    let our_err = ours(&clock)
        .get(&url)
        .with_extension(slot.clone())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(our_err, reqwest_middleware::Error::Reqwest(_)));
    assert!(our_err.is_connect());
    // What RetryError::WithRetries counted is in the report.
    let report = slot.take().unwrap();
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
}

#[tokio::test]
async fn a_streamed_body_is_replayed_here_and_not_sent_at_all_there() {
    fn streamed() -> reqwest::Body {
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("{\"amount\":"), Ok("1}")];
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    }
    let server = answering_with(ResponseTemplate::new(503)).await;
    let err = theirs()
        .put(server.uri())
        .body(streamed())
        .send()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not cloneable"), "{err}");
    assert_eq!(requests(&server).await, 0, "refused before sending");

    let server = answering_with(ResponseTemplate::new(503)).await;
    let clock = ManualClock::new();
    let response = ours(&clock)
        .put(server.uri())
        .body(streamed())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    // Kept as it was sent the first time, and sent again from the buffer.
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 3, "sent three times");
    assert!(received.iter().all(|r| r.body == b"{\"amount\":1}"));
}

/// In place of the network, below either retry layer: a server that takes
/// this long to answer, on tokio's clock (paused in the tests that use it,
/// so nothing waits for real, and no socket is involved). Like reqwest's
/// transport, it stops waiting at the request's own timeout, the one a
/// retry layer set for the attempt (with an error of its own: reqwest's
/// timeout error cannot be made outside reqwest).
#[derive(Debug, Clone, Copy)]
struct Takes(Duration);

#[derive(Debug)]
struct TimedOut;

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the attempt's timeout elapsed")
    }
}

impl std::error::Error for TimedOut {}

#[async_trait::async_trait]
impl Middleware for Takes {
    async fn handle(
        &self,
        request: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        match request.timeout() {
            Some(&timeout) if timeout < self.0 => {
                tokio::time::sleep(timeout).await;
                Err(reqwest_middleware::Error::middleware(TimedOut))
            }
            _ => {
                tokio::time::sleep(self.0).await;
                Ok(http::Response::new("done").into())
            }
        }
    }
}

/// `retry` over a server that takes `takes`: the status or the error, and
/// how long the call took on tokio's clock.
async fn slow_call(retry: impl Middleware, takes: Duration) -> (Result<u16, String>, Duration) {
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(retry)
        .with(Takes(takes))
        .build();
    let started = tokio::time::Instant::now();
    let result = client.get("http://api.example.test/report").send().await;
    let outcome = result
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string());
    (outcome, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_32_s_call_is_cut_at_the_default_30_s_deadline_here() {
    let slow = Duration::from_secs(32);
    // reqwest-retry, as it comes (no total duration; reqwest's client has
    // no timeout): the call finishes.
    let their_policy = ExponentialBackoff::builder().build_with_max_retries(3);
    let (outcome, took) = slow_call(
        RetryTransientMiddleware::new_with_policy(their_policy),
        slow,
    )
    .await;
    assert_eq!((outcome, took), (Ok(200), slow));

    // Ours, as it comes: the attempt gets the 30 s left as its timeout, and
    // the call fails at 30 s, with no time for another attempt.
    let (outcome, took) = slow_call(RetryMiddleware::new(RetryPolicy::default()), slow).await;
    assert_eq!(outcome, Err(TimedOut.to_string()));
    assert_eq!(took, Duration::from_secs(30));

    // Turned off (`.no_deadline()`), or longer than the slowest call: it
    // finishes as theirs does.
    for policy in [
        RetryPolicy::builder().no_deadline(),
        RetryPolicy::builder().deadline(Duration::from_secs(60)),
    ] {
        let retry = RetryMiddleware::new(policy.build().unwrap());
        assert_eq!(slow_call(retry, slow).await, (Ok(200), slow));
    }
}

#[tokio::test]
async fn the_key_and_the_time_left_go_to_every_host_here() {
    const KEY: &str = "idempotency-key";
    const TIME_LEFT: &str = "request-timeout-ms";
    // A third party's API, outside your own services.
    let third_party = answering_with(ResponseTemplate::new(201)).await;
    let server = &third_party;
    let sent = |i: usize| async move {
        let received = server.received_requests().await.unwrap();
        let has = |name: &str| received[i].headers.contains_key(name);
        (has(KEY), has(TIME_LEFT))
    };
    theirs().post(third_party.uri()).send().await.unwrap();
    assert_eq!(sent(0).await, (false, false), "reqwest-retry sends neither");

    let clock = ManualClock::new();
    ours(&clock).post(third_party.uri()).send().await.unwrap();
    assert_eq!(sent(1).await, (true, true), "this crate, by default, both");

    // Turned off for a client that calls third parties: no deadline header,
    // and no key attached to any method.
    let quiet = RetryPolicy::builder()
        .no_deadline_header()
        .idempotency_methods([])
        .manual_clock(&clock)
        .build()
        .unwrap();
    let quiet = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(quiet))
        .build();
    quiet.post(third_party.uri()).send().await.unwrap();
    assert_eq!(sent(2).await, (false, false));

    // Or the key off for one request.
    ours(&clock)
        .post(third_party.uri())
        .with_extension(RequestOptions::new().no_idempotency_key())
        .send()
        .await
        .unwrap();
    assert_eq!(sent(3).await, (false, true));
}
