//! A TCP proxy in front of a store's server (PostgreSQL, Redis) that can
//! cut every connection and refuse new ones: a database failover, or (one
//! proxy per replica) a network partition between one replica and its
//! database.
//!
//! A file of its own, included by path (`#[path = …] mod proxy;`) by the
//! tests that cut a database off: `tower-idempotency/tests/failover.rs` and
//! the workspace's end-to-end test of keys travelling downstream.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A proxy in front of PostgreSQL that can cut every connection and refuse
/// new ones.
pub struct Proxy {
    addr: SocketAddr,
    /// The database URL the proxy stands in front of.
    direct: String,
    up: Arc<AtomicBool>,
    /// Connections refused while cut: proof that the stores go through it.
    pub refused: Arc<AtomicUsize>,
    /// The forwarding tasks of the open connections.
    open: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    /// A proxy in front of the server of `direct` (a
    /// `scheme://[user@]host:port[/path]` URL, host an IP address or
    /// `localhost`).
    pub async fn start(direct: &str) -> Self {
        let upstream = upstream_addr(direct);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let refused = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(Mutex::new(JoinSet::new()));
        let (accept_up, accept_open, accept_refused) = (up.clone(), open.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if !accept_up.load(Ordering::SeqCst) {
                    // Refused: closed at once.
                    accept_refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                accept_open.lock().unwrap().spawn(forward(client, upstream));
            }
        });
        Self {
            addr,
            direct: direct.to_owned(),
            up,
            refused,
            open,
        }
    }

    /// Cuts every connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        // Aborting a forwarding task drops both of its sockets.
        self.open.lock().unwrap().abort_all();
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// The URL through this proxy: the direct URL with its host and port
    /// replaced by the proxy's.
    pub fn url(&self) -> String {
        let (before, _, path) = split_url(&self.direct);
        format!("{before}{}{path}", self.addr)
    }
}

/// `scheme://[user@]`, `host:port`, and the rest of a URL.
fn split_url(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |at| at + 3);
    let start = url[start..].find('@').map_or(start, |at| start + at + 1);
    let end = url[start..].find('/').map_or(url.len(), |at| start + at);
    (&url[..start], &url[start..end], &url[end..])
}

async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The address of the server of `url` (host:port; PostgreSQL's port if
/// there is none).
fn upstream_addr(url: &str) -> SocketAddr {
    let (_, host_port, _) = split_url(url);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    host_port
        .replace("localhost", "127.0.0.1")
        .parse()
        .expect("the URL names host:port as an IP address")
}
