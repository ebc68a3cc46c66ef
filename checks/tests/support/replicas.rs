//! Three replicas of one service on 127.0.0.1, .2 and .3 (one port), each
//! healthy, resetting every connection after reading the request, or
//! answering every request 503 on a connection it keeps; shared by
//! `tests/replicas.rs` and `examples/replicas.rs`.
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

/// One replica: what it does now, and the requests it read.
#[derive(Clone, Default)]
pub struct Replica {
    mode: Arc<AtomicU8>,
    requests: Arc<AtomicUsize>,
}

impl Replica {
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads until the end of a request head (and ignores any body); false
/// when the connection ended first.
pub async fn read_head(socket: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

async fn serve(listener: TcpListener, replica: Replica) {
    while let Ok((mut socket, _)) = listener.accept().await {
        let replica = replica.clone();
        tokio::spawn(async move {
            // HTTP/1.1 keep-alive: one request after another.
            while read_head(&mut socket).await {
                replica.requests.fetch_add(1, Ordering::SeqCst);
                let answer: &[u8] = match replica.mode.load(Ordering::SeqCst) {
                    RESETS => {
                        let _ = socket.set_zero_linger();
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
