//! What Redis's own durability means for the guarantee: a Redis killed
//! (`kill -9`) and restarted while a handler runs. With the append-only
//! file flushed on every write (`appendfsync always`) the key survives:
//! the owner stores its response and the retry gets the replay. Without
//! persistence the key is gone: the owner's answer cannot be kept and the
//! retry runs the handler again, which is why `RedisStore::connect`
//! refuses such a server (`tests/redis_store.rs`).
//!
//! Each test starts a Redis of its own (`redis-server` from the PATH, on a
//! free port, in a temporary directory), so it can kill it.
mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use support::{app, post, send, spawn_waiting};
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, RedisStore};

/// A Redis server of this test's own.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
    persistent: bool,
}

impl Server {
    async fn start(persistent: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tower-idem-redis-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            child: Self::spawn(port, &dir, persistent),
            port,
            dir,
            persistent,
        };
        server.wait_up().await;
        server
    }

    fn spawn(port: u16, dir: &PathBuf, persistent: bool) -> Child {
        let aof = if persistent { "yes" } else { "no" };
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", aof, "--appendfsync", "always"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH (Debian's redis-server package)")
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn wait_up(&mut self) {
        for _ in 0..200 {
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                    let pong: redis::RedisResult<String> =
                        redis::cmd("PING").query_async(&mut conn).await;
                    if pong.is_ok() {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// `kill -9`, then the same server again on the same port and files.
    async fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(self.port, &self.dir, self.persistent);
        self.wait_up().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A handler is running under its key when Redis crashes and comes back;
/// then it finishes, and its caller retries. Returns the handler's runs.
async fn crash_mid_request(server: &mut Server, store: RedisStore) -> usize {
    let store: Arc<dyn IdempotencyStore> = Arc::new(store);
    let (router, state) = app(IdempotencyLayer::from_arc(store));
    let started = state.started.notified();
    let first = spawn_waiting(&router, "k", "a");
    started.await;
    server.crash_and_restart().await;
    state.proceed.notify_one();
    first.await.unwrap();
    // The caller retries until it gets an answer that is not "in progress".
    for _ in 0..50 {
        let retry = send(&router, post("k", "a")).await;
        if retry.status.as_u16() != 409 && retry.status.as_u16() != 503 {
            assert_eq!(retry.status, 201, "{:?}", retry.body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    state.runs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_append_only_file_a_crash_runs_nothing_twice() {
    let mut server = Server::start(true).await;
    // A server with AOF and no eviction: `connect` accepts it.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(crash_mid_request(&mut server, store).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_a_crash_runs_the_handler_again() {
    let mut server = Server::start(false).await;
    assert!(RedisStore::connect(&server.url()).await.is_err());
    let store = RedisStore::connect_volatile(&server.url()).await.unwrap();
    assert_eq!(crash_mid_request(&mut server, store).await, 2);
}
