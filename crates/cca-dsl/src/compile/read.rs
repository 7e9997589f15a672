//! Reading values: each syntax value becomes a [`Scalar`] (placeholders
//! substituted, strings decoded, `from` files read), then typed readers turn
//! scalars into names, text, counts, ports and quantities, reporting a
//! precise error when the value has the wrong shape.

use std::collections::BTreeMap;

use cca_model::spec::QuantityError;
use cca_model::validity::{NAME_HELP, SERVICE_NAME_HELP, is_service_name, is_valid_name};

use super::Compiler;
use crate::ast::{Block, Entry, Value, decode_string};
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::schema::{self, Context, Form};
use crate::suggest::did_you_mean;
use crate::syntax::{NodeKind, SyntaxElement, TokenKind, lex};
use crate::template::{escape_for_string, substitute};

/// A value with templates and strings resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scalar {
    Name(String),
    Number(String),
    Text(String),
    Star,
    Arrow,
    List(Vec<Spanned>),
}

/// A scalar and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spanned {
    pub value: Scalar,
    pub span: Span,
}

impl Scalar {
    fn describe(&self) -> &'static str {
        match self {
            Scalar::Name(_) => "a name",
            Scalar::Number(_) => "a number",
            Scalar::Text(_) => "a string",
            Scalar::Star => "`*`",
            Scalar::Arrow => "`->`",
            Scalar::List(_) => "a list",
        }
    }
}

impl Compiler<'_> {
    /// Resolves one value; errors are reported and give `None`.
    pub(crate) fn scalar(&mut self, value: &Value<'_>) -> Option<Spanned> {
        let span = value.span();
        let scalar = match value {
            Value::Token { kind, text, span } => self.token_scalar(*kind, text, *span)?,
            Value::List { items, .. } => {
                let mut resolved = Vec::new();
                for item in items.iter() {
                    resolved.push(self.scalar(&item)?);
                }
                Scalar::List(resolved)
            }
            Value::From { span, .. } => Scalar::Text(self.inclusion(span.start)?.to_owned()),
        };
        Some(Spanned {
            value: scalar,
            span,
        })
    }

    fn token_scalar(&mut self, kind: TokenKind, text: &str, span: Span) -> Option<Scalar> {
        let base = span.start as usize;
        match kind {
            TokenKind::Ident => Some(Scalar::Name(text.to_owned())),
            TokenKind::Number => Some(Scalar::Number(text.to_owned())),
            TokenKind::Star => Some(Scalar::Star),
            TokenKind::Arrow => Some(Scalar::Arrow),
            TokenKind::String => {
                let expanded = self.expand(text, base, escape_for_string)?;
                self.decode(&expanded, span).map(Scalar::Text)
            }
            TokenKind::TripleString => {
                let expanded = self.expand(text, base, str::to_owned)?;
                self.decode(&expanded, span).map(Scalar::Text)
            }
            TokenKind::Template => {
                let value = self.expand(text, base, str::to_owned)?;
                Some(classify(value))
            }
            _ => None,
        }
    }

    fn expand(&mut self, text: &str, base: usize, escape: fn(&str) -> String) -> Option<String> {
        match substitute(text, base, self.values, escape) {
            Ok(expanded) => Some(expanded),
            Err(errors) => {
                for error in errors {
                    self.report(error);
                }
                None
            }
        }
    }

    fn decode(&mut self, raw: &str, span: Span) -> Option<String> {
        match decode_string(raw) {
            Ok(text) => Some(text),
            Err(error) => {
                self.report(
                    Diagnostic::error(codes::INVALID_ESCAPE, span, error.message)
                        .with_help("escapes are \\n \\t \\r \\0 \\\\ \\\" \\{ \\}"),
                );
                None
            }
        }
    }

    /// All values of an entry, resolved. An entry with a syntax error
    /// gives `None` silently: the parser has reported it already.
    pub(crate) fn scalars(&mut self, entry: Entry<'_>) -> Option<Vec<Spanned>> {
        if is_broken(entry) {
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        for value in entry.values() {
            match self.scalar(&value) {
                Some(scalar) => out.push(scalar),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// The one value of a setting.
    pub(crate) fn single(&mut self, entry: Entry<'_>) -> Option<Spanned> {
        let values = self.scalars(entry)?;
        if values.len() != 1 {
            let found = values.len();
            self.report(
                Diagnostic::error(
                    codes::WRONG_ARITY,
                    entry.span(),
                    format!("`{}` takes one value, found {found}", entry.key()),
                )
                .with_label("expected exactly one value"),
            );
            return None;
        }
        values.into_iter().next()
    }

    pub(crate) fn wrong_type(&mut self, value: &Spanned, expected: &str) {
        self.report(
            Diagnostic::error(
                codes::WRONG_TYPE,
                value.span,
                format!("expected {expected}, found {}", value.value.describe()),
            )
            .with_label(format!("expected {expected}")),
        );
    }

    /// A string (a bare name is accepted as text too).
    pub(crate) fn text_of(&mut self, value: &Spanned) -> Option<String> {
        match &value.value {
            Scalar::Text(text) | Scalar::Name(text) => Some(text.clone()),
            _ => {
                self.wrong_type(value, "a string");
                None
            }
        }
    }

    /// A reference to something by name (bare or quoted).
    pub(crate) fn name_of(&mut self, value: &Spanned) -> Option<String> {
        match &value.value {
            Scalar::Name(name) | Scalar::Text(name) => {
                if is_valid_name(name) {
                    Some(name.clone())
                } else {
                    self.invalid_name(name, value.span, "name");
                    None
                }
            }
            _ => {
                self.wrong_type(value, "a name");
                None
            }
        }
    }

    pub(crate) fn invalid_name(&mut self, name: &str, span: Span, what: &str) {
        self.report(
            Diagnostic::error(
                codes::INVALID_NAME,
                span,
                format!("`{name}` is not a valid {what}"),
            )
            .with_label("invalid name")
            .with_help(if what == "service name" {
                SERVICE_NAME_HELP
            } else {
                NAME_HELP
            }),
        );
    }

    /// A whole number without a unit.
    pub(crate) fn count_of(&mut self, value: &Spanned) -> Option<u32> {
        match &value.value {
            Scalar::Number(text) if text.starts_with('-') => {
                self.report(negative(value.span, format!("`{text}` is negative")));
                None
            }
            Scalar::Number(text) => match text.parse::<u32>() {
                Ok(count) => Some(count),
                Err(_) => {
                    let message = if text.bytes().all(|b| b.is_ascii_digit()) {
                        format!("`{text}` is too large")
                    } else {
                        format!("`{text}` is not a whole number")
                    };
                    self.report(
                        Diagnostic::error(codes::WRONG_TYPE, value.span, message)
                            .with_label("expected a whole number without a unit"),
                    );
                    None
                }
            },
            _ => {
                self.wrong_type(value, "a whole number");
                None
            }
        }
    }

    /// A port number, 1 to 65535.
    pub(crate) fn port_of(&mut self, value: &Spanned) -> Option<u16> {
        let number = self.count_of(value)?;
        match u16::try_from(number) {
            Ok(port) if port > 0 => Some(port),
            _ => {
                self.report(
                    Diagnostic::error(
                        codes::OUT_OF_RANGE,
                        value.span,
                        format!("port {number} is out of range"),
                    )
                    .with_label("ports are 1 to 65535"),
                );
                None
            }
        }
    }

    /// A quantity read with one of the `cca_model::spec` parsers.
    pub(crate) fn quantity<T>(
        &mut self,
        value: &Spanned,
        what: &str,
        parse: fn(&str) -> Result<T, QuantityError>,
    ) -> Option<T> {
        let Scalar::Number(text) = &value.value else {
            self.wrong_type(value, what);
            return None;
        };
        match parse(text) {
            Ok(quantity) => Some(quantity),
            Err(error) => {
                self.report(
                    Diagnostic::error(
                        codes::INVALID_QUANTITY,
                        value.span,
                        format!("invalid {} `{text}`: {error}", without_article(what)),
                    )
                    .with_label(format!("expected {what}")),
                );
                None
            }
        }
    }

    /// A flag: `secure` (true), `secure = true` or `secure = false`.
    pub(crate) fn flag(&mut self, entry: Entry<'_>) -> Option<bool> {
        let values = self.scalars(entry)?;
        match values.as_slice() {
            [] => Some(true),
            [value] => match &value.value {
                Scalar::Name(word) if word == "true" => Some(true),
                Scalar::Name(word) if word == "false" => Some(false),
                _ => {
                    self.wrong_type(value, "`true` or `false`");
                    None
                }
            },
            _ => {
                self.report(
                    Diagnostic::error(
                        codes::WRONG_ARITY,
                        entry.span(),
                        format!(
                            "`{}` is a flag: write it alone or `= true`/`= false`",
                            entry.key()
                        ),
                    )
                    .with_label("too many values"),
                );
                None
            }
        }
    }

    pub(crate) fn setting_text(&mut self, entry: Entry<'_>) -> Option<String> {
        let value = self.single(entry)?;
        self.text_of(&value)
    }

    /// A setting whose value is one of `choices` (written exactly so).
    pub(crate) fn setting_choice<T: Copy>(
        &mut self,
        entry: Entry<'_>,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let value = self.single(entry)?;
        let text = self.text_of(&value)?;
        if let Some((_, choice)) = choices.iter().find(|(name, _)| *name == text) {
            return Some(*choice);
        }
        let expected: Vec<String> = choices
            .iter()
            .map(|(name, _)| format!("\"{name}\""))
            .collect();
        let mut diagnostic = Diagnostic::error(
            codes::WRONG_TYPE,
            value.span,
            format!("unknown `{}` value `{text}`", entry.key()),
        )
        .with_label(format!("expected {}", expected.join(" or ")));
        if let Some(close) = did_you_mean(&text, choices.iter().map(|(name, _)| *name)) {
            diagnostic = diagnostic.with_help(format!("did you mean \"{close}\"?"));
        }
        self.report(diagnostic);
        None
    }

    pub(crate) fn setting_count(&mut self, entry: Entry<'_>) -> Option<u32> {
        let value = self.single(entry)?;
        if let Scalar::Number(text) = &value.value
            && text.starts_with('-')
        {
            let message = format!(
                "`{}` must be a non-negative whole number, not `{text}`",
                entry.key()
            );
            self.report(negative(value.span, message));
            return None;
        }
        self.count_of(&value)
    }

    pub(crate) fn setting_name(&mut self, entry: Entry<'_>) -> Option<(String, Span)> {
        let value = self.single(entry)?;
        self.name_of(&value).map(|name| (name, value.span))
    }

    pub(crate) fn setting_quantity<T>(
        &mut self,
        entry: Entry<'_>,
        what: &str,
        parse: fn(&str) -> Result<T, QuantityError>,
    ) -> Option<T> {
        let value = self.single(entry)?;
        self.quantity(&value, what, parse)
    }

    /// The entries of a block that the schema knows, after reporting
    /// unknown keys, repeated settings and misplaced blocks.
    pub(crate) fn entries<'a>(
        &mut self,
        block: Option<Block<'a>>,
        context: Context,
    ) -> Vec<Entry<'a>> {
        let Some(block) = block else {
            return Vec::new();
        };
        // Blocks are small: a list beats a map here.
        let mut seen: Vec<(&'a str, Span)> = Vec::new();
        let mut known = Vec::new();
        for entry in block.entries() {
            let key = entry.key();
            let Some(spec) = schema::lookup(context, key) else {
                self.unknown_key(entry, context);
                continue;
            };
            let block = if spec.block.is_none() {
                entry.block()
            } else {
                None
            };
            if let Some(block) = block {
                self.report(
                    Diagnostic::error(
                        codes::WRONG_ARITY,
                        block.span(),
                        format!("`{key}` takes no block"),
                    )
                    .with_label("unexpected block"),
                );
                continue;
            }
            if matches!(spec.form, Form::Setting | Form::Flag) {
                if let Some(&(_, first)) = seen.iter().find(|(seen_key, _)| *seen_key == key) {
                    self.report(
                        Diagnostic::error(
                            codes::DUPLICATE_KEY,
                            entry.key_span(),
                            format!("`{key}` is set twice"),
                        )
                        .with_label("set again here")
                        .with_secondary(first, "first set here"),
                    );
                    continue;
                }
                seen.push((key, entry.key_span()));
            }
            // A block's whole span would underline every line of it.
            let at = if spec.block.is_some() {
                entry.key_span()
            } else {
                entry.span()
            };
            self.check_enforced(context, key, at);
            known.push(entry);
        }
        known
    }

    fn unknown_key(&mut self, entry: Entry<'_>, context: Context) {
        let key = entry.key();
        let mut diagnostic = Diagnostic::error(
            codes::UNKNOWN_KEY,
            entry.key_span(),
            format!("unknown key `{key}`"),
        )
        .with_label("not known here");
        if let Some(close) = did_you_mean(key, schema::names(context)) {
            diagnostic.message = format!("unknown key `{key}` — did you mean `{close}`?");
            diagnostic = diagnostic.with_help(format!("replace `{key}` with `{close}`"));
        } else if key == "from" {
            diagnostic = diagnostic.with_help(
                "`from \"file\"` includes a file only at the top level; as a value write `key = from \"file\"`",
            );
        } else {
            let known: Vec<&str> = schema::names(context).collect();
            diagnostic = diagnostic.with_help(format!("known keys: {}", known.join(", ")));
        }
        self.report(diagnostic);
    }

    /// The block an entry must have.
    pub(crate) fn block_of<'a>(&mut self, entry: Entry<'a>) -> Option<Block<'a>> {
        let block = entry.block();
        if block.is_none() {
            self.report(
                Diagnostic::error(
                    codes::WRONG_ARITY,
                    entry.span(),
                    format!("`{}` needs a block `{{ ... }}`", entry.key()),
                )
                .with_label("block expected after this"),
            );
        }
        block
    }

    /// A free-form `key = value` map (`env`, `tags`, `restrict`, `params`).
    pub(crate) fn string_map(
        &mut self,
        entry: Entry<'_>,
        context: Context,
    ) -> BTreeMap<String, String> {
        self.string_pairs(entry, context)
            .into_iter()
            .map(|(key, value, _)| (key, value))
            .collect()
    }

    /// The pairs of a free-form block with the span of each value.
    pub(crate) fn string_pairs(
        &mut self,
        entry: Entry<'_>,
        context: Context,
    ) -> Vec<(String, String, Span)> {
        let mut pairs = Vec::new();
        let block = self.block_of(entry);
        for item in self.entries(block, context) {
            let Some(value) = self.single(item) else {
                continue;
            };
            match value.value {
                Scalar::Text(text) | Scalar::Name(text) | Scalar::Number(text) => {
                    pairs.push((item.key().to_owned(), text, value.span));
                }
                _ => self.wrong_type(&value, "a string"),
            }
        }
        pairs
    }

    /// The name after a block keyword: `service web { ... }`.
    pub(crate) fn block_name(
        &mut self,
        entry: Entry<'_>,
        service_rules: bool,
    ) -> Option<(String, Span)> {
        let values = self.scalars(entry)?;
        let Some(first) = values.first().filter(|_| values.len() == 1) else {
            self.report(
                Diagnostic::error(
                    codes::WRONG_ARITY,
                    entry.key_span(),
                    format!("`{}` needs exactly one name", entry.key()),
                )
                .with_help(format!("write `{} NAME {{ ... }}`", entry.key())),
            );
            return None;
        };
        let name = match &first.value {
            Scalar::Name(name) | Scalar::Text(name) => name.clone(),
            _ => {
                self.wrong_type(first, "a name");
                return None;
            }
        };
        let valid = if service_rules {
            is_service_name(&name)
        } else {
            is_valid_name(&name)
        };
        if !valid {
            let what = if service_rules {
                "service name"
            } else {
                "name"
            };
            self.invalid_name(&name, first.span, what);
            return None;
        }
        Some((name, first.span))
    }
}

/// Whether the parser reported an error inside this entry (outside its
/// block, whose entries are checked on their own).
fn is_broken(entry: Entry<'_>) -> bool {
    let mut values = 0;
    for child in &entry.node.children {
        match child {
            SyntaxElement::Node(node) if node.kind == NodeKind::Error => return true,
            SyntaxElement::Node(node) if node.kind != NodeKind::Block && node.has_errors() => {
                return true;
            }
            SyntaxElement::Token(token) if token.kind == TokenKind::Unknown => return true,
            SyntaxElement::Token(token) if token.kind.is_trivia() => {}
            _ => values += 1,
        }
    }
    entry.has_eq() && values < 3
}

fn without_article(what: &str) -> &str {
    what.strip_prefix("a ")
        .or_else(|| what.strip_prefix("an "))
        .unwrap_or(what)
}

/// A substituted placeholder in a value position: a number or a name when
/// it reads as exactly one, otherwise text.
fn classify(value: String) -> Scalar {
    let (tokens, errors) = lex(&value);
    if tokens.len() == 1 && errors.is_empty() {
        match tokens[0].kind {
            TokenKind::Number => return Scalar::Number(value),
            TokenKind::Ident => return Scalar::Name(value),
            _ => {}
        }
    }
    Scalar::Text(value)
}

/// A negative number where a count is expected.
fn negative(span: Span, message: String) -> Diagnostic {
    Diagnostic::error(codes::WRONG_TYPE, span, message)
        .with_label("a count is never negative")
        .with_help("write a whole number from 0 up, without a sign")
}
