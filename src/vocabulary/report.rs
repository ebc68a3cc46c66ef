//! What the caller learns about a logical operation: attempts, delays, the
//! key, and why the loop stopped.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::idempotency::SharedKey;
use super::partition::Partition;

/// Why the retry loop stopped. An enum, not a string, so callers can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The last attempt succeeded.
    Success,
    /// The outcome was permanent: retrying cannot help.
    Permanent,
    /// The outcome was transient but the maximum number of attempts was made.
    AttemptsExhausted,
    /// Another attempt would not fit before the deadline.
    Deadline,
    /// Retry admission had no room for another attempt (the budget was
    /// empty, or the retry waited as long as it may).
    BudgetExhausted,
    /// The server's Retry-After exceeds the configured maximum or the time
    /// left before the deadline.
    RetryAfterTooLong,
    /// A non-idempotent request without an idempotency key failed in a way
    /// that does not prove it never reached the server.
    NotIdempotent,
    /// The request body is a stream that cannot be sent twice.
    BodyNotCloneable,
    /// The request body is a stream that outgrew its replay buffer (see
    /// `RetryPolicyBuilder::body_replay_limit`): it was sent on, once.
    BodyTooLargeToReplay,
    /// The server said not to retry (`Stripe-Should-Retry: false`).
    ServerSaidNo,
    /// The circuit breaker refused the call: its host keeps failing, and
    /// no attempt was made.
    CircuitOpen,
}

impl StopReason {
    /// The snake_case name used in JSON and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Success => "success",
            StopReason::Permanent => "permanent",
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::Deadline => "deadline",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::RetryAfterTooLong => "retry_after_too_long",
            StopReason::NotIdempotent => "not_idempotent",
            StopReason::BodyNotCloneable => "body_not_cloneable",
            StopReason::BodyTooLargeToReplay => "body_too_large_to_replay",
            StopReason::ServerSaidNo => "server_said_no",
            StopReason::CircuitOpen => "circuit_open",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A duration as whole nanoseconds, saturating (584 years): half a
/// `Duration`'s room in the report, which the attempt loop's future
/// carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Nanos(u64);

impl Nanos {
    pub(crate) fn get(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

impl std::ops::AddAssign<Duration> for Nanos {
    fn add_assign(&mut self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0 = self.0.saturating_add(n);
    }
}

/// The record of one logical operation.
///
/// The middleware puts it in the final response's extensions
/// ([`RetryReportExt::retry_report`]) and, when the caller asked for it, in
/// a [`ReportSlot`] — the way to reach it when the call ends in an error.
///
/// It serializes with durations in milliseconds:
/// `{"attempts":2,"delays_ms":[87.5],"admission_wait_ms":0.0,"rate_limit_wait_ms":0.0,"elapsed_ms":90.1,
/// "idempotency_key":"…","stop_reason":"success","retry_after_honoured":0}`,
/// followed by `"hedges":1,"hedge_wins":1` when a hedge was sent, and
/// `"addresses":["10.0.0.2:443",…]` when they are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryReport {
    pub(crate) attempts: u32,
    pub(crate) delays: Vec<Duration>,
    pub(crate) admission_wait: Nanos,
    pub(crate) rate_limit_wait: Nanos,
    pub(crate) elapsed: Duration,
    pub(crate) idempotency_key: Option<SharedKey>,
    pub(crate) stop_reason: StopReason,
    pub(crate) retry_after_honoured: u32,
    pub(crate) partition: Partition,
    /// u16, saturating: they fit beside the other counts, where the
    /// middleware's future has room for them (`tests/future_size.rs`).
    pub(crate) hedges: u16,
    pub(crate) hedge_wins: u16,
    /// The address each attempt went to, where it is known (boxed: a
    /// call with no replica resolver carries one pointer for it, in the
    /// middleware's future).
    pub(crate) addresses: Option<Box<[Option<SocketAddr>]>>,
}

impl RetryReport {
    pub(crate) fn new() -> Self {
        RetryReport {
            attempts: 0,
            delays: Vec::new(),
            admission_wait: Nanos(0),
            rate_limit_wait: Nanos(0),
            elapsed: Duration::ZERO,
            idempotency_key: None,
            stop_reason: StopReason::Success,
            retry_after_honoured: 0,
            partition: Partition::SINGLE,
            hedges: 0,
            hedge_wins: 0,
            addresses: None,
        }
    }

    /// The address each attempt went to, in order (`None` where it is not
    /// known). Known when the client resolves through the policy's
    /// [`crate::replicas::ReplicaResolver`]: from the answer, or, for an attempt
    /// that failed before one, from the address its new connection was
    /// given; for a hedged attempt, from the copy whose answer was used.
    /// Empty otherwise.
    pub fn addresses(&self) -> &[Option<SocketAddr>] {
        self.addresses.as_deref().unwrap_or(&[])
    }

    /// The admission partition (by default the host) every decision of the
    /// operation was made for. Not serialized: a partition is a digest
    /// seeded per process.
    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Time the retries spent waiting for admission (not included in
    /// [`RetryReport::delays`]).
    pub fn admission_wait(&self) -> Duration {
        self.admission_wait.get()
    }

    /// Time the call waited for a server's rate: its host had throttled
    /// (429, or 503 with Retry-After) or said its quota was spent, and the
    /// call's attempts (the first included) waited for the host's release
    /// slots or its reset. Zero when it never waited so. A retry's part of
    /// it is in [`RetryReport::admission_wait`] too.
    pub fn rate_limit_wait(&self) -> Duration {
        self.rate_limit_wait.get()
    }

    /// Whether the call waited for a server's rate
    /// ([`RetryReport::rate_limit_wait`] is not zero).
    pub fn waited_for_rate_limit(&self) -> bool {
        self.rate_limit_wait.0 != 0
    }

    /// Total time of the logical operation, from the first attempt to the
    /// end of the last, measured on the policy's clock.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Attempts made, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The delays slept before each retry, in order.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// The Idempotency-Key every attempt carried, if any.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_ref().map(SharedKey::as_str)
    }

    /// Why the loop stopped.
    pub fn stop_reason(&self) -> StopReason {
        self.stop_reason
    }

    /// How many of the delays were set by a server's Retry-After.
    pub fn retry_after_honoured(&self) -> u32 {
        self.retry_after_honoured
    }

    /// Hedges sent: second copies of an attempt that was slower than its
    /// host's usual latency (see [`crate::hedging::HedgeConfig`]). Not counted in
    /// [`RetryReport::attempts`]: a hedge is part of the attempt it copies.
    pub fn hedges(&self) -> u32 {
        u32::from(self.hedges)
    }

    /// Of the hedges, those whose answer was the one used: it answered
    /// first, or the first copy failed transiently (or could not go on)
    /// while it was in flight (when both copies fail transiently, neither
    /// won). A hedge that ended in an error (its body no longer kept, its
    /// connection refused) never won.
    pub fn hedge_wins(&self) -> u32 {
        u32::from(self.hedge_wins)
    }
}

/// One line for a log or a failing test's message: the attempts, how the
/// call ended and where its time went, e.g. `3 attempts in 4.4s, stopped:
/// success; slept [2.1s, 2.2s], 2 by Retry-After; key 5f0c…`. Only what
/// happened is said: no waits that were zero, no hedges that were not
/// sent.
///
/// ```
/// # use reqwest_safe_retry::RetryReport;
/// fn log(report: &RetryReport) {
///     println!("payment: {report}");
/// }
/// ```
impl fmt::Display for RetryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = if self.attempts == 1 { "" } else { "s" };
        write!(
            f,
            "{} attempt{plural} in {:.1?}, stopped: {}",
            self.attempts, self.elapsed, self.stop_reason
        )?;
        if !self.delays.is_empty() {
            write!(f, "; slept {:.1?}", self.delays)?;
            if self.retry_after_honoured > 0 {
                write!(f, ", {} by Retry-After", self.retry_after_honoured)?;
            }
        }
        for (wait, what) in [
            (self.rate_limit_wait.get(), "for the server's rate"),
            (self.admission_wait.get(), "for retry admission"),
        ] {
            if !wait.is_zero() {
                write!(f, "; waited {wait:.1?} {what}")?;
            }
        }
        if self.hedges > 0 {
            write!(f, "; {} hedged, {} won", self.hedges, self.hedge_wins)?;
        }
        if let Some(key) = self.idempotency_key() {
            write!(f, "; key {key}")?;
        }
        Ok(())
    }
}

impl serde::Serialize for RetryReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // The hedge counts only when a hedge was sent: a report of a call
        // that was not hedged reads as it always did.
        let hedged = self.hedges > 0;
        let addressed = !self.addresses().is_empty();
        let fields = 8 + 2 * usize::from(hedged) + usize::from(addressed);
        let mut s = serializer.serialize_struct("RetryReport", fields)?;
        s.serialize_field("attempts", &self.attempts)?;
        let delays: Vec<f64> = self.delays.iter().copied().map(ms).collect();
        s.serialize_field("delays_ms", &delays)?;
        s.serialize_field("admission_wait_ms", &ms(self.admission_wait.get()))?;
        s.serialize_field("rate_limit_wait_ms", &ms(self.rate_limit_wait.get()))?;
        s.serialize_field("elapsed_ms", &ms(self.elapsed))?;
        s.serialize_field("idempotency_key", &self.idempotency_key())?;
        s.serialize_field("stop_reason", &self.stop_reason)?;
        s.serialize_field("retry_after_honoured", &self.retry_after_honoured)?;
        if hedged {
            s.serialize_field("hedges", &self.hedges)?;
            s.serialize_field("hedge_wins", &self.hedge_wins)?;
        }
        if addressed {
            let addresses: Vec<Option<String>> = self
                .addresses()
                .iter()
                .map(|a| a.map(|a| a.to_string()))
                .collect();
            s.serialize_field("addresses", &addresses)?;
        }
        s.end()
    }
}

/// Reads the [`RetryReport`] a response carries.
///
/// ```no_run
/// use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReportExt};
///
/// # async fn run() -> Result<(), reqwest_middleware::Error> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(RetryPolicy::default()))
///     .build();
/// let response = client.get("http://orders.internal/orders/42").send().await?;
/// if let Some(report) = response.retry_report() {
///     println!("{} attempt(s)", report.attempts());
/// }
/// # Ok(()) }
/// ```
pub trait RetryReportExt {
    /// The report of the logical operation that produced this response.
    fn retry_report(&self) -> Option<&RetryReport>;
}

impl RetryReportExt for reqwest::Response {
    fn retry_report(&self) -> Option<&RetryReport> {
        self.extensions().get::<RetryReport>()
    }
}

/// A place for the report of a call that may end in an error.
///
/// A transport error comes back exactly as reqwest made it
/// (`reqwest_middleware::Error::Reqwest`), so `is_timeout()`,
/// `is_connect()`, `status()` and `url()` keep working; to learn what the
/// retries did, put a slot in the request's extensions and read it after
/// the call, whatever its result. Clones share the slot.
///
/// ```no_run
/// use reqwest_safe_retry::{ReportSlot, RetryMiddleware, RetryPolicy};
///
/// # async fn run() {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(RetryPolicy::default()))
///     .build();
/// let slot = ReportSlot::new();
/// let result = client
///     .get("http://orders.internal/orders/42")
///     .with_extension(slot.clone())
///     .send()
///     .await;
/// if let Err(err) = result {
///     let report = slot.take().expect("filled by the middleware");
///     eprintln!("timeout: {}, after {} attempt(s)", err.is_timeout(), report.attempts());
/// }
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ReportSlot {
    inner: Arc<Mutex<Option<RetryReport>>>,
}

impl ReportSlot {
    /// An empty slot.
    pub fn new() -> Self {
        ReportSlot::default()
    }

    /// A copy of the report, once the call has finished.
    pub fn get(&self) -> Option<RetryReport> {
        self.guard().clone()
    }

    /// The report, leaving the slot empty.
    pub fn take(&self) -> Option<RetryReport> {
        self.guard().take()
    }

    pub(crate) fn fill(&self, report: RetryReport) {
        *self.guard() = Some(report);
    }

    /// The slot, whether or not a thread panicked holding it: a report is
    /// whole after every statement that writes it.
    fn guard(&self) -> std::sync::MutexGuard<'_, Option<RetryReport>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one line says what happened and nothing that did not.
    #[test]
    fn a_report_prints_as_one_line() {
        let mut report = RetryReport::new();
        report.attempts = 1;
        report.stop_reason = StopReason::Permanent;
        report.elapsed = Duration::from_millis(12);
        assert_eq!(
            report.to_string(),
            "1 attempt in 12.0ms, stopped: permanent"
        );
        report.attempts = 3;
        report.stop_reason = StopReason::Success;
        report.delays = vec![Duration::from_millis(2_100), Duration::from_millis(2_200)];
        report.retry_after_honoured = 2;
        report.rate_limit_wait += Duration::from_millis(300);
        report.hedges = 1;
        report.idempotency_key = Some(SharedKey::from(
            crate::IdempotencyKey::new("pay-42").unwrap(),
        ));
        assert_eq!(
            report.to_string(),
            "3 attempts in 12.0ms, stopped: success; slept [2.1s, 2.2s], 2 by \
             Retry-After; waited 300.0ms for the server's rate; 1 hedged, 0 won; key pay-42"
        );
    }
}
