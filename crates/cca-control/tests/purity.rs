//! Controllers are pure: their sources (and the contract's) never read a
//! clock, draw randomness, touch files or the network or hold the store;
//! time comes in through `Context::now`. A tidy check over the files, so a
//! stray `now_millis()` fails here rather than in a flaky table test.

use std::path::{Path, PathBuf};

/// What a controller must never name.
const FORBIDDEN: &[&str] = &[
    "now_millis",
    "SystemTime",
    "Instant::now",
    "clock::now",
    "fastrand",
    "tokio::",
    "dyn Store",
    "std::fs",
    "std::net",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn controllers_never_read_a_clock_or_do_io() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("controller.rs")];
    sources(&src.join("controllers"), &mut files);
    assert!(files.len() > 5, "found only {files:?}");
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in FORBIDDEN {
                if code.contains(word) {
                    offences.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "controllers must stay pure:\n{}",
        offences.join("\n")
    );
}
