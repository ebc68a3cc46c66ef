use std::collections::HashMap;
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use metrics_exporter_opentelemetry::Recorder;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{Aggregation, Instrument, SdkMeterProvider, Stream};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter};
use reqwest_safe_retry::observability::metric_names;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs both halves, before the policy is built (building it registers
/// every series). Keep the providers and `shutdown()` them before the
/// process exits, so that the last batch is exported.
pub fn install(
    spans: impl SpanExporter + 'static,
    metrics: impl PushMetricExporter,
) -> Result<(SdkTracerProvider, SdkMeterProvider), Box<dyn std::error::Error>> {
    let tracer_provider = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .build();
    let tracer = tracer_provider.tracer("my-service");
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init()?;
    let (meter_provider, recorder) = Recorder::builder("my-service")
        .with_meter_provider(|b| b.with_periodic_exporter(metrics).with_view(buckets))
        .build();
    metrics::set_global_recorder(Described(recorder, Mutex::default()))?;
    Ok((tracer_provider, meter_provider))
}

/// The crate's buckets for its two histograms (the SDK's default buckets
/// are for milliseconds).
fn buckets(instrument: &Instrument) -> Option<Stream> {
    let boundaries = match instrument.name() {
        metric_names::REQUEST_DURATION => metric_names::DURATION_BUCKETS,
        metric_names::ATTEMPTS => metric_names::ATTEMPTS_BUCKETS,
        _ => return None,
    };
    let histogram = Aggregation::ExplicitBucketHistogram {
        boundaries: boundaries.to_vec(),
        record_min_max: true,
    };
    Stream::builder().with_aggregation(histogram).build().ok()
}

/// metrics-exporter-opentelemetry 0.2 gives a name's unit and description
/// to the first series registered under it only, and OpenTelemetry makes
/// each later series (another host, another status) an instrument of its
/// own under the same name: describe the name again before each one.
#[derive(Debug)]
struct Described(
    Recorder,
    Mutex<HashMap<KeyName, (Option<Unit>, SharedString)>>,
);

impl Described {
    fn keep(&self, name: &KeyName, unit: Option<Unit>, help: &SharedString) {
        if let Ok(mut described) = self.1.lock() {
            described.insert(name.clone(), (unit, help.clone()));
        }
    }

    fn again(&self, key: &Key) -> Option<(KeyName, Option<Unit>, SharedString)> {
        let described = self.1.lock().ok()?;
        let (name, (unit, help)) = described.get_key_value(key.name())?;
        Some((name.clone(), *unit, help.clone()))
    }
}

impl metrics::Recorder for Described {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.keep(&name, unit, &help);
        self.0.describe_counter(name, unit, help);
    }

    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.keep(&name, unit, &help);
        self.0.describe_gauge(name, unit, help);
    }

    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.keep(&name, unit, &help);
        self.0.describe_histogram(name, unit, help);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if let Some((name, unit, help)) = self.again(key) {
            self.0.describe_counter(name, unit, help);
        }
        self.0.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if let Some((name, unit, help)) = self.again(key) {
            self.0.describe_gauge(name, unit, help);
        }
        self.0.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if let Some((name, unit, help)) = self.again(key) {
            self.0.describe_histogram(name, unit, help);
        }
        self.0.register_histogram(key, metadata)
    }
}
