//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! same checks the cargo-fuzz targets run, on stable, so every input the
//! fuzzer found interesting stays a regression test in CI. Fuzzing itself
//! needs nightly: see BENCHMARKS.md, "Has the parsing been fuzzed?".

#[path = "../../fuzz/checks.rs"]
mod checks;

use std::path::Path;

/// Runs `check` on every file of the target's corpus; returns how many.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        check(&data);
        inputs += 1;
    }
    assert!(inputs > 0, "the corpus of {target} is empty");
    inputs
}

#[test]
fn retry_after_corpus() {
    replay("retry_after", checks::retry_after);
}

#[test]
fn retry_after_with_date_corpus() {
    replay("retry_after_with_date", checks::retry_after_with_date);
}

#[test]
fn client_key_corpus() {
    replay("client_key", checks::client_key);
}

#[test]
fn server_layer_corpus() {
    replay("server_layer", checks::server_layer);
}
