//! Deadline propagation, inbound: `InheritDeadlineLayer` lends the caller's
//! time left to the calls a handler makes, refuses a request whose time is
//! spent, and turns a handler's give-up into "do not retry". No sockets:
//! tokio's paused clock, which the policy's default clock follows.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use reqwest_safe_retry::deadline::{InheritDeadlineLayer, InheritedDeadline};
use reqwest_safe_retry::retry::{retry, Outcome};
use reqwest_safe_retry::RetryPolicy;
use tower::{Layer, Service, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn request(headers: &[(&str, &str)]) -> Request<String> {
    let mut builder = Request::builder();
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(String::new()).unwrap()
}

/// What a handler's call saw: the time left its first attempt had.
async fn call_made_by_a_handler() -> Option<Duration> {
    let policy = RetryPolicy::default(); // its own deadline: 30 s
    retry(
        &policy,
        |ctx| async move { Outcome::success(ctx.time_left()) },
    )
    .await
    .0
}

/// A handler that works `work` long, then makes a call and answers with the
/// time left that call had; counts its runs.
fn handler(
    work: Duration,
    runs: Arc<AtomicUsize>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    tower::service_fn(move |_req: Request<String>| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(work).await;
            let left = call_made_by_a_handler().await;
            Ok::<_, Infallible>(Response::new(format!("{left:?}")))
        }
    })
}

async fn serve<S>(service: &mut S, req: Request<String>) -> Response<String>
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible>,
{
    service.ready().await.unwrap().call(req).await.unwrap()
}

fn shown(left: Option<Duration>) -> String {
    format!("{left:?}")
}

#[tokio::test(start_paused = true)]
async fn a_handlers_calls_get_the_callers_time_left_minus_what_the_handler_spent() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = InheritDeadlineLayer::new().layer(handler(ms(400), runs.clone()));
    let response = serve(&mut service, request(&[("request-timeout-ms", "1000")])).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body(), shown(Some(ms(600))));
    // A caller with more time than the call's own deadline: the call's.
    let response = serve(&mut service, request(&[("request-timeout-ms", "90000")])).await;
    assert_eq!(response.into_body(), shown(Some(Duration::from_secs(30))));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn without_the_layer_nothing_is_inherited() {
    let mut service = handler(ms(400), Arc::default());
    let response = serve(&mut service, request(&[("request-timeout-ms", "1000")])).await;
    assert_eq!(response.into_body(), shown(Some(Duration::from_secs(30))));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_time_is_spent_is_answered_at_once_without_the_handler() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = InheritDeadlineLayer::new().layer(handler(ms(0), runs.clone()));
    for spent in ["0", " 0", "0000"] {
        let response = serve(&mut service, request(&[("request-timeout-ms", spent)])).await;
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT, "{spent:?}");
        assert_eq!(response.headers()["stripe-should-retry"], "false");
        assert_eq!(response.body(), "");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
}

/// A spent time left is seen beside a piece that is not text on its line.
#[tokio::test(start_paused = true)]
async fn a_spent_time_left_beside_bytes_that_are_not_text_is_still_spent() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = InheritDeadlineLayer::new().layer(handler(ms(0), runs.clone()));
    for value in [&b"0, bad"[..], b"0, b\xc3\xa4d", b"\xff, 0"] {
        let mut req = request(&[]);
        req.headers_mut().insert(
            "request-timeout-ms",
            http::HeaderValue::from_bytes(value).unwrap(),
        );
        let response = serve(&mut service, req).await;
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT, "{value:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
}

#[tokio::test(start_paused = true)]
async fn a_malformed_or_missing_time_left_is_ignored() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = InheritDeadlineLayer::new().layer(handler(ms(0), runs.clone()));
    for headers in [
        vec![],
        vec![("request-timeout-ms", "soon")],
        vec![("request-timeout-ms", "-1")],
        vec![("request-timeout-ms", "1.5")],
        vec![("request-timeout-ms", "")],
    ] {
        let response = serve(&mut service, request(&headers)).await;
        assert_eq!(response.status(), StatusCode::OK, "{headers:?}");
        assert_eq!(
            response.into_body(),
            shown(Some(Duration::from_secs(30))),
            "{headers:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn the_header_name_is_the_layers_to_choose() {
    let layer = InheritDeadlineLayer::new().header(HeaderName::from_static("x-deadline-ms"));
    let mut service = layer.layer(handler(ms(0), Arc::default()));
    let response = serve(&mut service, request(&[("x-deadline-ms", "700")])).await;
    assert_eq!(response.into_body(), shown(Some(ms(700))));
    let response = serve(&mut service, request(&[("request-timeout-ms", "700")])).await;
    assert_eq!(response.into_body(), shown(Some(Duration::from_secs(30))));
}

/// A handler that makes a call (which gives up, or succeeds), then answers
/// `status` with `headers` (a verdict, a Retry-After: what an upstream's
/// answer handed on would carry).
fn answering(
    gives_up: bool,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> {
    tower::service_fn(move |_req: Request<String>| async move {
        let policy = RetryPolicy::builder().no_budget().build().unwrap();
        let _ = retry(&policy, |_| async move {
            if gives_up {
                Outcome::transient(())
            } else {
                Outcome::success(())
            }
        })
        .await;
        let mut response = Response::new(String::new());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response.headers_mut().insert(*name, value.parse().unwrap());
        }
        Ok::<_, Infallible>(response)
    })
}

async fn verdict_of(layer: InheritDeadlineLayer, gives_up: bool, status: u16) -> Option<String> {
    verdict_with(layer, gives_up, status, &[]).await
}

async fn verdict_with(
    layer: InheritDeadlineLayer,
    gives_up: bool,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
) -> Option<String> {
    let mut service = layer.layer(answering(gives_up, status, headers));
    let response = serve(&mut service, request(&[])).await;
    assert_eq!(response.status(), status);
    response
        .headers()
        .get("stripe-should-retry")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn when_a_handlers_call_gave_up_an_answer_a_client_would_retry_says_do_not() {
    let layer = InheritDeadlineLayer::new;
    for status in [408, 425, 429, 500, 502, 503, 504] {
        assert_eq!(
            verdict_of(layer(), true, status).await.as_deref(),
            Some("false"),
            "{status}"
        );
    }
    // Answers a client would not retry anyway are left as they are.
    for status in [200, 404, 501] {
        assert_eq!(verdict_of(layer(), true, status).await, None, "{status}");
    }
    // A 503 with no call that gave up is the handler's own: retry it.
    assert_eq!(verdict_of(layer(), false, 503).await, None);
    // A "do not retry" already there is kept.
    assert_eq!(
        verdict_with(layer(), true, 503, &[("stripe-should-retry", "false")])
            .await
            .as_deref(),
        Some("false")
    );
    // Turned off, or under another name.
    assert_eq!(verdict_of(layer().no_verdict(), true, 503).await, None);
    let renamed = layer().verdict_header(HeaderName::from_static("x-should-retry"));
    let mut service = renamed.layer(answering(true, 503, &[]));
    let response = serve(&mut service, request(&[])).await;
    assert_eq!(response.headers()["x-should-retry"], "false");
}

#[tokio::test(start_paused = true)]
async fn the_verdict_covers_a_keyed_409_and_a_413_with_retry_after() {
    // This crate's client retries both (a 409 when its request carried a
    // key, which the layer cannot see: marking an unkeyed one changes
    // nothing, the client does not retry it anyway).
    let layer = InheritDeadlineLayer::new;
    assert_eq!(
        verdict_of(layer(), true, 409).await.as_deref(),
        Some("false")
    );
    assert_eq!(
        verdict_with(layer(), true, 413, &[("retry-after", "1")])
            .await
            .as_deref(),
        Some("false")
    );
    // A 413 without a readable Retry-After is permanent: left as it is.
    assert_eq!(verdict_of(layer(), true, 413).await, None);
    assert_eq!(
        verdict_with(layer(), true, 413, &[("retry-after", "soon")]).await,
        None
    );
}

#[tokio::test(start_paused = true)]
async fn an_upstreams_retry_verdict_is_not_passed_on_after_a_give_up() {
    let layer = InheritDeadlineLayer::new;
    // The upstream's "retry" handed on, on a status the table retries and
    // on one it does not (the verdict alone makes a client retry a 404),
    // in any form the client reads as "retry".
    let told_to_retry: [&'static [(&str, &str)]; 2] = [
        &[("stripe-should-retry", "true")],
        &[("stripe-should-retry", " TRUE ")],
    ];
    for status in [503, 404] {
        for upstream in told_to_retry {
            assert_eq!(
                verdict_with(layer(), true, status, upstream)
                    .await
                    .as_deref(),
                Some("false"),
                "{status} {upstream:?}"
            );
        }
    }
    // A value the client does not read hides nothing: a 503 is retried.
    assert_eq!(
        verdict_with(layer(), true, 503, &[("stripe-should-retry", "maybe")])
            .await
            .as_deref(),
        Some("false")
    );
    // Under the layer's own name.
    let renamed = layer().verdict_header(HeaderName::from_static("x-should-retry"));
    let mut service = renamed.layer(answering(true, 404, &[("x-should-retry", "true")]));
    let response = serve(&mut service, request(&[])).await;
    assert_eq!(response.headers()["x-should-retry"], "false");
    // A hop that did not give up (its call succeeded, or made one attempt)
    // retried nothing: its caller is the one retry layer, and may retry.
    assert_eq!(
        verdict_with(layer(), false, 503, &[("stripe-should-retry", "true")])
            .await
            .as_deref(),
        Some("true")
    );
}

#[tokio::test(start_paused = true)]
async fn each_request_has_its_own_scope() {
    // A give-up while serving one request does not mark the next.
    let mut service =
        InheritDeadlineLayer::new().layer(tower::service_fn(|req: Request<String>| async move {
            if req.headers().contains_key("fail") {
                let policy = RetryPolicy::builder().no_budget().build().unwrap();
                let _ = retry(&policy, |_| async { Outcome::transient(()) }).await;
            }
            // The scope is there, fresh for each request.
            let gave_up = InheritedDeadline::current().unwrap().gave_up();
            assert_eq!(gave_up.is_some(), req.headers().contains_key("fail"));
            let mut response = Response::new(String::new());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Infallible>(response)
        }));
    let first = serve(&mut service, request(&[("fail", "1")])).await;
    assert_eq!(first.headers()["stripe-should-retry"], "false");
    let second = serve(&mut service, request(&[])).await;
    assert!(second.headers().get("stripe-should-retry").is_none());
}
