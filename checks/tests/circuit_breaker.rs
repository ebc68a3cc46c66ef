//! The circuit breaker, through the middleware: while a host keeps failing,
//! first attempts are refused locally, at once, with their own stop reason;
//! other hosts, a blip and a quiet process are never refused.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use reqwest_safe_retry::admission::CircuitBreakerConfig;
use reqwest_safe_retry::deadline::InheritDeadlineLayer;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{ReportSlot, RetryError, RetryPolicy, StopReason};
use support::{client, ms, policy};
use tower::{Layer, Service, ServiceExt};

fn with_breaker(clock: &ManualClock) -> RetryPolicy {
    policy(clock)
        .max_attempts(1)
        .circuit_breaker(CircuitBreakerConfig::default())
        .build()
        .unwrap()
}

/// Sends one GET to `url` every 10 ms of the manual clock for `span`;
/// returns (offered, refused by the breaker).
async fn offer(
    client: &reqwest_middleware::ClientWithMiddleware,
    clock: &ManualClock,
    url: &str,
    span: Duration,
) -> (u32, u32) {
    offer_every(client, clock, url, span, ms(10)).await
}

/// Sends one GET to `url` every `every` of the manual clock for `span`;
/// returns (offered, refused by the breaker).
async fn offer_every(
    client: &reqwest_middleware::ClientWithMiddleware,
    clock: &ManualClock,
    url: &str,
    span: Duration,
    every: Duration,
) -> (u32, u32) {
    let (mut offered, mut refused) = (0, 0);
    let end = clock.elapsed() + span;
    while clock.elapsed() < end {
        offered += 1;
        let slot = ReportSlot::new();
        let result = client.get(url).with_extension(slot.clone()).send().await;
        let report = slot.take().unwrap();
        if report.stop_reason() == StopReason::CircuitOpen {
            refused += 1;
            assert_eq!(report.attempts(), 0);
            assert_eq!(report.elapsed(), Duration::ZERO);
            let err = result.unwrap_err();
            let retry_error = RetryError::from_middleware(&err).unwrap();
            assert_eq!(retry_error.report().stop_reason(), StopReason::CircuitOpen);
        }
        clock.advance(every);
    }
    (offered, refused)
}

#[tokio::test]
async fn a_dead_host_is_refused_locally_and_the_others_are_not() {
    let dead = support::answering(503).await;
    let healthy = support::answering(200).await;
    let clock = ManualClock::new();
    let (client, _) = client(with_breaker(&clock));
    // The first two seconds of the outage go to the host.
    let (_, refused) = offer(&client, &clock, &dead.uri(), Duration::from_secs(2)).await;
    assert_eq!(refused, 0);
    // Then at most a fifth of the calls do.
    let (offered, refused) = offer(&client, &clock, &dead.uri(), Duration::from_secs(8)).await;
    assert!(
        f64::from(offered - refused) <= 0.2 * f64::from(offered),
        "{refused} of {offered} refused"
    );
    let arrived = dead.received_requests().await.unwrap().len();
    assert_eq!(arrived as u32, 200 + offered - refused);
    // The healthy host, on the same client, is never refused.
    let (_, refused) = offer(&client, &clock, &healthy.uri(), Duration::from_secs(2)).await;
    assert_eq!(refused, 0);
}

/// One failed call, five seconds of quiet, then a 1 s blip of 400
/// failing calls: a new blip, never refused (379 were, when the one old
/// failure still counted as the start of the blip's failing stretch).
#[tokio::test]
async fn a_blip_after_a_few_quiet_seconds_is_never_refused() {
    let dead = support::answering(503).await;
    let clock = ManualClock::new();
    let (client, _) = client(with_breaker(&clock));
    let response = client.get(dead.uri()).send().await.unwrap();
    assert_eq!(response.status(), 503);
    clock.advance(Duration::from_secs(5));
    let every = Duration::from_micros(2_500);
    let blip = Duration::from_secs(1);
    let (offered, refused) = offer_every(&client, &clock, &dead.uri(), blip, every).await;
    assert_eq!(offered, 400);
    assert_eq!(refused, 0);
    assert_eq!(dead.received_requests().await.unwrap().len(), 401);
}

/// A call the breaker refuses inside a handler is a give-up: behind
/// `InheritDeadlineLayer`, the handler's 503 goes out with "do not retry",
/// so the tier's callers do not retry what its breaker refused. A call let
/// through that failed after its one attempt is no give-up: no verdict.
#[tokio::test]
async fn a_refusal_inside_a_handler_answers_do_not_retry() {
    let dead = support::answering(503).await;
    let clock = ManualClock::new();
    let (client, _) = client(with_breaker(&clock));
    // Three seconds of failing calls: the host is refused now.
    let (_, refused) = offer(&client, &clock, &dead.uri(), Duration::from_secs(3)).await;
    assert!(refused > 0);
    let url = dead.uri();
    // A handler that makes one call and answers 503, naming in its body
    // why the call stopped.
    let handler = tower::service_fn(move |_req: http::Request<String>| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let slot = ReportSlot::new();
            let _ = client.get(&url).with_extension(slot.clone()).send().await;
            let reason = slot.take().unwrap().stop_reason();
            let mut response = http::Response::new(reason.as_str().to_owned());
            *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Infallible>(response)
        }
    });
    let mut tier = InheritDeadlineLayer::new().layer(handler);
    // Nearly every call is refused now, about one in a few hundred let
    // through: serve until both have been seen.
    let (mut open, mut let_through) = (0, 0);
    for _ in 0..3_000 {
        if open > 0 && let_through > 0 {
            break;
        }
        let request = http::Request::new(String::new());
        let response = tier.ready().await.unwrap().call(request).await.unwrap();
        let verdict = response.headers().get("stripe-should-retry").cloned();
        match response.into_body().as_str() {
            "circuit_open" => {
                open += 1;
                assert_eq!(verdict.unwrap(), "false");
            }
            "attempts_exhausted" => {
                let_through += 1;
                assert_eq!(verdict, None);
            }
            other => panic!("{other}"),
        }
        clock.advance(ms(10));
    }
    assert!(
        open > 0 && let_through > 0,
        "{open} refused, {let_through} sent"
    );
}

/// A host that fails every call with "do not retry" (`503` with
/// `Stripe-Should-Retry: false`, what every tier behind
/// `InheritDeadlineLayer` answers when its own call gave up) is failing:
/// the breaker refuses it as it refuses a plain 503 (0 of 800 were). A
/// "do not retry" on an answer that is no failure of the host (a declined
/// card's 402) is not.
#[tokio::test]
async fn a_host_that_answers_do_not_retry_to_everything_is_failing() {
    for (status, failing) in [
        (503, true),
        (500, true),
        (429, true),
        (402, false),
        (404, false),
    ] {
        let server = support::answering_with(
            wiremock::ResponseTemplate::new(status).insert_header("stripe-should-retry", "false"),
        )
        .await;
        let clock = ManualClock::new();
        let (client, _) = client(with_breaker(&clock));
        let (_, refused) = offer(&client, &clock, &server.uri(), Duration::from_secs(2)).await;
        assert_eq!(refused, 0, "{status}: nothing is refused in the first 2 s");
        let (offered, refused) =
            offer(&client, &clock, &server.uri(), Duration::from_secs(6)).await;
        if failing {
            assert!(
                f64::from(offered - refused) <= 0.2 * f64::from(offered),
                "{status}: {refused} of {offered} refused"
            );
        } else {
            assert_eq!(refused, 0, "{status}");
        }
    }
}

#[tokio::test]
async fn a_quiet_process_is_never_refused() {
    let dead = support::answering(503).await;
    let clock = ManualClock::new();
    let (client, _) = client(with_breaker(&clock));
    for _ in 0..120 {
        let response = client.get(dead.uri()).send().await.unwrap();
        assert_eq!(response.status(), 503);
        clock.advance(Duration::from_secs(1));
    }
}

#[tokio::test]
async fn without_the_breaker_nothing_is_refused() {
    let dead = support::answering(503).await;
    let clock = ManualClock::new();
    let (client, _) = client(policy(&clock).max_attempts(1).build().unwrap());
    let (offered, refused) = offer(&client, &clock, &dead.uri(), Duration::from_secs(5)).await;
    assert_eq!(refused, 0);
    assert_eq!(offered, 500);
}

/// The breaker beside pacing: a limit belongs to whoever met it. One
/// route of a host is over its limit (`/search`, every call a plain 429,
/// three calls to each of another route's) while `/orders` succeeds: the
/// host is not failing, and no `/orders` call is refused, as no limit of
/// its own refused it. A 429 is the pacing's evidence, per route and
/// caller, not the breaker's, which is per host.
#[tokio::test]
async fn a_route_over_its_limit_does_not_open_the_breaker_for_the_others() {
    use wiremock::matchers::path;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(path("/search"))
        .respond_with(ResponseTemplate::new(429))
        .mount(&server)
        .await;
    Mock::given(path("/orders"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let clock = ManualClock::new();
    let (client, _) = client(with_breaker(&clock));
    let (search, orders) = (
        format!("{}/search", server.uri()),
        format!("{}/orders", server.uri()),
    );
    let mut refused = [0u32; 2];
    for _ in 0..800 {
        for _ in 0..3 {
            refused[0] += offer_every(&client, &clock, &search, ms(1), ms(1)).await.1;
        }
        refused[1] += offer_every(&client, &clock, &orders, ms(7), ms(7)).await.1;
    }
    assert_eq!(refused, [0, 0], "(/search, /orders) calls refused");
}
