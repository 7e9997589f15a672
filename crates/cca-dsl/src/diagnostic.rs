//! Diagnostics as plain data: a stable code, a severity, a message, the
//! span it is about (file and byte range), secondary labels, a help line
//! and notes. Nothing here renders; the command layer turns diagnostics into
//! rustc-style text (miette) or JSON.

use std::fmt;

use serde::Serialize;

/// Index of a file in a [`crate::source::SourceMap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FileId(pub u32);

/// A half-open byte range `start..end` in one file's text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: offset(start),
            end: offset(end),
        }
    }

    /// The smallest span covering both.
    pub fn cover(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// Files are limited to 4 GiB by the loader; offsets beyond saturate.
fn offset(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// How bad a diagnostic is. Errors fail `cca lint` and stop a compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// A stable diagnostic code such as `cca::E011`. Codes are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Code(pub &'static str);

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cca::{}", self.0)
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Every code the language reports; `docs/dsl.md` lists them.
pub mod codes {
    use super::Code;
    // The codes of rules judged on the compiled model are that crate's.
    use cca_model::validity::Code as Rule;

    pub const INVALID_CHARACTER: Code = Code("E001");
    pub const UNTERMINATED_STRING: Code = Code("E002");
    pub const UNEXPECTED_TOKEN: Code = Code("E003");
    pub const UNCLOSED_DELIMITER: Code = Code("E004");
    pub const NESTING_TOO_DEEP: Code = Code("E005");
    pub const INVALID_UTF8: Code = Code("E006");
    pub const UNMATCHED_CLOSE: Code = Code("E007");
    pub const INVALID_ESCAPE: Code = Code("E008");
    pub const TOO_MANY_ERRORS: Code = Code("E009");
    pub const UNKNOWN_BLOCK: Code = Code("E010");
    pub const UNKNOWN_KEY: Code = Code("E011");
    pub const WRONG_ARITY: Code = Code("E012");
    pub const WRONG_TYPE: Code = Code(Rule::WrongType.number());
    pub const INVALID_QUANTITY: Code = Code("E014");
    pub const OUT_OF_RANGE: Code = Code(Rule::OutOfRange.number());
    pub const DUPLICATE_NAME: Code = Code(Rule::DuplicateName.number());
    pub const MISSING_FIELD: Code = Code(Rule::MissingField.number());
    pub const UNDEFINED_REFERENCE: Code = Code(Rule::UndefinedReference.number());
    pub const CONFLICT: Code = Code(Rule::Conflict.number());
    pub const DUPLICATE_KEY: Code = Code("E020");
    pub const INVALID_NAME: Code = Code(Rule::InvalidName.number());
    pub const INCLUDE_FAILED: Code = Code("E030");
    pub const INCLUDE_CYCLE: Code = Code("E031");
    pub const UNSET_VALUE: Code = Code("E040");
    pub const BAD_PLACEHOLDER: Code = Code("E041");
    pub const UNKNOWN_LABEL_VALUE: Code = Code("W001");
    pub const UNSATISFIABLE_HINT: Code = Code("W002");
    pub const UNUSED_SECRET: Code = Code("W003");
    pub const UNUSED_CONNECTION: Code = Code("W004");
    pub const INSECURE_COOKIE: Code = Code("W005");
    pub const REPLICAS_OVERRIDDEN: Code = Code("W006");
    pub const BUDGET_BLOCKS_DRAIN: Code = Code("W007");
    pub const NOT_ENFORCED: Code = Code("W008");
}

/// A secondary span with its own message, in the diagnostic's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// One finding about a source file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub file: FileId,
    pub span: Span,
    /// Text under the primary underline; may be empty.
    pub label: String,
    pub labels: Vec<Label>,
    pub help: Option<String>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(code, Severity::Error, span, message.into())
    }

    pub fn warning(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(code, Severity::Warning, span, message.into())
    }

    fn new(code: Code, severity: Severity, span: Span, message: String) -> Diagnostic {
        Diagnostic {
            code,
            severity,
            message,
            file: FileId::default(),
            span,
            label: String::new(),
            labels: Vec::new(),
            help: None,
            notes: Vec::new(),
        }
    }

    pub fn in_file(mut self, file: FileId) -> Diagnostic {
        self.file = file;
        self
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Maps byte offsets to 1-based line and column (in characters).
#[derive(Debug, Clone)]
pub struct LineIndex {
    line_starts: Vec<usize>,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(at, _)| at + 1));
        LineIndex { line_starts }
    }

    /// `(line, column)`, both 1-based; the column counts characters.
    pub fn line_col(&self, text: &str, offset: usize) -> (usize, usize) {
        let offset = offset.min(text.len());
        let line = self.line_starts.partition_point(|&start| start <= offset) - 1;
        let start = self.line_starts[line];
        let column = text
            .get(start..offset)
            .map_or(offset - start, |prefix| prefix.chars().count());
        (line + 1, column + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_is_one_based_and_counts_characters() {
        let text = "a\nbé c\n";
        let index = LineIndex::new(text);
        assert_eq!(index.line_col(text, 0), (1, 1));
        assert_eq!(index.line_col(text, 2), (2, 1));
        assert_eq!(index.line_col(text, 6), (2, 4));
        assert_eq!(index.line_col(text, 99), (3, 1));
    }

    #[test]
    fn codes_display_with_the_crate_prefix() {
        assert_eq!(codes::UNKNOWN_KEY.to_string(), "cca::E011");
    }
}
