//! `examples/payments_server` as a user runs it: a client whose attempts
//! time out before the handler answers still pays exactly once; callers
//! with different credentials never share a key; start-up failures are one
//! human sentence.

mod support;

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport};
use support::payments::{run_to_end, PaymentsServer};

const PAYMENTS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attempts_that_time_out_before_the_handler_answers_pay_once() {
    // The handler records the payment, then waits 400 ms; every attempt
    // times out after 150 ms, so the first attempt of every payment hangs up
    // on a handler that already charged.
    let server = PaymentsServer::start(&["--store", "memory", "--after-effect-ms", "400"]);
    let policy = RetryPolicy::builder()
        .max_attempts(10)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .attempt_timeout(Duration::from_millis(150))
        .deadline(Duration::from_secs(30))
        .no_budget()
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let calls: Vec<_> = (0..PAYMENTS)
        .map(|i| {
            let client = client.clone();
            let account = format!("slow-{run}-{i}");
            let url = server.url();
            tokio::spawn(async move {
                let result = client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"account":"{account}","amount":{i}}}"#))
                    .send()
                    .await;
                (account, result)
            })
        })
        .collect();
    let mut attempts = 0;
    for call in calls {
        let (account, result) = call.await.unwrap();
        // Exactly once first: without the layer keeping the handler alive,
        // each timed-out attempt released the key and paid again.
        assert_eq!(
            server.payments_of(&account).await,
            1,
            "{account}: {result:?}"
        );
        let response = result.unwrap();
        assert_eq!(response.status(), 201, "{account}");
        assert!(
            response.headers().contains_key("idempotent-replayed"),
            "{account}: the answer is the first attempt's, replayed"
        );
        let report = response.extensions().get::<RetryReport>().unwrap();
        assert!(
            report.attempts() >= 2,
            "{account}: the first attempt timed out"
        );
        attempts += report.attempts();
    }
    eprintln!("{PAYMENTS} payments, {attempts} attempts, each payment once");
}

#[tokio::test]
async fn callers_with_different_credentials_never_share_a_key() {
    let server = PaymentsServer::start(&["--store", "memory"]);
    let account = format!("tenant-{}", uuid::Uuid::new_v4().simple());
    let body = format!(r#"{{"account":"{account}","amount":5}}"#);
    let pay = |auth: &'static str| {
        reqwest::Client::new()
            .post(server.url())
            .header("authorization", auth)
            .header("idempotency-key", "same-key")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let a = pay("Bearer tenant-a").await.unwrap();
    assert_eq!(a.status(), 201);
    let b = pay("Bearer tenant-b").await.unwrap();
    assert_eq!(b.status(), 201);
    assert!(
        !b.headers().contains_key("idempotent-replayed"),
        "tenant B got tenant A's receipt"
    );
    let again = pay("Bearer tenant-a").await.unwrap();
    assert!(again.headers().contains_key("idempotent-replayed"));
    assert_eq!(server.payments_of(&account).await, 2);
}

#[test]
fn a_port_in_use_is_one_sentence_and_exit_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run_to_end(&["--listen", &addr, "--store", "memory"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("payments_server: address {addr} in use")
    );
}

#[test]
fn an_unreachable_postgres_is_named_at_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("postgres://postgres@{}/test", closed.local_addr().unwrap());
    drop(closed);
    let out = run_to_end(&["--listen", "127.0.0.1:0", "--store", &url]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.trim().starts_with(&format!(
            "payments_server: cannot reach PostgreSQL at {url}: "
        )),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // The probe's own error, not a wait for the pool's or our 10 s timeout.
    assert!(!stderr.contains("no answer within"), "{stderr}");
    assert!(!stderr.contains("timed out"), "{stderr}");
}

/// `--store redis://…`: two instances sharing one Redis share their keys.
/// The payment made through the first is replayed by the second, which
/// records none. (The machine's Redis keeps nothing on disk: the server
/// warns and runs.)
#[tokio::test]
async fn two_instances_on_one_redis_share_their_keys() {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let first = PaymentsServer::start(&["--store", &redis]);
    let second = PaymentsServer::start(&["--store", &redis]);
    let account = format!("shared-{}", uuid::Uuid::new_v4().simple());
    let key = uuid::Uuid::new_v4().to_string();
    let pay = |url: String| {
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"account":"{account}","amount":7}}"#))
            .send()
    };
    let paid = pay(first.url()).await.unwrap();
    assert_eq!(paid.status(), 201);
    let again = pay(second.url()).await.unwrap();
    assert_eq!(again.status(), 201);
    assert!(again.headers().contains_key("idempotent-replayed"));
    assert_eq!(first.payments_of(&account).await, 1);
    assert_eq!(second.payments_of(&account).await, 0);
}

#[test]
fn an_unreachable_redis_is_named_at_once() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = run_to_end(&["--listen", "127.0.0.1:0", "--store", &url]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .trim()
            .starts_with(&format!("payments_server: cannot reach Redis at {url}: ")),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
