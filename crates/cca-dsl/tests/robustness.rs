//! Hostile input never panics and always explains itself: empty files,
//! binary garbage, invalid UTF-8, a 10 MB file, 10,000-deep nesting and
//! unterminated strings and blocks.

use std::path::Path;

use cca_dsl::compile::{compile_file, compile_str};
use cca_dsl::format::format_source;
use cca_dsl::parse;
use cca_dsl::source::MemoryFs;
use cca_dsl::syntax::{MAX_DEPTH, MAX_ERRORS};
use cca_dsl::template::Values;

/// Parses, compiles and formats `text`; returns the diagnostic codes.
fn check(text: &str) -> Vec<String> {
    let parsed = parse(text);
    assert_eq!(parsed.root.text(text), text, "tree must be lossless");
    let compiled = compile_str(text, &Values::default());
    if parsed.errors.is_empty() {
        let formatted = format_source(text).expect("no syntax errors");
        assert_eq!(format_source(&formatted).expect("parses"), formatted);
    } else {
        assert!(format_source(text).is_err());
    }
    compiled
        .diagnostics
        .iter()
        .map(|d| d.code.to_string())
        .collect()
}

/// A deterministic byte soup (xorshift), so failures reproduce.
fn garbage(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()[0]
        })
        .collect()
}

#[test]
fn empty_and_blank_files_are_valid_and_empty() {
    for text in ["", "\n\n", "   ", "# just a comment\n"] {
        assert!(check(text).is_empty(), "{text:?}");
        let compiled = compile_str(text, &Values::default());
        assert!(compiled.program.services.is_empty());
    }
}

#[test]
fn binary_garbage_gives_diagnostics() {
    for seed in 1..=20 {
        let bytes = garbage(4096, seed);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let codes = check(&text);
        assert!(!codes.is_empty(), "seed {seed}");
        assert!(
            codes.len() <= MAX_ERRORS + 40,
            "seed {seed}: {} diagnostics",
            codes.len()
        );
    }
}

#[test]
fn invalid_utf8_is_reported_with_the_rest() {
    let fs = MemoryFs::new().with(
        "bad.cca",
        b"service a {\n  run = \"\xc3\x28\"\n  replica = 1\n}\n".to_vec(),
    );
    let compiled = compile_file(&fs, Path::new("bad.cca"), &Values::default()).expect("exists");
    let codes: Vec<String> = compiled
        .diagnostics
        .iter()
        .map(|d| d.code.to_string())
        .collect();
    assert_eq!(codes, ["cca::E006", "cca::E011"]);
}

#[test]
fn a_ten_megabyte_file_parses_and_compiles() {
    let block = "service svc-NNNNNN {\n  run = \"serve --port $PORT\"\n  replicas = 2\n  port http 8080\n  # a comment to pad the file out a little more\n}\n\n";
    let mut text = String::with_capacity(10 << 20);
    let mut index = 0;
    while text.len() < 10 << 20 {
        text.push_str(&block.replace("NNNNNN", &format!("{index:06}")));
        index += 1;
    }
    let compiled = compile_str(&text, &Values::default());
    assert!(compiled.diagnostics.is_empty());
    assert_eq!(compiled.program.services.len(), index);
}

#[test]
fn ten_megabytes_of_garbage_report_a_bounded_number_of_errors() {
    let bytes = garbage(10 << 20, 7);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let parsed = parse(&text);
    assert_eq!(parsed.errors.len(), MAX_ERRORS + 1);
    assert_eq!(
        parsed.errors.last().map(|e| e.code.to_string()),
        Some("cca::E009".to_owned())
    );
}

#[test]
fn deep_nesting_hits_the_limit_with_a_clear_error() {
    let blocks = format!("{}{}", "a {\n".repeat(10_000), "}\n".repeat(10_000));
    let lists = format!("a = {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let unclosed = "x { ".repeat(10_000);
    for text in [blocks, lists, unclosed] {
        let parsed = parse(&text);
        let deep = parsed
            .errors
            .iter()
            .find(|e| e.code.to_string() == "cca::E005")
            .expect("depth error");
        assert!(deep.message.contains(&MAX_DEPTH.to_string()));
        check(&text);
    }
}

#[test]
fn unterminated_strings_and_blocks_are_reported() {
    let cases = [
        ("service a {\n  run = \"open\n}\n", "cca::E002"),
        ("service a {\n  run = \"\"\"open\n}\n", "cca::E002"),
        ("service a {\n  run = \"x\"\n", "cca::E004"),
        ("service a {\n  command = [\"a\", \"b\"\n}\n", "cca::E004"),
        ("service a {\n  run = \"x\\", "cca::E002"),
        ("service a { env { A = {{ values.x", "cca::E004"),
    ];
    for (text, code) in cases {
        let codes = check(text);
        assert!(codes.iter().any(|c| c == code), "{text:?}: {codes:?}");
    }
}
