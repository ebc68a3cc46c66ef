//! The examples a user runs leave the checkout clean: `herd` writes its
//! plots under `target/` unless told `--out-dir bench-results`.

mod support;

#[test]
fn herd_writes_its_plots_under_target_by_default() {
    let dir = std::env::temp_dir().join(format!("herd-clean-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(support::payments::example("herd"))
        .args(["brooker", "--clients", "2", "--trials", "1"])
        .current_dir(&dir)
        .output()
        .expect("the herd example is built by `cargo test`");
    assert!(out.status.success(), "{out:?}");
    assert!(dir.join("target/herd/brooker-calls.svg").exists());
    assert!(
        !dir.join("bench-results").exists(),
        "herd wrote into bench-results"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
