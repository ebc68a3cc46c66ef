//! Shared test set-up: a client whose sleeps are recorded, not slept, and raw
//! TCP servers that fail in ways wiremock cannot.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{
    ReportSlot, RetryMiddleware, RetryPolicy, RetryPolicyBuilder, RetryReport,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wiremock::{Mock, MockServer, ResponseTemplate};

use replicas::read_head;

pub mod canned;
pub mod charges;
pub mod hosts;
pub mod payments;
pub mod replicas;
pub mod spans;
pub mod uploads;

/// A policy builder with a manual clock (sleeps are recorded, never slept) and
/// a fixed seed.
pub fn policy(clock: &ManualClock) -> RetryPolicyBuilder {
    RetryPolicy::builder().manual_clock(clock).seed(7)
}

/// A client that uses `policy`, and records what each attempt looked like on
/// its way out.
pub fn client(policy: RetryPolicy) -> (ClientWithMiddleware, Recorder) {
    client_with(reqwest::Client::new(), policy)
}

/// Like [`client`], over a given reqwest client.
pub fn client_with(
    inner: reqwest::Client,
    policy: RetryPolicy,
) -> (ClientWithMiddleware, Recorder) {
    let recorder = Recorder::default();
    let client = ClientBuilder::new(inner)
        .with(RetryMiddleware::new(policy))
        .with(recorder.clone())
        .build();
    (client, recorder)
}

/// What the retry middleware handed down for each attempt.
#[derive(Debug, Clone)]
pub struct Sent {
    pub headers: http::HeaderMap,
    pub timeout: Option<Duration>,
}

/// A middleware placed below `RetryMiddleware` that records every attempt.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl Recorder {
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    pub fn header_values(&self, name: &str) -> Vec<Option<String>> {
        self.sent()
            .iter()
            .map(|s| s.headers.get(name).map(|v| v.to_str().unwrap().to_owned()))
            .collect()
    }

    pub fn timeouts(&self) -> Vec<Option<Duration>> {
        self.sent().iter().map(|s| s.timeout).collect()
    }
}

#[async_trait::async_trait]
impl Middleware for Recorder {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.sent.lock().unwrap().push(Sent {
            headers: req.headers().clone(),
            timeout: req.timeout().copied(),
        });
        next.run(req, extensions).await
    }
}

/// How a raw TCP server misbehaves after reading a request's head.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Reset the connection (SO_LINGER 0, then close).
    Reset,
    /// Close the connection without a byte of response.
    Close,
    /// Send half a status line, then close.
    CutShort,
    /// Never answer (until the client gives up).
    Hang,
}

/// A server on 127.0.0.1 that fails every request with `fault` and counts the
/// requests it read.
pub async fn faulty_server(fault: Fault) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                if read_head(&mut socket).await.is_none() {
                    return;
                }
                seen.fetch_add(1, Ordering::SeqCst);
                match fault {
                    Fault::Reset => {
                        socket.set_zero_linger().unwrap();
                        drop(socket);
                    }
                    Fault::Close => drop(socket),
                    Fault::CutShort => {
                        let _ = socket.write_all(b"HTTP/1.1 20").await;
                        let _ = socket.flush().await;
                        drop(socket);
                    }
                    Fault::Hang => {
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = socket.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, count)
}

/// An address on which nothing listens: connecting is refused.
pub async fn refused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

/// Milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A server that answers each request with the next of `responses` (raw
/// HTTP/1.1, written as given: no `Date` header unless it is in the text),
/// repeating the last one, and closes the connection.
pub async fn scripted_server(responses: Vec<String>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let n = served.fetch_add(1, Ordering::SeqCst);
            let response = responses[n.min(responses.len() - 1)].clone();
            tokio::spawn(async move {
                if read_head(&mut socket).await.is_some() {
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                }
            });
        }
    });
    addr
}

/// A wiremock server that answers every request with `status`.
pub async fn answering(status: u16) -> MockServer {
    answering_with(ResponseTemplate::new(status)).await
}

/// A wiremock server that answers every request with `template`.
pub async fn answering_with(template: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(template)
        .mount(&server)
        .await;
    server
}

/// Sends `request` expecting it to fail: returns the error, as reqwest made
/// it, and the report the middleware left in a [`ReportSlot`].
pub async fn send_failing(
    request: reqwest_middleware::RequestBuilder,
) -> (reqwest_middleware::Error, RetryReport) {
    let slot = ReportSlot::new();
    let err = request
        .with_extension(slot.clone())
        .send()
        .await
        .expect_err("the call should fail");
    let report = slot.take().expect("the middleware fills the slot");
    (err, report)
}
