//! Issue 42's real limit, from outside: a real nginx `limit_req` (5 r/s,
//! no burst, 429 with `Retry-After: 1`) on a free port of its own, and 20
//! concurrent GETs through one client with the default policy, twice
//! (cold, then warm): on one path, and on 20 paths sharing the limit
//! (nginx keys it by the client's address, as an API keys a limit by
//! account or token). Real sockets and real time: the bounds are the
//! issue's (2.1× the calls, warm in 6.5 s, 1.1× warm with paced first
//! attempts) but the cold wave's time, 7 s, not 6.5: it is 5.8–6.3 s with
//! the one Retry-After its ramp costs, and a release that reaches nginx
//! late on two cores shared by other builds (6–20 ms, 4 of 382 traced in
//! issue 51) can still meet a refusal and its 1 s hold: the pacing moves
//! the next slot after a late answer, but not the late release itself.
//! The paused-clock stand-ins in `rate_limited.rs` (one of them makes each
//! release late in turn) meet the issue's exactly; the test takes about
//! 35 s.
//!
//! Needs Debian's `nginx` (`.ci/run` installs it when missing).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReportExt};

/// A running nginx with a config of its own in a directory of its own;
/// stopped, and its directory removed, when dropped.
struct Nginx {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Nginx {
    fn start(name: &str) -> Nginx {
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("nginx is not installed: `apt-get install -y nginx` (.ci/run does)");
        let slug: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = std::env::temp_dir().join(format!("nginx-limit-{slug}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("www")).unwrap();
        std::fs::write(dir.join("www/ok.txt"), "ok\n").unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        // `limit_req` runs before `try_files` serves the file (a `return`
        // would answer before the limit is looked at).
        let conf = format!(
            "daemon off; master_process off; worker_processes 1;
             pid {d}/nginx.pid; error_log {d}/error.log;
             events {{ worker_connections 256; }}
             http {{
               access_log off;
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
               fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi;
               scgi_temp_path {d}/scgi;
               limit_req_zone $binary_remote_addr zone=account:1m rate=5r/s;
               limit_req_status 429;
               server {{
                 listen 127.0.0.1:{port};
                 location / {{
                   limit_req zone=account;
                   add_header Retry-After 1 always;
                   root {d}/www;
                   try_files /ok.txt =404;
                 }}
               }}
             }}"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut nginx = Nginx { child, dir, port };
        let up = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
                panic!("nginx exited ({status}): {log}");
            }
            assert!(
                up.elapsed() < Duration::from_secs(10),
                "nginx did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The limit has seen nobody yet: start from an empty bucket.
        std::thread::sleep(Duration::from_millis(300));
        nginx
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a wave of 20 concurrent calls came to.
#[derive(Debug)]
struct Wave {
    succeeded: usize,
    /// Requests that reached nginx (every attempt does), per call.
    load: f64,
    took: Duration,
}

async fn wave(client: &ClientWithMiddleware, port: u16, path: fn(usize) -> String) -> Wave {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let client = client.clone();
        let url = format!("http://127.0.0.1:{port}{}", path(i));
        set.spawn(async move {
            let r = client.get(url).send().await.unwrap();
            let attempts = r.retry_report().unwrap().attempts();
            (r.status().as_u16(), attempts)
        });
    }
    let (mut succeeded, mut attempts) = (0, 0);
    while let Some(joined) = set.join_next().await {
        let (status, n) = joined.unwrap();
        succeeded += usize::from(status == 200);
        attempts += n as usize;
    }
    Wave {
        succeeded,
        load: attempts as f64 / 20.0,
        took: start.elapsed(),
    }
}

/// Cold, then warm (the second wave once the first has ended).
async fn cold_and_warm(
    name: &'static str,
    policy: RetryPolicy,
    path: fn(usize) -> String,
) -> [Wave; 2] {
    let nginx = Nginx::start(name);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let cold = wave(&client, nginx.port, path).await;
    let warm = wave(&client, nginx.port, path).await;
    println!("{name}: cold {cold:?}, warm {warm:?}");
    [cold, warm]
}

fn one_path(i: usize) -> String {
    format!("/items/{i}")
}

fn twenty_paths(i: usize) -> String {
    format!("/resource-{}", char::from(b'a' + i as u8))
}

/// The three lines of the issue's table, each against its own nginx, one
/// after another (36 s): run at once on two shared cores, the real-time
/// bounds measured the machine's load as much as the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_nginx_limit_lines_of_issue_42() {
    let seeded = || RetryPolicy::builder().seed(7);
    let one = cold_and_warm("one path", seeded().build().unwrap(), one_path).await;
    let paced_first = cold_and_warm(
        "one path, paced first attempts",
        seeded().pace_first_attempts(true).build().unwrap(),
        one_path,
    )
    .await;
    // One limit shared by 20 paths: reqwest-retry gets about half through;
    // each path paced as if it were alone got 4-7.
    let twenty = cold_and_warm("20 paths", seeded().build().unwrap(), twenty_paths).await;
    for w in one.iter().chain(&twenty) {
        assert_eq!(w.succeeded, 20, "{w:?}");
        assert!(w.load <= 2.1, "{w:?}");
    }
    let [cold, warm] = &one;
    assert!(cold.took <= Duration::from_secs(7), "{cold:?}");
    // The limit known: one Retry-After, then a release a slot (4.95 s).
    assert!(warm.took <= Duration::from_millis(6_500), "{warm:?}");
    let [cold, warm] = paced_first;
    assert_eq!(cold.succeeded, 20, "{cold:?}");
    assert_eq!(warm.succeeded, 20, "{warm:?}");
    assert!(warm.load <= 1.1, "{warm:?}");
}
