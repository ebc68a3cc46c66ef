//! The public types are what a library's users need: Send, Sync, Debug,
//! object-safe extension points; and the crate's root is a front door: the
//! names of the quick start and of the table of equivalents, the rest in
//! modules named for what they hold, the test clock and seeds only with
//! the `test-util` feature.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest_safe_retry::admission::*;
use reqwest_safe_retry::classify::*;
use reqwest_safe_retry::deadline::*;
use reqwest_safe_retry::keys::*;
use reqwest_safe_retry::observability::*;
use reqwest_safe_retry::retry::Backoff;
use reqwest_safe_retry::time::*;
use reqwest_safe_retry::*;

fn send_sync<T: Send + Sync + 'static>() {}
fn debug<T: std::fmt::Debug>() {}

#[test]
fn public_types_are_send_sync_and_debug() {
    send_sync::<RetryMiddleware>();
    send_sync::<RetryPolicy>();
    send_sync::<RetryReport>();
    send_sync::<RetryError>();
    send_sync::<ConfigError>();
    send_sync::<KeyError>();
    send_sync::<TokenBucket>();
    send_sync::<AdaptiveAdmission>();
    send_sync::<NoAdmission>();
    send_sync::<ReportSlot>();
    send_sync::<RequestOptions>();
    send_sync::<ManualClock>();
    send_sync::<Partition>();
    send_sync::<CircuitBreakerConfig>();
    debug::<RetryMiddleware>();
    debug::<RetryPolicyBuilder>();
    debug::<RequestOptions>();
    debug::<MetricsSnapshot>();
    debug::<Backoff>();
    debug::<AdaptiveConfig>();
    debug::<TokenBucketConfig>();
    debug::<RetryRequest>();
    debug::<Admission>();
    debug::<ReportSlot>();
    debug::<RetryPolicy>();
    debug::<Partition>();
    debug::<CircuitBreakerConfig>();
}

#[test]
fn extension_points_are_object_safe() {
    let _: Option<Box<dyn Classifier>> = None;
    let _: Option<Box<dyn Sleeper>> = None;
    let _: Option<Box<dyn Clock>> = None;
    let _: Option<Box<dyn RetryAdmission>> = None;
}

#[test]
fn errors_are_std_errors_with_lowercase_messages() {
    fn std_error<E: std::error::Error + Send + Sync + 'static>() {}
    std_error::<RetryError>();
    std_error::<ConfigError>();
    std_error::<KeyError>();
    let e = IdempotencyKey::new("").unwrap_err().to_string();
    assert_eq!(e, "invalid idempotency key: the key is empty");
}

#[test]
fn stop_reasons_have_the_snake_case_names_of_the_contract() {
    let names = [
        (StopReason::Success, "success"),
        (StopReason::Permanent, "permanent"),
        (StopReason::AttemptsExhausted, "attempts_exhausted"),
        (StopReason::Deadline, "deadline"),
        (StopReason::BudgetExhausted, "budget_exhausted"),
        (StopReason::RetryAfterTooLong, "retry_after_too_long"),
        (StopReason::NotIdempotent, "not_idempotent"),
        (StopReason::BodyNotCloneable, "body_not_cloneable"),
        (StopReason::BodyTooLargeToReplay, "body_too_large_to_replay"),
        (StopReason::ServerSaidNo, "server_said_no"),
        (StopReason::CircuitOpen, "circuit_open"),
    ];
    for (reason, name) in names {
        assert_eq!(reason.as_str(), name);
        assert_eq!(
            serde_json::to_string(&reason).unwrap(),
            format!("\"{name}\"")
        );
    }
}

#[test]
fn deadline_propagation_types_are_send_sync_and_debug() {
    type Handler = tower::util::BoxCloneSyncService<
        http::Request<String>,
        http::Response<String>,
        std::convert::Infallible,
    >;
    send_sync::<InheritedDeadline>();
    send_sync::<InheritDeadlineLayer>();
    send_sync::<InheritDeadline<Handler>>();
    send_sync::<GiveUp>();
    debug::<InheritedDeadline>();
    debug::<InheritDeadlineLayer>();
    debug::<InheritDeadline<Handler>>();
    debug::<GiveUp>();
    // The response future is Send when the inner one is: axum needs it.
    fn send<T: Send>() {}
    send::<InheritDeadlineFuture<<Handler as tower::Service<http::Request<String>>>::Future, String>>(
    );
    debug::<InheritDeadlineFuture<std::future::Ready<()>, String>>();
}

/// The names at the crate's root: what the quick start (README.md,
/// docs/using.md) and the table of equivalents (docs/migrating.md) use,
/// and the modules that hold the rest.
const ROOT: [&str; 28] = [
    // The re-exported crates the client is built from.
    "reqwest",
    "reqwest_middleware",
    // The quick start and the table of equivalents.
    "ConfigError",
    "Class",
    "HttpAttempt",
    "IdempotencyKey",
    "Jitter",
    "ReportSlot",
    "RequestOptions",
    "RetryError",
    "RetryMiddleware",
    "RetryPolicy",
    "RetryPolicyBuilder",
    "RetryReport",
    "RetryReportExt",
    "StopReason",
    // The modules, one per concern.
    "admission",
    "classify",
    "deadline",
    "hedging",
    "keys",
    "observability",
    "pacing",
    "replay",
    "replicas",
    "retry",
    "time",
    // Documentation only (`cfg(doc)`): the guide.
    "_guide",
];

/// The public names `src/lib.rs` declares, by module (`""` is the root):
/// its `pub use`, `pub mod`, `pub fn`, … items, read from the text with
/// comments left out, `as` aliases counted under the alias.
fn public_names() -> BTreeMap<String, Vec<String>> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let code: String = lib
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // The module each `{` opened: `Some(name)` for a `pub mod`.
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut rest = code.as_str();
    let mut pending_mod: Option<String> = None;
    while let Some(c) = rest.chars().next() {
        let module = stack
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join("::");
        let in_item = stack.iter().any(Option::is_none);
        if c == '{' {
            stack.push(pending_mod.take());
            rest = &rest[1..];
        } else if c == '}' {
            stack.pop();
            rest = &rest[1..];
        } else if !in_item && rest.starts_with("pub use ") {
            let end = rest.find(';').unwrap();
            let tree = &rest["pub use ".len()..end];
            for path in expand(tree) {
                let name = match path.split_once(" as ") {
                    Some((_, alias)) => alias.trim().to_owned(),
                    None => path.rsplit("::").next().unwrap().trim().to_owned(),
                };
                names.entry(module.clone()).or_default().push(name);
            }
            rest = &rest[end + 1..];
        } else if !in_item && rest.starts_with("pub ") {
            let mut words =
                rest["pub ".len()..].split(|c: char| !(c.is_alphanumeric() || c == '_'));
            let kind = words.next().unwrap();
            let name = words.find(|w| !w.is_empty()).unwrap().to_owned();
            names.entry(module.clone()).or_default().push(name.clone());
            let skip = rest.find(['{', ';']).unwrap();
            if kind == "mod" && rest.as_bytes()[skip] == b'{' {
                pending_mod = Some(name);
            } else if rest.as_bytes()[skip] == b'{' {
                pending_mod = None;
            }
            rest = &rest[skip..];
        } else {
            if c == ';' {
                pending_mod = None;
            }
            rest = &rest[c.len_utf8()..];
        }
    }
    names
}

/// A use tree's paths, groups expanded: `a::{b, c::{d, e}}` is `a::b`,
/// `a::c::d` and `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_root_holds_the_quick_start_and_the_rest_is_in_modules() {
    let names = public_names();
    let mut at_root = names[""].clone();
    at_root.sort();
    let mut allowed: Vec<String> = ROOT.iter().map(|n| n.to_string()).collect();
    allowed.sort();
    assert_eq!(
        at_root,
        allowed,
        "the crate's root: {} names, {} allowed; put the new ones in a module \
         (or add them to ROOT, saying why)",
        at_root.len(),
        allowed.len()
    );
    // Each name at one path: no module re-exports what the root or
    // another module does.
    // (The guide's pages are documentation, no items.)
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (module, items) in names.iter().filter(|(m, _)| !m.starts_with("_guide")) {
        // A module is a path, not an item: `retry::retry` is one name.
        for item in items
            .iter()
            .filter(|i| !(module.is_empty() && names.contains_key(*i)))
        {
            if let Some(other) = seen.insert(item, module) {
                panic!("`{item}` is public both in `{other}` and in `{module}`");
            }
        }
    }
    // The modules hold the rest: about seventy names before the front door.
    let total: usize = names.values().map(Vec::len).sum();
    assert!(total > 70, "{total} names in all: {names:#?}");
}

/// A project that depends on the crate as a user's does, with and without
/// `test-util`: the test clock and the seed setters are there only with
/// it. It shares the quick start's target folder (readme.rs), so only the
/// two small crates are checked again.
#[test]
fn the_test_clock_and_seeds_need_the_test_util_feature() {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().join("readme-quick-start");
    let program = r#"use rand::SeedableRng;
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::RetryPolicy;

fn main() {
    let clock = ManualClock::new();
    let _ = RetryPolicy::builder().manual_clock(&clock);
    let _ = RetryPolicy::builder().seed(42);
    let _ = RetryPolicy::builder().rng(rand::rngs::StdRng::seed_from_u64(1));
}
"#;
    // The quick start's other lines, as readme.rs writes them, so that its
    // dependencies are checked once for both.
    const QUICK_START: &str =
        "reqwest = { version = \"0.13\", default-features = false, features = [\"http2\"] }\n\
        reqwest-middleware = \"0.5\"\n\
        tokio = { version = \"1\", features = [\"macros\", \"rt-multi-thread\"] }\n";
    let mut outputs = Vec::new();
    for (name, features) in [("without", ""), ("with", r#", features = ["test-util"]"#)] {
        let project = target.join(format!("project-test-util-{name}"));
        std::fs::create_dir_all(project.join("src")).unwrap();
        let manifest = format!(
            "[package]\nname = \"test-util-{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[workspace]\n\n[dependencies]\n\
             reqwest-safe-retry = {{ path = {:?}{features} }}\nrand = \"0.10\"\n{QUICK_START}",
            root().display().to_string()
        );
        std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
        std::fs::write(project.join("src/main.rs"), program).unwrap();
        std::fs::copy(root().join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
        let out = Command::new(env!("CARGO"))
            .args(["check", "--offline", "--message-format=short"])
            .current_dir(&project)
            .env("CARGO_TARGET_DIR", target.join("target"))
            .output()
            .expect("cargo runs");
        outputs.push((
            name,
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let (_, built, stderr) = &outputs[1];
    assert!(
        built,
        "with `test-util` the test clock and seeds are there:\n{stderr}"
    );
    let (_, built, stderr) = &outputs[0];
    assert!(
        !built,
        "without `test-util` the test clock and the seeds are public"
    );
    for missing in [
        "unresolved import `reqwest_safe_retry::time::ManualClock`",
        "no method named `manual_clock`",
        "no method named `seed`",
        "no method named `rng`",
    ] {
        assert!(stderr.contains(missing), "{missing}:\n{stderr}");
    }
}
