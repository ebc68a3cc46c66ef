//! The README's snippets, and the guide's (`docs/`), are what a reader
//! pastes: check them against the code that compiles and runs, and check
//! that every link leads somewhere.

const README: &str = include_str!("../../README.md");
const MANIFEST: &str = include_str!("../../Cargo.toml");

/// Every page a reader reads, as (path from the workspace's root, text):
/// the READMEs and the guides' pages (`reqwest_safe_retry::_guide`,
/// `tower_idempotency::_guide` on docs.rs).
const PAGES: [(&str, &str); 14] = [
    ("README.md", README),
    ("docs/using.md", include_str!("../../docs/using.md")),
    (
        "docs/production.md",
        include_str!("../../docs/production.md"),
    ),
    ("docs/migrating.md", include_str!("../../docs/migrating.md")),
    (
        "docs/observability.md",
        include_str!("../../docs/observability.md"),
    ),
    ("docs/testing.md", include_str!("../../docs/testing.md")),
    ("docs/call.md", include_str!("../../docs/call.md")),
    ("docs/layout.md", include_str!("../../docs/layout.md")),
    (
        "tower-idempotency/README.md",
        include_str!("../../tower-idempotency/README.md"),
    ),
    (
        "tower-idempotency/docs/requests.md",
        include_str!("../../tower-idempotency/docs/requests.md"),
    ),
    (
        "tower-idempotency/docs/configuration.md",
        include_str!("../../tower-idempotency/docs/configuration.md"),
    ),
    (
        "tower-idempotency/docs/stores.md",
        include_str!("../../tower-idempotency/docs/stores.md"),
    ),
    (
        "idempotency-key/README.md",
        include_str!("../../idempotency-key/README.md"),
    ),
    ("BENCHMARKS.md", include_str!("../../BENCHMARKS.md")),
];

/// The text of section `title` (a `## ` heading) of the README or a page
/// of the guide, up to the next `## ` heading.
fn section(title: &str) -> &'static str {
    let needle = format!("\n## {title}\n");
    let (text, start) = PAGES
        .iter()
        .find_map(|(_, text)| Some((*text, text.find(&needle)?)))
        .unwrap_or_else(|| panic!("no section {title:?}"));
    let rest = &text[start + 1..];
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
    let quick = section("Quick start");
    let toml = blocks(quick, "toml");
    assert_eq!(toml.len(), 2, "the dependencies, and the git line");
    for name in ["reqwest", "reqwest-middleware"] {
        let wanted = format!("\n{name} = \"{}\"\n", dependency_version(name));
        assert!(toml[0].contains(&wanted), "{wanted:?} in {}", toml[0]);
    }
    // The root package's version, read from its manifest (this test is
    // in the checks package, whose own version is not the crate's).
    let version = MANIFEST
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap();
    let own = format!(
        "`reqwest-safe-retry = \"{}\"`",
        version.rsplit_once('.').unwrap().0
    );
    assert!(quick.contains(&own), "the published line, for later: {own}");
}

/// The metrics page's Cargo lines: the feature, and the exporter at the
/// version the checks build its program with.
#[test]
fn the_metrics_page_gives_the_cargo_lines_of_the_feature_and_the_exporter() {
    let toml = blocks(section("Observability"), "toml");
    assert_eq!(
        toml.len(),
        2,
        "the Prometheus route, the OpenTelemetry route"
    );
    assert!(
        toml[0].contains("reqwest-safe-retry = { version = \"0.1\", features = [\"metrics\"] }")
    );
    let checks = include_str!("../Cargo.toml");
    let exporter = checks
        .lines()
        .find(|l| l.starts_with("metrics-exporter-prometheus = "))
        .unwrap();
    assert!(
        toml[0].lines().any(|l| l == exporter),
        "{exporter} in {}",
        toml[0]
    );
}

/// The OpenTelemetry route's Cargo lines name the versions
/// tests/opentelemetry.rs reads the exporters' output with.
#[test]
fn the_opentelemetry_route_names_the_versions_the_test_reads_back() {
    let toml = blocks(section("Observability"), "toml");
    let checks = include_str!("../Cargo.toml")
        .split("\n[dev-dependencies]\n")
        .nth(1)
        .unwrap();
    // `name = "1"` or `name = { version = "1", .. }`: the first quoted word.
    let requirement = |text: &'static str, name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        line.split('"').nth(1).unwrap()
    };
    for name in [
        "opentelemetry",
        "opentelemetry_sdk",
        "tracing-opentelemetry",
        "metrics-exporter-opentelemetry",
    ] {
        assert_eq!(
            requirement(toml[1], name),
            requirement(checks, name),
            "{name}"
        );
    }
    assert!(
        toml[1].contains("reqwest-safe-retry = { version = \"0.1\", features = [\"metrics\"] }")
    );
    assert_eq!(
        requirement(toml[1], "metrics"),
        requirement(checks, "metrics")
    );
    // The set-up is the one the test installs.
    let rust = blocks(section("Observability"), "rust");
    assert_eq!(
        rust.len(),
        2,
        "the Prometheus route, the OpenTelemetry route"
    );
    assert_eq!(rust[1], include_str!("support/opentelemetry.rs"));
}

#[test]
fn the_testing_cases_are_the_tests_that_run() {
    let rust = blocks(section("The cases people test next"), "rust");
    assert_eq!(rust, [include_str!("wiremock_cases.rs")]);
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

/// Every Rust block a reader can paste: the READMEs, the guides' pages
/// and both crates' front pages.
fn pasted_sources() -> Vec<(&'static str, String)> {
    /// The text of a crate's `//!` docs.
    fn front_page(source: &str) -> String {
        source
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    }
    let mut sources: Vec<(&str, String)> = PAGES
        .iter()
        .filter(|(path, _)| path.ends_with(".md") && *path != "BENCHMARKS.md")
        .map(|(path, text)| (*path, text.to_string()))
        .collect();
    sources.push(("src/lib.rs", front_page(include_str!("../../src/lib.rs"))));
    sources.push((
        "tower-idempotency/src/lib.rs",
        front_page(include_str!("../../tower-idempotency/src/lib.rs")),
    ));
    sources
}

#[test]
fn every_rust_block_in_both_readmes_and_front_pages_compiles_as_pasted() {
    // Each of these is compiled by `cargo test --doc`: the READMEs through
    // the `ReadmeDoctests` items below, the front pages as crate docs.
    for (crate_root, source, readme) in [
        (
            "checks/src/lib.rs",
            include_str!("../src/lib.rs"),
            "../../README.md",
        ),
        (
            "tower-idempotency/src/lib.rs",
            include_str!("../../tower-idempotency/src/lib.rs"),
            "../README.md",
        ),
    ] {
        let needle = format!("#[doc = include_str!(\"{readme}\")]\nstruct ReadmeDoctests;");
        assert!(
            source.contains(&needle),
            "{crate_root} no longer compiles its README"
        );
    }
    // And the guides' pages, each through a `#[doc = include_str!(..)]`
    // of a doctest item.
    for (path, _) in PAGES.iter().filter(|(p, _)| p.contains("docs/")) {
        let (crate_root, source, from) = match path.strip_prefix("tower-idempotency/") {
            Some(page) => (
                "tower-idempotency/src/lib.rs",
                include_str!("../../tower-idempotency/src/lib.rs"),
                format!("../{page}"),
            ),
            None => (
                "checks/src/lib.rs",
                include_str!("../src/lib.rs"),
                format!("../../{path}"),
            ),
        };
        let needle = format!("#[doc = include_str!(\"{from}\")]");
        assert!(
            source.contains(&needle),
            "{crate_root} does not compile {path}"
        );
    }
    let mut count = 0;
    for (file, text) in pasted_sources() {
        let mut rest = text.as_str();
        while let Some(open) = rest.find("```") {
            let after = &rest[open + 3..];
            let (info, body) = after.split_once('\n').unwrap();
            let close = body.find("```").unwrap();
            rest = &body[close + 3..];
            // rustdoc compiles a block as Rust unless its info string
            // names another language (no info, or only attributes, is Rust).
            let rustdoc_words = [
                "rust",
                "no_run",
                "ignore",
                "should_panic",
                "compile_fail",
                "edition2021",
            ];
            let rust = info
                .split(',')
                .map(str::trim)
                .all(|t| t.is_empty() || rustdoc_words.contains(&t));
            if !rust {
                continue;
            }
            count += 1;
            let first = body.lines().next().unwrap_or("");
            for attr in ["ignore", "compile_fail"] {
                assert!(
                    !info.split(',').any(|t| t == attr),
                    "{file}: a block marked {attr} is not compiled: {first}"
                );
            }
            // rustdoc hides lines starting with `# `: a reader would paste
            // the block without them.
            for line in body[..close].lines() {
                let t = line.trim_start();
                assert!(
                    !(t == "#" || t.starts_with("# ")),
                    "{file}: hidden line {line:?} in the block starting {first:?}"
                );
            }
        }
    }
    assert!(count >= 12, "{count} blocks: the walk found them all");
}

#[test]
fn the_status_table_is_the_classifier_s() {
    use reqwest_safe_retry::classify::classify_status;
    use reqwest_safe_retry::reqwest::StatusCode;
    use reqwest_safe_retry::Class;

    let table = section("What it does");
    let codes = |cell: &str| -> Vec<u16> {
        cell.split(|c: char| !c.is_ascii_digit())
            .filter(|w| w.len() == 3)
            .map(|w| w.parse().unwrap())
            .collect()
    };
    let row = |class: &str| {
        let line = table
            .lines()
            .find(|l| l.contains(&format!("| {class}")) && !l.contains("Idempotency-Key"))
            .unwrap_or_else(|| panic!("no {class} row"));
        codes(line.split('|').nth(1).unwrap())
    };
    let transient = row("transient: retried");
    let permanent = row("permanent");
    for &code in &transient {
        let status = StatusCode::from_u16(code).unwrap();
        assert_eq!(classify_status(status, false), Class::Transient, "{code}");
    }
    for &code in &permanent {
        let status = StatusCode::from_u16(code).unwrap();
        assert_eq!(classify_status(status, false), Class::Permanent, "{code}");
    }
    // Every registered 5xx is named in one of the two rows (509 is not
    // registered).
    for code in (500..=511).filter(|&c| c != 509) {
        assert!(
            transient.contains(&code) || permanent.contains(&code),
            "{code} is missing from the README's table"
        );
    }
}

#[test]
fn the_reqwest_retry_section_swaps_the_middleware_and_its_policy() {
    // The block compiles as a doctest (reqwest-retry is a dev-dependency);
    // this keeps it the swap, and its claims tied to the test that shows
    // them.
    let text = section("Coming from reqwest-retry");
    let rust = blocks(text, "rust");
    assert_eq!(rust.len(), 1);
    for needed in [
        "RetryTransientMiddleware::new_with_policy(policy)",
        "build_with_max_retries(3)",
        "RetryMiddleware::new(policy)",
        ".max_attempts(4)",
    ] {
        assert!(rust[0].contains(needed), "{needed}");
    }
    assert!(text.contains("`checks/tests/from_reqwest_retry.rs`"));
    assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/from_reqwest_retry.rs")
        .exists());
}

#[test]
fn the_reqwest_retry_section_names_the_defaults_that_reach_further() {
    // Two defaults a migrated program meets on its first slow call or its
    // first third-party host, each with how to turn it off, each shown side
    // by side in the test file the section names.
    let text = section("Coming from reqwest-retry");
    for needed in [
        "32 s",
        "`.no_deadline()`",
        "`.no_deadline_header()`",
        "`Idempotency-Key`",
        "`.idempotency_methods([])`",
        "`no_idempotency_key()`",
        "third part",
    ] {
        assert!(text.contains(needed), "{needed}");
    }
    // The header it names is the one the client sends.
    let header = reqwest_safe_retry::deadline::DEFAULT_DEADLINE_HEADER;
    assert!(text.to_ascii_lowercase().contains(header), "{header}");
    let tests = include_str!("from_reqwest_retry.rs");
    for test in [
        "fn a_32_s_call_is_cut_at_the_default_30_s_deadline_here",
        "fn the_key_and_the_time_left_go_to_every_host_here",
    ] {
        assert!(tests.contains(test), "{test}");
    }
}

/// A heading's anchor as GitHub and rustdoc make it: lowercase, spaces to
/// hyphens, no punctuation but `-` and `_`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `text` without its fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of a page's markdown links.
fn links(text: &str) -> Vec<String> {
    prose(text)
        .split("](")
        .skip(1)
        .map(|l| l.split(')').next().unwrap_or("").to_owned())
        .collect()
}

/// The pages a registry or docs.rs shows (shipped in a package): a
/// relative link on them leads nowhere there.
fn shipped(page: &str) -> bool {
    page.ends_with("README.md") || page.contains("docs/")
}

/// Where link `target` on `page` leads, as (file from the workspace's
/// root, anchor); `None` for another site. A docs.rs link to a guide's
/// page leads to its file in `docs/`.
fn resolve(page: &str, target: &str) -> Option<(String, Option<String>)> {
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f.to_owned())),
        None => (target, None),
    };
    if path.is_empty() {
        return Some((page.to_owned(), fragment));
    }
    for (krate, dir) in [
        ("reqwest-safe-retry", ""),
        ("tower-idempotency", "tower-idempotency/"),
    ] {
        let guide = format!(
            "https://docs.rs/{krate}/latest/{}/_guide/",
            krate.replace('-', "_")
        );
        if let Some(rest) = path.strip_prefix(&guide) {
            let name = rest.strip_suffix("/index.html").unwrap_or(rest);
            return Some((format!("{dir}docs/{name}.md"), fragment));
        }
    }
    if path.contains("://") {
        return None;
    }
    let base = std::path::Path::new(page).parent().unwrap();
    Some((base.join(path).to_string_lossy().into_owned(), fragment))
}

/// Every link of the READMEs, the guides' pages and BENCHMARKS.md leads to
/// a file of the repository and, with `#`, to one of its headings; on the
/// pages a registry shows, no link is relative to the repository (a
/// guide's page is linked on docs.rs); and each README links every page of
/// its guide.
#[test]
fn every_link_leads_to_a_file_and_a_heading() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for (page, text) in PAGES {
        for target in links(text) {
            let Some((file, fragment)) = resolve(page, &target) else {
                continue;
            };
            let same_page = target.starts_with('#');
            assert!(
                same_page || !shipped(page) || target.starts_with("https://"),
                "{page}: `{target}` is relative to the repository; a registry shows this page"
            );
            assert!(
                root.join(&file).exists(),
                "{page}: `{target}`: no file {file}"
            );
            if let Some(fragment) = fragment {
                let linked = std::fs::read_to_string(root.join(&file)).unwrap();
                assert!(
                    anchors(&linked).contains(&fragment),
                    "{page}: `{target}`: no heading #{fragment} in {file}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} links: the walk found them");
    for (readme, dir) in [
        ("README.md", ""),
        ("tower-idempotency/README.md", "tower-idempotency/"),
    ] {
        let text = PAGES.iter().find(|(p, _)| *p == readme).unwrap().1;
        let linked: Vec<String> = links(text)
            .iter()
            .filter_map(|t| resolve(readme, t))
            .map(|(file, _)| file)
            .collect();
        for (page, _) in PAGES.iter().filter(|(p, _)| {
            p.strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with("docs/"))
        }) {
            assert!(
                linked.iter().any(|f| f == page),
                "{readme} does not link {page}"
            );
        }
    }
}

/// A README is a front page, read in minutes: the long form is the
/// guide's.
#[test]
fn each_readme_is_a_front_page_of_at_most_300_lines() {
    for (page, text) in PAGES.iter().filter(|(p, _)| p.ends_with("README.md")) {
        let lines = text.lines().count();
        assert!(lines <= 300, "{page}: {lines} lines");
    }
}

/// Each `cargo run … --example NAME` on a page names an example of the
/// package it names (of any default member without `-p`).
#[test]
fn the_example_commands_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for (page, text) in PAGES {
        for line in text.lines().filter(|l| l.contains("cargo run")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |flag: &str| {
                let i = words.iter().position(|w| *w == flag)?;
                words.get(i + 1).copied()
            };
            let Some(example) = after("--example") else {
                continue;
            };
            let example = example.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
            let folders: &[&str] = match after("-p") {
                Some("reqwest-safe-retry") => &["examples"],
                Some("reqwest-safe-retry-checks") => &["checks/examples"],
                Some("tower-idempotency") => &["tower-idempotency/examples"],
                Some(other) => panic!("{page}: `{line}` names package {other}"),
                None => &["examples", "checks/examples", "tower-idempotency/examples"],
            };
            // An example is a file, or a folder with a `main.rs`.
            let exists = |f: &&str| {
                let folder = root.join(f);
                folder.join(format!("{example}.rs")).exists()
                    || folder.join(example).join("main.rs").exists()
            };
            assert!(
                folders.iter().any(exists),
                "{page}: `{line}`: no example {example} in {folders:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} commands: the walk found them");
}

/// The quick start's lines work for a reader who has the repository: a
/// throwaway project with the README's `[dependencies]` and program is
/// checked by `cargo check`, through the path line (pointed at this
/// workspace) and through the git line (pointed at `file://` and this
/// workspace, so the last commit: what a reader's clone would give).
///
/// No network: the workspace's `Cargo.lock` is copied so every registry
/// crate is one already downloaded; the path build runs `--offline`; the
/// git one cannot (Cargo refuses a git checkout offline, even a local one),
/// so any HTTP it tried would go to a dead proxy and fail at once. Both
/// share a target folder under this build's target, so after the first
/// run (a `cargo check` of the client's dependencies) a run takes seconds.
#[test]
fn a_project_made_of_the_quick_start_s_lines_builds() {
    use std::path::Path;
    use std::process::Command;

    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap();
    let quick = section("Quick start");
    let toml = blocks(quick, "toml");
    let path_line = r#"reqwest-safe-retry = { path = "../reqwest-safe-retry" }"#;
    let git_line = r#"reqwest-safe-retry = { git = "file:///home/you/src/reqwest-safe-retry" }"#;
    assert!(toml[0].lines().any(|l| l == path_line), "{}", toml[0]);
    assert_eq!(toml[1].trim(), git_line);
    // reqwest's default `charset` and `system-proxy` features need crates
    // this workspace never locks (encoding_rs; system-configuration, for
    // macOS), which offline cannot resolve; a reader's Cargo fetches them.
    // The project keeps HTTP/2, and leaves TLS out: the program calls
    // http, and its TLS stack (aws-lc, a C build of minutes) would be built
    // a second time in this target, for nothing the check reads.
    let reqwest_line = "reqwest = \"0.13\"";
    assert!(toml[0].lines().any(|l| l == reqwest_line), "{}", toml[0]);
    let offline_reqwest =
        r#"reqwest = { version = "0.13", default-features = false, features = ["http2"] }"#;
    let program = blocks(quick, "rust")[0];

    // tests/…/target/debug/deps/readme-… → target/readme-quick-start
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().join("readme-quick-start");
    let url = format!("file://{}", root.display());
    for (name, line) in [
        (
            "path",
            path_line.replace("../reqwest-safe-retry", &root.display().to_string()),
        ),
        (
            "git",
            git_line.replace("file:///home/you/src/reqwest-safe-retry", &url),
        ),
    ] {
        let project = target.join(format!("project-{name}"));
        std::fs::create_dir_all(project.join("src")).unwrap();
        let dependencies = toml[0]
            .replace(path_line, &line)
            .replace(reqwest_line, offline_reqwest);
        let manifest = format!(
            "[package]\nname = \"quick-start-{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n# Its own workspace, wherever it lies.\n[workspace]\n\n{dependencies}"
        );
        std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
        std::fs::write(project.join("src/main.rs"), program).unwrap();
        std::fs::copy(root.join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .arg("check")
            .current_dir(&project)
            .env("CARGO_TARGET_DIR", target.join("target"))
            .env("CARGO_NET_RETRY", "0")
            .env("CARGO_HTTP_TIMEOUT", "5")
            .args(["--config", "http.proxy=\"http://127.0.0.1:9\""]);
        if name == "path" {
            cargo.arg("--offline");
        } else {
            // Only the local repository is fetched; an offline setting of
            // the caller's would refuse even that.
            cargo
                .env_remove("CARGO_NET_OFFLINE")
                .args(["--config", "net.offline=false"]);
        }
        if name == "git" && !root.join(".git").exists() {
            eprintln!(
                "{} is not a git repository: the git line is not checked",
                root.display()
            );
            continue;
        }
        let started = std::time::Instant::now();
        let out = cargo.output().expect("cargo runs");
        eprintln!("the {name} line: cargo check in {:.1?}", started.elapsed());
        assert!(
            out.status.success(),
            "a project made of the quick start's lines with the {name} line \
             ({line}) does not build in {}:\n{}",
            project.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
