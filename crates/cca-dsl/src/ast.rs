//! A typed view over the syntax tree: files hold entries, entries have a
//! key, values and maybe a block. Views borrow the tree and the source
//! text; they never allocate a second tree. String literals are decoded
//! here too (escapes, triple-quoted indentation).

use crate::diagnostic::Span;
use crate::syntax::{NodeKind, SyntaxElement, SyntaxNode, TokenKind};

/// The root of a parsed file.
#[derive(Clone, Copy, Debug)]
pub struct File<'a> {
    pub source: &'a str,
    pub node: &'a SyntaxNode,
}

/// `key value...`, `key = value` or `key value... { ... }`.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub source: &'a str,
    pub node: &'a SyntaxNode,
}

/// `{ entries }`.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    pub source: &'a str,
    pub node: &'a SyntaxNode,
}

/// One value of an entry.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    /// A single token: name, number, string, placeholder, `*` or `->`.
    Token {
        kind: TokenKind,
        span: Span,
        text: &'a str,
    },
    /// `[a, b]`.
    List { span: Span, items: ListItems<'a> },
    /// `from "path"`; `path` is the string token.
    From {
        span: Span,
        path: Span,
        raw: &'a str,
    },
}

/// The items of a list value.
#[derive(Clone, Copy, Debug)]
pub struct ListItems<'a> {
    pub source: &'a str,
    pub node: &'a SyntaxNode,
}

impl<'a> File<'a> {
    pub fn new(source: &'a str, node: &'a SyntaxNode) -> File<'a> {
        File { source, node }
    }

    pub fn entries(self) -> impl Iterator<Item = Entry<'a>> {
        entries_of(self.source, self.node)
    }
}

impl<'a> Block<'a> {
    pub fn entries(self) -> impl Iterator<Item = Entry<'a>> {
        entries_of(self.source, self.node)
    }

    pub fn span(self) -> Span {
        self.node.span
    }
}

fn entries_of<'a>(source: &'a str, node: &'a SyntaxNode) -> impl Iterator<Item = Entry<'a>> {
    node.child_nodes()
        .filter(|child| child.kind == NodeKind::Entry)
        .map(move |child| Entry {
            source,
            node: child,
        })
}

impl<'a> Entry<'a> {
    /// The key token's span (the first child of every entry).
    pub fn key_span(self) -> Span {
        self.node
            .children
            .first()
            .map_or(self.node.span, SyntaxElement::span)
    }

    pub fn key(self) -> &'a str {
        self.source.get(self.key_span().range()).unwrap_or_default()
    }

    pub fn span(self) -> Span {
        self.node.span
    }

    /// Whether the entry was written `key = value`.
    pub fn has_eq(self) -> bool {
        self.node.child_tokens().any(|t| t.kind == TokenKind::Eq)
    }

    /// The values after the key (and `=`), before any block.
    pub fn values(self) -> Vec<Value<'a>> {
        self.node
            .children
            .iter()
            .skip(1)
            .filter_map(|child| element_value(self.source, child))
            .collect()
    }

    pub fn block(self) -> Option<Block<'a>> {
        self.node
            .child_nodes()
            .find(|child| child.kind == NodeKind::Block)
            .map(|node| Block {
                source: self.source,
                node,
            })
    }
}

/// The value a tree element stands for, if it is one.
pub fn element_value<'a>(source: &'a str, element: &'a SyntaxElement) -> Option<Value<'a>> {
    match element {
        SyntaxElement::Token(token) => {
            let is_value = !token.kind.is_trivia()
                && !matches!(
                    token.kind,
                    TokenKind::Eq
                        | TokenKind::Comma
                        | TokenKind::Newline
                        | TokenKind::Semicolon
                        | TokenKind::Unknown
                );
            is_value.then(|| Value::Token {
                kind: token.kind,
                span: token.span,
                text: source.get(token.span.range()).unwrap_or_default(),
            })
        }
        SyntaxElement::Node(node) => match node.kind {
            NodeKind::List => Some(Value::List {
                span: node.span,
                items: ListItems { source, node },
            }),
            NodeKind::From => {
                let path = node.child_tokens().last()?;
                Some(Value::From {
                    span: node.span,
                    path: path.span,
                    raw: source.get(path.span.range()).unwrap_or_default(),
                })
            }
            _ => None,
        },
    }
}

impl<'a> ListItems<'a> {
    pub fn iter(self) -> impl Iterator<Item = Value<'a>> {
        let source = self.source;
        self.node
            .children
            .iter()
            .filter_map(move |child| element_value(source, child))
            .filter(|value| {
                !matches!(
                    value,
                    Value::Token {
                        kind: TokenKind::LBracket | TokenKind::RBracket,
                        ..
                    }
                )
            })
    }
}

impl Value<'_> {
    pub fn span(&self) -> Span {
        match self {
            Value::Token { span, .. } | Value::List { span, .. } | Value::From { span, .. } => {
                *span
            }
        }
    }

    /// How diagnostics name the value.
    pub fn describe(&self) -> &'static str {
        match self {
            Value::Token { kind, .. } => kind.describe(),
            Value::List { .. } => "a list",
            Value::From { .. } => "a file inclusion",
        }
    }
}

/// A string literal that could not be decoded: byte offset (within the
/// token) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscapeError {
    pub offset: usize,
    pub message: String,
}

/// Decodes a `"..."` or `"""..."""` token's text to its value.
pub fn decode_string(raw: &str) -> Result<String, EscapeError> {
    if let Some(inner) = raw.strip_prefix("\"\"\"") {
        let inner = inner.strip_suffix("\"\"\"").unwrap_or(inner);
        return Ok(trim_indent(inner));
    }
    let inner = raw.strip_prefix('"').unwrap_or(raw);
    let inner = inner.strip_suffix('"').unwrap_or(inner);
    unescape(inner)
}

fn unescape(inner: &str) -> Result<String, EscapeError> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.char_indices();
    while let Some((at, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next().map(|(_, e)| e) {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some(e @ ('\\' | '"' | '{' | '}')) => out.push(e),
            other => {
                let shown = other.map_or(String::new(), String::from);
                return Err(EscapeError {
                    offset: at + 1,
                    message: format!("unknown escape `\\{shown}`"),
                });
            }
        }
    }
    Ok(out)
}

/// Triple-quoted text: a blank first and last line are dropped and the
/// common indentation of the other lines removed, so the text can be
/// indented with the file.
pub fn trim_indent(inner: &str) -> String {
    let mut lines: Vec<&str> = inner.split('\n').collect();
    if lines.len() > 1 && lines.first().is_some_and(|l| l.trim().is_empty()) {
        lines.remove(0);
    }
    if lines.len() > 1 && lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    let indent = lines
        .iter()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.len() - line.trim_start_matches([' ', '\t']).len())
        .min()
        .unwrap_or(0);
    let trimmed: Vec<&str> = lines
        .iter()
        .map(|line| line.get(indent..).unwrap_or_else(|| line.trim_start()))
        .collect();
    trimmed.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::parse;

    #[test]
    fn entries_expose_key_values_and_block() {
        let text = "service web {\n  port http 8080\n  image = \"x\"\n}\n";
        let parsed = parse(text);
        let file = File::new(text, &parsed.root);
        let service = file.entries().next().expect("one entry");
        assert_eq!(service.key(), "service");
        let inner: Vec<_> = service.block().expect("block").entries().collect();
        assert_eq!(inner[0].key(), "port");
        assert_eq!(inner[0].values().len(), 2);
        assert!(inner[1].has_eq());
    }

    #[test]
    fn strings_decode_escapes_and_triple_quote_indentation() {
        assert_eq!(decode_string(r#""a\"b\n""#), Ok("a\"b\n".to_owned()));
        assert_eq!(decode_string(r#""\{{ x }}""#), Ok("{{ x }}".to_owned()));
        assert_eq!(
            decode_string("\"\"\"\n    one\n      two\n    \"\"\""),
            Ok("one\n  two".to_owned())
        );
        assert_eq!(
            decode_string(r#""\q""#),
            Err(EscapeError {
                offset: 1,
                message: "unknown escape `\\q`".into()
            })
        );
    }
}
