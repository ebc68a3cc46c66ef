//! An admission that admits every retry with a token and keeps what it
//! was asked and told: the engine's questions and records, as a test
//! reads them.
#![allow(dead_code, unreachable_pub)]

use std::sync::Mutex;
use std::time::Instant;

use reqwest_safe_retry::admission::{
    Admission, AttemptRecord, Grant, GrantSource, Partition, RetryAdmission, RetryKind,
    RetryRequest,
};

/// What an admission that admits everything was asked and told.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The kind of each retry (or hedge) asked for.
    pub asked: Mutex<Vec<RetryKind>>,
    /// Each attempt recorded, in order.
    pub records: Mutex<Vec<AttemptRecord>>,
}

impl RetryAdmission for Ledger {
    fn first_attempt(&self, _: Partition, _: Instant) {}

    fn admit(&self, _: Partition, retry: RetryRequest, _: Instant) -> Admission {
        self.asked.lock().unwrap().push(retry.kind());
        Admission::Admit(Grant::new(GrantSource::Token, 1.0))
    }

    fn record(&self, _: Partition, attempt: AttemptRecord, _: Instant) {
        self.records.lock().unwrap().push(attempt);
    }
}
