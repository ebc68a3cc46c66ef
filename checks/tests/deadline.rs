//! The deadline: no sleep crosses it, and each attempt's timeout is
//! min(configured, time left).

mod support;

use std::time::Duration;

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{Jitter, RequestOptions, RetryPolicy, RetryReport, StopReason};
use support::{client, ms, policy};
use wiremock::{MockServer, ResponseTemplate};

async fn always_503() -> MockServer {
    support::answering_with(ResponseTemplate::new(503).set_body_string("down")).await
}

#[tokio::test]
async fn no_sleep_crosses_the_deadline() {
    let server = always_503().await;
    for seed in 0..20 {
        let clock = ManualClock::new();
        let p = policy(&clock)
            .seed(seed)
            .max_attempts(100)
            .backoff(ms(100), ms(800))
            .deadline(Duration::from_secs(2))
            .min_attempt_window(ms(50))
            .no_budget()
            .build()
            .unwrap();
        let counters = p.clone();
        let (c, _) = client(p);
        let response = c.get(server.uri()).send().await.unwrap();
        assert_eq!(counters.metrics().snapshot().deadline_give_ups, 1);
        assert_eq!(response.status(), 503, "the last response, unchanged");
        let report = response.extensions().get::<RetryReport>().unwrap().clone();
        assert_eq!(report.stop_reason(), StopReason::Deadline);
        assert_eq!(response.text().await.unwrap(), "down");
        // Every sleep ended with at least the attempt window left.
        assert!(
            clock.elapsed() + ms(50) <= Duration::from_secs(2),
            "seed {seed}"
        );
        assert_eq!(report.delays(), clock.sleeps());
    }
}

#[tokio::test]
async fn the_attempt_timeout_is_the_smaller_of_configured_and_time_left() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(100)
        .backoff(ms(200), ms(200))
        .jitter(Jitter::None)
        .attempt_timeout(ms(500))
        .deadline(ms(1000))
        .min_attempt_window(ms(100))
        .build()
        .unwrap();
    let (c, recorder) = client(p);
    let response = c.get(server.uri()).send().await.unwrap();
    let timeouts: Vec<_> = recorder
        .timeouts()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(timeouts, [ms(500), ms(500), ms(500), ms(400), ms(200)]);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Deadline);
}

#[tokio::test]
async fn a_callers_own_request_timeout_is_kept_when_shorter() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).deadline(ms(1000)).build().unwrap());
    c.get(server.uri()).timeout(ms(150)).send().await.unwrap();
    assert!(recorder.timeouts().iter().all(|t| *t == Some(ms(150))));
}

#[tokio::test]
async fn a_request_can_set_its_own_deadline_and_attempts() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(
        policy(&clock)
            .deadline(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    c.get(server.uri())
        .with_extension(RequestOptions::new().deadline(ms(300)).max_attempts(10))
        .send()
        .await
        .unwrap();
    assert_eq!(recorder.timeouts()[0], Some(ms(300)));
    assert!(clock.elapsed() <= ms(300));
    let before = recorder.sent().len();
    let response = c
        .get(server.uri())
        .with_extension(RequestOptions::new().max_attempts(1))
        .send()
        .await
        .unwrap();
    assert_eq!(recorder.sent().len(), before + 1);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
}

#[tokio::test]
async fn the_time_left_and_attempt_number_can_be_sent_downstream() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .backoff(ms(250), ms(250))
        .jitter(Jitter::None)
        .deadline(ms(1000))
        .deadline_header("x-deadline-ms")
        .attempt_count_header("x-attempt-count")
        .build()
        .unwrap();
    let (c, _) = client(p);
    c.get(server.uri()).send().await.unwrap();
    let received = server.received_requests().await.unwrap();
    let header = |name: &str| -> Vec<String> {
        received
            .iter()
            .map(|r| r.headers.get(name).unwrap().to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(header("x-deadline-ms"), ["1000", "750", "500"]);
    assert_eq!(header("x-attempt-count"), ["1", "2", "3"]);
}

#[tokio::test]
async fn by_default_the_time_left_is_sent_and_the_attempt_number_is_not() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .backoff(ms(250), ms(250))
        .jitter(Jitter::None)
        .deadline(ms(1000))
        .build()
        .unwrap();
    let (c, recorder) = client(p);
    c.get(server.uri()).send().await.unwrap();
    // Every attempt, on the wire, with what was left when it was sent.
    let received = server.received_requests().await.unwrap();
    let left: Vec<_> = received
        .iter()
        .map(|r| r.headers["request-timeout-ms"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, ["1000", "750", "500"]);
    for sent in recorder.sent() {
        assert_eq!(sent.headers.len(), 1, "{:?}", sent.headers);
    }
}

/// The header says how long this attempt is waited for: with an attempt
/// timeout shorter than the time left, or the caller's own shorter request
/// timeout, that, not the whole call's time (past it the attempt is
/// abandoned and another sent); a smaller value the request already
/// carries is kept.
#[tokio::test]
async fn the_header_is_what_this_attempt_is_waited_for() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .backoff(ms(250), ms(250))
        .jitter(Jitter::None)
        .deadline(ms(30_000))
        .attempt_timeout(ms(1_000))
        .build()
        .unwrap();
    let (c, _) = client(p);
    c.get(server.uri()).send().await.unwrap();
    c.get(server.uri()).timeout(ms(400)).send().await.unwrap();
    c.get(server.uri())
        .header("request-timeout-ms", "300")
        .send()
        .await
        .unwrap();
    c.get(server.uri())
        .header("request-timeout-ms", "9000")
        .send()
        .await
        .unwrap();
    let received = server.received_requests().await.unwrap();
    let left: Vec<_> = received
        .iter()
        .map(|r| r.headers["request-timeout-ms"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        left,
        [
            "1000", "1000", "1000", // the attempt timeout
            "400", "400", "400", // the caller's request timeout
            "300", "300", "300", // the caller's own, smaller value
            "1000", "1000", "1000", // a larger one is replaced
        ]
    );
}

#[tokio::test]
async fn no_deadline_header_sends_none_and_no_deadline_has_none_to_send() {
    let server = always_503().await;
    for p in [
        RetryPolicy::builder().no_deadline_header(),
        RetryPolicy::builder().no_deadline(),
    ] {
        let clock = ManualClock::new();
        let (c, recorder) = client(p.manual_clock(&clock).seed(7).build().unwrap());
        c.get(server.uri()).send().await.unwrap();
        assert_eq!(recorder.sent().len(), 3);
        for sent in recorder.sent() {
            assert_eq!(sent.headers.len(), 0, "{:?}", sent.headers);
        }
    }
}

#[tokio::test]
async fn a_transport_error_that_cannot_be_retried_in_time_is_returned_at_once() {
    let addr = support::refused_addr().await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(10)
        .backoff(ms(400), ms(400))
        .jitter(Jitter::None)
        .deadline(ms(1000))
        .build()
        .unwrap();
    let (c, _) = client(p);
    let (err, report) = support::send_failing(c.get(format!("http://{addr}/"))).await;
    assert!(err.is_connect(), "the last error, unchanged");
    assert_eq!(report.stop_reason(), StopReason::Deadline);
    assert_eq!(report.delays(), [ms(400), ms(400)]);
    assert_eq!(clock.elapsed(), ms(800));
}

#[tokio::test]
async fn zero_request_limits_are_ignored() {
    let server = always_503().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).deadline(ms(1000)).build().unwrap());
    let response = c
        .get(server.uri())
        .with_extension(
            RequestOptions::new()
                .deadline(Duration::ZERO)
                .attempt_timeout(Duration::ZERO),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        recorder.timeouts()[0],
        Some(ms(1000)),
        "the policy's deadline"
    );
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 3);
}

/// A caller's own per-request deadline is a budget to use: shorter than
/// the policy's minimum attempt window, it still sends its first attempt,
/// with the time left as its timeout, and the call completes (issue 51:
/// a 50 ms deadline to a service answering in 2 ms was refused unsent).
/// The window still guards the retry: a 503 within such a deadline is
/// not tried again.
#[tokio::test]
async fn a_callers_own_deadline_under_the_window_sends_its_first_attempt() {
    let ok = support::answering_with(ResponseTemplate::new(200)).await;
    let down = always_503().await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).min_attempt_window(ms(100)).build().unwrap());
    let own = || RequestOptions::new().deadline(ms(50));
    let response = c.get(ok.uri()).with_extension(own()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(recorder.timeouts(), [Some(ms(50))], "within its deadline");
    let response = c
        .get(down.uri())
        .with_extension(own())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "the answer, unchanged");
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 1, "no retry without the window");
    assert_eq!(report.stop_reason(), StopReason::Deadline);
    assert!(clock.sleeps().is_empty(), "nothing slept");
}

/// The deadline still holds while the caller reads the body, after the
/// middleware has returned the response: a server that sends its head and
/// then stalls mid-body ends the read at the deadline, with reqwest's own
/// timeout error (`is_timeout()`), and the response carries its report.
/// On tokio's paused clock: the stall costs no real time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_deadline_covers_the_body_read_after_the_call_returns() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    let (sent, received) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            head.extend_from_slice(&buf[..n]);
        }
        let _ = sent.send(String::from_utf8_lossy(&head).to_lowercase());
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
            .await
            .unwrap();
        // The rest of the body never comes; the connection stays open.
        std::future::pending::<()>().await;
        drop(socket);
    });
    let p = RetryPolicy::builder().deadline(ms(500)).build().unwrap();
    let (c, _) = client(p);
    let start = tokio::time::Instant::now();
    let response = c.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let head = received.await.unwrap();
    assert!(head.contains("request-timeout-ms: 500\r\n"), "{head}");
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    assert_eq!(report.stop_reason(), StopReason::Success);
    let err = response.bytes().await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let waited = start.elapsed();
    assert!(waited >= ms(500) && waited < ms(600), "{waited:?}");
}
