//! The `call` example, driven from outside as a user's shell script would.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest_safe_retry::RetryPolicy;
use wiremock::matchers::{body_string, header_exists, method, path};
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
async fn a_given_key_is_used_and_a_final_503_exits_0_as_curl_s_does() {
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
    assert_eq!(
        out.status.code(),
        Some(0),
        "a response came: -f makes it 22"
    );
    let r = report(&out);
    assert_eq!(r["idempotency_key"], "order-9");
    assert_eq!(r["attempts"], 2);
    assert_eq!(r["stop_reason"], "attempts_exhausted");

    let out = call(&["-X", "POST", "--no-idempotency-key", "--report-json", &url]);
    assert_eq!(out.status.code(), Some(0));
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
    assert_eq!(out.status.code(), Some(7), "curl's: failed to connect");
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
    assert_eq!(out.status.code(), Some(0), "no mock for PUT: 404");
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
        "--request",
        "DELETE",
        "--report-json",
        "--report-json",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0));
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
async fn retry_trace_prints_one_line_per_attempt() {
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
        "--retry-trace",
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
    let out = call(&[
        "--retry-trace",
        "--max-attempts",
        "1",
        &format!("127.0.0.1:{port}"),
    ]);
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
    let ms = |d: Duration| d.as_millis().to_string();
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
        "0  a response came",
        "2  usage error",
        "7  could not connect",
        "22  -f and the final status is 400 or more",
        "28  timed out",
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
    assert_eq!(out.status.code(), Some(0), "curl's: 0 unless -f");
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
    assert_eq!(out.status.code(), Some(0));
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
        assert_eq!(out.status.code(), Some(0), "a response, as with curl -s");
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
    assert_eq!(quiet.status.code(), Some(7), "the exit code still tells");
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

#[cfg(target_os = "linux")]
#[path = "support/tls.rs"]
mod tls;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A URL nothing listens on.
fn refused_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}/")
}

/// A file in the temporary directory, unique to this process and `name`.
fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("call-cli-{}-{name}", std::process::id()))
}

#[tokio::test]
async fn a_redirect_is_the_answer_without_location_and_followed_with_it() {
    let server = MockServer::start().await;
    for (from, to, status) in [("/old", "/mid", 302), ("/mid", "/new", 301)] {
        Mock::given(path(from))
            .respond_with(ResponseTemplate::new(status).insert_header("location", to))
            .mount(&server)
            .await;
    }
    Mock::given(path("/new"))
        .respond_with(ResponseTemplate::new(200).set_body_string("moved here"))
        .mount(&server)
        .await;
    let old = format!("{}/old", server.uri());
    let format = "%{http_code} %{num_redirects} %{url_effective}";
    // curl's default: the 302 is the answer.
    let out = call(&["-w", format, &old]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), format!("302 0 {old}"));
    assert_eq!(stderr(&out), "call: 302 Found\n");
    for flag in ["-L", "--location"] {
        let out = call(&[flag, "-w", format, &old]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(
            stdout(&out),
            format!("moved here\n200 2 {}/new", server.uri())
        );
    }
    // More than --max-redirs: curl's 47, and /new is never asked for.
    let out = call(&["-L", "--max-redirs", "1", "--report-json", &old]);
    assert_eq!(out.status.code(), Some(47), "{out:?}");
    let error = report(&out)["error"].as_str().unwrap().to_owned();
    assert!(error.contains("Maximum (1) redirects followed"), "{error}");
    let news = received(&server)
        .await
        .iter()
        .filter(|r| r.url.path() == "/new")
        .count();
    assert_eq!(news, 2, "the two -L calls only");
}

#[tokio::test]
async fn output_writes_the_body_to_a_file_byte_for_byte() {
    let server = answering_with(ResponseTemplate::new(200).set_body_string("no newline")).await;
    let file = temp_file("output.txt");
    let out = call(&["-o", file.to_str().unwrap(), &server.uri()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "", "the body went to the file");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"no newline",
        "no newline added"
    );
    // With -i, the headers go to the file too, as curl's do.
    let out = call(&["--output", file.to_str().unwrap(), "-i", &server.uri()]);
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nno newline"), "{text}");
    // `-` is stdout.
    assert_eq!(stdout(&call(&["-o", "-", &server.uri()])), "no newline\n");
    // A file that cannot be written: curl's 23.
    let out = call(&["-o", "/nonexistent/dir/out", &server.uri()]);
    assert_eq!(out.status.code(), Some(23), "{out:?}");
    assert!(stderr(&out).starts_with("call: (23) writing /nonexistent/dir/out"));
}

#[tokio::test]
async fn fail_exits_22_without_the_body_and_silent_and_show_error_as_curl_s() {
    let server = answering_with(ResponseTemplate::new(503).set_body_string("busy")).await;
    let url = server.uri();
    let line = "call: (22) The requested URL returned error: 503\n";
    for flag in ["-f", "--fail"] {
        let out = call(&[flag, "--max-attempts", "1", "-w", "%{http_code}", &url]);
        assert_eq!(out.status.code(), Some(22), "{out:?}");
        assert_eq!(stdout(&out), "503", "no body, -w still");
        assert_eq!(stderr(&out), line);
    }
    // curl's everyday `-fsS`: silent, but errors still shown.
    let out = call(&["-fs", "--max-attempts", "1", &url]);
    assert_eq!((out.status.code(), stderr(&out)), (Some(22), String::new()));
    for flags in [&["-fsS"][..], &["-f", "-s", "--show-error"]] {
        let out = call(&[flags, &["--max-attempts", "1", &url]].concat());
        assert_eq!((out.status.code(), stderr(&out)), (Some(22), line.into()));
    }
    let out = call(&["-sS", "--max-attempts", "1", &refused_url()]);
    assert_eq!(out.status.code(), Some(7));
    assert!(stderr(&out).starts_with("call: (7) "), "{}", stderr(&out));
    // A status below 400 is not a failure.
    let ok = answering_with(ResponseTemplate::new(200).set_body_string("fine")).await;
    let out = call(&["-f", &ok.uri()]);
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), "fine\n".into())
    );
}

#[tokio::test]
async fn head_sends_head_and_prints_the_status_line_and_headers() {
    let server = answering_with(ResponseTemplate::new(200).insert_header("x-order", "42")).await;
    for flag in ["-I", "--head"] {
        let out = call(&[flag, &server.uri()]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let text = stdout(&out);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("\r\nx-order: 42\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "{text}");
    }
    let got = received(&server).await;
    assert!(got.iter().all(|r| r.method.as_str() == "HEAD"));
    // A body with -I is two methods: refused, as curl refuses it.
    let out = call(&["-I", "-d", "x", &server.uri()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(received(&server).await.len(), 2);
}

#[cfg(all(target_os = "linux", feature = "default-tls"))]
// The TLS server runs on this runtime while `call` blocks a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_and_cacert_decide_which_certificate_is_trusted() {
    let certs = tls::certificates();
    let (addr, requests) = tls::tls_server(&certs, 0).await;
    let url = format!("https://{addr}/");
    // The test's authority is no system's: curl's 60, nothing read.
    let out = call(&["--max-attempts", "1", &url]);
    assert_eq!(out.status.code(), Some(60), "{out:?}");
    assert!(stderr(&out).starts_with("call: (60) "), "{}", stderr(&out));
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    for flag in ["-k", "--insecure"] {
        let out = call(&[flag, &url]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(stdout(&out), "ok over tls\n");
    }
    let ca = temp_file("ca.pem");
    std::fs::write(&ca, &certs.ca).unwrap();
    let out = call(&["--cacert", ca.to_str().unwrap(), &url]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Only the file's authorities: another one's server is refused.
    std::fs::write(&ca, tls::certificates().ca).unwrap();
    let out = call(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--max-attempts",
        "1",
        &url,
    ]);
    std::fs::remove_file(&ca).unwrap();
    assert_eq!(out.status.code(), Some(60), "{out:?}");
    let out = call(&["--cacert", "/nonexistent/ca.pem", &url]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// A self-signed certificate as `openssl req -x509 -subj /CN=127.0.0.1`
/// makes one (`CA:TRUE`, no subjectAltName), served as the server's own:
/// curl accepts it when --cacert holds it (OpenSSL trusts the certificate
/// itself), and still refuses it expired, for another name, or when the
/// file holds another certificate.
#[cfg(all(target_os = "linux", feature = "default-tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cacert_trusts_a_self_signed_server_certificate_as_curl_does() {
    use tls::{key, leaf_or_ca, Certificates, Leaf};
    let openssl_req = Leaf {
        like_openssl_req: true,
        ..Leaf::default()
    };
    let expired = Leaf {
        expired: true,
        ..openssl_req
    };
    let server_key = key();
    let served = |name: &str, leaf: Leaf| leaf_or_ca(name, &server_key, None, leaf);
    let good = served("127.0.0.1", openssl_req);
    let (old, elsewhere) = (
        served("127.0.0.1", expired),
        served("example.com", openssl_req),
    );
    // What is served, what --cacert holds, and why curl refuses it.
    let cases = [
        ("self-signed, trusted", &good, &good, None),
        (
            "another one trusted",
            &good,
            &served("127.0.0.1", openssl_req),
            Some("self-signed certificate"),
        ),
        ("expired", &old, &old, Some("certificate has expired")),
        (
            "another name",
            &elsewhere,
            &elsewhere,
            Some("not valid for 127.0.0.1"),
        ),
    ];
    for (case, server, trusted, refused) in cases {
        let certs = Certificates {
            ca: trusted.to_pem().unwrap(),
            server: server.to_pem().unwrap(),
            server_key: server_key.private_key_to_pem_pkcs8().unwrap(),
        };
        let (addr, requests) = tls::tls_server(&certs, 0).await;
        let ca = temp_file("self-signed.pem");
        std::fs::write(&ca, &certs.ca).unwrap();
        let url = format!("https://{addr}/");
        let out = call(&[
            "--cacert",
            ca.to_str().unwrap(),
            "--max-attempts",
            "1",
            &url,
        ]);
        std::fs::remove_file(&ca).unwrap();
        let read = requests.load(std::sync::atomic::Ordering::SeqCst);
        match refused {
            None => {
                assert_eq!(out.status.code(), Some(0), "{case}: {}", stderr(&out));
                assert_eq!(stdout(&out), "ok over tls\n", "{case}");
            }
            Some(why) => {
                assert_eq!(out.status.code(), Some(60), "{case}: {}", stderr(&out));
                assert!(stderr(&out).starts_with("call: (60) "), "{case}");
                assert!(stderr(&out).contains(why), "{case}: {}", stderr(&out));
                assert_eq!(read, 0, "{case}: nothing is sent to an untrusted server");
            }
        }
    }
}

#[tokio::test]
async fn max_time_is_the_call_s_deadline_and_exits_28() {
    // The server never answers in time; the call gives up at its deadline
    // (a 30 s one without -m would outlast the test's patience).
    let server =
        answering_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(60))).await;
    for flag in ["-m", "--max-time"] {
        let out = call(&[flag, "0.2", "--report-json", &server.uri()]);
        assert_eq!(out.status.code(), Some(28), "{out:?}");
        assert!(stderr(&out).starts_with("call: (28) "), "{}", stderr(&out));
        assert_eq!(report(&out)["stop_reason"], "deadline", "{}", stderr(&out));
    }
}

#[test]
fn a_host_that_does_not_resolve_exits_6() {
    // `.invalid` never resolves (RFC 6761).
    let out = call(&["--max-attempts", "1", "http://nonexistent.invalid/"]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(stderr(&out).starts_with("call: (6) "), "{}", stderr(&out));
}

#[tokio::test]
async fn user_sends_basic_auth_and_user_agent_its_name_unless_h_gives_them() {
    let server = answering(200).await;
    let url = server.uri();
    for args in [
        &["-u", "alice:s3cret", "-A", "probe/1.0"][..],
        &["--user", "bob", "--user-agent", "probe/2.0"],
        &["-u", "alice:x", "-H", "Authorization: Bearer t"],
        &["-A", "a", "-H", "User-Agent: b"],
    ] {
        let out = call(&[args, &[&url]].concat());
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let got = received(&server).await;
    let all = |name: &str| -> Vec<Vec<String>> {
        got.iter()
            .map(|r| {
                r.headers
                    .get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    };
    let auth = ["Basic YWxpY2U6czNjcmV0", "Basic Ym9iOg==", "Bearer t"];
    assert_eq!(all("authorization")[..3], auth.map(|a| vec![a.to_owned()]));
    assert!(all("authorization")[3].is_empty());
    let agents = all("user-agent");
    assert_eq!(agents[..2], [["probe/1.0"], ["probe/2.0"]]);
    // Without -A, one as curl's `curl/8.5.0`: the command and its version.
    let ours = format!("call/{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(agents[2], [ours.as_str()], "a default User-Agent");
    assert_eq!(agents[3], ["b"], "-H wins, and only one goes");
}

#[tokio::test]
async fn write_out_fills_in_curl_s_variables() {
    let server = answering_with(ResponseTemplate::new(200).set_body_string("12345")).await;
    let url = server.uri();
    let format = r"%{http_code} %{response_code} %{size_download} 100%%\n";
    let out = call(&["-w", format, &url]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "12345\n200 200 5 100%\n");
    let out = call(&["--write-out", "%{time_total}", &url]);
    let time = stdout(&out).strip_prefix("12345\n").unwrap().to_owned();
    assert!(time.parse::<f64>().is_ok_and(|t| t > 0.0), "{time}");
    assert_eq!(time.split_once('.').unwrap().1.len(), 6, "curl's {time}");
    // No response: 000.
    let out = call(&["-w", "%{http_code}", "--max-attempts", "1", &refused_url()]);
    assert_eq!(stdout(&out), "000");
    // An unknown variable is a usage error, before anything is sent.
    let out = call(&["-w", "%{bogus}", "--report-json", &url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(report(&out)["error"].as_str().unwrap().contains("%{bogus}"));
    assert_eq!(received(&server).await.len(), 2);
}

#[tokio::test]
async fn data_raw_sends_the_text_as_it_is_even_with_an_at() {
    let server = answering(200).await;
    let url = server.uri();
    let out = call(&["--data-raw", "@not-a-file", &url]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let got = received(&server).await;
    assert_eq!(got[0].method.as_str(), "POST");
    assert_eq!(got[0].body, b"@not-a-file");
    assert_eq!(
        got[0].headers["content-type"],
        "application/x-www-form-urlencoded"
    );
    for other in [["-d", "b"], ["--json", "{}"]] {
        let out = call(&[&["--data-raw", "a"], &other[..], &[&url]].concat());
        assert_eq!(out.status.code(), Some(2), "two bodies: {other:?}");
    }
}

#[tokio::test]
async fn compressed_asks_for_a_body_it_can_read_and_refuses_an_encoded_one() {
    let server = answering_with(ResponseTemplate::new(200).set_body_string("plain")).await;
    let out = call(&["--compressed", &server.uri()]);
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), "plain\n".into())
    );
    call(&[&server.uri()]);
    let got = received(&server).await;
    assert_eq!(got[0].headers["accept-encoding"], "identity");
    assert!(!got[1].headers.contains_key("accept-encoding"));
    // Encoded anyway: curl's 61, not the encoded bytes.
    let gzip = answering_with(
        ResponseTemplate::new(200)
            .insert_header("content-encoding", "gzip")
            .set_body_bytes(vec![0x1f, 0x8b, 0x08, 0]),
    )
    .await;
    let out = call(&["--compressed", &gzip.uri()]);
    assert_eq!(out.status.code(), Some(61), "{out:?}");
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).starts_with("call: (61) "), "{}", stderr(&out));
}

#[tokio::test]
async fn verbose_prints_each_attempt_s_headers_as_curl_s_does() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).insert_header("x-order", "42"))
        .mount(&server)
        .await;
    let url = server.uri();
    let host = url.strip_prefix("http://").unwrap();
    let out = call(&[
        "-v",
        "-H",
        "x-trace: 1",
        "--idempotency-key",
        "order-7",
        "--base-ms",
        "1",
        "--jitter",
        "none",
        "-d",
        "{}",
        &format!("{url}/pay?x=1"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    let at = |line: &str| -> Vec<usize> {
        let found: Vec<usize> = (0..lines.len()).filter(|&i| lines[i] == line).collect();
        assert!(!found.is_empty(), "no {line:?} in\n{err}");
        found
    };
    assert_eq!(at("> POST /pay?x=1 HTTP/1.1").len(), 2, "one per attempt");
    at(&format!("> Host: {host}"));
    at("> x-trace: 1");
    at("> idempotency-key: order-7");
    let first = at("< HTTP/1.1 503 Service Unavailable")[0];
    let trace = at("* attempt 1: 503, retry in 1 ms, key order-7")[0];
    let second = at("> POST /pay?x=1 HTTP/1.1")[1];
    assert!(first < trace && trace < second, "{err}");
    let created = at("< HTTP/1.1 201 Created")[0];
    assert_eq!(
        lines[created + 1..].first(),
        Some(&"< x-order: 42"),
        "{err}"
    );
    at("* attempt 2: 201, stop: success, key order-7");
    assert_eq!(stdout(&out), "", "headers on stderr only");
}

#[test]
fn an_unknown_option_gets_clap_s_plain_error() {
    for option in ["--frobnicate", "-Z"] {
        let out = call(&[option, "http://127.0.0.1:1/"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = stderr(&out);
        assert!(
            err.starts_with(&format!("error: unexpected argument '{option}' found")),
            "{err}"
        );
        assert!(!err.contains("tip: to pass"), "{err}");
        assert!(err.contains("Usage: call [OPTIONS] <URL>"), "{err}");
    }
}

#[test]
fn the_readme_names_every_option_help_lists() {
    let readme = include_str!("../../docs/call.md");
    let start = readme.find("## The `call` command").unwrap();
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").unwrap()];
    let help = stdout(&call(&["--help"]));
    // The lines that declare an option, and its aliases.
    let options: std::collections::BTreeSet<&str> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-') || l.starts_with("[alias"))
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')))
        .filter(|w| w.starts_with("--") && w.len() > 2 && *w != "--help")
        .collect();
    assert!(options.len() > 30, "{options:?}");
    for option in options {
        assert!(
            section.contains(&format!("`{option}")),
            "{option} is not in the README"
        );
    }
}
