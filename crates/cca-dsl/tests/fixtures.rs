//! Fixture directories with insta snapshots:
//! - `fixtures/parse/*.cca`: the lossless tree and syntax errors;
//! - `fixtures/fmt/*.cca`: the formatted text, plus fmt∘fmt = fmt and an
//!   unchanged tree shape;
//! - `fixtures/diagnostics/*.cca`: rendered diagnostics of a full lint
//!   (inclusions and auto-loaded values come from the fixture directory);
//! - `fixtures/compile/*.cca`: the desired facts, which must also be
//!   identical when compiling the formatted file.
//!
//! New fixture: add the file, run `INSTA_UPDATE=always cargo test -p
//! cca-dsl --test fixtures`, review the new `.snap` files, commit them.

use std::path::{Path, PathBuf};

use cca_dsl::commands::report::{Style, render_human};
use cca_dsl::commands::{ValueOptions, gather_values};
use cca_dsl::compile::{compile_file, compile_loaded};
use cca_dsl::diagnostic::codes;
use cca_dsl::format::format_source;
use cca_dsl::parse;
use cca_dsl::source::{MemoryFs, load_str};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The `.cca` files directly in `fixtures/{group}`, sorted.
fn fixtures(group: &str) -> Vec<(String, String)> {
    let dir = fixtures_dir().join(group);
    let mut found: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("fixture directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cca"))
        .map(|path| {
            let name = path
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&path).expect("readable");
            (name, String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no fixtures in {}", dir.display());
    found
}

/// Every file under `fixtures/{group}` in a memory file system, named
/// relative to `fixtures/` so snapshots do not depend on the checkout path.
fn memory_fs(group: &str) -> MemoryFs {
    let mut fs = MemoryFs::new();
    let mut pending = vec![fixtures_dir().join(group)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("fixture directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path.strip_prefix(fixtures_dir()).expect("inside fixtures");
            fs.insert(relative, std::fs::read(&path).expect("readable"));
        }
    }
    fs
}

fn snapshot(group: &str, name: &str, value: &str) {
    insta::with_settings!({
        snapshot_path => format!("snapshots/{group}"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name.to_owned(), value);
    });
}

#[test]
fn parse_fixtures() {
    for (name, text) in fixtures("parse") {
        let parsed = parse(&text);
        assert_eq!(
            parsed.root.text(&text),
            text,
            "{name}: tree is not lossless"
        );
        let mut out = parsed.root.debug_tree(&text);
        out.push_str("--- errors\n");
        for error in &parsed.errors {
            out.push_str(&format!(
                "{} {}..{} {}\n",
                error.code, error.span.start, error.span.end, error.message
            ));
        }
        snapshot("parse", &name, &out);
    }
}

#[test]
fn fmt_fixtures() {
    for (name, text) in fixtures("fmt") {
        let formatted = format_source(&text)
            .unwrap_or_else(|errors| panic!("{name}: fmt fixture has syntax errors: {errors:?}"));
        let again = format_source(&formatted).expect("formatted text parses");
        assert_eq!(again, formatted, "{name}: fmt is not idempotent");
        let before = parse(&text).root.shape(&text);
        let after = parse(&formatted).root.shape(&formatted);
        assert_eq!(before, after, "{name}: fmt changed the tree");
        snapshot("fmt", &name, &formatted);
    }
}

#[test]
fn diagnostics_fixtures() {
    let fs = memory_fs("diagnostics");
    for (name, _) in fixtures("diagnostics") {
        let path = PathBuf::from(format!("diagnostics/{name}.cca"));
        let values = gather_values(&fs, &path, &ValueOptions::default(), &|_| None)
            .expect("fixture values load");
        let compiled = compile_file(&fs, &path, &values).expect("fixture loads");
        let rendered = render_human(
            &compiled.loaded.sources,
            &compiled.diagnostics,
            Style::default(),
        );
        snapshot("diagnostics", &name, &rendered);
    }
}

/// Every key the schema accepts is exercised by `compile/everything.cca`,
/// so a key the compiler silently ignored would show in its snapshot.
#[test]
fn the_everything_fixture_uses_every_key() {
    use cca_dsl::schema::{Context, names};
    let text =
        std::fs::read_to_string(fixtures_dir().join("compile/everything.cca")).expect("readable");
    let words: std::collections::BTreeSet<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let contexts = [
        Context::File,
        Context::Service,
        Context::Resources,
        Context::Health,
        Context::Placement,
        Context::Update,
        Context::Budget,
        Context::Autoscale,
        Context::Vertical,
        Context::Init,
        Context::Gate,
        Context::Sticky,
        Context::Tls,
        Context::Timeouts,
        Context::Retries,
        Context::CircuitBreaker,
        Context::RateLimit,
        Context::Cache,
        Context::Connection,
        Context::Secret,
        Context::Network,
    ];
    let missing: Vec<String> = contexts
        .iter()
        .flat_map(|context| names(*context).map(move |name| (context, name)))
        .filter(|(_, name)| *name != "from" && !words.contains(name))
        .map(|(context, name)| format!("{context:?}.{name}"))
        .collect();
    assert!(missing.is_empty(), "not exercised: {missing:?}");
}

#[test]
fn compile_fixtures() {
    let fs = memory_fs("compile");
    for (name, text) in fixtures("compile") {
        let path = PathBuf::from(format!("compile/{name}.cca"));
        let values = gather_values(&fs, &path, &ValueOptions::default(), &|_| None)
            .expect("fixture values load");
        let compiled = compile_file(&fs, &path, &values).expect("fixture loads");
        // Settings not enforced yet warn (the diagnostics fixture
        // `not_enforced` shows them); anything else is a defect here.
        let messages: Vec<String> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.code != codes::NOT_ENFORCED)
            .map(|d| d.message.clone())
            .collect();
        assert!(messages.is_empty(), "{name}: {messages:#?}");
        let facts = compiled.program.facts().expect("encodes");
        let mut out = String::new();
        for fact in &facts {
            let value: serde_json::Value = serde_json::from_slice(&fact.value).expect("JSON");
            let pretty = serde_json::to_string_pretty(&value).expect("prints");
            out.push_str(&format!("{}\n{pretty}\n\n", fact.key));
        }
        snapshot("compile", &name, &out);

        let formatted = format_source(&text).expect("parses");
        let reloaded = load_str(&fs, &path, &formatted);
        let recompiled = compile_loaded(reloaded, &values);
        let refacts = recompiled.program.facts().expect("encodes");
        assert_eq!(refacts, facts, "{name}: formatting changed the facts");
    }
}
