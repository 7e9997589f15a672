//! The recursive-descent parser: tokens to a lossless tree. Each entry ends
//! at a newline, `;` or `}`; after an error the parser skips to the end of
//! the line (never past a `}`), so one run reports every error in a file.
//! Nesting beyond [`MAX_DEPTH`] is reported and skipped without recursion.

use super::{MAX_DEPTH, NodeKind, SyntaxElement, SyntaxNode, Token, TokenKind};
use crate::diagnostic::{Diagnostic, Span, codes};

/// Builds the tree for `tokens` (which cover `text`).
pub(super) fn parse_tokens(text: &str, tokens: &[Token]) -> (SyntaxNode, Vec<Diagnostic>) {
    let mut parser = Parser {
        text,
        tokens,
        pos: 0,
        depth: 0,
        errors: Vec::new(),
    };
    let root = parser.file();
    (root, parser.errors)
}

struct Parser<'t> {
    text: &'t str,
    tokens: &'t [Token],
    pos: usize,
    depth: usize,
    errors: Vec<Diagnostic>,
}

type Children = Vec<SyntaxElement>;

impl Parser<'_> {
    fn file(&mut self) -> SyntaxNode {
        let mut children = Children::new();
        while let Some(kind) = self.peek_raw() {
            match kind {
                TokenKind::Ident => children.push(self.entry()),
                TokenKind::RBrace => {
                    let token = self.tokens[self.pos];
                    self.error(
                        Diagnostic::error(codes::UNMATCHED_CLOSE, token.span, "unmatched `}`")
                            .with_label("no block is open here"),
                    );
                    children.push(self.error_node_of_one());
                }
                kind if is_separator(kind) || kind.is_trivia() => children.push(self.bump()),
                kind => children.push(self.skip_line(kind, "a key")),
            }
        }
        SyntaxNode::new(NodeKind::File, children, 0)
    }

    /// `key value... [block]` or `key = value`.
    fn entry(&mut self) -> SyntaxElement {
        let start = self.offset();
        let mut children = Vec::with_capacity(8);
        children.push(self.bump());
        self.eat_whitespace(&mut children);
        if self.peek_raw() == Some(TokenKind::Eq) {
            children.push(self.bump());
            self.eat_whitespace(&mut children);
            match self.peek_raw() {
                Some(kind) if starts_value(kind) => children.push(self.value()),
                found => self.expected_value_after_eq(found),
            }
            return node(NodeKind::Entry, children, start);
        }
        loop {
            match self.peek_raw() {
                Some(kind) if starts_value(kind) => children.push(self.value()),
                Some(TokenKind::LBrace) => {
                    children.push(self.block());
                    break;
                }
                Some(TokenKind::Eq) => {
                    let span = self.tokens[self.pos].span;
                    self.error(
                        Diagnostic::error(codes::UNEXPECTED_TOKEN, span, "unexpected `=`")
                            .with_label("`=` may only follow the key")
                            .with_help("write `key = value`, or `key value...` without `=`"),
                    );
                    children.push(self.error_node_of_one());
                }
                Some(TokenKind::RBracket | TokenKind::Comma) => {
                    children.push(
                        self.skip_line(TokenKind::Comma, "a value, `{` or the end of the line"),
                    );
                }
                _ => break,
            }
            self.eat_whitespace(&mut children);
        }
        node(NodeKind::Entry, children, start)
    }

    fn expected_value_after_eq(&mut self, found: Option<TokenKind>) {
        if found == Some(TokenKind::Unknown) {
            return;
        }
        let span = self.current_span();
        let found = found.map_or("the end of the file", TokenKind::describe);
        self.error(
            Diagnostic::error(
                codes::UNEXPECTED_TOKEN,
                span,
                format!("expected a value after `=`, found {found}"),
            )
            .with_label("a value belongs here"),
        );
    }

    /// One value: a token, a list or `from "path"`.
    fn value(&mut self) -> SyntaxElement {
        match self.peek_raw() {
            Some(TokenKind::LBracket) => self.list(),
            Some(TokenKind::Ident) if self.is_from() => self.from(),
            _ => self.bump(),
        }
    }

    fn is_from(&self) -> bool {
        let token = self.tokens[self.pos];
        if self.text.get(token.span.range()) != Some("from") {
            return false;
        }
        let next = self.tokens[self.pos + 1..]
            .iter()
            .find(|t| t.kind != TokenKind::Whitespace);
        next.is_some_and(|t| matches!(t.kind, TokenKind::String | TokenKind::TripleString))
    }

    fn from(&mut self) -> SyntaxElement {
        let start = self.offset();
        let mut children = vec![self.bump()];
        self.eat_whitespace(&mut children);
        children.push(self.bump());
        node(NodeKind::From, children, start)
    }

    /// `{ entries }`.
    fn block(&mut self) -> SyntaxElement {
        if self.depth >= MAX_DEPTH {
            return self.too_deep();
        }
        self.depth += 1;
        let start = self.offset();
        let open = self.tokens[self.pos].span;
        let mut children = Vec::with_capacity(16);
        children.push(self.bump());
        loop {
            match self.peek_raw() {
                None => {
                    self.unclosed(open, "block", "`}`");
                    break;
                }
                Some(TokenKind::RBrace) => {
                    children.push(self.bump());
                    break;
                }
                Some(TokenKind::Ident) => children.push(self.entry()),
                Some(kind) if is_separator(kind) || kind.is_trivia() => {
                    children.push(self.bump());
                }
                Some(kind) => children.push(self.skip_line(kind, "a key or `}`")),
            }
        }
        self.depth -= 1;
        node(NodeKind::Block, children, start)
    }

    /// `[a, b, c]`, over several lines if need be.
    fn list(&mut self) -> SyntaxElement {
        if self.depth >= MAX_DEPTH {
            return self.too_deep();
        }
        self.depth += 1;
        let start = self.offset();
        let open = self.tokens[self.pos].span;
        let mut children = vec![self.bump()];
        loop {
            match self.peek_raw() {
                None | Some(TokenKind::RBrace | TokenKind::LBrace) => {
                    self.unclosed(open, "list", "`]`");
                    break;
                }
                Some(TokenKind::RBracket) => {
                    children.push(self.bump());
                    break;
                }
                Some(kind) if starts_value(kind) => children.push(self.value()),
                Some(kind) if kind.is_trivia() || kind == TokenKind::Newline => {
                    children.push(self.bump());
                }
                Some(TokenKind::Comma) => children.push(self.bump()),
                Some(kind) => {
                    let span = self.tokens[self.pos].span;
                    self.error(
                        Diagnostic::error(
                            codes::UNEXPECTED_TOKEN,
                            span,
                            format!("expected a list item or `]`, found {}", kind.describe()),
                        )
                        .with_label("not a value"),
                    );
                    children.push(self.error_node_of_one());
                }
            }
        }
        self.depth -= 1;
        node(NodeKind::List, children, start)
    }

    fn unclosed(&mut self, open: Span, what: &str, closer: &str) {
        let at = self.current_span();
        self.error(
            Diagnostic::error(
                codes::UNCLOSED_DELIMITER,
                at,
                format!("this {what} is never closed"),
            )
            .with_label(format!("expected {closer} here"))
            .with_secondary(open, format!("the {what} opens here")),
        );
    }

    /// Reports nesting beyond the limit, then skips the balanced run of
    /// brackets iteratively.
    fn too_deep(&mut self) -> SyntaxElement {
        let start = self.offset();
        let span = self.tokens[self.pos].span;
        self.error(
            Diagnostic::error(
                codes::NESTING_TOO_DEEP,
                span,
                format!("blocks and lists nest more than {MAX_DEPTH} levels deep"),
            )
            .with_label("the limit is reached here")
            .with_help("flatten the structure; nothing this deep is meaningful"),
        );
        let mut children = Children::new();
        let mut open = 0usize;
        while let Some(kind) = self.peek_raw() {
            match kind {
                TokenKind::LBrace | TokenKind::LBracket => open += 1,
                TokenKind::RBrace | TokenKind::RBracket => open = open.saturating_sub(1),
                _ => {}
            }
            children.push(self.bump());
            if open == 0 {
                break;
            }
        }
        node(NodeKind::Error, children, start)
    }

    /// Reports `found` and skips to the end of the line (not past `}`).
    fn skip_line(&mut self, found: TokenKind, expected: &str) -> SyntaxElement {
        let start = self.offset();
        let span = self.current_span();
        let message = format!("expected {expected}, found {}", found.describe());
        let mut diagnostic =
            Diagnostic::error(codes::UNEXPECTED_TOKEN, span, message).with_label("unexpected here");
        if starts_value(found) {
            diagnostic = diagnostic.with_help(
                "an entry is `key value...` or `key = value` (which takes exactly one value)",
            );
        }
        // The lexer has already reported unknown characters.
        if found != TokenKind::Unknown {
            self.error(diagnostic);
        }
        let mut children = Children::new();
        while let Some(kind) = self.peek_raw() {
            if matches!(
                kind,
                TokenKind::Newline | TokenKind::RBrace | TokenKind::Semicolon
            ) {
                break;
            }
            children.push(self.bump());
        }
        node(NodeKind::Error, children, start)
    }

    fn error_node_of_one(&mut self) -> SyntaxElement {
        let start = self.offset();
        let token = self.bump();
        node(NodeKind::Error, vec![token], start)
    }

    fn eat_whitespace(&mut self, children: &mut Children) {
        while self.peek_raw() == Some(TokenKind::Whitespace) {
            children.push(self.bump());
        }
    }

    fn peek_raw(&self) -> Option<TokenKind> {
        self.tokens.get(self.pos).map(|t| t.kind)
    }

    fn bump(&mut self) -> SyntaxElement {
        let token = self.tokens[self.pos];
        self.pos += 1;
        SyntaxElement::Token(token)
    }

    fn offset(&self) -> usize {
        self.tokens
            .get(self.pos)
            .map_or(self.text.len(), |t| t.span.start as usize)
    }

    /// The current token's span, or an empty span at the end of the file.
    fn current_span(&self) -> Span {
        self.tokens
            .get(self.pos)
            .map_or(Span::new(self.text.len(), self.text.len()), |t| t.span)
    }

    fn error(&mut self, diagnostic: Diagnostic) {
        self.errors.push(diagnostic);
    }
}

fn node(kind: NodeKind, children: Children, at: usize) -> SyntaxElement {
    SyntaxElement::Node(Box::new(SyntaxNode::new(kind, children, at)))
}

fn is_separator(kind: TokenKind) -> bool {
    matches!(kind, TokenKind::Newline | TokenKind::Semicolon)
}

fn starts_value(kind: TokenKind) -> bool {
    matches!(
        kind,
        TokenKind::Ident
            | TokenKind::Number
            | TokenKind::String
            | TokenKind::TripleString
            | TokenKind::Template
            | TokenKind::LBracket
            | TokenKind::Arrow
            | TokenKind::Star
    )
}

#[cfg(test)]
mod tests {
    use crate::syntax::{MAX_DEPTH, parse};

    #[test]
    fn every_error_in_a_file_is_reported() {
        let text = "service a {\n  image = \n  port http 80 ]\n}\n}\n= 3\n";
        let parsed = parse(text);
        let messages: Vec<&str> = parsed.errors.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "expected a value after `=`, found end of line",
                "expected a value, `{` or the end of the line, found `,`",
                "unmatched `}`",
                "expected a key, found `=`",
            ]
        );
        assert_eq!(parsed.root.text(text), text);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let text = format!("{}{}", "a {".repeat(10_000), "}".repeat(10_000));
        let parsed = parse(&text);
        assert_eq!(parsed.errors.len(), 1);
        assert!(parsed.errors[0].message.contains(&MAX_DEPTH.to_string()));
        assert_eq!(parsed.root.text(&text), text);
        let lists = format!("a {}", "[".repeat(10_000));
        let parsed = parse(&lists);
        assert!(!parsed.errors.is_empty());
    }

    #[test]
    fn unclosed_block_points_at_its_opening() {
        let parsed = parse("service a {\n image = \"x\"\n");
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(parsed.errors[0].message, "this block is never closed");
        assert_eq!(parsed.errors[0].labels[0].span.start, 10);
    }
}
