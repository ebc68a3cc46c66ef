//! Retry-After, seen through the delays the injected sleeper records.

mod support;

use std::time::{Duration, SystemTime};

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{Jitter, RetryPolicy, RetryReport, StopReason};
use support::{client, ms, policy};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[test]
fn every_form_in_the_fixture_parses_or_is_ignored() {
    let table = include_str!("../../fixtures/retry_after.tsv");
    let date = "Sun, 06 Nov 1994 08:49:37 GMT";
    // The local clock is far off: only the Date header gives these results.
    let now = SystemTime::UNIX_EPOCH;
    let mut rows = 0;
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (value, want) = line.rsplit_once('\t').unwrap();
        let want = match want {
            "ignored" => None,
            secs => Some(Duration::from_secs(secs.parse().unwrap())),
        };
        let got = reqwest_safe_retry::classify::retry_after::parse(value, Some(date), now);
        assert_eq!(got, want, "Retry-After: {value:?}");
        rows += 1;
    }
    assert_eq!(rows, 74, "every row was read");
}

/// A server that answers 503 with these headers once, then 200.
async fn hinting(headers: &[(&str, String)]) -> MockServer {
    let server = MockServer::start().await;
    let mut first = ResponseTemplate::new(503);
    for (name, value) in headers {
        first = first.append_header(*name, value.as_str());
    }
    Mock::given(wiremock::matchers::any())
        .respond_with(first)
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

/// A policy whose own backoff is tiny (≤ 1 ms), so a slept delay of seconds
/// can only come from the hint.
fn small_backoff(clock: &ManualClock) -> RetryPolicy {
    policy(clock)
        .backoff(ms(1), ms(1))
        .deadline(Duration::from_secs(600))
        .max_retry_after(Duration::from_secs(300))
        .build()
        .unwrap()
}

async fn slept_after(
    headers: &[(&str, String)],
    clock: &ManualClock,
) -> (Vec<Duration>, RetryReport) {
    let server = hinting(headers).await;
    let (c, _) = client(small_backoff(clock));
    let response = c.get(server.uri()).send().await.unwrap();
    let report = response.extensions().get::<RetryReport>().unwrap().clone();
    (clock.sleeps(), report)
}

fn assert_hint_floor(slept: Duration, hint: Duration) {
    let spread = hint.mul_f64(0.2).min(Duration::from_secs(2));
    assert!(
        slept >= hint && slept <= hint + spread,
        "slept {slept:?} for a hint of {hint:?}"
    );
}

#[tokio::test]
async fn delay_seconds_are_a_floor_with_jitter_on_top() {
    let clock = ManualClock::new();
    let (sleeps, report) = slept_after(&[("Retry-After", "7".into())], &clock).await;
    assert_eq!(sleeps.len(), 1);
    assert_hint_floor(sleeps[0], Duration::from_secs(7));
    assert_eq!(report.retry_after_honoured(), 1);
    assert_eq!(report.stop_reason(), StopReason::Success);
}

#[tokio::test]
async fn http_dates_in_all_three_forms_are_measured_against_the_response_date() {
    // The response says it is 08:49:37; the local clock says 2026: only the
    // Date header can give the 12 s the server meant.
    let date = "Sun, 06 Nov 1994 08:49:37 GMT".to_owned();
    for retry_after in [
        "Sun, 06 Nov 1994 08:49:49 GMT",
        "Sunday, 06-Nov-94 08:49:49 GMT",
        "Sun Nov  6 08:49:49 1994",
    ] {
        let clock = ManualClock::new();
        let (sleeps, _) = slept_after(
            &[("Retry-After", retry_after.into()), ("Date", date.clone())],
            &clock,
        )
        .await;
        assert_hint_floor(sleeps[0], Duration::from_secs(12));
    }
}

#[tokio::test]
async fn without_a_date_header_the_local_clock_is_used() {
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 08:49:37
    let clock = ManualClock::with_wall(wall);
    // wiremock's server adds a Date header; this one sends none.
    let addr = support::scripted_server(vec![
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: Sun, 06 Nov 1994 08:49:42 GMT\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
            .to_owned(),
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
    ])
    .await;
    let (c, _) = client(small_backoff(&clock));
    let response = c.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let sleeps = clock.sleeps();
    assert_hint_floor(sleeps[0], Duration::from_secs(5));
}

#[tokio::test]
async fn past_dates_and_malformed_values_leave_the_computed_backoff() {
    for value in [
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "-5",
        "1.5",
        "soon",
        "Sunday, 06-Nov-94x08:49:37 GMT",
    ] {
        let clock = ManualClock::new();
        let (sleeps, report) = slept_after(&[("Retry-After", value.into())], &clock).await;
        assert_eq!(sleeps.len(), 1, "{value}");
        assert!(sleeps[0] <= ms(1), "{value}: slept {:?}", sleeps[0]);
        assert_eq!(report.retry_after_honoured(), 0, "{value}");
    }
}

#[tokio::test]
async fn a_computed_delay_longer_than_the_hint_wins() {
    let clock = ManualClock::new();
    let server = hinting(&[("Retry-After", "1".into())]).await;
    let p = policy(&clock)
        .backoff(Duration::from_secs(30), Duration::from_secs(30))
        .jitter(Jitter::None)
        .deadline(Duration::from_secs(600))
        .build()
        .unwrap();
    let (c, _) = client(p);
    c.get(server.uri()).send().await.unwrap();
    assert_eq!(clock.sleeps(), [Duration::from_secs(30)]);
}

#[tokio::test]
async fn a_hint_above_the_maximum_ends_the_operation_at_once() {
    let clock = ManualClock::new();
    let server = hinting(&[("Retry-After", "120".into())]).await;
    let p = policy(&clock)
        .max_retry_after(Duration::from_secs(60))
        .deadline(Duration::from_secs(600))
        .build()
        .unwrap();
    let (c, _) = client(p);
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 503, "the last response, unchanged");
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::RetryAfterTooLong);
    assert_eq!(report.attempts(), 1);
    assert!(clock.sleeps().is_empty(), "no sleeping through it");
}

#[tokio::test]
async fn a_hint_beyond_the_deadline_ends_the_operation_at_once() {
    let clock = ManualClock::new();
    let server = hinting(&[("Retry-After", "20".into())]).await;
    let p = policy(&clock)
        .deadline(Duration::from_secs(10))
        .build()
        .unwrap();
    let (c, _) = client(p);
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::RetryAfterTooLong);
    assert!(clock.sleeps().is_empty());
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_429_with_a_hint_is_honoured() {
    let clock = ManualClock::new();
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "3"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let (c, _) = client(small_backoff(&clock));
    let response = c.get(server.uri()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let sleeps = clock.sleeps();
    assert_eq!(sleeps.len(), 2);
    for s in sleeps {
        assert_hint_floor(s, Duration::from_secs(3));
    }
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.delays(), clock.sleeps());
}

#[tokio::test]
async fn an_overflowing_number_is_the_largest_hint_and_ends_the_operation() {
    for value in [
        "18446744073709551616",
        "9999999999999999999999999999999999999999",
    ] {
        let clock = ManualClock::new();
        let server = hinting(&[("Retry-After", value.into())]).await;
        let (c, _) = client(small_backoff(&clock));
        let response = c.get(server.uri()).send().await.unwrap();
        assert_eq!(response.status(), 503, "{value}");
        let report = response.extensions().get::<RetryReport>().unwrap();
        assert_eq!(
            report.stop_reason(),
            StopReason::RetryAfterTooLong,
            "{value}"
        );
        assert!(
            clock.sleeps().is_empty(),
            "{value}: a bigger hint is never a sooner retry"
        );
    }
}

#[tokio::test]
async fn a_date_with_a_numeric_zone_is_read_with_its_offset() {
    // 09:49:49 at +0100 is 08:49:49 GMT: 12 s after the response's Date.
    let date = "Sun, 06 Nov 1994 08:49:37 GMT".to_owned();
    for retry_after in [
        "Sun, 06 Nov 1994 09:49:49 +0100",
        "Sun, 06 Nov 1994 08:49:49 UTC",
        "Sun, 6 Nov 94 08:49:49 +0000",
    ] {
        let clock = ManualClock::new();
        let (sleeps, report) = slept_after(
            &[("Retry-After", retry_after.into()), ("Date", date.clone())],
            &clock,
        )
        .await;
        assert_hint_floor(sleeps[0], Duration::from_secs(12));
        assert_eq!(report.retry_after_honoured(), 1, "{retry_after}");
    }
}

#[tokio::test]
async fn two_retry_after_fields_that_disagree_leave_the_computed_backoff() {
    for pair in [["1", "30"], ["30", "1"]] {
        let clock = ManualClock::new();
        let (sleeps, report) = slept_after(
            &[
                ("Retry-After", pair[0].into()),
                ("Retry-After", pair[1].into()),
            ],
            &clock,
        )
        .await;
        assert_eq!(sleeps.len(), 1, "{pair:?}");
        assert!(sleeps[0] <= ms(1), "{pair:?}: slept {:?}", sleeps[0]);
        assert_eq!(report.retry_after_honoured(), 0);
    }
    // Two that agree are one hint.
    let clock = ManualClock::new();
    let (sleeps, _) = slept_after(
        &[("Retry-After", "4".into()), ("Retry-After", "4".into())],
        &clock,
    )
    .await;
    assert_hint_floor(sleeps[0], Duration::from_secs(4));
}
