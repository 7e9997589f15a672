//! `cca-dsl`: the `.cca` language. Text is lexed and parsed into a lossless
//! syntax tree ([`syntax`]) that never fails to build; a typed view
//! ([`ast`]) sits on top; [`compile`] checks the program and turns it into
//! the typed desired facts of `cca_model::spec`; [`format`](mod@format) prints the
//! canonical layout; [`template`] expands `{{ values.key }}`; [`source`]
//! loads files (and `from` inclusions) through a small file-system trait;
//! [`commands`] implements `cca fmt`, `cca lint` and `cca render`.
//!
//! Architecture invariant: nothing here does network IO or depends on
//! tokio; files are read only through [`source::FileSystem`].

pub mod ast;
pub mod commands;
pub mod compile;
pub mod diagnostic;
pub mod format;
pub mod schema;
pub mod source;
pub mod suggest;
pub mod syntax;
pub mod template;

pub use diagnostic::{Diagnostic, FileId, Severity, Span};
pub use syntax::{Parse, parse};
