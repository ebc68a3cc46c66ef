//! Three replicas of one service on 127.0.0.1, .2 and .3 (one port), each
//! healthy, resetting every connection after reading the request (every
//! time, or once), answering every request 503 on a connection it keeps,
//! or never answering; and a look-up that answers as the system resolver
//! does (several addresses, no port). Shared by `tests/replicas.rs`,
//! `tests/replicas_deployed.rs` and `examples/replicas.rs`.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Answers 200.
pub const HEALTHY: u8 = 0;
/// Reads each request, then resets the connection.
pub const RESETS: u8 = 1;
/// Answers every request 503, no Retry-After, and keeps the connection.
pub const ANSWERS_503: u8 = 2;
/// Resets the next connection after reading its request, then is healthy.
pub const RESETS_ONCE: u8 = 3;
/// Reads each request and never answers (the connection stays open).
pub const HANGS: u8 = 4;

/// One replica: what it does now, the requests it read, and how many of
/// them asked for their connection to be closed.
#[derive(Clone, Default)]
pub struct Replica {
    mode: Arc<AtomicU8>,
    requests: Arc<AtomicUsize>,
    closes: Arc<AtomicUsize>,
}

impl Replica {
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Requests that carried `Connection: close`.
    pub fn closes(&self) -> usize {
        self.closes.load(Ordering::SeqCst)
    }
}

/// Reads until the end of a request head (and ignores any body); `None`
/// when the connection ended first, else whether it asked `Connection:
/// close`.
pub async fn read_head(socket: &mut TcpStream) -> Option<bool> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    Some(head.contains("\r\nconnection: close\r\n"))
}

async fn serve(listener: TcpListener, replica: Replica) {
    while let Ok((mut socket, _)) = listener.accept().await {
        let replica = replica.clone();
        tokio::spawn(async move {
            // HTTP/1.1 keep-alive: one request after another.
            while let Some(close) = read_head(&mut socket).await {
                replica.requests.fetch_add(1, Ordering::SeqCst);
                if close {
                    replica.closes.fetch_add(1, Ordering::SeqCst);
                }
                let answer: &[u8] = match replica.mode.load(Ordering::SeqCst) {
                    RESETS => {
                        let _ = socket.set_zero_linger();
                        return;
                    }
                    RESETS_ONCE => {
                        replica.set(HEALTHY);
                        let _ = socket.set_zero_linger();
                        return;
                    }
                    HANGS => {
                        // Holds the connection until the client drops it.
                        let mut rest = [0u8; 64];
                        while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
                        return;
                    }
                    ANSWERS_503 => b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
                    _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                };
                if socket.write_all(answer).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Three healthy replicas on 127.0.0.1, .2 and .3, one port.
pub async fn replicas() -> (Vec<SocketAddr>, Vec<Replica>) {
    for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let (Ok(second), Ok(third)) = (
            TcpListener::bind(("127.0.0.2", port)).await,
            TcpListener::bind(("127.0.0.3", port)).await,
        ) else {
            continue;
        };
        let mut addrs = Vec::new();
        let mut all = Vec::new();
        for listener in [first, second, third] {
            addrs.push(listener.local_addr().unwrap());
            let replica = Replica::default();
            all.push(replica.clone());
            tokio::spawn(serve(listener, replica));
        }
        return (addrs, all);
    }
    panic!("no port free on 127.0.0.1, .2 and .3");
}

/// A look-up that answers as the system resolver does: the name's
/// addresses without a port, in the order given, changed at will.
#[derive(Clone, Default)]
pub struct Lookup {
    answer: Arc<std::sync::Mutex<Vec<std::net::IpAddr>>>,
    asked: Arc<AtomicUsize>,
}

impl Lookup {
    pub fn new(ips: &[std::net::IpAddr]) -> Self {
        let lookup = Lookup::default();
        lookup.answer(ips);
        lookup
    }

    /// What the name resolves to from now on.
    pub fn answer(&self, ips: &[std::net::IpAddr]) {
        *self.answer.lock().unwrap() = ips.to_vec();
    }

    /// How many times the name was looked up.
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

impl reqwest::dns::Resolve for Lookup {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let addrs: Vec<SocketAddr> = self
            .answer
            .lock()
            .unwrap()
            .iter()
            .map(|ip| SocketAddr::new(*ip, 0))
            .collect();
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

/// An address on `port` where nothing listens: a connection is refused.
pub fn dead(last_octet: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, last_octet], port))
}
