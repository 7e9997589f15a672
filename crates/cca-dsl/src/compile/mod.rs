//! The compiler: syntax trees of a loaded program → the typed desired facts
//! of `cca_model::spec`, with every finding reported as a diagnostic. It
//! checks what needs the text itself (syntax, unknown keys, wrong types and
//! units, settings given twice, definitions given twice, port names to
//! resolve, "did you mean" hints); every rule that can be judged on the
//! compiled program is `cca_model::validity`'s, run here after the program
//! is built (and again by the API server), each problem mapped back to the
//! span where its object or field was written (`sites`). Compiling the
//! same input twice gives the same program and so the same fact bytes.

mod checks;
mod edges;
mod enforced;
mod gate;
mod read;
mod service;
mod sites;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cca_model::spec::Program;
use cca_model::validity::{Field, Subject};

use crate::ast::{Entry, File};
use crate::diagnostic::{Diagnostic, FileId, Span, codes};
use crate::schema::{self, Context};
use crate::source::{FileSystem, LoadError, Loaded, MemoryFs, load, load_str};
use crate::suggest::did_you_mean;
use crate::template::Values;

/// The outcome of compiling one program.
#[derive(Debug, Clone)]
pub struct Compilation {
    pub loaded: Loaded,
    pub program: Program,
    /// Load, syntax and semantic diagnostics, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Compilation {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Loads `path` (and its inclusions) and compiles it with `values`.
pub fn compile_file(
    fs: &dyn FileSystem,
    path: &Path,
    values: &Values,
) -> Result<Compilation, LoadError> {
    let loaded = load(fs, path)?;
    Ok(compile_loaded(loaded, values))
}

/// Compiles a single in-memory file named `main.cca` (no inclusions can be
/// read). Used by tests, the benchmark and the property tests.
pub fn compile_str(text: &str, values: &Values) -> Compilation {
    let loaded = load_str(&MemoryFs::new(), Path::new("main.cca"), text);
    compile_loaded(loaded, values)
}

/// Compiles the text of one file as [`compile_str`] does, with no
/// template values: the program, or every diagnostic rendered as the CLI
/// prints them (without colour). For clients that hold only text: the
/// MCP server's diff and the console's diff page.
pub fn compile_text(text: &str) -> Result<Program, String> {
    let compilation = compile_str(text, &Values::default());
    if compilation.has_errors() {
        return Err(crate::commands::report::render_human(
            &compilation.loaded.sources,
            &compilation.diagnostics,
            crate::commands::report::Style::default(),
        ));
    }
    Ok(compilation.program)
}

/// Compiles already-loaded sources.
pub fn compile_loaded(loaded: Loaded, values: &Values) -> Compilation {
    let mut diagnostics = loaded.diagnostics.clone();
    for (_, file) in loaded.sources.files() {
        diagnostics.extend(file.parse.errors.iter().cloned());
    }
    let mut compiler = Compiler::new(&loaded, values);
    for (id, file) in loaded.sources.files() {
        compiler.file(id, File::new(&file.text, &file.parse.root));
    }
    compiler.finish();
    diagnostics.append(&mut compiler.diagnostics);
    diagnostics.sort_by_key(|d| (d.file, d.span.start, d.span.end));
    let program = compiler.program;
    Compilation {
        loaded,
        program,
        diagnostics,
    }
}

/// Where something was written: for "defined here" notes and references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Site {
    pub file: FileId,
    pub span: Span,
}

/// The kinds of named things a program defines.
pub(crate) use cca_model::validity::ObjectKind as Kind;

pub(crate) struct Compiler<'l> {
    loaded: &'l Loaded,
    values: &'l Values,
    pub(crate) program: Program,
    pub(crate) diagnostics: Vec<Diagnostic>,
    pub(crate) definitions: BTreeMap<(Kind, String), Site>,
    /// Where each compiled object and its fields were written.
    pub(crate) sites: sites::Sites,
    /// Fields the compiler reported itself; the model's problems about
    /// them are not reported again.
    pub(crate) reported: BTreeSet<Subject>,
    /// Gate targets (and path routes) whose port is a name or not given,
    /// resolved once services are known.
    pub(crate) gate_ports: Vec<gate::PendingGatePort>,
    /// Sites of restrict values, for lint warnings.
    pub(crate) restrict_sites: BTreeMap<(String, String), Site>,
    /// Current file while compiling it.
    pub(crate) file: FileId,
}

impl<'l> Compiler<'l> {
    fn new(loaded: &'l Loaded, values: &'l Values) -> Compiler<'l> {
        Compiler {
            loaded,
            values,
            program: Program::default(),
            diagnostics: Vec::new(),
            definitions: BTreeMap::new(),
            sites: sites::Sites::default(),
            reported: BTreeSet::new(),
            gate_ports: Vec::new(),
            restrict_sites: BTreeMap::new(),
            file: FileId::default(),
        }
    }

    fn file(&mut self, id: FileId, file: File<'_>) {
        self.file = id;
        for entry in file.entries() {
            self.top_level(entry);
        }
    }

    fn top_level(&mut self, entry: Entry<'_>) {
        self.sites.leave();
        if schema::lookup(Context::File, entry.key()).is_some() {
            // `gate NAME`: the keyword and the name, not the whole block.
            let at = entry
                .values()
                .first()
                .map_or(entry.key_span(), |name| entry.key_span().cover(name.span()));
            self.check_enforced(Context::File, entry.key(), at);
        }
        match entry.key() {
            "service" => self.service(entry),
            "gate" => self.gate(entry),
            "connection" => self.connection(entry),
            "secret" => self.secret(entry),
            "network" => self.network(entry),
            "group" => self.removed_group(entry),
            "from" => self.check_include_entry(entry),
            other => self.unknown_block(entry, other),
        }
    }

    fn unknown_block(&mut self, entry: Entry<'_>, key: &str) {
        let mut diagnostic = Diagnostic::error(
            codes::UNKNOWN_BLOCK,
            entry.key_span(),
            format!("unknown block `{key}`"),
        )
        .with_label("not a top-level block");
        if key == "route" {
            diagnostic = diagnostic.with_help("external traffic blocks are called `gate`");
        } else if let Some(close) = did_you_mean(key, schema::names(Context::File)) {
            diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
        } else if schema::lookup(Context::Service, key).is_some() {
            diagnostic = diagnostic.with_help(format!("`{key}` belongs inside a `service` block"));
        } else {
            diagnostic = diagnostic
                .with_help("a file holds service, gate, connection, secret and network blocks");
        }
        self.report(diagnostic);
    }

    /// `group` was accepted by earlier versions; say why it is gone and
    /// what to write instead rather than calling it unknown.
    fn removed_group(&mut self, entry: Entry<'_>) {
        self.report(
            Diagnostic::error(
                codes::UNKNOWN_BLOCK,
                entry.key_span(),
                "`group` blocks were removed from the language",
            )
            .with_label("no longer a top-level block")
            .with_help(
                "group members were separate services that scale and roll out on their own, \
                 so they could not share a node's network namespace and volumes safely; \
                 keep them as services and add `placement { colocate OTHER }` so that the \
                 scheduler prefers one node for them (docs/design/groups.md)",
            ),
        );
    }

    fn check_include_entry(&mut self, entry: Entry<'_>) {
        let values = entry.values();
        let is_path = values.len() == 1
            && matches!(
                values[0],
                crate::ast::Value::Token {
                    kind: crate::syntax::TokenKind::String | crate::syntax::TokenKind::TripleString,
                    ..
                }
            );
        if !is_path || entry.block().is_some() {
            self.report(
                Diagnostic::error(
                    codes::WRONG_ARITY,
                    entry.span(),
                    "`from` takes one file path",
                )
                .with_help("write `from \"other.cca\"`"),
            );
        }
    }

    /// Records a definition; a second one with the same name is an error
    /// pointing at the first. The first one's fields are marked from here
    /// on (`mark`); `key` is the block keyword, `span` the name.
    pub(crate) fn define(&mut self, kind: Kind, name: &str, key: Span, span: Span) -> bool {
        let site = Site {
            file: self.file,
            span,
        };
        if let Some(first) = self.definitions.get(&(kind, name.to_owned())).copied() {
            let position = self.loaded.sources.position(first.file, first.span);
            let mut diagnostic = Diagnostic::error(
                codes::DUPLICATE_NAME,
                span,
                format!("{} `{name}` is defined twice", kind.noun()),
            )
            .with_label("second definition");
            if first.file == self.file {
                diagnostic = diagnostic.with_secondary(first.span, "first defined here");
            } else {
                diagnostic = diagnostic.with_note(format!("first defined at {position}"));
            }
            self.report(diagnostic);
            return false;
        }
        self.definitions.insert((kind, name.to_owned()), site);
        self.sites.enter(kind, name, self.file, key, span);
        true
    }

    /// Records where a field of the object being compiled was written.
    pub(crate) fn mark(&mut self, field: impl Into<Field>, span: Span) {
        self.sites.mark(field.into(), span);
    }

    /// Adds a diagnostic for the current file.
    pub(crate) fn report(&mut self, diagnostic: Diagnostic) {
        let file = self.file;
        self.diagnostics.push(diagnostic.in_file(file));
    }

    /// The text of a value-position `from` file.
    pub(crate) fn inclusion(&self, node_start: u32) -> Option<&'l str> {
        self.loaded
            .inclusions
            .get(&(self.file, node_start))
            .map(String::as_str)
    }

    fn finish(&mut self) {
        self.sites.leave();
        self.resolve_gate_ports();
        self.grant_connection_secrets();
        self.report_problems();
        self.check_placement();
        self.warn_unused();
    }
}
