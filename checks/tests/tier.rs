//! `examples/tier` as a user runs it: chains of tiers in front of a
//! wiremock upstream. `cargo test` builds the examples; with `--test tier`
//! alone, run `cargo build --example tier` first.

mod support;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryReport, StopReason};
use wiremock::matchers::{body_string, header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A running tier, killed when dropped.
struct Tier {
    child: Child,
    url: String,
}

impl Drop for Tier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tier_command() -> Command {
    let bin = support::payments::example("tier");
    assert!(
        bin.exists(),
        "build the example first: cargo build --example tier"
    );
    Command::new(bin)
}

impl Tier {
    fn in_front_of(upstream: &str) -> Tier {
        let mut child = tier_command()
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("not a start line: {line:?}"))
            .to_owned();
        Tier {
            child,
            url: format!("http://{addr}"),
        }
    }
}

/// `depth` tiers in a chain in front of `upstream`; the outermost first.
fn chain(upstream: &str, depth: usize) -> Vec<Tier> {
    let mut tiers: Vec<Tier> = Vec::new();
    for _ in 0..depth {
        let next = tiers.last().map_or(upstream.to_owned(), |t| t.url.clone());
        tiers.push(Tier::in_front_of(&next));
    }
    tiers.reverse();
    tiers
}

fn time_left(request: &wiremock::Request) -> u64 {
    request.headers["request-timeout-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn help_says_how_to_run_it() {
    let out = tier_command().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("--listen") && help.contains("--upstream"),
        "{help}"
    );
}

#[tokio::test]
async fn the_time_left_shrinks_hop_by_hop() {
    let upstream = support::answering(200).await;
    let plain = reqwest::Client::new();
    // Each hop reads the time left when the request arrives and sends what
    // is left when its own call starts: whole milliseconds, rounded down,
    // so at least 1 ms less per hop. A tier that did not propagate would
    // send its own 30 s.
    for depth in 1..=3 {
        let tiers = chain(&upstream.uri(), depth);
        let response = plain
            .get(&tiers[0].url)
            .header("request-timeout-ms", "5000")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let received = upstream.received_requests().await.unwrap();
        let left = time_left(received.last().unwrap());
        let most = 5000 - depth as u64;
        assert!((4000..=most).contains(&left), "depth {depth}: {left} ms");
    }
}

#[tokio::test]
async fn method_path_query_body_and_headers_are_passed_on() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/payments"))
        .and(query_param("account", "bob"))
        .and(header("idempotency-key", "order-42"))
        .and(header("content-type", "application/json"))
        .and(body_string(r#"{"amount":25}"#))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("location", "/payments/1")
                .set_body_string("created"),
        )
        .mount(&upstream)
        .await;
    let tiers = chain(&upstream.uri(), 2);
    let response = reqwest::Client::new()
        .post(format!("{}/payments?account=bob", tiers[0].url))
        .header("idempotency-key", "order-42")
        .header("content-type", "application/json")
        .body(r#"{"amount":25}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["location"], "/payments/1");
    assert_eq!(response.text().await.unwrap(), "created");
}

#[tokio::test]
async fn a_request_whose_time_is_spent_goes_no_further() {
    let upstream = support::answering(200).await;
    let tiers = chain(&upstream.uri(), 2);
    let response = reqwest::Client::new()
        .get(&tiers[0].url)
        .header("request-timeout-ms", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    assert_eq!(response.headers()["stripe-should-retry"], "false");
    assert!(upstream.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn only_the_innermost_tier_retries() {
    let upstream = support::answering(503).await;
    let tiers = chain(&upstream.uri(), 2);
    let clock = ManualClock::new();
    let (caller, _) = support::client(support::policy(&clock).build().unwrap());
    let response = caller.get(&tiers[0].url).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["stripe-should-retry"], "false");
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
    // The inner tier's three attempts; not 3 × 3 × 3.
    assert_eq!(upstream.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn an_upstreams_retry_verdict_stops_at_the_innermost_tier() {
    // The upstream says "retry": the innermost tier does, and gives up;
    // the tiers above must not take its "retry" on as their own (the
    // caller's client would then retry too: up to 3^4 at the bottom).
    let upstream = support::answering_with(
        ResponseTemplate::new(503).insert_header("stripe-should-retry", "true"),
    )
    .await;
    let tiers = chain(&upstream.uri(), 3);
    let clock = ManualClock::new();
    let (caller, _) = support::client(support::policy(&clock).no_budget().build().unwrap());
    let response = caller.get(&tiers[0].url).send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["stripe-should-retry"], "false");
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::ServerSaidNo);
    assert_eq!(upstream.received_requests().await.unwrap().len(), 3);
}
