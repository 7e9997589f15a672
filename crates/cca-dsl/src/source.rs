//! Source files: reading them through [`FileSystem`] (real or in memory),
//! the [`SourceMap`] of every file a program consists of, and the loader
//! that follows `from "file"` inclusions (relative to the including file,
//! each file loaded once, cycles reported) and reads value-position
//! `from "path"` files.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::diagnostic::{Diagnostic, FileId, LineIndex, Span, codes};
use crate::syntax::{NodeKind, Parse, SyntaxElement, SyntaxNode, TokenKind, parse};

/// Files larger than this are refused before parsing.
pub const MAX_FILE_BYTES: usize = 64 << 20;

/// Where source files come from and `cca fmt` writes to. Tests use
/// [`MemoryFs`].
pub trait FileSystem {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn write(&self, path: &Path, contents: &[u8]) -> io::Result<()>;
}

/// The machine's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl FileSystem for RealFs {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    /// Writes a sibling temporary file and renames it over `path`, so an
    /// interrupted `cca fmt` never leaves a half-written file.
    fn write(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".cca-fmt.tmp");
        let temporary = PathBuf::from(temporary);
        std::fs::write(&temporary, contents)?;
        std::fs::rename(&temporary, path)
    }
}

/// An in-memory file system keyed by normalised path.
#[derive(Debug, Default, Clone)]
pub struct MemoryFs {
    files: RefCell<BTreeMap<PathBuf, Vec<u8>>>,
}

impl MemoryFs {
    pub fn new() -> MemoryFs {
        MemoryFs::default()
    }

    pub fn insert(&mut self, path: impl AsRef<Path>, contents: impl Into<Vec<u8>>) {
        self.files
            .get_mut()
            .insert(normalize(path.as_ref()), contents.into());
    }

    /// The current contents of a file, if it exists.
    pub fn contents(&self, path: impl AsRef<Path>) -> Option<Vec<u8>> {
        self.files.borrow().get(&normalize(path.as_ref())).cloned()
    }

    pub fn with(mut self, path: impl AsRef<Path>, contents: impl Into<Vec<u8>>) -> MemoryFs {
        self.insert(path, contents);
        self
    }
}

impl FileSystem for MemoryFs {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files
            .borrow()
            .get(&normalize(path))
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }

    fn write(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        self.files
            .borrow_mut()
            .insert(normalize(path), contents.to_vec());
        Ok(())
    }
}

/// Resolves `.` and `..` without touching the disk, so the same file is
/// recognised however an inclusion spells its path.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// One loaded file.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
    pub parse: Parse,
    pub lines: LineIndex,
}

/// Every file of a program, addressed by [`FileId`].
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    /// Parses `text` and adds it; parse errors are tagged with the new id.
    pub fn add(&mut self, path: PathBuf, text: String) -> FileId {
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        let mut parsed = parse(&text);
        for error in &mut parsed.errors {
            error.file = id;
        }
        let lines = LineIndex::new(&text);
        self.files.push(SourceFile {
            path,
            text,
            parse: parsed,
            lines,
        });
        id
    }

    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(index, file)| (FileId(u32::try_from(index).unwrap_or(u32::MAX)), file))
    }

    /// `path:line:col` of a span's start.
    pub fn position(&self, id: FileId, span: Span) -> String {
        match self.get(id) {
            Some(file) => {
                let (line, column) = file.lines.line_col(&file.text, span.start as usize);
                format!("{}:{line}:{column}", file.path.display())
            }
            None => "<unknown>".to_owned(),
        }
    }
}

/// A root file that could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {error}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub error: io::Error,
}

/// A program's files, with the contents of value-position `from` files.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub sources: SourceMap,
    /// `(file, start of the from node)` → the included file's text.
    pub inclusions: BTreeMap<(FileId, u32), String>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Loads `root` and every file it includes.
pub fn load(fs: &dyn FileSystem, root: &Path) -> Result<Loaded, LoadError> {
    let bytes = fs.read(root).map_err(|source| LoadError {
        path: root.to_path_buf(),
        error: source,
    })?;
    let mut loader = Loader {
        fs,
        loaded: Loaded::default(),
        stack: Vec::new(),
        seen: Vec::new(),
    };
    loader.add_file(normalize(root), bytes);
    Ok(loader.loaded)
}

/// Loads a program held in a string (tests, benchmarks, editors).
pub fn load_str(fs: &dyn FileSystem, path: &Path, text: &str) -> Loaded {
    let mut loader = Loader {
        fs,
        loaded: Loaded::default(),
        stack: Vec::new(),
        seen: Vec::new(),
    };
    loader.add_file(normalize(path), text.as_bytes().to_vec());
    loader.loaded
}

struct Loader<'f> {
    fs: &'f dyn FileSystem,
    loaded: Loaded,
    /// Files being loaded, outermost first: an inclusion of one is a cycle.
    stack: Vec<PathBuf>,
    seen: Vec<PathBuf>,
}

impl Loader<'_> {
    fn add_file(&mut self, path: PathBuf, bytes: Vec<u8>) -> FileId {
        let (text, utf8_error) = decode(bytes);
        self.seen.push(path.clone());
        let id = self.loaded.sources.add(path.clone(), text);
        if let Some(diagnostic) = utf8_error {
            self.loaded.diagnostics.push(diagnostic.in_file(id));
        }
        self.stack.push(path);
        self.follow_inclusions(id);
        self.stack.pop();
        id
    }

    fn follow_inclusions(&mut self, id: FileId) {
        let Some(file) = self.loaded.sources.get(id) else {
            return;
        };
        let mut includes = Vec::new();
        let mut reads = Vec::new();
        // Both kinds of inclusion are spelled `from`: most files have none.
        if file.text.contains("from") {
            collect_inclusions(
                &file.text,
                &file.parse.root,
                true,
                &mut includes,
                &mut reads,
            );
        }
        let directory = file
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for (raw, span) in includes {
            self.include(id, &directory, &raw, span);
        }
        for (raw, node_start, span) in reads {
            self.read_value_file(id, &directory, &raw, node_start, span);
        }
    }

    /// A top-level `from "file.cca"`: load the file's blocks too.
    fn include(&mut self, from: FileId, directory: &Path, raw: &str, span: Span) {
        let Some(path) = self.resolve(from, directory, raw, span) else {
            return;
        };
        if let Some(at) = self.stack.iter().position(|open| *open == path) {
            let chain: Vec<String> = self.stack[at..]
                .iter()
                .chain(std::iter::once(&path))
                .map(|p| p.display().to_string())
                .collect();
            self.loaded.diagnostics.push(
                Diagnostic::error(codes::INCLUDE_CYCLE, span, "inclusion cycle")
                    .in_file(from)
                    .with_label("this file is already being included")
                    .with_note(format!("cycle: {}", chain.join(" -> "))),
            );
            return;
        }
        if self.seen.contains(&path) {
            return;
        }
        match self.fs.read(&path) {
            Ok(bytes) => {
                self.add_file(path, bytes);
            }
            Err(error) => self.read_failed(from, span, &path, &error),
        }
    }

    /// A value `from "path"`: the file's text becomes the value.
    fn read_value_file(
        &mut self,
        from: FileId,
        directory: &Path,
        raw: &str,
        node_start: u32,
        span: Span,
    ) {
        let Some(path) = self.resolve(from, directory, raw, span) else {
            return;
        };
        match self.fs.read(&path) {
            Ok(bytes) => {
                let (text, utf8_error) = decode(bytes);
                if utf8_error.is_some() {
                    self.loaded.diagnostics.push(
                        Diagnostic::error(
                            codes::INVALID_UTF8,
                            span,
                            format!("{} is not valid UTF-8", path.display()),
                        )
                        .in_file(from),
                    );
                }
                self.loaded.inclusions.insert((from, node_start), text);
            }
            Err(error) => self.read_failed(from, span, &path, &error),
        }
    }

    fn resolve(
        &mut self,
        from: FileId,
        directory: &Path,
        raw: &str,
        span: Span,
    ) -> Option<PathBuf> {
        match crate::ast::decode_string(raw) {
            Ok(relative) if !relative.is_empty() => Some(normalize(&directory.join(relative))),
            _ => {
                self.loaded.diagnostics.push(
                    Diagnostic::error(codes::INCLUDE_FAILED, span, "invalid inclusion path")
                        .in_file(from)
                        .with_label("expected a file path"),
                );
                None
            }
        }
    }

    fn read_failed(&mut self, from: FileId, span: Span, path: &Path, error: &io::Error) {
        self.loaded.diagnostics.push(
            Diagnostic::error(
                codes::INCLUDE_FAILED,
                span,
                format!("cannot read {}: {error}", path.display()),
            )
            .in_file(from)
            .with_label("included here"),
        );
    }
}

/// Text from bytes; invalid UTF-8 is replaced and reported at the first bad
/// byte (offsets before it are unchanged by the replacement).
fn decode(bytes: Vec<u8>) -> (String, Option<Diagnostic>) {
    if bytes.len() > MAX_FILE_BYTES {
        let diagnostic = Diagnostic::error(
            codes::INCLUDE_FAILED,
            Span::new(0, 0),
            format!(
                "file is {} bytes; the limit is {MAX_FILE_BYTES}",
                bytes.len()
            ),
        );
        return (String::new(), Some(diagnostic));
    }
    match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(error) => {
            let valid = error.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(error.as_bytes()).into_owned();
            let end = text[valid..]
                .char_indices()
                .nth(1)
                .map_or(text.len(), |(at, _)| valid + at);
            let diagnostic = Diagnostic::error(
                codes::INVALID_UTF8,
                Span::new(valid, end),
                "the file is not valid UTF-8",
            )
            .with_label("invalid bytes start here")
            .with_help("save the file as UTF-8");
            (text, Some(diagnostic))
        }
    }
}

/// Top-level `from "x"` entries (file inclusions) and value-position
/// `from "x"` nodes anywhere (file reads).
fn collect_inclusions(
    source: &str,
    node: &SyntaxNode,
    top_level: bool,
    includes: &mut Vec<(String, Span)>,
    reads: &mut Vec<(String, u32, Span)>,
) {
    for child in node.child_nodes() {
        if top_level && child.kind == NodeKind::Entry && is_from_entry(source, child) {
            if let Some(token) = child.child_tokens().find(|t| is_string(t.kind)) {
                let raw = source.get(token.span.range()).unwrap_or_default();
                includes.push((raw.to_owned(), token.span));
            }
            continue;
        }
        if child.kind == NodeKind::From {
            if let Some(token) = child.child_tokens().find(|t| is_string(t.kind)) {
                let raw = source.get(token.span.range()).unwrap_or_default();
                reads.push((raw.to_owned(), child.span.start, token.span));
            }
            continue;
        }
        collect_inclusions(source, child, false, includes, reads);
    }
}

fn is_string(kind: TokenKind) -> bool {
    matches!(kind, TokenKind::String | TokenKind::TripleString)
}

fn is_from_entry(source: &str, entry: &SyntaxNode) -> bool {
    matches!(entry.children.first(), Some(SyntaxElement::Token(key))
        if source.get(key.span.range()) == Some("from"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inclusions_are_followed_once_and_cycles_reported() {
        let fs = MemoryFs::new()
            .with("app/main.cca", "from \"lib/a.cca\"\nfrom \"lib/a.cca\"\n")
            .with("app/lib/a.cca", "from \"../main.cca\"\nsecret a\n");
        let loaded = load(&fs, Path::new("app/main.cca")).expect("root exists");
        assert_eq!(loaded.sources.files().count(), 2);
        assert_eq!(loaded.diagnostics.len(), 1);
        assert_eq!(loaded.diagnostics[0].message, "inclusion cycle");
        assert_eq!(
            loaded.diagnostics[0].notes,
            ["cycle: app/main.cca -> app/lib/a.cca -> app/main.cca"]
        );
    }

    #[test]
    fn value_files_are_read_relative_to_the_including_file() {
        let fs = MemoryFs::new()
            .with("a/main.cca", "service s {\n  run = from \"run.sh\"\n}\n")
            .with("a/run.sh", "echo hi\n");
        let loaded = load(&fs, Path::new("a/main.cca")).expect("root exists");
        assert!(loaded.diagnostics.is_empty());
        assert_eq!(
            loaded.inclusions.values().next().map(String::as_str),
            Some("echo hi\n")
        );
    }

    #[test]
    fn invalid_utf8_is_reported_at_the_first_bad_byte() {
        let fs = MemoryFs::new().with("x.cca", b"secret a\n\xff\xfe".to_vec());
        let loaded = load(&fs, Path::new("x.cca")).expect("root exists");
        assert_eq!(loaded.diagnostics[0].span, Span::new(9, 12));
    }

    #[test]
    fn missing_root_is_a_load_error() {
        let err = load(&MemoryFs::new(), Path::new("none.cca")).expect_err("missing");
        assert_eq!(err.to_string(), "cannot read none.cca: no such file");
    }
}
