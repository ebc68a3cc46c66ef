//! A TCP proxy in front of PostgreSQL that can cut every connection and
//! refuse new ones: a database failover, or (one proxy per replica) a
//! network partition between one replica and its database.
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
    /// A proxy in front of the database of `direct` (a
    /// `postgres://user@host:port/db` URL, host an IP address or
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

    /// The database URL through this proxy: the direct URL with its host
    /// and port replaced by the proxy's.
    pub fn url(&self) -> String {
        let (scheme_user, rest) = self
            .direct
            .split_once('@')
            .expect("DATABASE_URL has the form postgres://user@host:port/db");
        let path = rest.find('/').map_or("", |at| &rest[at..]);
        format!("{scheme_user}@{}{path}", self.addr)
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The address of the database of `url` (host:port, port 5432 if absent).
fn upstream_addr(url: &str) -> SocketAddr {
    let host_port = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("127.0.0.1:5432");
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    host_port
        .replace("localhost", "127.0.0.1")
        .parse()
        .expect("DATABASE_URL names host:port as an IP address")
}
