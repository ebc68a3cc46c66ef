//! A keyed request whose body never finishes arriving gets `408` after the
//! layer's `request_body_timeout` and claims nothing: a client trickling
//! its body cannot hold the connection for long. Paused time: no socket,
//! nothing sleeps for real.
mod support;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::Request;
use http_body::Frame;
use support::{app, post, send, Harness};

/// A body that sends one byte and then nothing, forever.
struct Trickle {
    sent: bool,
}

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent {
            return Poll::Pending;
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{")))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_arrives_times_out_and_claims_nothing() {
    let h = Harness::memory().await;
    let layer = h
        .builder()
        .request_body_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let slow = Request::post("/payments")
        .header("idempotency-key", "k")
        .body(Body::new(Trickle { sent: false }))
        .unwrap();
    let reply = send(&router, slow).await;
    let doc = reply.assert_problem(408);
    assert_eq!(doc["code"], "request_timeout");
    assert_eq!(state.runs(), 0);
    // Nothing was claimed: the same key runs at once when it arrives.
    assert_eq!(send(&router, post("k", "{")).await.status, 201);
}
