//! Turning diagnostics into output: rustc-style text through miette's
//! graphical handler (file:line:col, the source line, an underline, the
//! message, help and notes) or JSON for editors and CI. This is the only
//! place diagnostics are rendered.

use std::fmt;

use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};
use serde::Serialize;

use crate::diagnostic::{Diagnostic, FileId, Severity, Span};
use crate::source::SourceMap;

/// How diagnostics are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiagnosticFormat {
    /// Source excerpts with underlines (miette).
    Human,
    /// One JSON document: `{"diagnostics": [...], "errors": n, "warnings": n}`.
    Json,
}

/// Options for human output.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub color: bool,
    pub width: usize,
}

impl Default for Style {
    fn default() -> Style {
        Style {
            color: false,
            width: 100,
        }
    }
}

/// Renders diagnostics as text, one after another.
pub fn render_human(sources: &SourceMap, diagnostics: &[Diagnostic], style: Style) -> String {
    let theme = if style.color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(style.width)
        .with_links(false);
    let mut out = String::new();
    for diagnostic in diagnostics {
        let (name, text) = match sources.get(diagnostic.file) {
            Some(file) => (file.path.display().to_string(), file.text.as_str()),
            None => ("<unknown>".to_owned(), ""),
        };
        let adapter = Adapter {
            diagnostic,
            source: Named { name, text },
            help: help_text(diagnostic),
        };
        if handler.render_report(&mut out, &adapter).is_err() {
            out.push_str(&format!("{}: {}\n", diagnostic.code, diagnostic.message));
        }
        for note in &diagnostic.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    out
}

/// The help line; notes are printed after the report (miette has no notes).
fn help_text(diagnostic: &Diagnostic) -> Option<String> {
    diagnostic.help.clone()
}

/// A file's text with its name, borrowed for the rendering.
struct Named<'a> {
    name: String,
    text: &'a str,
}

impl SourceCode for Named<'_> {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self
            .text
            .read_span(span, context_lines_before, context_lines_after)?;
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            inner.line(),
            inner.column(),
            inner.line_count(),
        )))
    }
}

/// Presents one of our diagnostics through miette's trait.
struct Adapter<'a> {
    diagnostic: &'a Diagnostic,
    source: Named<'a>,
    help: Option<String>,
}

impl fmt::Debug for Adapter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.diagnostic, f)
    }
}

impl fmt::Display for Adapter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Adapter<'_> {}

impl miette::Diagnostic for Adapter<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diagnostic.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|help| Box::new(help) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let limit = self.source.text.len();
        let primary = LabeledSpan::new_primary_with_span(
            (!self.diagnostic.label.is_empty()).then(|| self.diagnostic.label.clone()),
            clamp(self.diagnostic.span, limit),
        );
        let secondary = self.diagnostic.labels.iter().map(move |label| {
            LabeledSpan::new_with_span(Some(label.message.clone()), clamp(label.span, limit))
        });
        Some(Box::new(std::iter::once(primary).chain(secondary)))
    }
}

fn clamp(span: Span, limit: usize) -> SourceSpan {
    let start = (span.start as usize).min(limit);
    let end = (span.end as usize).clamp(start, limit);
    SourceSpan::new(start.into(), end - start)
}

/// A diagnostic as JSON: positions are 1-based line and column (in
/// characters) plus byte offsets.
#[derive(Debug, Serialize)]
pub struct JsonDiagnostic {
    pub file: String,
    pub code: String,
    pub severity: Severity,
    pub message: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub span: Span,
    pub label: String,
    pub labels: Vec<JsonLabel>,
    pub help: Option<String>,
    pub notes: Vec<String>,
}

/// A secondary label as JSON.
#[derive(Debug, Serialize)]
pub struct JsonLabel {
    pub line: usize,
    pub column: usize,
    pub span: Span,
    pub message: String,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    diagnostics: &'a [JsonDiagnostic],
    errors: usize,
    warnings: usize,
}

/// Converts diagnostics for JSON output.
pub fn to_json(sources: &SourceMap, diagnostics: &[Diagnostic]) -> Vec<JsonDiagnostic> {
    diagnostics
        .iter()
        .map(|d| {
            let (line, column) = line_col(sources, d.file, d.span.start);
            let (end_line, end_column) = line_col(sources, d.file, d.span.end);
            JsonDiagnostic {
                file: sources
                    .get(d.file)
                    .map(|f| f.path.display().to_string())
                    .unwrap_or_default(),
                code: d.code.to_string(),
                severity: d.severity,
                message: d.message.clone(),
                line,
                column,
                end_line,
                end_column,
                span: d.span,
                label: d.label.clone(),
                labels: d
                    .labels
                    .iter()
                    .map(|label| {
                        let (line, column) = line_col(sources, d.file, label.span.start);
                        JsonLabel {
                            line,
                            column,
                            span: label.span,
                            message: label.message.clone(),
                        }
                    })
                    .collect(),
                help: d.help.clone(),
                notes: d.notes.clone(),
            }
        })
        .collect()
}

/// The JSON document `cca lint --format json` prints.
pub fn render_json(diagnostics: &[JsonDiagnostic]) -> String {
    let report = JsonReport {
        diagnostics,
        errors: diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count(),
        warnings: diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .count(),
    };
    serde_json::to_string_pretty(&report)
        .unwrap_or_else(|error| format!("{{\"error\": \"cannot encode diagnostics: {error}\"}}"))
}

fn line_col(sources: &SourceMap, file: FileId, offset: u32) -> (usize, usize) {
    sources
        .get(file)
        .map_or((0, 0), |f| f.lines.line_col(&f.text, offset as usize))
}
