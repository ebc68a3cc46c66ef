//! A real Redis Cluster for the tests: three masters and three replicas
//! of Debian's `redis-server` on free ports of 127.0.0.1, in a temporary
//! folder, created with `redis-cli --cluster create`; its nodes die with
//! the [`Cluster`] (or with the test process, whichever comes first).
//!
//! Each node runs under a small shell that holds a pipe from the test
//! process: when the pipe closes (the `Cluster` dropped, or the process
//! gone, even killed) the shell kills its node and removes its files (the
//! last one the folder), so no test leaves a node or a folder behind. `cluster-node-timeout` is 1000 ms: a replica takes over a
//! killed master within a few seconds.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// One node: its port, the shell that holds it, the server's pid.
struct Node {
    port: u16,
    shell: Child,
    /// Closing it makes the shell kill the node.
    hold: Option<ChildStdin>,
    pid: u32,
}

/// A running cluster of 3 masters and 3 replicas.
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

/// Whether `port` and its cluster bus port (+10000) are free on 127.0.0.1.
fn free(port: u16) -> bool {
    let bus = match port.checked_add(10000) {
        Some(bus) => bus,
        None => return false,
    };
    TcpListener::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("127.0.0.1", bus)).is_ok()
}

/// Six consecutive free ports (and their bus ports), from a start chosen by
/// the process id and the time so that test binaries running side by side
/// look in different places; never ports this process handed out already
/// (two clusters starting at once in one binary would both find them free).
fn free_ports() -> Vec<u16> {
    static TAKEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    for attempt in 0..200u64 {
        let base = 20000 + ((seed + attempt * 7919) % 9000) as u16;
        let ports: Vec<u16> = (base..base + 6).collect();
        if ports.iter().all(|p| !taken.contains(p) && free(*p)) {
            taken.extend(&ports);
            return ports;
        }
    }
    panic!("no six free ports (with their bus ports) between 20000 and 29006");
}

/// `redis-cli -p port ARGS…`'s output (panics if it cannot run).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (apt-get install redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` every 50 ms for up to `within`; panics with `what` if it
/// never holds.
pub fn wait_until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "{what} (waited {within:?})");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Cluster {
    /// Starts six nodes and makes them a cluster (blocking: call it from
    /// `spawn_blocking`, or use [`Cluster::start_async`]).
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-idem-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let mut cluster = Self {
            dir,
            nodes: Vec::new(),
        };
        for port in free_ports() {
            cluster.nodes.push(cluster.spawn(port));
        }
        for node in &cluster.nodes {
            let port = node.port;
            wait_until(Duration::from_secs(10), "a node never answered", || {
                cli(port, &["ping"]).trim() == "PONG"
            });
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        cluster.wait_ready();
        cluster
    }

    /// [`Cluster::start`] on a blocking thread.
    pub async fn start_async() -> Self {
        tokio::task::spawn_blocking(Self::start)
            .await
            .expect("the cluster started")
    }

    fn spawn(&self, port: u16) -> Node {
        let dir = self.dir.display().to_string();
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(concat!(
                r#"redis-server "$@" & echo $!; read _closed; kill -9 $! 2>/dev/null; wait; "#,
                r#"rm -f "$DIR/nodes-$PORT.conf" "$DIR/$PORT.log" "$DIR/dump.rdb"; rmdir "$DIR" 2>/dev/null"#
            ))
            .env("DIR", &dir)
            .env("PORT", port.to_string())
            .arg("sh")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "1000"])
            .args(["--dir", &dir, "--logfile", &format!("{dir}/{port}.log")])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server)");
        let mut line = String::new();
        BufReader::new(shell.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the shell prints the server's pid");
        let pid = line.trim().parse().expect("a pid");
        Node {
            port,
            hold: shell.stdin.take(),
            shell,
            pid,
        }
    }

    /// Waits until every live node says `cluster_state:ok` and sees every
    /// slot served, and every master has a replica in sync.
    pub fn wait_ready(&self) {
        let live: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.hold.is_some())
            .map(|n| n.port)
            .collect();
        wait_until(
            Duration::from_secs(30),
            "the cluster never got ready",
            || {
                live.iter().all(|p| {
                    let info = cli(*p, &["cluster", "info"]);
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                }) && live.iter().all(|p| {
                    let repl = cli(*p, &["info", "replication"]);
                    repl.contains("role:slave") && repl.contains("master_link_status:up")
                        || repl.contains("role:master")
                })
            },
        );
    }

    /// `redis://127.0.0.1:P` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The ports of the live masters.
    pub fn masters(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.hold.is_some())
            .map(|n| n.port)
            .filter(|p| cli(*p, &["info", "replication"]).contains("role:master"))
            .collect()
    }

    /// The port of the master serving `slot`.
    pub fn master_of(&self, slot: u16) -> u16 {
        self.masters()
            .into_iter()
            .find(|p| self.serves(*p, slot))
            .expect("a master serves the slot")
    }

    /// Whether the node at `port` serves `slot` (from its `CLUSTER NODES`).
    fn serves(&self, port: u16, slot: u16) -> bool {
        let nodes = cli(port, &["cluster", "nodes"]);
        let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
            return false;
        };
        me.split_whitespace().skip(8).any(|range| {
            let mut ends = range.split('-');
            match (ends.next().and_then(|a| a.parse::<u16>().ok()), ends.next()) {
                (Some(a), None) => a == slot,
                (Some(a), Some(b)) => b.parse::<u16>().is_ok_and(|b| a <= slot && slot <= b),
                _ => false,
            }
        })
    }

    /// The node id of the node at `port`.
    pub fn id(&self, port: u16) -> String {
        cli(port, &["cluster", "myid"]).trim().to_owned()
    }

    /// The port of the replica of the master at `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        let id = self.id(port);
        let nodes = cli(port, &["cluster", "nodes"]);
        let line = nodes
            .lines()
            .find(|l| l.split_whitespace().nth(3) == Some(id.as_str()))
            .expect("the master has a replica");
        let addr = line.split_whitespace().nth(1).expect("an address");
        addr.split(['@', ':'])
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    /// Kills the node at `port` (`kill -9`, by its pid): a crash.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        let _ = Command::new("kill")
            .args(["-9", &node.pid.to_string()])
            .status();
        node.hold = None;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            // Closing the pipe makes the shell kill its node.
            node.hold = None;
        }
        for node in &mut self.nodes {
            let _ = node.shell.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The cluster the store matrix shares in one test binary, started by its
/// first test (each test writes under a prefix of its own). Its nodes die
/// with the test process.
pub async fn shared() -> &'static Cluster {
    static SHARED: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
    SHARED.get_or_init(Cluster::start_async).await
}
