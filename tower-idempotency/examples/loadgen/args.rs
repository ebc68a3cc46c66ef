//! The command line: the modes (each a handler, with or without the
//! layer and its store, and the no-layer mode it is compared with) and the
//! options of a run.

use std::fmt;
use std::str::FromStr;

use clap::Parser;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    None,
    /// Diagnostic: the trivial handler, awaiting one empty spawned task (the
    /// hand-over between tasks the layer used to make), no layer.
    NoneSpawn,
    Memory,
    PgNone,
    /// Diagnostic: the insert in a transaction of the handler's own.
    PgTxNone,
    PgTwoPhase,
    /// The two-phase layer; the handler completes its key in its own
    /// transaction (`commit_completed`): two commits a request.
    PgTwoPhaseInTx,
    PgTransactional,
    Redis,
    /// Baseline: two round trips to Redis, no layer.
    RedisFloor,
    /// Diagnostic: two round trips to Redis, each a Lua script that does
    /// nothing, no layer: the floor of any store whose calls are scripts.
    RedisScriptFloor,
    /// The trivial handler behind the layer over `RedisClusterStore`.
    RedisCluster,
}

impl Mode {
    const ALL: [Mode; 12] = [
        Mode::None,
        Mode::NoneSpawn,
        Mode::Memory,
        Mode::PgNone,
        Mode::PgTxNone,
        Mode::PgTwoPhase,
        Mode::PgTwoPhaseInTx,
        Mode::PgTransactional,
        Mode::Redis,
        Mode::RedisFloor,
        Mode::RedisScriptFloor,
        Mode::RedisCluster,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::NoneSpawn => "none-spawn",
            Mode::Memory => "memory",
            Mode::PgNone => "pg-none",
            Mode::PgTxNone => "pg-tx-none",
            Mode::PgTwoPhase => "pg-two-phase",
            Mode::PgTwoPhaseInTx => "pg-two-phase-in-tx",
            Mode::PgTransactional => "pg-transactional",
            Mode::Redis => "redis",
            Mode::RedisFloor => "redis-floor",
            Mode::RedisScriptFloor => "redis-script-floor",
            Mode::RedisCluster => "redis-cluster",
        }
    }

    /// The no-layer mode this one is compared with.
    pub(crate) fn baseline(self) -> Option<Mode> {
        match self {
            Mode::None | Mode::PgNone => None,
            Mode::Memory
            | Mode::NoneSpawn
            | Mode::Redis
            | Mode::RedisFloor
            | Mode::RedisScriptFloor
            | Mode::RedisCluster => Some(Mode::None),
            Mode::PgTxNone | Mode::PgTwoPhase | Mode::PgTwoPhaseInTx | Mode::PgTransactional => {
                Some(Mode::PgNone)
            }
        }
    }

    pub(crate) fn needs_pg(self) -> bool {
        matches!(
            self,
            Mode::PgNone
                | Mode::PgTxNone
                | Mode::PgTwoPhase
                | Mode::PgTwoPhaseInTx
                | Mode::PgTransactional
        )
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Mode::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mode {s:?}; expected one of {}", names.join(","))
            })
    }
}

#[derive(Parser, Debug)]
#[command(about = "Req/s and latency of a POST handler with and without the idempotency layer")]
pub(crate) struct Args {
    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,memory,pg-none,pg-two-phase,pg-transactional"
    )]
    pub(crate) modes: Vec<Mode>,
    /// Concurrent clients (one keep-alive connection each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub(crate) clients: Vec<usize>,
    /// Measured seconds per mode and client count.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// Unrecorded warm-up seconds before each measurement.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) warmup: f64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// PostgreSQL pool size (shared by the handler and the store).
    #[arg(long, default_value_t = 10)]
    pub(crate) pool: u32,
    /// Make every commit of the benchmark's PostgreSQL connections wait this
    /// many microseconds before its WAL flush (`commit_delay`, with
    /// `commit_siblings = 0`; needs a superuser): emulates a disk, or a
    /// synchronous standby, whose flush costs that much more than this
    /// machine's. 0 (the default) leaves the server's settings alone.
    #[arg(long, default_value_t = 0)]
    pub(crate) commit_delay_us: u32,
    /// Worker threads of the client runtime (the server always has 2).
    #[arg(long, default_value_t = 2)]
    pub(crate) client_threads: usize,
    /// Build the PostgreSQL pool with `test_before_acquire(false)`: no ping
    /// (a round trip) each time a connection is taken from the pool. sqlx
    /// pings by default, and again, in the background, each time one is
    /// given back.
    #[arg(long)]
    pub(crate) no_test_before_acquire: bool,
    /// Give the PostgreSQL store a pool of this many connections of its own
    /// (`PostgresStore::store_connections`), beside `--pool`; 0 (the
    /// default): the store borrows the pool's connections.
    #[arg(long, default_value_t = 0)]
    pub(crate) store_connections: u32,
}
