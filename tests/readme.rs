//! The README's snippets are what a reader pastes: check them against the
//! code that compiles and runs.

const README: &str = include_str!("../README.md");
const MANIFEST: &str = include_str!("../Cargo.toml");

/// The text of README section `title`, up to the next `## ` heading.
fn section(title: &str) -> &'static str {
    let start = README
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let rest = &README[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 4);
    &rest[..end]
}

/// The code blocks of `text` whose info string starts with `lang`.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let (info, body) = after.split_once('\n').unwrap();
        let close = body.find("```").unwrap();
        if info.starts_with(lang) {
            out.push(&body[..close]);
        }
        rest = &body[close + 3..];
    }
    out
}

/// The version requirement of `name` in the root manifest's [dependencies].
fn dependency_version(name: &str) -> &'static str {
    let deps = MANIFEST
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap();
    let line = deps
        .lines()
        .find(|l| l.starts_with(&format!("{name} =")))
        .unwrap_or_else(|| panic!("{name} is not a dependency"));
    line.split('"').nth(1).unwrap()
}

#[test]
fn the_quick_start_is_a_whole_program_that_pastes_as_it_reads() {
    let quick = section("Quick start");
    let rust = blocks(quick, "rust");
    assert!(!rust.is_empty());
    // rustdoc hides lines starting with `# `: a reader would paste code
    // without them. Without any, the doctest compiles exactly what the
    // reader sees.
    for line in rust.iter().flat_map(|block| block.lines()) {
        let t = line.trim_start();
        assert!(
            !(t == "#" || t.starts_with("# ")),
            "hidden line in the quick start: {line:?}"
        );
    }
    assert!(rust[0].contains("#[tokio::main]\nasync fn main()"));
}

#[test]
fn the_quick_start_names_the_versions_the_crate_is_built_against() {
    let toml = blocks(section("Quick start"), "toml");
    assert_eq!(toml.len(), 1);
    for name in ["reqwest", "reqwest-middleware"] {
        let wanted = format!("\n{name} = \"{}\"\n", dependency_version(name));
        assert!(toml[0].contains(&wanted), "{wanted:?} in {}", toml[0]);
    }
    let own = format!(
        "reqwest-safe-retry = \"{}\"",
        env!("CARGO_PKG_VERSION").rsplit_once('.').unwrap().0
    );
    assert!(toml[0].contains(&own), "{own}");
}

#[test]
fn the_testing_example_is_the_test_that_runs() {
    let rust = blocks(section("Testing code that retries"), "rust");
    assert_eq!(rust.len(), 1);
    assert_eq!(
        rust[0],
        include_str!("wiremock_example.rs"),
        "README and tests/wiremock_example.rs differ"
    );
}

#[test]
fn the_crates_a_user_needs_are_re_exported() {
    // Same types as the crate's own: a caller can build the client from the
    // re-exports and never name a second version.
    let client: reqwest_safe_retry::reqwest_middleware::ClientWithMiddleware =
        reqwest_safe_retry::reqwest_middleware::ClientBuilder::new(
            reqwest_safe_retry::reqwest::Client::new(),
        )
        .with(reqwest_safe_retry::RetryMiddleware::new(
            reqwest_safe_retry::RetryPolicy::default(),
        ))
        .build();
    drop(client);
}
