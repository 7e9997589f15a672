//! `cca fmt`: prints a syntax tree in the one canonical layout. Two-space
//! indentation, one entry per line, settings as `key = value` and
//! directives as `key args`, `;` and redundant blank lines dropped, top-level
//! blocks separated by one blank line, every comment kept where it was
//! (on its own line, or trailing its entry). Formatting is idempotent:
//! `format(format(x)) == format(x)`.

use crate::ast::{Entry, Value};
use crate::diagnostic::Diagnostic;
use crate::schema::{self, Context, Form};
use crate::syntax::{NodeKind, SyntaxElement, SyntaxNode, TokenKind, parse};

const INDENT: &str = "  ";

/// Parses and formats `text`; a file with syntax errors is not formatted
/// and its errors are returned instead.
pub fn format_source(text: &str) -> Result<String, Vec<Diagnostic>> {
    let parsed = parse(text);
    if !parsed.errors.is_empty() {
        return Err(parsed.errors);
    }
    Ok(format_tree(text, &parsed.root))
}

/// Formats an error-free tree of `source`.
pub fn format_tree(source: &str, root: &SyntaxNode) -> String {
    let mut printer = Printer {
        source,
        out: String::with_capacity(source.len() + 64),
    };
    let (_, mut lines) = collect_lines(source, root, false);
    separate_top_level_blocks(source, &mut lines);
    printer.lines(&lines, Context::File, 0);
    printer.out
}

/// One printed line of a file or block body.
#[derive(Debug)]
struct Line<'a> {
    item: Item<'a>,
    blank_before: bool,
    trailing: Option<&'a str>,
}

#[derive(Debug)]
enum Item<'a> {
    Entry(&'a SyntaxNode),
    Comment(&'a str),
}

/// The entries and comments of a file or block, with the blank lines and
/// trailing comments worth keeping. Also returns a comment that sits on a
/// block's opening line, after the `{`.
fn collect_lines<'a>(
    source: &'a str,
    node: &'a SyntaxNode,
    in_block: bool,
) -> (Option<&'a str>, Vec<Line<'a>>) {
    let mut lines: Vec<Line<'a>> = Vec::new();
    let mut opening_comment = None;
    let mut newlines = 0;
    let mut line_has_content = in_block;
    for child in &node.children {
        match child {
            SyntaxElement::Token(token) if token.kind == TokenKind::Newline => {
                newlines += 1;
                line_has_content = false;
            }
            SyntaxElement::Token(token) if token.kind == TokenKind::Comment => {
                let text = source
                    .get(token.span.range())
                    .unwrap_or_default()
                    .trim_end();
                match lines.last_mut() {
                    Some(last) if line_has_content && last.trailing.is_none() => {
                        last.trailing = Some(text);
                    }
                    None if line_has_content => opening_comment = Some(text),
                    _ => lines.push(Line {
                        item: Item::Comment(text),
                        blank_before: !lines.is_empty() && newlines >= 2,
                        trailing: None,
                    }),
                }
                line_has_content = true;
                newlines = 0;
            }
            SyntaxElement::Node(entry) if entry.kind == NodeKind::Entry => {
                lines.push(Line {
                    item: Item::Entry(entry),
                    blank_before: !lines.is_empty() && newlines >= 2,
                    trailing: None,
                });
                line_has_content = true;
                newlines = 0;
            }
            _ => {}
        }
    }
    (opening_comment, lines)
}

/// A top-level entry with a block gets a blank line before it (and its
/// leading comments) and after it.
fn separate_top_level_blocks(source: &str, lines: &mut [Line<'_>]) {
    let mut previous_had_block = false;
    for index in 0..lines.len() {
        let Item::Entry(node) = lines[index].item else {
            continue;
        };
        let has_block = Entry { source, node }.block().is_some();
        let mut start = index;
        while start > 0
            && matches!(lines[start - 1].item, Item::Comment(_))
            && !lines[start].blank_before
        {
            start -= 1;
        }
        if start > 0 && (has_block || previous_had_block) {
            lines[start].blank_before = true;
        }
        previous_had_block = has_block;
    }
}

struct Printer<'a> {
    source: &'a str,
    out: String,
}

impl<'a> Printer<'a> {
    fn lines(&mut self, lines: &[Line<'a>], context: Context, depth: usize) {
        for line in lines {
            if line.blank_before {
                self.out.push('\n');
            }
            self.indent(depth);
            match line.item {
                Item::Entry(node) => self.entry(node, context, depth),
                Item::Comment(text) => self.out.push_str(text),
            }
            if let Some(comment) = line.trailing {
                self.out.push(' ');
                self.out.push_str(comment);
            }
            self.out.push('\n');
        }
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str(INDENT);
        }
    }

    fn entry(&mut self, node: &'a SyntaxNode, context: Context, depth: usize) {
        let entry = Entry {
            source: self.source,
            node,
        };
        let key = entry.key();
        let values = entry.values();
        let block = entry.block();
        self.out.push_str(key);
        if uses_eq(context, entry, values.len(), block.is_some()) {
            self.out.push_str(" =");
        }
        for value in &values {
            self.out.push(' ');
            self.value(value, depth);
        }
        if let Some(block) = block {
            self.out.push_str(" {");
            let inner = schema::block_context(context, key);
            let (opening, lines) = collect_lines(self.source, block.node, true);
            if let Some(comment) = opening {
                self.out.push(' ');
                self.out.push_str(comment);
            }
            if lines.is_empty() && opening.is_none() {
                self.out.push('}');
                return;
            }
            self.out.push('\n');
            self.lines(&lines, inner, depth + 1);
            self.indent(depth);
            self.out.push('}');
        }
    }

    fn value(&mut self, value: &Value<'a>, depth: usize) {
        match value {
            Value::Token { text, .. } => self.out.push_str(text),
            Value::From { raw, .. } => {
                self.out.push_str("from ");
                self.out.push_str(raw);
            }
            Value::List { items, .. } if needs_lines(items.node) => {
                self.multiline_list(items.node, depth);
            }
            Value::List { items, .. } => self.inline_list(items.node, depth),
        }
    }

    fn inline_list(&mut self, list: &'a SyntaxNode, depth: usize) {
        self.out.push('[');
        let mut first = true;
        for value in list_values(self.source, list) {
            if !first {
                self.out.push_str(", ");
            }
            first = false;
            self.value(&value, depth);
        }
        self.out.push(']');
    }

    /// One item per line with a trailing comma; a comment that followed an
    /// item on its line stays there, others get their own line.
    fn multiline_list(&mut self, list: &'a SyntaxNode, depth: usize) {
        self.out.push('[');
        let mut item_on_line = false;
        for child in &list.children {
            match child {
                SyntaxElement::Token(token) if token.kind == TokenKind::Newline => {
                    item_on_line = false;
                }
                SyntaxElement::Token(token) if token.kind == TokenKind::Comment => {
                    let text = self.source.get(token.span.range()).unwrap_or_default();
                    if item_on_line {
                        self.out.push(' ');
                    } else {
                        self.out.push('\n');
                        self.indent(depth + 1);
                    }
                    self.out.push_str(text.trim_end());
                    item_on_line = false;
                }
                other => {
                    if let Some(value) = list_value(self.source, other) {
                        self.out.push('\n');
                        self.indent(depth + 1);
                        self.value(&value, depth + 1);
                        self.out.push(',');
                        item_on_line = true;
                    }
                }
            }
        }
        self.out.push('\n');
        self.indent(depth);
        self.out.push(']');
    }
}

/// Whether an entry is written `key = value`: settings and flags with one
/// value and no block; unknown keys keep what the author wrote.
fn uses_eq(context: Context, entry: Entry<'_>, values: usize, has_block: bool) -> bool {
    if values != 1 || has_block {
        return false;
    }
    match schema::lookup(context, entry.key()) {
        Some(key) => matches!(key.form, Form::Setting | Form::Flag),
        None => entry.has_eq(),
    }
}

/// A list goes over several lines when it holds a comment or multi-line text.
fn needs_lines(list: &SyntaxNode) -> bool {
    list.children.iter().any(|child| match child {
        SyntaxElement::Token(token) => {
            matches!(token.kind, TokenKind::Comment | TokenKind::TripleString)
        }
        SyntaxElement::Node(node) => needs_lines(node),
    })
}

fn list_values<'a>(source: &'a str, list: &'a SyntaxNode) -> impl Iterator<Item = Value<'a>> {
    list.children
        .iter()
        .filter_map(move |child| list_value(source, child))
}

fn list_value<'a>(source: &'a str, child: &'a SyntaxElement) -> Option<Value<'a>> {
    crate::ast::element_value(source, child).filter(|value| {
        !matches!(
            value,
            Value::Token {
                kind: TokenKind::LBracket | TokenKind::RBracket,
                ..
            }
        )
    })
}
