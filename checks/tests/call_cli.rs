//! The `call` example, driven from outside as a user's shell script would.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use reqwest_safe_retry::RetryPolicy;
use wiremock::matchers::{body_string, header_exists, method};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// `cargo test` builds the examples next to the test binaries.
fn example(name: &str) -> Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "build the example first: cargo build --example {name}"
    );
    Command::new(bin)
}

fn command() -> Command {
    example("call")
}

fn call(args: &[&str]) -> Output {
    command().args(args).output().unwrap()
}

/// Runs `call` with `input` on its standard input.
fn call_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A server that answers `status` to everything.
async fn answering(status: u16) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(status))
        .mount(&server)
        .await;
    server
}

async fn received(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.unwrap()
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
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"created\n", "a newline ends the body");
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
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert_eq!(r["idempotency_key"], "order-9");
    assert_eq!(r["attempts"], 2);
    assert_eq!(r["stop_reason"], "attempts_exhausted");

    let out = call(&["-X", "POST", "--no-idempotency-key", "--report-json", &url]);
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
    let out = call(&[
        "--max-attempts",
        "2",
        "--base-ms",
        "1",
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert!(r["status"].is_null());
    assert_eq!(r["attempts"], 2);
    assert!(
        r["error"].as_str().unwrap().contains("Connection refused"),
        "{r}"
    );
}

#[tokio::test]
async fn data_comes_from_a_file_or_stdin_and_implies_post() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header_exists("idempotency-key"))
        .and(body_string("{\"amount\":1200}\n"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    let url = server.uri();
    let file = std::env::temp_dir().join(format!("call-cli-body-{}.json", std::process::id()));
    std::fs::write(&file, "{\"amount\":1200}\n").unwrap();
    let at_file = format!("@{}", file.display());
    let out = call(&["-d", &at_file, &url]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = call_with_stdin(&["-d", "@-", &url], b"{\"amount\":1200}\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(received(&server).await.len(), 2);

    // A file that cannot be read is a usage error, before anything is sent.
    let out = call(&["-d", "@/nonexistent/body.json", "--report-json", &url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(report(&out)["error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/body.json"));
    assert_eq!(received(&server).await.len(), 2);
    // An explicit -X still wins over the POST that -d implies.
    let out = call(&["-X", "PUT", "-d", "x", &url]);
    assert_eq!(out.status.code(), Some(1), "no mock for PUT: 404");
    assert_eq!(received(&server).await[2].method.as_str(), "PUT");
}

#[tokio::test]
async fn a_repeated_option_the_last_one_wins() {
    let server = answering(503).await;
    let url = server.uri();
    let out = call(&[
        "--max-attempts",
        "5",
        "--max-attempts",
        "2",
        "--base-ms",
        "1",
        "-X",
        "PUT",
        "-X",
        "DELETE",
        "--report-json",
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report(&out)["attempts"], 2);
    let got = received(&server).await;
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.method.as_str() == "DELETE"));
}

#[tokio::test]
async fn a_url_without_a_scheme_means_http() {
    let server = answering(200).await;
    let bare = server.uri().strip_prefix("http://").unwrap().to_owned() + "/x";
    let out = call(&[&bare]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(received(&server).await[0].url.path(), "/x");
}

#[tokio::test]
async fn every_usage_error_exits_2_and_still_ends_with_the_json_report() {
    let server = answering(200).await;
    let url = server.uri();
    let cases: &[&[&str]] = &[
        &["--report-json"],
        &["--report-json", "--jitter", "sometimes", &url],
        &["--report-json", "--deadline", "-1", &url],
        &["--report-json", "--max-attempts", "many", &url],
        &["--report-json", "-H", "no colon", &url],
        &["--report-json", "-X", "GE T", &url],
        &["--report-json", "--idempotency-key", "has space", &url],
        &["--report-json", "--idempotency-key", &"k".repeat(256), &url],
        &[
            "--report-json",
            "--idempotency-key",
            "k",
            "--no-idempotency-key",
            &url,
        ],
        &[
            "--report-json",
            "--idempotency-key",
            "a",
            "-H",
            "Idempotency-Key: b",
            &url,
        ],
        &[
            "--report-json",
            "--no-idempotency-key",
            "-H",
            "idempotency-key: b",
            &url,
        ],
        &["--report-json", "--unknown", &url],
        &["--report-json", "http://[::1"],
    ];
    for args in cases {
        let out = call(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let r = report(&out);
        assert!(
            r["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{args:?}: {r}"
        );
        assert!(r["status"].is_null() && r["attempts"] == 0, "{args:?}: {r}");
    }
    assert!(
        received(&server).await.is_empty(),
        "a usage error sends nothing"
    );
}

#[tokio::test]
async fn a_key_in_a_header_and_a_flag_never_both_go_on_the_wire() {
    let server = answering(201).await;
    let url = server.uri();
    let out = call(&[
        "-X",
        "POST",
        "--idempotency-key",
        "a",
        "-H",
        "Idempotency-Key: b",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not both"), "{stderr}");
    assert!(received(&server).await.is_empty());
    // Either one alone is sent, once.
    for args in [["--idempotency-key", "a"], ["-H", "Idempotency-Key: a"]] {
        let out = call(&[&["-X", "POST"], &args[..], &[&url]].concat());
        assert_eq!(out.status.code(), Some(0));
    }
    for r in received(&server).await {
        let keys: Vec<_> = r.headers.get_all("idempotency-key").iter().collect();
        assert_eq!(keys, ["a"]);
    }
}

#[tokio::test]
async fn verbose_prints_one_line_per_attempt() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    let url = server.uri();
    let out = call(&[
        "-v",
        "-d",
        "{}",
        "--idempotency-key",
        "order-7",
        "--base-ms",
        "1",
        "--jitter",
        "none",
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "call: attempt 1: 503, retry in 1 ms, key order-7",
            "call: attempt 2: 503, retry in 2 ms, key order-7",
            "call: attempt 3: 201, stop: success, key order-7",
        ],
        "{stderr}"
    );
    assert_eq!(
        report(&out)["attempts"],
        3,
        "the report is still the last line"
    );

    // An error instead of a status.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = call(&["-v", "--max-attempts", "1", &format!("127.0.0.1:{port}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("call: attempt 1: connect error, stop: attempts_exhausted, key none\n"),
        "{stderr}"
    );
}

#[test]
fn help_shows_the_defaults_the_exit_codes_and_every_jitter_mode() {
    let out = call(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    let defaults = RetryPolicy::default();
    let ms = |d: std::time::Duration| d.as_millis().to_string();
    for default in [
        defaults.max_attempts().to_string(),
        defaults.deadline().unwrap().as_secs().to_string(),
        ms(defaults.backoff().base()),
        ms(defaults.backoff().cap()),
        defaults.backoff().jitter().name().to_owned(),
    ] {
        assert!(
            help.contains(&format!("[default: {default}]")),
            "{default}: {help}"
        );
    }
    for mode in ["none", "full", "equal", "decorrelated", "proportional"] {
        assert!(help.contains(&format!("- {mode}:")), "{mode}: {help}");
    }
    for code in [
        "0  the final response is 2xx",
        "1  the final",
        "2  usage error",
    ] {
        assert!(help.contains(code), "{code}: {help}");
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A server that answers `template` to everything.
async fn answering_with(template: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(template)
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn the_body_ends_in_one_newline_so_the_report_has_a_line_of_its_own() {
    let server = answering_with(ResponseTemplate::new(200).set_body_string("no newline")).await;
    let out = call(&["--report-json", &server.uri()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"no newline\n");
    assert_eq!(report(&out)["status"], 200);
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "a 2xx names no status: {}",
        stderr(&out)
    );

    // A body that has its newline keeps it, once; an empty body prints
    // nothing.
    let server = answering_with(ResponseTemplate::new(200).set_body_string("one\n")).await;
    assert_eq!(call(&[&server.uri()]).stdout, b"one\n");
    let server = answering(204).await;
    assert_eq!(call(&[&server.uri()]).stdout, b"");
}

#[tokio::test]
async fn a_final_status_that_is_not_2xx_is_named_on_stderr() {
    let server = answering_with(ResponseTemplate::new(404).set_body_string("no such order")).await;
    let out = call(&[&server.uri()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, b"no such order\n");
    assert_eq!(stderr(&out), "call: 404 Not Found\n");

    // After the retries, before the report, which stays the last line.
    let server = answering(503).await;
    let out = call(&[
        "--max-attempts",
        "2",
        "--base-ms",
        "1",
        "--report-json",
        &server.uri(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert_eq!(lines[0], "call: 503 Service Unavailable");
    assert_eq!(report(&out)["attempts"], 2);
}

#[tokio::test]
async fn silent_drops_the_status_and_error_lines_as_curl_s_does() {
    let server = answering(503).await;
    for flag in ["-s", "--silent"] {
        let out = call(&[flag, "--max-attempts", "1", &server.uri()]);
        assert_eq!(out.status.code(), Some(1), "the exit code still tells");
        assert_eq!(stderr(&out), "", "{flag}");
    }
    // The report was asked for: it still comes, alone.
    let out = call(&["-s", "--max-attempts", "1", "--report-json", &server.uri()]);
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert_eq!(report(&out)["status"], 503);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    let loud = call(&["--max-attempts", "1", &url]);
    assert!(stderr(&loud).starts_with("call: "), "{}", stderr(&loud));
    let quiet = call(&["-s", "--max-attempts", "1", &url]);
    assert_eq!(quiet.status.code(), Some(1));
    assert_eq!(stderr(&quiet), "");
}

#[tokio::test]
async fn include_prints_the_status_line_and_the_headers_before_the_body() {
    let server = answering_with(
        ResponseTemplate::new(201)
            .insert_header("x-order", "42")
            .set_body_string("paid"),
    )
    .await;
    for flag in ["-i", "--include"] {
        let out = call(&[flag, &server.uri()]);
        assert_eq!(out.status.code(), Some(0));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(stdout.starts_with("HTTP/1.1 201 Created\r\n"), "{stdout}");
        let (head, body) = stdout.split_once("\r\n\r\n").unwrap();
        assert!(head.lines().any(|l| l == "x-order: 42"), "{head}");
        assert!(head.lines().any(|l| l == "content-length: 4"), "{head}");
        assert_eq!(body, "paid\n");
    }
    // Without it, the body alone.
    assert_eq!(call(&[&server.uri()]).stdout, b"paid\n");
}

#[tokio::test]
async fn json_sends_a_json_body_with_curl_s_headers_and_implies_post() {
    let server = answering(201).await;
    let url = server.uri();
    let out = call(&["--json", r#"{"amount":1200}"#, &url]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The same through a file, and with a content type of the caller's.
    let file = std::env::temp_dir().join(format!("call-cli-json-{}.json", std::process::id()));
    std::fs::write(&file, r#"{"amount":1200}"#).unwrap();
    let out = call(&[
        "--json",
        &format!("@{}", file.display()),
        "-H",
        "Content-Type: application/merge-patch+json",
        &url,
    ]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let got = received(&server).await;
    assert_eq!(got.len(), 2);
    for (r, content_type) in got
        .iter()
        .zip(["application/json", "application/merge-patch+json"])
    {
        assert_eq!(r.method.as_str(), "POST");
        assert_eq!(r.body, br#"{"amount":1200}"#);
        let types: Vec<_> = r.headers.get_all("content-type").iter().collect();
        assert_eq!(types, [content_type], "-H wins, and only one goes");
        assert_eq!(r.headers["accept"], "application/json");
        assert!(
            r.headers.contains_key("idempotency-key"),
            "a POST gets a key"
        );
    }

    // -d and --json are two bodies: refused before anything is sent.
    let out = call(&["-d", "a=1", "--json", "{}", "--report-json", &url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(report(&out)["error"].as_str().is_some());
    assert_eq!(received(&server).await.len(), 2);
}

#[tokio::test]
async fn data_is_sent_as_a_form_unless_a_content_type_is_given_as_curl_does() {
    let server = answering(200).await;
    let url = server.uri();
    call(&["-d", "a=1", &url]);
    call(&["-d", "a=1", "-H", "content-type: text/plain", &url]);
    let got = received(&server).await;
    let types: Vec<Vec<_>> = got
        .iter()
        .map(|r| r.headers.get_all("content-type").iter().collect())
        .collect();
    assert_eq!(
        types,
        [["application/x-www-form-urlencoded"], ["text/plain"]]
    );
    assert!(
        got.iter().all(|r| r.headers["accept"] == "*/*"),
        "-d asks for no JSON"
    );
    // No body, no content type.
    call(&[&url]);
    assert!(!received(&server).await[2]
        .headers
        .contains_key("content-type"));
}

#[test]
fn every_example_answers_help_and_runs_nothing() {
    for name in ["call", "demo", "herd", "payments_server"] {
        let out = example(name).arg("--help").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(&format!("Usage: {name}")), "{name}: {help}");
        assert!(out.stderr.is_empty(), "{name}: {}", stderr(&out));
    }
    // The demo's help is not the demo: its table never starts.
    let out = example("demo").arg("--help").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("POST /payments:"));
    // Nor is an option it does not know.
    let out = example("demo").arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
}
