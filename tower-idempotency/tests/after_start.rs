//! Once a handler has started, nothing frees its key: not a dropped request,
//! a panic, an error of the inner service, nor a store that fails to save the
//! response. A retry gets the stored response, or the documented marker
//! (`410`, `response_not_retained`), and never runs the handler again.
mod support;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use http_body::Frame;
use support::{app, post, req, send, spawn_waiting, Faulty, Harness, PanickingBody};
use tower::{Layer, ServiceExt};

both_stores!(
    dropped_request_keeps_running,
    panic_leaves_a_marker,
    service_error_leaves_a_marker,
    store_failure_is_retried,
    store_failure_leaves_a_marker,
    store_failure_is_outlasted,
    a_panicking_response_body_leaves_a_marker,
    a_response_body_panicking_when_read_and_dropped_leaves_a_marker,
    a_response_body_panicking_only_when_dropped_is_kept,
    a_handler_future_panicking_on_drop_leaves_a_marker
);

async fn dropped_request_keeps_running(h: Harness) {
    let (layer, store) = h.watched_layer();
    let (router, state) = app(layer);
    let started = state.started.notified();
    let client = spawn_waiting(&router, "k", "a");
    started.await;
    send(&router, post("k", "a")).await.assert_problem(409);
    // The client disconnects: the request future is dropped mid-handler.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    // The handler still owns the key ...
    send(&router, post("k", "a")).await.assert_problem(409);
    state.proceed.notify_one();
    // ... finishes, and its response is what the retry gets.
    store.wait_settled(1).await;
    let retry = send(&router, post("k", "a")).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(state.runs(), 1);
}

async fn panic_leaves_a_marker(h: Harness) {
    let (router, state) = app(h.layer());
    let crashed = send(
        &router,
        req("POST", "/payments", Some("k"), "a", &[("x-panic", "1")]),
    )
    .await;
    let doc = crashed.assert_problem(410);
    assert_eq!(doc["code"], "response_not_retained");
    assert!(doc["detail"].as_str().unwrap().contains("panicked"));
    // The handler may have done its effect before panicking: never again.
    let retry = send(&router, post("k", "a")).await;
    assert_eq!(retry.assert_problem(410), doc);
    assert!(retry.replayed());
    assert_eq!(state.runs(), 1, "{}", h.name);
}

async fn service_error_leaves_a_marker(h: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let failing = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<Body>, _>(std::io::Error::other("downstream broke")) }
    });
    let service = h.layer().layer(failing);
    let err = service.clone().oneshot(post("k", "a")).await.unwrap_err();
    assert_eq!(err.to_string(), "downstream broke");
    let retry = service.oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.status(), 410);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{}", h.name);
}

async fn store_failure_is_retried(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    store.failing_completes.store(2, Ordering::SeqCst);
    let layer = tower_idempotency::IdempotencyLayer::builder_from_arc(store.clone())
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let first = send(&router, post("k", "a")).await;
    assert_eq!(first.status, 201);
    assert_eq!(store.completes.load(Ordering::SeqCst), 3);
    let retry = send(&router, post("k", "a")).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(state.runs(), 1);
}

/// A store that fails for a while during completion (six failed writes,
/// about 0.6 s) is outlasted: the response is kept, the key never stays in
/// progress, and no retry runs the handler again.
async fn store_failure_is_outlasted(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    store.failing_completes.store(6, Ordering::SeqCst);
    let layer = tower_idempotency::IdempotencyLayer::builder_from_arc(store.clone())
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let first = send(&router, post("k", "a")).await;
    assert_eq!(first.status, 201);
    assert_eq!(store.completes.load(Ordering::SeqCst), 7);
    let retry = send(&router, post("k", "a")).await;
    assert_eq!(retry.status, 201, "{}: {:?}", h.name, retry.body);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(state.runs(), 1, "{}", h.name);
}

async fn store_failure_leaves_a_marker(h: Harness) {
    let store = Arc::new(Faulty::new(h.store.clone()));
    // The store fails for longer than the layer's patience (one attempt,
    // and none after it: the first pause is longer): the marker gets
    // through.
    store.failing_completes.store(1, Ordering::SeqCst);
    let layer = tower_idempotency::IdempotencyLayer::builder_from_arc(store.clone())
        .completion_patience(Duration::from_millis(1))
        .build()
        .unwrap();
    let (router, state) = app(layer);
    // The first caller gets the marker, as every retry will: the owner's
    // answer and the replays are the same response ...
    let first = send(&router, post("k", "a")).await;
    let first_doc = first.assert_problem(410);
    assert!(first_doc["detail"].as_str().unwrap().contains("status 201"));
    // ... and the key stayed completed.
    let retry = send(&router, post("k", "a")).await;
    let doc = retry.assert_problem(410);
    assert_eq!(doc, first_doc);
    assert!(retry.replayed());
    assert_eq!(state.runs(), 1, "{}", h.name);
}

async fn a_panicking_response_body_leaves_a_marker(h: Harness) {
    // The handler ran and answered; reading its body panicked.
    answered_once_with_the_marker(&h, || async {
        Ok(Response::new(Body::new(PanickingBody { on_drop: false })))
    })
    .await;
}

/// Two panics of the handler's code, one while the other unwinds, would
/// abort the whole server: the body is dropped only after its stream's
/// panic is caught, and its destructor's panic is caught too.
async fn a_response_body_panicking_when_read_and_dropped_leaves_a_marker(h: Harness) {
    answered_once_with_the_marker(&h, || async {
        Ok(Response::new(Body::new(PanickingBody { on_drop: true })))
    })
    .await;
}

/// A response body that streams `paid`, then panics when it is dropped.
struct PaidThenPanicsOnDrop(bool);

impl http_body::Body for PaidThenPanicsOnDrop {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if std::mem::replace(&mut self.0, true) {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"paid")))))
    }
}

impl Drop for PaidThenPanicsOnDrop {
    fn drop(&mut self) {
        panic!("response body panicked on drop on purpose")
    }
}

/// A body read in full is the handler's answer, whatever its destructor
/// does afterwards: it is stored, answered and replayed.
async fn a_response_body_panicking_only_when_dropped_is_kept(h: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Body::new(PaidThenPanicsOnDrop(false)))) }
    });
    let service = h.layer().layer(handler);
    for replayed in [false, true] {
        let answer = service.clone().oneshot(post("k", "a")).await.unwrap();
        assert_eq!(answer.status(), 200, "{}", h.name);
        assert_eq!(
            answer.headers().contains_key("idempotent-replayed"),
            replayed
        );
        let body = http_body_util::BodyExt::collect(answer.into_body()).await;
        assert_eq!(body.unwrap().to_bytes(), "paid");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{}", h.name);
}

/// A handler's future that completes, then panics when it is dropped.
struct PanicsOnDrop(Option<Response<Body>>);

impl Future for PanicsOnDrop {
    type Output = Result<Response<Body>, Infallible>;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(self.0.take().expect("polled once")))
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("handler future panicked on drop on purpose")
    }
}

async fn a_handler_future_panicking_on_drop_leaves_a_marker(h: Harness) {
    answered_once_with_the_marker(&h, || PanicsOnDrop(Some(Response::new(Body::from("paid")))))
        .await;
}

/// Behind the layer, a handler answering with `answer()` (whose answer goes
/// wrong after the handler started) gets the marker, never a second run:
/// the first caller and the retry both get `410`, the retry as a replay.
async fn answered_once_with_the_marker<F, Fut>(h: &Harness, answer: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        answer()
    });
    let service = h.layer().layer(handler);
    let first = service.clone().oneshot(post("k", "a")).await.unwrap();
    assert_eq!(first.status(), 410);
    let retry = service.oneshot(post("k", "a")).await.unwrap();
    assert_eq!(retry.status(), 410);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "{}", h.name);
}

/// `completion_patience(Duration::MAX)` means "keep trying as long as the
/// process lives", not a panic at the first failed completion (which left
/// the key in progress without a heartbeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patience_of_duration_max_keeps_trying() {
    let h = Harness::memory().await;
    let store = Arc::new(Faulty::new(h.store.clone()));
    store.failing_completes.store(2, Ordering::SeqCst);
    let layer = h
        .builder_over(store.clone())
        .completion_patience(Duration::MAX)
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let first = send(&router, post("k", "a")).await;
    assert_eq!(first.status, 201);
    assert!(send(&router, post("k", "a")).await.replayed());
    assert_eq!(state.runs(), 1);
}
