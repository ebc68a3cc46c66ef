//! Load generator: what the idempotency layer costs a real HTTP server.
//!
//! ```text
//! cargo run --release -p tower-idempotency --example loadgen -- \
//!     --modes none,memory,pg-none,pg-two-phase,pg-transactional \
//!     --clients 1,32 --seconds 5 --warmup 1 --rounds 3
//! ```
//!
//! Each measurement starts an axum server on `127.0.0.1:0` in a server
//! runtime of its own (2 worker threads) and drives it from a separate client
//! runtime with C concurrent clients, each on one keep-alive HTTP/1.1
//! connection, each request a `POST /pay` with a small JSON body and a fresh
//! unique `Idempotency-Key`. Requests started during the warm-up are not
//! recorded; the others are, by latency (send to last body byte). Modes:
//!
//! * `none`: a trivial handler answering `201` with a small JSON body;
//! * `memory`: the same handler behind `IdempotencyLayer` over `MemoryStore`;
//! * `pg-none`: a handler inserting one row (autocommit, pooled), no layer;
//! * `pg-tx-none`: the same insert in a transaction of the handler's own
//!   (`BEGIN`, `INSERT`, `COMMIT`), no layer: what any design that commits
//!   the handler's write together with something else pays before the
//!   layer adds its claim and its stored response;
//! * `pg-two-phase`: that handler behind the layer over `PostgresStore`;
//! * `pg-two-phase-in-tx`: the same layer; the handler inserts its row and
//!   completes its key in one transaction of its own
//!   (`PostgresStore::commit_completed`): two commits a request, the
//!   claim's and the handler's, and no completion call of the layer's;
//! * `pg-transactional`: the handler inserting its row through the request's
//!   `IdempotencyTransaction`, behind `IdempotencyLayer::transactional`;
//! * `redis`: the trivial handler behind `IdempotencyLayer` over
//!   `RedisStore` (`REDIS_URL`, default `redis://127.0.0.1:6379`, keys under
//!   the prefix `loadgen`, kept a minute), compared with `none`;
//! * `redis-floor`: no layer; the trivial handler makes the two round trips
//!   a keyed request needs at the least (a claim, then the response kept:
//!   two `SET … PX 60000` of its own): what any Redis-backed idempotency
//!   pays before doing anything else, compared with `none`;
//! * `redis-script-floor` (diagnostic): no layer; the same two round trips,
//!   each an `EVALSHA` of a script that does nothing (`return 1`) given the
//!   keys and arguments of the layer's claim, then of its completion: what
//!   any store pays whose calls are Lua scripts (atomic on the server)
//!   before its scripts do anything, compared with `none`;
//! * `redis-cluster`: the trivial handler behind `IdempotencyLayer` over
//!   `RedisClusterStore` (`REDIS_CLUSTER_URLS`, the nodes' URLs
//!   comma-separated, keys under the prefix `loadgen`, kept a minute),
//!   compared with `none`.
//!
//! Rounds are interleaved (round r runs every client count × every mode,
//! the mode order reversed on odd rounds), and every server is fresh (a new
//! `MemoryStore`; the PostgreSQL tables truncated), so the ratio of a layer
//! mode to its no-layer mode (`memory`/`none`, `pg-*`/`pg-none`) is paired
//! within one round. The summary gives medians over rounds and each round's
//! ratio. Beside req/s, the CPU time the server runtime's threads used per
//! recorded request (Linux, from `/proc/self/task/*/schedstat`; time the
//! hypervisor stole from the VM is not in it), and its ratio to the
//! baseline's (baseline CPU / mode CPU: 1 means the layer costs nothing): on
//! a shared machine whose speed swings, the paired CPU ratio moves much
//! less than the throughput ratio. For the PostgreSQL modes it leaves out
//! the database's own CPU. Answers other than 2xx are counted and printed: a benchmark that
//! silently measures 409s or 5xx measures the wrong thing.
//!
//! PostgreSQL: `DATABASE_URL` (default `postgres://postgres@127.0.0.1/test`),
//! tables `loadgen_payments` and `loadgen_keys`, a pool of `--pool`
//! connections shared by the handler and the store.
//!
//! The modules: `args` (the command line), `handlers` (the servers under
//! test), `stores` (PostgreSQL), `measure` (the clients and one
//! measurement), `report` (the tables).

mod args;
mod handlers;
mod measure;
mod report;
mod stores;
#[path = "../support/mod.rs"]
mod support;

use clap::Parser;
use tower_idempotency::{RedisClusterStore, RedisStore};

use args::{Args, Mode};
use handlers::router;
use measure::{measure, Sample};
use report::{print_round, print_summary};
use stores::{connect_pg, truncate};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.modes.is_empty() || args.clients.is_empty() || args.rounds == 0 {
        return Err("nothing to run: give at least one mode, client count and round".into());
    }
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .thread_name("client")
        .enable_all()
        .build()?;

    let pg = if args.modes.iter().any(|m| m.needs_pg()) {
        Some(server_rt.block_on(connect_pg(
            args.pool,
            args.commit_delay_us,
            !args.no_test_before_acquire,
            args.store_connections,
        ))?)
    } else {
        None
    };
    let redis = if args
        .modes
        .iter()
        .any(|m| matches!(m, Mode::Redis | Mode::RedisFloor | Mode::RedisScriptFloor))
    {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let store = server_rt
            .block_on(RedisStore::connect_volatile(&url))
            .map_err(|e| format!("Redis is not reachable at REDIS_URL={url}: {e}"))?
            .with_prefix("loadgen")
            .map_err(|e| e.to_string())?;
        Some(store)
    } else {
        None
    };

    let cluster = if args.modes.contains(&Mode::RedisCluster) {
        let urls = std::env::var("REDIS_CLUSTER_URLS").map_err(|_| {
            "redis-cluster needs REDIS_CLUSTER_URLS (the nodes' URLs, comma-separated)"
        })?;
        let nodes: Vec<&str> = urls.split(',').collect();
        let store = server_rt
            .block_on(RedisClusterStore::connect_volatile(&nodes))
            .map_err(|e| format!("the Redis Cluster at REDIS_CLUSTER_URLS={urls}: {e}"))?
            .with_prefix("loadgen")
            .map_err(|e| e.to_string())?;
        Some(store)
    } else {
        None
    };

    println!(
        "loadgen: modes {}, clients {:?}, {} s measured after {} s warm-up, {} rounds, \
         server runtime 2 workers, client runtime {} workers{}",
        args.modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(","),
        args.clients,
        args.seconds,
        args.warmup,
        args.rounds,
        args.client_threads,
        if pg.is_some() {
            let delay = if args.commit_delay_us > 0 {
                format!(", commit_delay {} µs", args.commit_delay_us)
            } else {
                String::new()
            };
            let ping = if args.no_test_before_acquire {
                ", no ping before acquire"
            } else {
                ""
            };
            format!(", PostgreSQL pool {}{delay}{ping}", args.pool)
        } else {
            String::new()
        }
    );

    // results[round][(mode, clients)]
    let mut results: Vec<Vec<(Mode, usize, Sample)>> = Vec::new();
    for round in 0..args.rounds {
        let mut modes = args.modes.clone();
        if round % 2 == 1 {
            modes.reverse();
        }
        let mut this_round = Vec::new();
        for &clients in &args.clients {
            for &mode in &modes {
                if let Some(store) = &pg {
                    server_rt.block_on(truncate(store))?;
                }
                let app = router(mode, pg.as_ref(), redis.as_ref(), cluster.as_ref())?;
                let sample = measure(&server_rt, &client_rt, app, clients, &args)?;
                this_round.push((mode, clients, sample));
            }
        }
        println!("\n### Round {}\n", round + 1);
        print_round(&this_round, &args);
        results.push(this_round);
    }
    print_summary(&results, &args);
    Ok(())
}
