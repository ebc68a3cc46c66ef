//! The crates' `src/` folders are floors: read from their `use` lines, no
//! file imports one that imports it back, and no floor of either crate
//! (the client, `tower-idempotency`) reaches up to a floor above it.
//!
//! The graph is read from the source text, not from the compiler: every
//! path that starts at `crate`, `self`, `super` or a child module, in a
//! `use` line or in code, is followed through the `use` and `pub use`
//! lines it meets to the file that defines the item. An arrow `a → b`
//! means that `a` names an item defined in `b`. A folder's `mod.rs`
//! re-exporting its own children, and `lib.rs`, the crate's face, draw no
//! arrow; unit tests (`#[cfg(test)]` items) are left out.
//!
//! Each floor says what it may use on a line of its module
//! docs, `//! May use: `a`, `b`.`; the test reads those lines, so the docs
//! and the rule cannot drift apart. See the graph:
//! `cargo test -p reqwest-safe-retry-checks --test layers -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The longest a source file may be.
const MAX_LINES: usize = 450;
/// The most arrows the client's files may draw between them.
const MAX_CLIENT_ARROWS: usize = 49;

type Module = Vec<String>;

struct Source {
    /// Relative to the crate's root, for messages.
    file: String,
    /// The text without comments, literals or `#[cfg(test)]` items.
    code: Vec<Token>,
    /// The names this module brings into scope with `use`: name → path.
    uses: BTreeMap<String, Vec<String>>,
    /// The `use` paths, each with whether it is a re-export (`pub use`).
    imports: Vec<(Vec<String>, bool)>,
    /// The floors named by a `//! May use:` line, if it has one.
    may_use: Option<BTreeSet<String>>,
}

struct Crate {
    modules: BTreeMap<Module, Source>,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Path,
    Punct(char),
}

impl Crate {
    fn read(root: &Path) -> Crate {
        Crate::read_src(&root.join("src"))
    }

    /// The modules under `src`, whose root file is `lib.rs` or `main.rs`
    /// (an example of several files has a folder of its own).
    fn read_src(src: &Path) -> Crate {
        let mut modules = BTreeMap::new();
        for path in rust_files(src) {
            let relative = path.strip_prefix(src).unwrap();
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib"))
                || module == ["main"]
            {
                module.pop();
            }
            let text = fs::read_to_string(&path).unwrap();
            modules.insert(
                module,
                Source::parse(&format!("src/{}", relative.display()), &text),
            );
        }
        // A file whose module is declared `#[cfg(test)] mod tests;` holds
        // only tests.
        let test_files: Vec<Module> = modules
            .keys()
            .filter(|m| m.last().is_some_and(|n| n == "tests") && m.len() > 1)
            .cloned()
            .collect();
        for m in test_files {
            modules.remove(&m);
        }
        Crate { modules }
    }

    fn is_module(&self, m: &[String]) -> bool {
        self.modules.contains_key(m)
    }

    /// The module whose file defines the item that `path`, written in
    /// module `from`, names; `None` for another crate's item.
    fn resolve(&self, from: &[String], path: &[String], depth: usize) -> Option<Module> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let mut at: Module = match path[0].as_str() {
            "crate" => Vec::new(),
            "self" => from.to_vec(),
            "super" => from[..from.len().saturating_sub(1)].to_vec(),
            first => {
                let mut child = from.to_vec();
                child.push(first.to_owned());
                if self.is_module(&child) {
                    child
                } else if let Some(alias) = self.modules[from].uses.get(first) {
                    let mut full = alias.clone();
                    full.extend_from_slice(&path[1..]);
                    return self.resolve(from, &full, depth + 1);
                } else {
                    return None;
                }
            }
        };
        let mut rest = &path[1..];
        while rest.first().is_some_and(|s| s == "super") {
            at.pop();
            rest = &rest[1..];
        }
        for (i, segment) in rest.iter().enumerate() {
            if segment == "self" {
                continue;
            }
            let mut child = at.clone();
            child.push(segment.clone());
            if self.is_module(&child) {
                at = child;
                continue;
            }
            if let Some(alias) = self.modules.get(&at)?.uses.get(segment) {
                let mut full = alias.clone();
                full.extend_from_slice(&rest[i + 1..]);
                return self.resolve(&at, &full, depth + 1);
            }
            return Some(at);
        }
        Some(at)
    }

    /// Every arrow between two files: the module that names an item, and
    /// the module whose file defines it.
    fn arrows(&self) -> BTreeSet<(Module, Module)> {
        let mut arrows = BTreeSet::new();
        for (module, source) in &self.modules {
            if module.is_empty() {
                continue; // lib.rs: the crate's face
            }
            let mut paths: Vec<(Vec<String>, bool)> = source.imports.clone();
            paths.extend(code_paths(&source.code).into_iter().map(|p| (p, false)));
            for (path, reexport) in paths {
                let Some(target) = self.resolve(module, &path, 0) else {
                    continue;
                };
                let below_own_face = reexport && target.starts_with(module);
                if target != *module && !below_own_face {
                    arrows.insert((module.clone(), target));
                }
            }
        }
        arrows
    }
}

impl Source {
    fn parse(file: &str, text: &str) -> Source {
        let may_use = text
            .lines()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .find_map(|l| l.strip_prefix("//! May use:"))
            .map(|rest| {
                rest.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect()
            });
        let code = without_tests(tokens(&strip(text)));
        let mut uses = BTreeMap::new();
        let mut imports = Vec::new();
        for (tree, reexport) in use_trees(&code) {
            for path in expand(&tree) {
                let (path, name) = match path.iter().position(|s| s == "as") {
                    Some(i) => (path[..i].to_vec(), path.get(i + 1).cloned()),
                    None => {
                        let name = match path.last().map(String::as_str) {
                            Some("self") if path.len() > 1 => path.get(path.len() - 2).cloned(),
                            last => last.map(str::to_owned),
                        };
                        (path, name)
                    }
                };
                if let Some(name) = name.filter(|n| n != "*" && n != "_") {
                    uses.insert(name, path.clone());
                }
                imports.push((path, reexport));
            }
        }
        Source {
            file: file.to_owned(),
            code,
            uses,
            imports,
            may_use,
        }
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// `text` with comments, string and character literals blanked out.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::Path);
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_numeric() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// The tokens without the items marked `#[cfg(test)]`.
fn without_tests(tokens: Vec<Token>) -> Vec<Token> {
    let attribute = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i..].starts_with(&attribute) {
            i += attribute.len();
            // Skip the item: up to its `;`, or its balanced `{ }`.
            let mut depth = 0usize;
            while i < tokens.len() {
                match tokens[i] {
                    Token::Punct('{') => depth += 1,
                    Token::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    Token::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(tokens[i].clone());
            i += 1;
        }
    }
    out
}

/// The `use` declarations: their tokens up to the `;`, and whether each
/// is a re-export (`pub use`, `pub(crate) use`).
fn use_trees(code: &[Token]) -> Vec<(Vec<Token>, bool)> {
    let mut out = Vec::new();
    for (i, token) in code.iter().enumerate() {
        if *token != Token::Ident("use".into()) {
            continue;
        }
        let reexport = match i.checked_sub(1).map(|j| &code[j]) {
            Some(Token::Ident(word)) => word == "pub",
            Some(Token::Punct(')')) => code[..i]
                .iter()
                .rposition(|t| *t == Token::Punct('('))
                .and_then(|open| open.checked_sub(1))
                .is_some_and(|j| code[j] == Token::Ident("pub".into())),
            _ => false,
        };
        let end = code[i..]
            .iter()
            .position(|t| *t == Token::Punct(';'))
            .map_or(code.len(), |p| i + p);
        out.push((code[i + 1..end].to_vec(), reexport));
    }
    out
}

/// A use tree's paths, its groups expanded: `a::{b, c::d}` is `a::b` and
/// `a::c::d`; `as` and the alias stay at the end of a path.
fn expand(tree: &[Token]) -> Vec<Vec<String>> {
    fn walk(tokens: &[Token], prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                Token::Ident(name) => path.push(name.clone()),
                Token::Punct('*') => path.push("*".into()),
                Token::Path => {}
                Token::Punct('{') => {
                    let mut depth = 0usize;
                    let mut start = i + 1;
                    let mut j = i;
                    while j < tokens.len() {
                        match tokens[j] {
                            Token::Punct('{') => depth += 1,
                            Token::Punct('}') => {
                                depth -= 1;
                                if depth == 0 {
                                    walk(&tokens[start..j], &path, out);
                                    break;
                                }
                            }
                            Token::Punct(',') if depth == 1 => {
                                walk(&tokens[start..j], &path, out);
                                start = j + 1;
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    return;
                }
                _ => {}
            }
            i += 1;
        }
        if path.len() > prefix.len() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(tree, &[], &mut out);
    out
}

/// The paths named in code, outside `use` lines, that start at `crate`,
/// `self` or `super`: `crate::a::b(..)` is `crate::a::b`.
fn code_paths(code: &[Token]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_use = false;
    let mut i = 0;
    while i < code.len() {
        match &code[i] {
            Token::Ident(w) if w == "use" => in_use = true,
            Token::Punct(';') => in_use = false,
            Token::Ident(first)
                if !in_use
                    && matches!(first.as_str(), "crate" | "super" | "self")
                    && code.get(i + 1) == Some(&Token::Path)
                    && !matches!(code.get(i.wrapping_sub(1)), Some(Token::Path)) =>
            {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while code.get(j) == Some(&Token::Path) {
                    match code.get(j + 1) {
                        Some(Token::Ident(name)) => path.push(name.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                i = j;
                out.push(path);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The circles of the graph: its strongly connected parts of more than
/// one module (Tarjan's algorithm).
fn circles(arrows: &BTreeSet<(Module, Module)>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        next: BTreeMap<&'a Module, Vec<&'a Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, m: &'a Module) {
            let n = self.index.len();
            self.index.insert(m, n);
            self.low.insert(m, n);
            self.stack.push(m);
            self.on_stack.insert(m);
            for &to in self.next.get(m).cloned().unwrap_or_default().iter() {
                if !self.index.contains_key(to) {
                    self.visit(to);
                    let low = self.low[m].min(self.low[to]);
                    self.low.insert(m, low);
                } else if self.on_stack.contains(to) {
                    let low = self.low[m].min(self.index[to]);
                    self.low.insert(m, low);
                }
            }
            if self.low[m] == self.index[m] {
                let mut part = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    part.push(top.clone());
                    if top == m {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for (from, to) in arrows {
        walk.next.entry(from).or_default().push(to);
    }
    let starts: Vec<&Module> = walk.next.keys().copied().collect();
    for m in starts {
        if !walk.index.contains_key(m) {
            walk.visit(m);
        }
    }
    walk.found
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "lib".to_owned()
    } else {
        m.join("::")
    }
}

fn crate_root(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// A crate's floors, read from the `May use:` lines of its top-level
/// modules: floor → the floors it may use.
fn floors(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    krate
        .modules
        .iter()
        .filter(|(m, _)| m.len() == 1)
        .map(|(m, source)| {
            let may_use = source.may_use.clone().unwrap_or_else(|| {
                panic!(
                    "{} opens with no `//! May use:` line: say which floors it stands on",
                    source.file
                )
            });
            (m[0].clone(), may_use)
        })
        .collect()
}

/// The arrows as a reader of each folder sees them: between the entries
/// (files and folders) of the folder that holds both ends. An arrow from
/// `engine::run` to `decisions::admission::adaptive` is `engine →
/// decisions`, drawn once however many files of `engine` use however many
/// of `decisions`; one from `engine::run` to `engine::policy` stays as it
/// is. At `src/` this is the count of arrows between its top-level files
/// and folders.
fn between_siblings(arrows: &BTreeSet<(Module, Module)>) -> BTreeSet<(Module, Module)> {
    arrows
        .iter()
        .map(|(from, to)| {
            let shared = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            let end = |m: &Module| m[..(shared + 1).min(m.len())].to_vec();
            (end(from), end(to))
        })
        .collect()
}

fn print_graph(title: &str, krate: &Crate, arrows: &BTreeSet<(Module, Module)>) {
    let top: BTreeSet<(&String, &String)> = arrows
        .iter()
        .filter(|(from, to)| to.first().is_some_and(|t| *t != from[0]))
        .map(|(from, to)| (&from[0], &to[0]))
        .collect();
    let folders: BTreeSet<&String> = krate.modules.keys().filter_map(|m| m.first()).collect();
    println!(
        "{title}: {} files, {} arrows between them; {} between the entries of each folder; \
         {} top-level files and folders, {} arrows between those",
        krate.modules.len(),
        arrows.len(),
        between_siblings(arrows).len(),
        folders.len(),
        top.len()
    );
    for (from, to) in arrows {
        println!("  {} -> {}", name(from), name(to));
    }
}

/// Fails, naming them, on the files of the crate in folder `root` that
/// import each other through a circle; prints the graph.
fn assert_no_circle(root: &str, title: &str) {
    let krate = Crate::read(&crate_root(root));
    let arrows = krate.arrows();
    print_graph(title, &krate, &arrows);
    let found: Vec<Vec<String>> = circles(&arrows)
        .iter()
        .map(|c| c.iter().map(|m| name(m)).collect())
        .collect();
    assert!(
        found.is_empty(),
        "{title}: files that import each other, through a circle: {found:#?}"
    );
}

#[test]
fn the_client_has_no_circle_of_imports() {
    assert_no_circle(".", "reqwest-safe-retry");
}

#[test]
fn the_server_crate_has_no_circle_of_imports() {
    assert_no_circle("tower-idempotency", "tower-idempotency");
}

#[test]
fn the_call_example_has_no_circle_of_imports() {
    let krate = Crate::read_src(&crate_root("checks/examples/call"));
    let arrows = krate.arrows();
    print_graph("examples/call", &krate, &arrows);
    let found = circles(&arrows);
    assert!(
        found.is_empty(),
        "examples/call: a circle of imports: {found:?}"
    );
}

#[test]
fn the_herd_and_loadgen_examples_have_no_circle_of_imports() {
    for (root, title) in [
        ("checks/examples/herd", "examples/herd"),
        (
            "tower-idempotency/examples/loadgen",
            "tower-idempotency/examples/loadgen",
        ),
    ] {
        let krate = Crate::read_src(&crate_root(root));
        let arrows = krate.arrows();
        print_graph(title, &krate, &arrows);
        let found = circles(&arrows);
        assert!(found.is_empty(), "{title}: a circle of imports: {found:?}");
    }
}

/// The examples are held to the sources' length: a long one is a folder
/// (`examples/NAME/main.rs` and its modules), split by concern, each file
/// opening with a module doc that says what it holds.
#[test]
fn no_example_file_is_over_450_lines_and_each_folder_file_says_what_it_holds() {
    let mut long = Vec::new();
    let mut undocumented = Vec::new();
    for root in ["examples", "checks/examples", "tower-idempotency/examples"] {
        let dir = crate_root(root);
        for path in rust_files(&dir) {
            let text = fs::read_to_string(&path).unwrap();
            let file = format!("{root}/{}", path.strip_prefix(&dir).unwrap().display());
            let lines = text.lines().count();
            if lines > MAX_LINES {
                long.push(format!("{file}: {lines} lines"));
            }
            let in_folder = path.parent() != Some(dir.as_path());
            if in_folder && !text.starts_with("//! ") {
                undocumented.push(file);
            }
        }
    }
    assert!(
        long.is_empty(),
        "examples over {MAX_LINES} lines: {long:#?}"
    );
    assert!(
        undocumented.is_empty(),
        "example modules without a module doc: {undocumented:#?}"
    );
}

#[test]
fn no_floor_of_the_client_reaches_up() {
    assert_no_floor_reaches_up(".");
}

/// The server crate in floors: the store's vocabulary (`store`), the three
/// stores on it, the request path above them, the layer and its builder
/// on top.
#[test]
fn no_floor_of_the_server_crate_reaches_up() {
    assert_no_floor_reaches_up("tower-idempotency");
}

/// Fails, naming them, on the imports of the crate in folder `root` that
/// reach a floor its importer's `May use:` line does not name.
fn assert_no_floor_reaches_up(root: &str) {
    let krate = Crate::read(&crate_root(root));
    let floors = floors(&krate);
    // The floors' own order has no circle either: a floor may not use one
    // that may use it.
    let floor_arrows: BTreeSet<(Module, Module)> = floors
        .iter()
        .flat_map(|(floor, below)| {
            below
                .iter()
                .map(move |b| (vec![floor.clone()], vec![b.clone()]))
        })
        .collect();
    for (floor, below) in &floors {
        for b in below {
            assert!(
                floors.contains_key(b),
                "{root}/src/{floor}: `May use:` names `{b}`, which is no floor"
            );
        }
    }
    assert!(
        circles(&floor_arrows).is_empty(),
        "floors that may use each other: {floors:?}"
    );
    let mut upward = Vec::new();
    for (from, to) in krate.arrows() {
        let (from_floor, to_floor) = (&from[0], &to[0]);
        if from_floor != to_floor && !floors[from_floor].contains(to_floor) {
            upward.push(format!("{} -> {}", name(&from), name(&to)));
        }
    }
    assert!(
        upward.is_empty(),
        "{root}: imports of a floor not named in the importer's `May use:` line: {upward:#?}"
    );
}

#[test]
fn the_client_draws_fewer_than_fifty_arrows() {
    let krate = Crate::read(&crate_root("."));
    let between = between_siblings(&krate.arrows());
    assert!(
        between.len() <= MAX_CLIENT_ARROWS,
        "{} arrows between the entries of the client's folders (at most {MAX_CLIENT_ARROWS}): {between:#?}",
        between.len()
    );
}

#[test]
fn no_source_file_is_over_450_lines() {
    let mut long = Vec::new();
    for root in [".", "tower-idempotency"] {
        let src = crate_root(root).join("src");
        for path in rust_files(&src) {
            let lines = fs::read_to_string(&path).unwrap().lines().count();
            if lines > MAX_LINES {
                let file = path.strip_prefix(&src).unwrap().display();
                long.push(format!("{root}/src/{file}: {lines} lines").replace("./", ""));
            }
        }
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:#?}");
}

/// The reader itself, on code written to hold what it must see through.
#[test]
fn the_reader_follows_paths_through_re_exports_and_skips_tests() {
    let krate = Crate {
        modules: [
            (vec![], "mod a; mod b; mod c; pub use a::X;"),
            (
                vec!["a"],
                "//! May use: `b`.\nmod inner; pub use inner::X; use crate::b::{Y, self as bee};\n\
                 fn f() { crate::c::g(); let s = \"crate::c::h\"; } // crate::c::i\n\
                 #[cfg(test)] mod tests { use crate::c::Z; }",
            ),
            (vec!["a", "inner"], "pub struct X; use super::super::b::Y;"),
            (vec!["b"], "pub struct Y;"),
            (vec!["c"], "pub fn g() {} use crate::X;"),
        ]
        .into_iter()
        .map(|(m, text)| {
            (
                m.into_iter().map(String::from).collect(),
                Source::parse("t", text),
            )
        })
        .collect(),
    };
    let arrows: Vec<(String, String)> = krate
        .arrows()
        .iter()
        .map(|(f, t)| (name(f), name(t)))
        .collect();
    let expected = [("a", "b"), ("a", "c"), ("a::inner", "b"), ("c", "a::inner")];
    assert_eq!(
        arrows,
        expected.map(|(f, t)| (f.to_owned(), t.to_owned())).to_vec()
    );
    assert_eq!(
        krate.modules[&vec!["a".to_owned()]].may_use,
        Some(["b".to_owned()].into())
    );
    let circle: BTreeSet<(Module, Module)> = [
        (vec!["a".to_owned()], vec!["c".to_owned()]),
        (vec!["c".to_owned()], vec!["a".to_owned()]),
    ]
    .into();
    assert_eq!(circles(&circle).len(), 1);
}
