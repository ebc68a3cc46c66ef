//! The `call` example, driven from outside as a user's shell script would.

use std::process::{Command, Output};

use wiremock::matchers::{header_exists, method};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// `cargo test` builds the examples next to the test binaries.
fn call(args: &[&str]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir
        .join("examples")
        .join(format!("call{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "build the example first: cargo build --example call"
    );
    Command::new(bin).args(args).output().unwrap()
}

fn report(output: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().expect("a report line");
    serde_json::from_str(last).unwrap()
}

#[tokio::test]
async fn retries_and_prints_the_body_and_the_report() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_exists("idempotency-key"))
        .respond_with(ResponseTemplate::new(201).set_body_string("created"))
        .mount(&server)
        .await;
    let url = server.uri();
    let out = call(&[
        "-X",
        "POST",
        "-d",
        "{}",
        "--base-ms",
        "1",
        "--cap-ms",
        "2",
        "--seed",
        "1",
        "--json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"created");
    let r = report(&out);
    assert_eq!(r["status"], 201);
    assert_eq!(r["attempts"], 3);
    assert_eq!(r["delays_ms"].as_array().unwrap().len(), 2);
    assert_eq!(r["stop_reason"], "success");
    assert!(r["error"].is_null());
    let keys: Vec<_> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.headers["idempotency-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| *k == keys[0]));
    assert_eq!(r["idempotency_key"], keys[0].as_str());
}

#[tokio::test]
async fn a_given_key_is_used_and_a_final_failure_exits_1() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let url = server.uri();
    let out = call(&[
        "-X",
        "POST",
        "--idempotency-key",
        "order-9",
        "--max-attempts",
        "2",
        "--base-ms",
        "1",
        "--json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert_eq!(r["idempotency_key"], "order-9");
    assert_eq!(r["attempts"], 2);
    assert_eq!(r["stop_reason"], "attempts_exhausted");

    let out = call(&["-X", "POST", "--no-idempotency-key", "--json", &url]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert_eq!(r["stop_reason"], "not_idempotent");
    assert!(r["idempotency_key"].is_null());
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(call(&[]).status.code(), Some(2));
    assert_eq!(
        call(&["--jitter", "sometimes", "http://127.0.0.1:1/"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        call(&["--deadline", "-1", "http://127.0.0.1:1/"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        call(&["-H", "no colon", "http://127.0.0.1:1/"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        call(&[
            "--idempotency-key",
            "k",
            "--no-idempotency-key",
            "http://127.0.0.1:1/"
        ])
        .status
        .code(),
        Some(2)
    );
}

#[test]
fn a_refused_connection_reports_null_status_and_the_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    let out = call(&["--max-attempts", "2", "--base-ms", "1", "--json", &url]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert!(r["status"].is_null());
    assert_eq!(r["attempts"], 2);
    assert!(
        r["error"].as_str().unwrap().contains("Connection refused"),
        "{r}"
    );
}
