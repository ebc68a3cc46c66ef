//! Running `examples/payments_server` from a test.
//!
//! `cargo test` builds the examples; `cargo test --test NAME` does not, so
//! run `cargo build --examples` first or the test runs a stale server.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

/// The PostgreSQL the tests use: `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The path of an example binary; `cargo test` builds the examples next to
/// the test binaries.
pub fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// A running payments server, killed when dropped.
#[derive(Debug)]
pub struct PaymentsServer {
    child: Child,
    pub addr: SocketAddr,
    /// What the server wrote to stderr (its warnings), drained by a thread:
    /// an unread pipe fills up and blocks the server's next log line.
    stderr: Arc<Mutex<Vec<String>>>,
    /// One client for every count: a new reqwest client costs tens of
    /// milliseconds (it loads the TLS roots).
    direct: reqwest::Client,
}

impl Drop for PaymentsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PaymentsServer {
    /// Starts one on a free port with these extra arguments; panics with the
    /// server's own words if it does not start.
    pub fn start(args: &[&str]) -> PaymentsServer {
        let mut child = Command::new(example("payments_server"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("build the example first: cargo build --example payments_server");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        let drain = std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                lines.lock().unwrap().push(line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        match line.trim().strip_prefix("listening on ") {
            Some(addr) => PaymentsServer {
                addr: addr.parse().unwrap(),
                child,
                stderr,
                direct: reqwest::Client::new(),
            },
            None => {
                let _ = child.wait();
                let _ = drain.join();
                panic!(
                    "payments_server {args:?} did not start: {}",
                    stderr.lock().unwrap().join("\n")
                );
            }
        }
    }

    /// How many lines the server wrote to stderr so far.
    pub fn stderr_lines(&self) -> usize {
        self.stderr.lock().unwrap().len()
    }

    /// `http://addr/payments`.
    pub fn url(&self) -> String {
        format!("http://{}/payments", self.addr)
    }

    /// How many payments `account` has, asked straight from the server.
    pub async fn payments_of(&self, account: &str) -> usize {
        let url = format!("{}?account={account}", self.url());
        let response = self.direct.get(url).send().await.unwrap();
        let bytes = response.bytes().await.unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&bytes).unwrap();
        rows.len()
    }
}

/// Runs the server to its end (for start-up failures).
pub fn run_to_end(args: &[&str]) -> Output {
    Command::new(example("payments_server"))
        .args(args)
        .output()
        .expect("build the example first: cargo build --example payments_server")
}
