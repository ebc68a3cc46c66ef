//! The retry metrics in Prometheus: the `metrics` feature publishes them
//! through the `metrics` facade, and metrics-exporter-prometheus renders
//! what a Prometheus server scrapes (and `dashboards/reqwest-safe-retry.json`
//! plots).
//!
//! ```text
//! cargo run --example metrics_prometheus --features metrics
//! cargo run --example metrics_prometheus --features metrics -- --serve 127.0.0.1:9000
//! ```
//!
//! It sends a few calls through `RetryMiddleware` to a local server that
//! answers 503 (with `Retry-After: 1`) twice and then 201, scrapes its own
//! `/metrics` endpoint once and prints the scrape. With `--serve ADDR` it
//! keeps serving `/metrics` on ADDR for a Prometheus server to scrape.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use reqwest_safe_retry::observability::metric_names;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

#[derive(Parser, Debug)]
#[command(
    name = "metrics_prometheus",
    about = "Retry counters exported to Prometheus through the metrics facade"
)]
struct Args {
    /// Keep serving /metrics on this address after the calls.
    #[arg(long, value_name = "ADDR")]
    serve: Option<SocketAddr>,
    /// How many calls to send.
    #[arg(long, default_value_t = 3)]
    calls: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();

    // The application's side: install an exporter before building the
    // policy (building it registers every series at zero). Prometheus's
    // naming (`_total` on counters, `_seconds` from the unit), and the two
    // histograms as real histograms with buckets (what `histogram_quantile`
    // and the dashboard in `dashboards/` need), not the exporter's default
    // summaries.
    let handle = PrometheusBuilder::new()
        .with_recommended_naming(true)
        .set_buckets_for_metric(
            Matcher::Full(metric_names::REQUEST_DURATION.to_owned()),
            metric_names::DURATION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(metric_names::ATTEMPTS.to_owned()),
            metric_names::ATTEMPTS_BUCKETS,
        )?
        .install_recorder()?;

    // A flaky payments endpoint: two 503s asking for 1 s, then 201s.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(50), Duration::from_secs(2))
        .build()?;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build();
    for _ in 0..args.calls {
        let response = client
            .post(format!("{}/payments", server.uri()))
            .body(r#"{"amount":1200}"#)
            .send()
            .await?;
        eprintln!("POST /payments: {}", response.status());
    }

    // The scrape endpoint, and one scrape of it, as Prometheus would.
    let render = handle.clone();
    let app = Router::new().route("/metrics", get(move || async move { render.render() }));
    let listener =
        tokio::net::TcpListener::bind(args.serve.unwrap_or(([127, 0, 0, 1], 0).into())).await?;
    let addr = listener.local_addr()?;
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });
    let scrape = reqwest::get(format!("http://{addr}/metrics"))
        .await?
        .text()
        .await?;
    print!("{scrape}");
    if args.serve.is_some() {
        eprintln!("serving http://{addr}/metrics");
        serving.await??;
    }
    Ok(())
}
