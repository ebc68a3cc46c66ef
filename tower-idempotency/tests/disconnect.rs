//! A client that disconnects while the handler works after its effect neither
//! cancels the handler nor frees its key: the effect happens once, the retry
//! gets 409 while the handler runs and the stored response afterwards.
mod support;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use support::{app, post, send, Harness};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

both_stores!(disconnect_after_effect_runs_once);

/// Serves `router` over real HTTP/1.1 on 127.0.0.1; every connection that
/// ends (the server saw the client close) is reported on the channel.
async fn serve(router: axum::Router) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed_tx, closed_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(router.clone());
            let closed = closed_tx.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                let _ = closed.send(());
            });
        }
    });
    (addr, closed_rx)
}

async fn disconnect_after_effect_runs_once(h: Harness) {
    let (layer, store) = h.watched_layer();
    let (router, state) = app(layer);
    let (addr, mut closed) = serve(router.clone()).await;
    let started = state.started.notified();

    // The client writes a whole keyed POST whose handler does its effect
    // (counts a run) and then waits ...
    let mut client = TcpStream::connect(addr).await.unwrap();
    let body = "amount=10";
    let request = format!(
        "POST /payments HTTP/1.1\r\nhost: test\r\nidempotency-key: k\r\nx-wait: 1\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    started.await;
    assert_eq!(state.runs(), 1);
    // ... and gives up: the socket closes while the handler still works.
    drop(client);
    tokio::time::timeout(Duration::from_secs(10), closed.recv())
        .await
        .expect("the server never noticed the client closing")
        .unwrap();

    // The key is still held by the running handler.
    send(&router, post("k", body)).await.assert_problem(409);
    state.proceed.notify_one();
    // Once it finished, the retry gets its stored response.
    store.wait_settled(1).await;
    let retry = send(&router, post("k", body)).await;
    assert_eq!(retry.status, 201, "{}: {:?}", h.name, retry.body);
    assert!(retry.replayed(), "{}: the handler ran again", h.name);
    assert_eq!(retry.json()["run"], 1);
    assert_eq!(state.runs(), 1, "{}: two effects for one key", h.name);
}
