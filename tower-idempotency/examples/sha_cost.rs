//! What the fingerprint's SHA-256 costs: natively, and under valgrind.
//!
//! ```text
//! cargo run --release -p tower-idempotency --example sha_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/sha_cost --digests 1      # and --digests 100001:
//! # per digest = (count at 100 001 - count at 1) / 100 000
//! ```
//!
//! Digests the 64 bytes the layer fingerprints for `layer_cost`'s request
//! (method, path and body, each length-prefixed: two SHA-256 blocks with
//! the padding) `--digests` times. sha2 picks the SHA-NI instructions when
//! the CPU has them (checked once, at run time); valgrind's CPU does not
//! offer them, so under valgrind the same binary runs sha2's software
//! rounds, which is what callgrind counts in the layer's instructions.

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use sha2::{Digest, Sha256};

#[derive(Parser, Debug)]
struct Args {
    /// Digests to compute.
    #[arg(long, default_value_t = 1_000_000)]
    digests: u64,
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

fn fingerprint(body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    field(&mut hasher, b"POST");
    field(&mut hasher, b"/pay");
    field(&mut hasher, body);
    hasher.finalize().into()
}

fn main() {
    let args = Args::parse();
    let body = br#"{"amount":1234,"currency":"eur"}"#;
    #[cfg(target_arch = "x86_64")]
    let sha_ni = std::arch::is_x86_feature_detected!("sha");
    #[cfg(not(target_arch = "x86_64"))]
    let sha_ni = false;
    let start = Instant::now();
    let mut last = [0u8; 32];
    for _ in 0..args.digests {
        last = fingerprint(black_box(body));
    }
    let took = start.elapsed();
    println!(
        "{} digests of 64 bytes (2 blocks), SHA-NI {}: {:.1} ns per digest (first byte {:02x})",
        args.digests,
        if sha_ni { "used" } else { "not available" },
        took.as_nanos() as f64 / args.digests.max(1) as f64,
        last[0]
    );
}
