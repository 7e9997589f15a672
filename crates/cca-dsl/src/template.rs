//! Templates: `{{ values.key }}` placeholders in value positions and inside
//! strings, the `.ccv` values-file format, the layered value set (auto-loaded
//! `NAME/values.ccv` < `--values` < `--set` < `--set-from-env`) and `cca
//! render`'s text expansion.
//!
//! A `.ccv` file holds one `key = value` per line; `#` starts a comment
//! line; keys are letters, digits, `_`, `-` and `.`; a value is either a
//! double-quoted string (with the `.cca` escapes) or the rest of the line,
//! trimmed.

use std::collections::BTreeMap;

use crate::ast::decode_string;
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::syntax::{TokenKind, lex};

/// One value and where it came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueOrigin {
    pub value: String,
    pub origin: String,
}

/// Template values, later layers overriding earlier ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Values {
    entries: BTreeMap<String, ValueOrigin>,
}

impl Values {
    /// Sets `key`, replacing any value from a lower layer.
    pub fn set(&mut self, key: &str, value: &str, origin: &str) {
        self.entries.insert(
            key.to_owned(),
            ValueOrigin {
                value: value.to_owned(),
                origin: origin.to_owned(),
            },
        );
    }

    pub fn get(&self, key: &str) -> Option<&ValueOrigin> {
        self.entries.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
}

/// A line of a `.ccv` file that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ValuesFileError {
    pub line: usize,
    pub message: String,
}

/// Reads a `.ccv` file into `(key, value)` pairs, in file order.
pub fn parse_values_file(text: &str) -> Result<Vec<(String, String)>, ValuesFileError> {
    let mut pairs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let error = |message: String| ValuesFileError {
            line: index + 1,
            message,
        };
        let Some((key, value)) = line.split_once('=') else {
            return Err(error("expected `key = value`".to_owned()));
        };
        let key = key.trim();
        if !is_value_key(key) {
            return Err(error(format!(
                "`{key}` is not a valid key (letters, digits, `_`, `-`, `.`)"
            )));
        }
        let value = value.trim();
        let value = if value.starts_with('"') && value.len() >= 2 && value.ends_with('"') {
            decode_string(value).map_err(|e| error(e.message))?
        } else {
            value.to_owned()
        };
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

fn is_value_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A `{{ ... }}` found in some text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placeholder {
    /// Byte range of the whole `{{ ... }}` in the scanned text.
    pub start: usize,
    pub end: usize,
    /// The key after `values.`, or why the placeholder is malformed.
    pub key: Result<String, String>,
}

/// Every placeholder in `text`, skipping `\{` escapes.
pub fn placeholders(text: &str) -> Vec<Placeholder> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at + 1 < bytes.len() {
        if bytes[at] == b'\\' {
            at += 2;
            continue;
        }
        if bytes[at] == b'{' && bytes[at + 1] == b'{' {
            let Some(close) = text[at + 2..].find("}}") else {
                break;
            };
            let end = at + 2 + close + 2;
            let inner = &text[at + 2..end - 2];
            found.push(Placeholder {
                start: at,
                end,
                key: placeholder_key(inner),
            });
            at = end;
            continue;
        }
        at += 1;
    }
    found
}

fn placeholder_key(inner: &str) -> Result<String, String> {
    let inner = inner.trim();
    match inner.strip_prefix("values.") {
        Some(key) if is_value_key(key) => Ok(key.to_owned()),
        _ => Err(format!(
            "`{{{{ {inner} }}}}` is not a placeholder; write `{{{{ values.KEY }}}}`"
        )),
    }
}

/// Replaces every placeholder in `text` (which starts at `base` in its
/// file) with its value, passing each through `escape`. Unset or malformed
/// placeholders are reported with their span.
pub fn substitute(
    text: &str,
    base: usize,
    values: &Values,
    escape: impl Fn(&str) -> String,
) -> Result<String, Vec<Diagnostic>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    let mut copied = 0;
    for placeholder in placeholders(text) {
        out.push_str(&text[copied..placeholder.start]);
        copied = placeholder.end;
        let span = Span::new(base + placeholder.start, base + placeholder.end);
        if let Some(value) = lookup(&placeholder, span, values, &mut errors) {
            out.push_str(&escape(value));
        }
    }
    out.push_str(&text[copied..]);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The value of a placeholder; a malformed or unset one is added to `errors`.
fn lookup<'v>(
    placeholder: &Placeholder,
    span: Span,
    values: &'v Values,
    errors: &mut Vec<Diagnostic>,
) -> Option<&'v str> {
    let key = match &placeholder.key {
        Ok(key) => key,
        Err(message) => {
            errors.push(
                Diagnostic::error(codes::BAD_PLACEHOLDER, span, message.clone())
                    .with_label("malformed placeholder"),
            );
            return None;
        }
    };
    let found = values.get(key).map(|found| found.value.as_str());
    if found.is_none() {
        errors.push(unset_value(key, span, values));
    }
    found
}

fn unset_value(key: &str, span: Span, values: &Values) -> Diagnostic {
    let mut diagnostic = Diagnostic::error(
        codes::UNSET_VALUE,
        span,
        format!("value `{key}` is not set"),
    )
    .with_label(format!("`values.{key}` is used here"))
    .with_help(format!(
        "set it in NAME/values.ccv next to the file, with `--values FILE.ccv`, `--set {key}=...` or `--set-from-env {key}=ENV_VAR`"
    ));
    if let Some(close) = crate::suggest::did_you_mean(key, values.keys()) {
        diagnostic = diagnostic.with_note(format!("a value `{close}` is set: is that the one?"));
    }
    diagnostic
}

/// Escapes a value for use inside a `"..."` string.
pub fn escape_for_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '{' => out.push_str("\\{"),
            '}' => out.push_str("\\}"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            _ => out.push(c),
        }
    }
    out
}

/// How a substituted value reads in a value position: a number or a name
/// when it lexes as exactly one, otherwise a quoted string.
pub fn value_literal(value: &str) -> String {
    let (tokens, errors) = lex(value);
    let single = tokens.len() == 1
        && errors.is_empty()
        && matches!(tokens[0].kind, TokenKind::Number | TokenKind::Ident);
    if single {
        value.to_owned()
    } else {
        format!("\"{}\"", escape_for_string(value))
    }
}

/// `cca render`: the file's text with every placeholder replaced. Values in
/// value positions become literals, inside strings they are escaped, so the
/// result parses to what the compiler saw.
pub fn render(text: &str, values: &Values) -> Result<String, Vec<Diagnostic>> {
    let (tokens, _) = lex(text);
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    for token in tokens {
        let raw = text.get(token.span.range()).unwrap_or_default();
        let base = token.span.start as usize;
        let expanded = match token.kind {
            TokenKind::Template => substitute(raw, base, values, value_literal),
            TokenKind::String => substitute(raw, base, values, escape_for_string),
            TokenKind::TripleString => substitute(raw, base, values, str::to_owned),
            _ => Ok(raw.to_owned()),
        };
        match expanded {
            Ok(text) => out.push_str(&text),
            Err(found) => errors.extend(found),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> Values {
        let mut values = Values::default();
        for (key, value) in pairs {
            values.set(key, value, "test");
        }
        values
    }

    #[test]
    fn values_files_hold_bare_and_quoted_values() {
        let text = "# defaults\nport = 8080\nimage.tag = \"1.4 \\\"lts\\\"\"\n\n";
        assert_eq!(
            parse_values_file(text),
            Ok(vec![
                ("port".into(), "8080".into()),
                ("image.tag".into(), "1.4 \"lts\"".into())
            ])
        );
        let err = parse_values_file("ok = 1\nbroken\n").expect_err("no =");
        assert_eq!(err.to_string(), "line 2: expected `key = value`");
    }

    #[test]
    fn render_expands_values_and_strings() {
        let text = "replicas = {{ values.n }}\nrun = \"serve --port {{values.port}}\"\nimage = {{ values.image }}\n";
        let rendered = render(
            text,
            &values(&[("n", "3"), ("port", "80"), ("image", "nginx:1.27")]),
        )
        .expect("renders");
        assert_eq!(
            rendered,
            "replicas = 3\nrun = \"serve --port 80\"\nimage = \"nginx:1.27\"\n"
        );
    }

    #[test]
    fn unset_values_name_the_key_and_place() {
        let errors = render("a = {{ values.prot }}", &values(&[("port", "1")])).expect_err("unset");
        assert_eq!(errors[0].message, "value `prot` is not set");
        assert_eq!(errors[0].span, Span::new(4, 21));
        assert_eq!(errors[0].notes, ["a value `port` is set: is that the one?"]);
    }

    #[test]
    fn escaped_braces_are_not_placeholders() {
        assert!(placeholders(r"\{{ values.x }}").is_empty());
        assert!(placeholders("{{ other }}")[0].key.is_err());
    }
}
