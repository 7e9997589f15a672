//! The lossless syntax tree of a `.cca` file. Every byte of the input,
//! comments and whitespace included, belongs to exactly one token, and every
//! token to exactly one node, so printing the tokens in order gives back the
//! input. [`parse`] never fails: it returns a tree and the errors it found.

mod lexer;
mod parser;

use serde::Serialize;

use crate::diagnostic::{Diagnostic, Span, codes};

pub use lexer::{Token, lex};

/// What a token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum TokenKind {
    /// Spaces, tabs and carriage returns.
    Whitespace,
    Newline,
    /// `# ...` up to the end of the line.
    Comment,
    /// A name: a letter or `_`, then letters, digits, `_` and `-`.
    Ident,
    /// Digits with an optional fraction and unit: `8080`, `500m`, `70%`.
    Number,
    /// `"..."` with backslash escapes.
    String,
    /// `"""..."""`, raw and possibly multi-line.
    TripleString,
    /// `{{ values.key }}` in a value position.
    Template,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    Eq,
    Semicolon,
    /// `->` in network rules.
    Arrow,
    /// `*` in network rules.
    Star,
    /// A character that starts no token.
    Unknown,
}

impl TokenKind {
    /// Whitespace and comments: kept in the tree, ignored by the grammar.
    pub fn is_trivia(self) -> bool {
        matches!(self, TokenKind::Whitespace | TokenKind::Comment)
    }

    /// How diagnostics name the token.
    pub fn describe(self) -> &'static str {
        match self {
            TokenKind::Whitespace => "whitespace",
            TokenKind::Newline => "end of line",
            TokenKind::Comment => "a comment",
            TokenKind::Ident => "a name",
            TokenKind::Number => "a number",
            TokenKind::String | TokenKind::TripleString => "a string",
            TokenKind::Template => "a placeholder",
            TokenKind::LBrace => "`{`",
            TokenKind::RBrace => "`}`",
            TokenKind::LBracket => "`[`",
            TokenKind::RBracket => "`]`",
            TokenKind::Comma => "`,`",
            TokenKind::Eq => "`=`",
            TokenKind::Semicolon => "`;`",
            TokenKind::Arrow => "`->`",
            TokenKind::Star => "`*`",
            TokenKind::Unknown => "an unknown character",
        }
    }
}

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum NodeKind {
    /// The whole file: entries, separated by newlines or `;`.
    File,
    /// `key value...`, `key = value` or `key value... { ... }`.
    Entry,
    /// `{ entries }`.
    Block,
    /// `[value, ...]`.
    List,
    /// `from "path"`: the contents of a file, as a value.
    From,
    /// Tokens the parser could not place; an error was reported for them.
    Error,
}

/// A leaf of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntaxToken {
    pub kind: TokenKind,
    pub span: Span,
}

/// An inner node of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxNode {
    pub kind: NodeKind,
    pub span: Span,
    pub children: Vec<SyntaxElement>,
}

/// A child of a node. Nodes are boxed so an element is 16 bytes: tokens
/// far outnumber nodes, and small children lists keep walks cache-friendly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyntaxElement {
    Node(Box<SyntaxNode>),
    Token(SyntaxToken),
}

impl SyntaxElement {
    pub fn span(&self) -> Span {
        match self {
            SyntaxElement::Node(node) => node.span,
            SyntaxElement::Token(token) => token.span,
        }
    }
}

impl SyntaxNode {
    /// A node whose span covers its children (or is empty at `at`).
    pub fn new(kind: NodeKind, children: Vec<SyntaxElement>, at: usize) -> SyntaxNode {
        let span = match (children.first(), children.last()) {
            (Some(first), Some(last)) => first.span().cover(last.span()),
            _ => Span::new(at, at),
        };
        SyntaxNode {
            kind,
            span,
            children,
        }
    }

    pub fn child_nodes(&self) -> impl Iterator<Item = &SyntaxNode> {
        self.children.iter().filter_map(|child| match child {
            SyntaxElement::Node(node) => Some(&**node),
            SyntaxElement::Token(_) => None,
        })
    }

    pub fn child_tokens(&self) -> impl Iterator<Item = &SyntaxToken> {
        self.children.iter().filter_map(|child| match child {
            SyntaxElement::Token(token) => Some(token),
            SyntaxElement::Node(_) => None,
        })
    }

    /// Whether any node below (or this one) is an error node.
    pub fn has_errors(&self) -> bool {
        self.kind == NodeKind::Error || self.child_nodes().any(SyntaxNode::has_errors)
    }

    /// The source text this node covers, rebuilt from its tokens.
    pub fn text(&self, source: &str) -> String {
        let mut out = String::new();
        self.write_text(source, &mut out);
        out
    }

    fn write_text(&self, source: &str, out: &mut String) {
        for child in &self.children {
            match child {
                SyntaxElement::Node(node) => node.write_text(source, out),
                SyntaxElement::Token(token) => {
                    out.push_str(source.get(token.span.range()).unwrap_or_default());
                }
            }
        }
    }

    /// An indented outline of the tree with spans and token texts, for
    /// snapshot tests and `--debug` output.
    pub fn debug_tree(&self, source: &str) -> String {
        let mut out = String::new();
        self.write_debug(source, 0, &mut out);
        out
    }

    fn write_debug(&self, source: &str, depth: usize, out: &mut String) {
        let indent = "  ".repeat(depth);
        out.push_str(&format!(
            "{indent}{:?}@{}..{}\n",
            self.kind, self.span.start, self.span.end
        ));
        for child in &self.children {
            match child {
                SyntaxElement::Node(node) => node.write_debug(source, depth + 1, out),
                SyntaxElement::Token(token) => {
                    let text = source.get(token.span.range()).unwrap_or_default();
                    out.push_str(&format!(
                        "{indent}  {:?}@{}..{} {:?}\n",
                        token.kind, token.span.start, token.span.end, text
                    ));
                }
            }
        }
    }

    /// The tree's shape without trivia, newlines and separators: what the
    /// formatter must never change.
    pub fn shape(&self, source: &str) -> String {
        let mut out = String::new();
        self.write_shape(source, 0, &mut out);
        out
    }

    fn write_shape(&self, source: &str, depth: usize, out: &mut String) {
        let indent = "  ".repeat(depth);
        out.push_str(&format!("{indent}{:?}\n", self.kind));
        for child in &self.children {
            match child {
                SyntaxElement::Node(node) => node.write_shape(source, depth + 1, out),
                SyntaxElement::Token(token) if is_layout(token.kind) => {}
                SyntaxElement::Token(token) => {
                    let mut text = source.get(token.span.range()).unwrap_or_default();
                    if token.kind == TokenKind::Comment {
                        text = text.trim_end();
                    }
                    out.push_str(&format!("{indent}  {:?} {text:?}\n", token.kind));
                }
            }
        }
    }
}

/// Tokens whose placement is layout, not meaning.
fn is_layout(kind: TokenKind) -> bool {
    matches!(
        kind,
        TokenKind::Whitespace
            | TokenKind::Newline
            | TokenKind::Semicolon
            | TokenKind::Comma
            | TokenKind::Eq
    )
}

/// The result of parsing one file.
#[derive(Clone, Debug)]
pub struct Parse {
    pub root: SyntaxNode,
    pub errors: Vec<Diagnostic>,
}

/// Blocks and lists may nest this deep; deeper input is reported (not
/// followed), so a hostile file cannot overflow the stack.
pub const MAX_DEPTH: usize = 128;

/// At most this many syntax errors are kept per file: past that, a file
/// is not worth reading error by error (binary garbage, a wrong file).
pub const MAX_ERRORS: usize = 100;

/// Parses `text` into a lossless tree. Never fails and never panics.
pub fn parse(text: &str) -> Parse {
    let (tokens, mut errors) = lex(text);
    let (root, parse_errors) = parser::parse_tokens(text, &tokens);
    errors.extend(parse_errors);
    errors.sort_by_key(|e| (e.span.start, e.span.end));
    if errors.len() > MAX_ERRORS {
        let dropped = errors.len() - MAX_ERRORS;
        let at = errors[MAX_ERRORS].span;
        errors.truncate(MAX_ERRORS);
        errors.push(
            Diagnostic::error(
                codes::TOO_MANY_ERRORS,
                at,
                format!("{dropped} more syntax errors not shown"),
            )
            .with_label("stopped reporting here")
            .with_help("is this a .cca file?"),
        );
    }
    Parse { root, errors }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_text_is_the_input() {
        let text = "service web { # c\n  image = \"x\"\n port http 80 }\n}\n[ \u{1}";
        let parsed = parse(text);
        assert_eq!(parsed.root.text(text), text);
        assert!(!parsed.errors.is_empty());
    }

    #[test]
    fn shape_ignores_layout() {
        let a = parse("a = 1\nb [x, y]\n");
        let b = parse("a 1;  b [x,y]");
        assert_eq!(
            a.root.shape("a = 1\nb [x, y]\n"),
            b.root.shape("a 1;  b [x,y]")
        );
    }
}
