//! PostgreSQL as fleets run it, for the store's tests: a PgBouncer of the
//! test's own (Debian's `pgbouncer` package: on a free port, with its own
//! config file in a directory of its own, stopped when dropped), roles with
//! a `CONNECTION LIMIT` or a `statement_timeout`, and a payments handler
//! completing its key with `commit_completed`.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::{Extension, Router};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Executor;
use tower_idempotency::{IdempotencyContext, IdempotencyLayer, PostgresStore, StoredResponse};

use crate::support::{app, database_url, post, send, unique};

/// A running PgBouncer of the test's own.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

impl PgBouncer {
    /// Starts a PgBouncer in `pool_mode` (`session` or `transaction`) with
    /// `default_pool_size` = `pool_size` in front of the local PostgreSQL,
    /// and waits until it accepts connections.
    pub fn start(pool_mode: &str, pool_size: u32) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(unique("tower_idem_pgbouncer_"));
        std::fs::create_dir_all(&dir).unwrap();
        // PgBouncer refuses to run as root: as root it runs as `postgres`,
        // which must write its log here.
        set_mode(&dir, 0o777);
        let users = dir.join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").unwrap();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port=5432\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {pool_mode}\n\
                 default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n\
                 max_client_conn = 500\nquery_wait_timeout = 30\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\npidfile = {pid}\n",
                users = users.display(),
                log = dir.join("pgbouncer.log").display(),
                pid = dir.join("pgbouncer.pid").display(),
            ),
        )
        .unwrap();
        for file in [&users, &ini] {
            set_mode(file, 0o644);
        }
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut command = Command::new(binary);
        if is_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "starting {binary} ({err}): install it with \
                     `apt-get install -y pgbouncer` (.ci/run does)"
                )
            });
        let bouncer = Self { child, dir, port };
        // An upper bound on its start, not a timing check.
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < until,
                "PgBouncer did not start: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// The test database through this PgBouncer.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| out.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// A superuser pool for the test's own statements.
pub async fn admin() -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap()
}

/// A non-superuser role `name` (created if missing) with `settings` (say
/// `CONNECTION LIMIT 4`) and `options` (say `SET statement_timeout =
/// '300ms'`), allowed to create tables in `public`; its URL.
pub async fn role(name: &str, settings: &str, options: &[&str]) -> String {
    let admin = admin().await;
    // Tests running at once may both create it: either error means it is there.
    let create = format!(
        "DO $$ BEGIN CREATE ROLE {name} LOGIN; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    );
    admin.execute(create.as_str()).await.unwrap();
    let alter = format!("ALTER ROLE {name} NOSUPERUSER {settings}");
    admin.execute(alter.as_str()).await.unwrap();
    for option in options {
        let alter = format!("ALTER ROLE {name} {option}");
        admin.execute(alter.as_str()).await.unwrap();
    }
    let grant = format!("GRANT CREATE, USAGE ON SCHEMA public TO {name}");
    admin.execute(grant.as_str()).await.unwrap();
    admin.close().await;
    format!("postgres://{name}@127.0.0.1:5432/test")
}

/// Whether `pool` opens `n` transactions at once, each running a
/// statement, within `within` (an upper bound, not a timing check).
pub async fn opens_transactions(pool: &PgPool, n: u32, within: Duration) -> bool {
    let open: Vec<_> = (0..n)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tx = pool.begin().await?;
                (&mut *tx).execute("SELECT 1").await?;
                Ok::<_, sqlx::Error>(tx)
            })
        })
        .collect();
    let all = async {
        let mut txs = Vec::new();
        for task in open {
            txs.push(task.await.unwrap().unwrap());
        }
        txs
    };
    matches!(tokio::time::timeout(within, all).await, Ok(txs) if txs.len() == n as usize)
}

/// A keyed request through the two-phase layer and one through the
/// transactional mode over `store`, each answered `201`; then whether
/// `store`'s pool still opens `n` transactions at once within `within`.
pub async fn keyed_then_opens(store: &PostgresStore, n: u32, within: Duration) -> bool {
    let (router, _) = app(IdempotencyLayer::new(store.clone()));
    assert_eq!(send(&router, post("two-phase", "a")).await.status, 201);
    let transactional = IdempotencyLayer::transactional(store.clone())
        .build()
        .unwrap();
    let (router, _) = app(transactional);
    assert_eq!(send(&router, post("transactional", "a")).await.status, 201);
    opens_transactions(store.pool(), n, within).await
}

/// A pool of `size` connections to `url`, waiting up to 30 s for one.
pub async fn app_pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .unwrap()
}

/// A store on `pool` with a table of its own, migrated.
pub async fn store_on(pool: PgPool) -> PostgresStore {
    let store = PostgresStore::new(pool)
        .with_table(&unique("tidem_fleet_"))
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// The payments application: `POST /payments` inserts a payment row,
/// works for `work` in the database, and completes its key with
/// `commit_completed`, in one transaction of the application's pool. Its
/// statements are unprepared (`persistent(false)`), as a transaction-mode
/// pooler needs.
#[derive(Clone)]
pub struct Payments {
    pub store: PostgresStore,
    pub table: Arc<String>,
    pub work: Duration,
}

impl Payments {
    /// The application over `store`, its payments table created.
    pub async fn new(store: &PostgresStore, work: Duration) -> Self {
        let table = unique("tower_idem_payments_");
        let create = format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, note text NOT NULL)");
        sqlx::raw_sql(&create).execute(store.pool()).await.unwrap();
        Self {
            store: store.clone(),
            table: Arc::new(table),
            work,
        }
    }

    /// The router, behind the two-phase layer.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/payments", post_route(pay))
            .with_state(self.clone())
            .layer(IdempotencyLayer::new(self.store.clone()))
    }

    /// `clients` clients at once, each sending `each` payments one after
    /// the other: how many were answered `201` within `within`.
    pub async fn run(&self, clients: usize, each: usize, within: Duration) -> usize {
        let router = self.router();
        let created = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (router, created) = (router.clone(), created.clone());
                tokio::spawn(async move {
                    for p in 0..each {
                        let reply = send(&router, post(&format!("pay-{c}-{p}"), "1")).await;
                        if reply.status == StatusCode::CREATED {
                            created.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let all = async {
            for task in tasks {
                task.await.unwrap();
            }
        };
        let _ = tokio::time::timeout(within, all).await;
        created.load(Ordering::SeqCst)
    }

    /// Payments committed; drops the tables.
    pub async fn finish(self) -> i64 {
        let admin = admin().await;
        let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table))
            .fetch_one(&admin)
            .await
            .unwrap();
        let drop = format!("DROP TABLE {}, {}", self.table, self.store.table());
        sqlx::raw_sql(&drop).execute(&admin).await.unwrap();
        count
    }
}

async fn pay(
    State(app): State<Payments>,
    Extension(ctx): Extension<IdempotencyContext>,
    body: String,
) -> (StatusCode, String) {
    let failed = |err: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    let mut tx = match app.store.pool().begin().await {
        Ok(tx) => tx,
        Err(err) => return failed(&err),
    };
    let insert = format!("INSERT INTO {} (note) VALUES ($1)", app.table);
    let work = sqlx::query(&insert)
        .bind(&body)
        .persistent(false)
        .execute(&mut *tx)
        .await
        .and(Ok(()));
    let work = match work {
        Ok(()) if !app.work.is_zero() => sqlx::query("SELECT pg_sleep($1)")
            .bind(app.work.as_secs_f64())
            .persistent(false)
            .execute(&mut *tx)
            .await
            .and(Ok(())),
        other => other,
    };
    if let Err(err) = work {
        return failed(&err);
    }
    let stored = StoredResponse::json(201, r#"{"paid":true}"#);
    match app.store.commit_completed(tx, &ctx, &stored).await {
        Ok(true) => (StatusCode::CREATED, "paid".into()),
        Ok(false) => (StatusCode::CONFLICT, "taken over".into()),
        Err(err) => failed(&err),
    }
}
