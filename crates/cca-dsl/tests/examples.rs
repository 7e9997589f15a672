//! The shipped examples (`examples/*.cca`) must compile without any
//! diagnostic but the documented "not enforced yet" warning, and already
//! be in canonical format.

use std::path::{Path, PathBuf};

use cca_dsl::compile::compile_file;
use cca_dsl::diagnostic::codes;
use cca_dsl::format::format_source;
use cca_dsl::source::RealFs;
use cca_dsl::template::Values;

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples directory exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cca"))
        .collect();
    paths.sort();
    paths
}

#[test]
fn the_required_examples_exist() {
    let names: Vec<String> = examples()
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for required in [
        "hello.cca",
        "whoami-multiport.cca",
        "airflow.cca",
        "rolling-update.cca",
    ] {
        assert!(names.iter().any(|n| n == required), "{required} missing");
    }
}

/// No errors and no warnings, except `cca::W008` for a setting this
/// version does not enforce yet, and then the example must say so in a
/// comment on the line or in the comment lines right above it.
#[test]
fn examples_are_lint_clean() {
    for path in examples() {
        let compiled = compile_file(&RealFs, &path, &Values::default()).expect("readable");
        let text = std::fs::read_to_string(&path).expect("readable");
        let lines: Vec<&str> = text.lines().collect();
        let messages: Vec<String> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.code != codes::NOT_ENFORCED || !commented(&lines, &text, d.span.start))
            .map(|d| format!("{} {}", d.code, d.message))
            .collect();
        assert!(messages.is_empty(), "{}: {messages:#?}", path.display());
        assert!(!compiled.program.services.is_empty());
    }
}

/// Whether the line holding `offset`, or the comment lines directly above
/// it, say "not enforced".
fn commented(lines: &[&str], text: &str, offset: u32) -> bool {
    let line = text[..offset as usize].matches('\n').count();
    let says = |line: &str| line.contains("not enforced");
    if lines.get(line).is_some_and(|l| says(l)) {
        return true;
    }
    lines[..line]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with('#'))
        .any(|l| says(l))
}

#[test]
fn examples_are_fmt_stable() {
    for path in examples() {
        let text = std::fs::read_to_string(&path).expect("readable");
        let formatted = format_source(&text).expect("parses");
        assert_eq!(formatted, text, "{} is not canonical", path.display());
    }
}
