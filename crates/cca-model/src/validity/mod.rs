//! Validity of a compiled program: every semantic rule that can be judged
//! on the model alone (names, references, ports, ranges, conflicts), as one
//! function, [`Program::problems`]. It runs in both places a program is
//! judged: the DSL compiler maps each [`Problem`]'s [`Subject`] to the span
//! of that object or field in the source, and the API server refuses a
//! program with problems before writing anything. A problem is plain data:
//! a stable code (the compiler's `cca::E0xx`), a message, and a typed
//! location; no source text or span ever reaches this crate.

mod rules;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use rules::{
    MAX_GATE_QUEUE, MAX_REPLICAS, NAME_HELP, SERVICE_NAME_HELP, is_host_name, is_service_name,
    is_valid_name, name_problem,
};

use crate::spec::Program;

impl Program {
    /// Every problem of the program, in a deterministic order (objects by
    /// kind and name, then rule). Empty for a program the cluster accepts.
    pub fn problems(&self) -> Vec<Problem> {
        rules::check(self)
    }
}

/// The stable code of a rule. Codes are shared with the DSL's diagnostics
/// (`docs/dsl.md` lists them) and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Code {
    #[serde(rename = "cca::E013")]
    WrongType,
    #[serde(rename = "cca::E015")]
    OutOfRange,
    #[serde(rename = "cca::E016")]
    DuplicateName,
    #[serde(rename = "cca::E017")]
    MissingField,
    #[serde(rename = "cca::E018")]
    UndefinedReference,
    #[serde(rename = "cca::E019")]
    Conflict,
    #[serde(rename = "cca::E021")]
    InvalidName,
}

impl Code {
    /// The code's number without the `cca::` prefix, e.g. `E018`.
    pub const fn number(self) -> &'static str {
        match self {
            Code::WrongType => "E013",
            Code::OutOfRange => "E015",
            Code::DuplicateName => "E016",
            Code::MissingField => "E017",
            Code::UndefinedReference => "E018",
            Code::Conflict => "E019",
            Code::InvalidName => "E021",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cca::{}", self.number())
    }
}

/// The kinds of named objects a program defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Service,
    Gate,
    Connection,
    Secret,
    Network,
}

impl ObjectKind {
    /// How messages name the kind: "network policy".
    pub fn noun(self) -> &'static str {
        match self {
            ObjectKind::Service => "service",
            ObjectKind::Gate => "gate",
            ObjectKind::Connection => "connection",
            ObjectKind::Secret => "secret",
            ObjectKind::Network => "network policy",
        }
    }

    /// The block keyword that defines one: `network`.
    pub fn keyword(self) -> &'static str {
        match self {
            ObjectKind::Network => "network",
            other => other.noun(),
        }
    }
}

/// One step of a [`Field`] path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Segment {
    /// A field of a struct: `ports`.
    Field(String),
    /// A position in a list: `[1]`.
    Index(usize),
    /// A key of a map: `["team"]`.
    Key(String),
}

/// A path from an object to one of its fields, printed and parsed as
/// `ports[1].name` or `secrets["db"]`. The empty path is the object itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Field(pub Vec<Segment>);

impl Field {
    /// The object itself.
    pub fn root() -> Field {
        Field(Vec::new())
    }

    /// `self.name`.
    pub fn field(mut self, name: &str) -> Field {
        self.0.push(Segment::Field(name.to_owned()));
        self
    }

    /// `self[index]`.
    pub fn index(mut self, index: usize) -> Field {
        self.0.push(Segment::Index(index));
        self
    }

    /// `self["key"]`.
    pub fn key(mut self, key: &str) -> Field {
        self.0.push(Segment::Key(key.to_owned()));
        self
    }

    /// The enclosing field, `None` for the object itself.
    pub fn parent(&self) -> Option<Field> {
        let (_, rest) = self.0.split_last()?;
        Some(Field(rest.to_vec()))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

/// A path `a.b` built from dotted field names: `Field::from("update.max_surge")`.
impl From<&str> for Field {
    fn from(path: &str) -> Field {
        Field(
            path.split('.')
                .filter(|part| !part.is_empty())
                .map(|part| Segment::Field(part.to_owned()))
                .collect(),
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Field(name) if at == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Key(key) => {
                    let quoted = serde_json::to_string(key).map_err(|_| fmt::Error)?;
                    write!(f, "[{quoted}]")?;
                }
            }
        }
        Ok(())
    }
}

/// A field path that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{path}` is not a field path like `ports[1].name`: {reason}")]
pub struct FieldError {
    pub path: String,
    pub reason: &'static str,
}

impl FromStr for Field {
    type Err = FieldError;

    fn from_str(path: &str) -> Result<Field, FieldError> {
        let error = |reason| FieldError {
            path: path.to_owned(),
            reason,
        };
        let mut segments = Vec::new();
        let mut rest = path;
        while !rest.is_empty() {
            if let Some(inner) = rest.strip_prefix('[') {
                if inner.starts_with('"') {
                    // A JSON string, then `]`.
                    let mut stream =
                        serde_json::Deserializer::from_str(inner).into_iter::<String>();
                    let key = match stream.next() {
                        Some(Ok(key)) => key,
                        _ => return Err(error("a map key is not a quoted string")),
                    };
                    let after = &inner[stream.byte_offset()..];
                    rest = after
                        .strip_prefix(']')
                        .ok_or_else(|| error("a map key is not closed with `]`"))?;
                    segments.push(Segment::Key(key));
                } else {
                    let end = inner
                        .find(']')
                        .ok_or_else(|| error("an index is not closed with `]`"))?;
                    let index = inner[..end]
                        .parse()
                        .map_err(|_| error("an index is not a whole number"))?;
                    segments.push(Segment::Index(index));
                    rest = &inner[end + 1..];
                }
                continue;
            }
            let name = if segments.is_empty() {
                rest
            } else {
                rest.strip_prefix('.')
                    .ok_or_else(|| error("expected `.`, `[` or the end"))?
            };
            let end = name.find(['.', '[']).unwrap_or(name.len());
            if end == 0 {
                return Err(error("a field name is empty"));
            }
            segments.push(Segment::Field(name[..end].to_owned()));
            rest = &name[end..];
        }
        Ok(Field(segments))
    }
}

impl Serialize for Field {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Field, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a problem is: an object of the program and a field in it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Subject {
    pub kind: ObjectKind,
    pub name: String,
    /// Empty for the object as a whole.
    #[serde(default, skip_serializing_if = "Field::is_root")]
    pub field: Field,
}

impl Subject {
    pub fn new(kind: ObjectKind, name: &str, field: impl Into<Field>) -> Subject {
        Subject {
            kind,
            name: name.to_owned(),
            field: field.into(),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.kind.noun(), self.name)?;
        if !self.field.is_root() {
            write!(f, " {}", self.field)?;
        }
        Ok(())
    }
}

/// A second place a problem is about ("first declared here").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Related {
    pub subject: Subject,
    pub label: String,
}

/// A name that is used but not defined: lets a front end suggest a close
/// name it knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undefined {
    pub kind: ObjectKind,
    pub name: String,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub code: Code,
    pub message: String,
    pub subject: Subject,
    /// A short text about the subject itself; may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// How to fix it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<Related>,
    /// For an undefined reference: what is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undefined: Option<Undefined>,
}

impl Problem {
    pub fn new(code: Code, subject: Subject, message: impl Into<String>) -> Problem {
        Problem {
            code,
            message: message.into(),
            subject,
            label: String::new(),
            help: None,
            related: Vec::new(),
            undefined: None,
        }
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Problem {
        self.label = label.into();
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Problem {
        self.help = Some(help.into());
        self
    }

    pub fn with_related(mut self, subject: Subject, label: impl Into<String>) -> Problem {
        self.related.push(Related {
            subject,
            label: label.into(),
        });
        self
    }
}

/// `cca::E018 gate `shop` service: undefined service `web``.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.subject, self.message)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_print_and_parse_back() {
        let paths = [
            Field::root(),
            Field::from("replicas"),
            Field::from("ports").index(1).field("name"),
            Field::from("secrets").key("db"),
            Field::from("placement.restrict").key("a.b\"]["),
            Field::from("rules").index(0).field("from"),
        ];
        let printed: Vec<String> = paths.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            [
                "",
                "replicas",
                "ports[1].name",
                "secrets[\"db\"]",
                "placement.restrict[\"a.b\\\"][\"]",
                "rules[0].from",
            ]
        );
        for (path, text) in paths.iter().zip(&printed) {
            assert_eq!(&text.parse::<Field>().expect(text), path);
        }
    }

    #[test]
    fn malformed_field_paths_are_refused_with_the_reason() {
        for (text, reason) in [
            ("ports[x]", "an index is not a whole number"),
            ("ports[1", "an index is not closed with `]`"),
            ("a..b", "a field name is empty"),
            ("secrets[\"db\"", "a map key is not closed with `]`"),
            ("ports[1]name", "expected `.`, `[` or the end"),
        ] {
            let error = text.parse::<Field>().expect_err(text);
            assert_eq!(error.reason, reason, "{text}");
        }
    }

    #[test]
    fn a_problem_is_json_with_a_readable_location() {
        let problem = Problem::new(
            Code::DuplicateName,
            Subject::new(ObjectKind::Service, "web", Field::from("ports").index(1)),
            "this port is declared twice",
        )
        .with_related(
            Subject::new(ObjectKind::Service, "web", Field::from("ports").index(0)),
            "declared first here",
        );
        let json = serde_json::to_value(&problem).expect("encodes");
        assert_eq!(
            json,
            serde_json::json!({
                "code": "cca::E016",
                "message": "this port is declared twice",
                "subject": {"kind": "service", "name": "web", "field": "ports[1]"},
                "related": [{
                    "subject": {"kind": "service", "name": "web", "field": "ports[0]"},
                    "label": "declared first here",
                }],
            })
        );
        let back: Problem = serde_json::from_value(json).expect("decodes");
        assert_eq!(back, problem);
        assert_eq!(
            problem.to_string(),
            "cca::E016 service `web` ports[1]: this port is declared twice"
        );
    }
}
