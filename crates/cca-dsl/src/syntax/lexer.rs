//! The lexer: text to a flat list of tokens that covers every byte. Bad
//! input becomes `Unknown` tokens or unterminated strings plus an error, so
//! the parser always has something to work with.

use super::{SyntaxToken, TokenKind};
use crate::diagnostic::{Diagnostic, Span, codes};

/// Tokens are tree leaves; the lexer hands them out directly.
pub type Token = SyntaxToken;

/// Splits `text` into tokens, reporting unknown characters and
/// unterminated strings.
pub fn lex(text: &str) -> (Vec<Token>, Vec<Diagnostic>) {
    let mut lexer = Lexer {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        tokens: Vec::with_capacity(text.len() / 3),
        errors: Vec::new(),
        no_template_close_before: 0,
    };
    while lexer.pos < lexer.bytes.len() {
        lexer.next_token();
    }
    (lexer.tokens, lexer.errors)
}

struct Lexer<'t> {
    text: &'t str,
    bytes: &'t [u8],
    pos: usize,
    tokens: Vec<Token>,
    errors: Vec<Diagnostic>,
    /// A `{{` before this offset has no `}}` on its line: remembered so a
    /// line of thousands of `{` is scanned once, not once per brace.
    no_template_close_before: usize,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> u8 {
        self.bytes.get(self.pos + ahead).copied().unwrap_or(0)
    }

    fn push(&mut self, kind: TokenKind, start: usize) {
        self.tokens.push(Token {
            kind,
            span: Span::new(start, self.pos),
        });
    }

    fn next_token(&mut self) {
        let start = self.pos;
        let kind = match self.peek(0) {
            b' ' | b'\t' | b'\r' => {
                self.eat_while(|b| matches!(b, b' ' | b'\t' | b'\r'));
                TokenKind::Whitespace
            }
            b'\n' => self.single(TokenKind::Newline),
            b'#' => {
                self.eat_while(|b| b != b'\n');
                TokenKind::Comment
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => self.ident(),
            b'0'..=b'9' => self.number(),
            b'"' if self.bytes[self.pos..].starts_with(b"\"\"\"") => self.triple_string(),
            b'"' => self.string(),
            b'{' if self.peek(1) == b'{' && self.template_closes() => TokenKind::Template,
            b'{' => self.single(TokenKind::LBrace),
            b'}' => self.single(TokenKind::RBrace),
            b'[' => self.single(TokenKind::LBracket),
            b']' => self.single(TokenKind::RBracket),
            b',' => self.single(TokenKind::Comma),
            b'=' => self.single(TokenKind::Eq),
            b';' => self.single(TokenKind::Semicolon),
            b'*' => self.single(TokenKind::Star),
            b'-' if self.peek(1) == b'>' => {
                self.pos += 2;
                TokenKind::Arrow
            }
            // A negative number is a number (so the setting that reads it
            // says it must not be negative, at its span), not an unknown `-`.
            b'-' if self.peek(1).is_ascii_digit() => {
                self.pos += 1;
                self.number()
            }
            _ => self.unknown(),
        };
        self.push(kind, start);
    }

    fn single(&mut self, kind: TokenKind) -> TokenKind {
        self.pos += 1;
        kind
    }

    fn eat_while(&mut self, keep: impl Fn(u8) -> bool) {
        while self.pos < self.bytes.len() && keep(self.bytes[self.pos]) {
            self.pos += 1;
        }
    }

    fn ident(&mut self) -> TokenKind {
        while self.pos < self.bytes.len() {
            let byte = self.bytes[self.pos];
            let continues = byte.is_ascii_alphanumeric()
                || byte == b'_'
                || (byte == b'-' && self.peek(1) != b'>');
            if !continues {
                break;
            }
            self.pos += 1;
        }
        TokenKind::Ident
    }

    fn number(&mut self) -> TokenKind {
        self.eat_while(|b| b.is_ascii_digit());
        if self.peek(0) == b'.' && self.peek(1).is_ascii_digit() {
            self.pos += 1;
            self.eat_while(|b| b.is_ascii_digit());
        }
        self.eat_while(|b| b.is_ascii_alphanumeric() || b == b'%');
        TokenKind::Number
    }

    fn string(&mut self) -> TokenKind {
        let start = self.pos;
        self.pos += 1;
        while self.pos < self.bytes.len() {
            match self.bytes[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return TokenKind::String;
                }
                b'\n' => break,
                b'\\' => {
                    self.pos += 1;
                    if self.peek(0) != b'\n' {
                        self.skip_char();
                    }
                }
                _ => self.pos += 1,
            }
        }
        self.unterminated(start, "string");
        TokenKind::String
    }

    fn triple_string(&mut self) -> TokenKind {
        let start = self.pos;
        self.pos += 3;
        match find(&self.bytes[self.pos..], b"\"\"\"") {
            Some(at) => self.pos += at + 3,
            None => {
                self.pos = self.bytes.len();
                self.unterminated(start, "triple-quoted string");
            }
        }
        TokenKind::TripleString
    }

    fn unterminated(&mut self, start: usize, what: &str) {
        self.errors.push(
            Diagnostic::error(
                codes::UNTERMINATED_STRING,
                Span::new(start, self.pos),
                format!("unterminated {what}"),
            )
            .with_label("this string is never closed")
            .with_help(
                "close it with `\"` on the same line, or use `\"\"\"` for text over several lines",
            ),
        );
    }

    /// Whether the `{{` at `pos` is closed by `}}` on the same line; if so,
    /// consumes the whole placeholder.
    fn template_closes(&mut self) -> bool {
        if self.pos < self.no_template_close_before {
            return false;
        }
        let rest = &self.bytes[self.pos + 2..];
        let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        match find(&rest[..line_end], b"}}") {
            Some(at) => {
                self.pos += 2 + at + 2;
                true
            }
            None => {
                self.no_template_close_before = self.pos + 2 + line_end;
                false
            }
        }
    }

    /// Consumes a run of characters no token starts with, reporting it once.
    fn unknown(&mut self) -> TokenKind {
        let start = self.pos;
        while self.pos < self.bytes.len() && !starts_token(self.bytes[self.pos]) {
            self.skip_char();
        }
        if self.pos == start {
            self.skip_char();
        }
        let found = self.text.get(start..self.pos).unwrap_or_default();
        let shown: String = found
            .chars()
            .take(16)
            .flat_map(char::escape_debug)
            .collect();
        self.errors.push(
            Diagnostic::error(
                codes::INVALID_CHARACTER,
                Span::new(start, self.pos),
                format!("unexpected character `{shown}`"),
            )
            .with_label("not part of the language")
            .with_help("names start with a letter or `_`; text goes in double quotes"),
        );
        TokenKind::Unknown
    }

    /// Advances over one whole UTF-8 character.
    fn skip_char(&mut self) {
        if self.pos >= self.bytes.len() {
            return;
        }
        self.pos += 1;
        while self.pos < self.bytes.len() && !self.text.is_char_boundary(self.pos) {
            self.pos += 1;
        }
    }
}

/// Bytes that begin some token (so an unknown run stops before them).
fn starts_token(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b' ' | b'\t'
                | b'\r'
                | b'\n'
                | b'#'
                | b'_'
                | b'"'
                | b'{'
                | b'}'
                | b'['
                | b']'
                | b','
                | b'='
                | b';'
                | b'*'
        )
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<TokenKind> {
        lex(text)
            .0
            .into_iter()
            .filter(|t| t.kind != TokenKind::Whitespace)
            .map(|t| t.kind)
            .collect()
    }

    #[test]
    fn lexes_entries_numbers_and_arrows() {
        use TokenKind::*;
        assert_eq!(
            kinds("cpu = 500m # half\nallow web->db port 5432"),
            [
                Ident, Eq, Number, Comment, Newline, Ident, Ident, Arrow, Ident, Ident, Number
            ]
        );
        assert_eq!(kinds("airflow-web 70% 1.5"), [Ident, Number, Number]);
    }

    #[test]
    fn placeholders_need_their_closing_braces_on_the_line() {
        use TokenKind::*;
        assert_eq!(kinds("n = {{ values.n }}"), [Ident, Eq, Template]);
        assert_eq!(
            kinds("a {{\n}}"),
            [Ident, LBrace, LBrace, Newline, RBrace, RBrace]
        );
    }

    #[test]
    fn unterminated_strings_stop_at_the_line_end() {
        let (tokens, errors) = lex("a \"open\nb = 1");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].message, "unterminated string");
        assert_eq!(tokens[2].span, Span::new(2, 7));
        let (_, errors) = lex("a \"\"\"never");
        assert_eq!(errors[0].message, "unterminated triple-quoted string");
        let (tokens, _) = lex("\"x\\");
        assert_eq!(tokens[0].span, Span::new(0, 3));
    }

    #[test]
    fn unknown_runs_are_one_token_and_one_error() {
        let (tokens, errors) = lex("a @@€€ b");
        assert_eq!(errors.len(), 1);
        assert_eq!(tokens[2].kind, TokenKind::Unknown);
        assert_eq!(errors[0].message, "unexpected character `@@€€`");
    }
}
