//! Where each object of the program and its fields were written, and the
//! mapping of `cca_model::validity` problems back to those spans: a problem
//! about `ports[1].name` of service `web` underlines that port's name, or
//! the nearest enclosing field that was written (the whole port, then the
//! service's keyword) when that one was not.

use std::collections::BTreeMap;

use cca_model::validity::{Field, Problem, Subject};

use super::{Compiler, Kind, Site};
use crate::diagnostic::{Code, Diagnostic, FileId, Span};
use crate::suggest::did_you_mean;

/// The spans of one object: its block keyword and the fields marked.
#[derive(Debug)]
struct ObjectSites {
    file: FileId,
    key: Span,
    fields: BTreeMap<Field, Span>,
}

/// The spans of every compiled object, and which object is being compiled.
#[derive(Debug, Default)]
pub(crate) struct Sites {
    objects: BTreeMap<(Kind, String), ObjectSites>,
    current: Option<(Kind, String)>,
}

impl Sites {
    /// Starts marking the fields of a (first) definition.
    pub(crate) fn enter(
        &mut self,
        kind: Kind,
        name: &str,
        file: FileId,
        key: Span,
        name_span: Span,
    ) {
        let mut fields = BTreeMap::new();
        fields.insert(Field::from("name"), name_span);
        let object = ObjectSites { file, key, fields };
        self.objects.insert((kind, name.to_owned()), object);
        self.current = Some((kind, name.to_owned()));
    }

    /// Stops marking: the next fields belong to no object (a second
    /// definition, or the end of a block).
    pub(crate) fn leave(&mut self) {
        self.current = None;
    }

    /// Records `field`'s span in the current object; the first one wins.
    pub(crate) fn mark(&mut self, field: Field, span: Span) {
        let Some(current) = &self.current else {
            return;
        };
        if let Some(object) = self.objects.get_mut(current) {
            object.fields.entry(field).or_insert(span);
        }
    }

    /// The span of the subject's field, or of the nearest enclosing field
    /// that was written, or of the object's keyword.
    fn site(&self, subject: &Subject) -> Option<Site> {
        let object = self.objects.get(&(subject.kind, subject.name.clone()))?;
        let mut field = Some(subject.field.clone());
        while let Some(at) = field {
            if let Some(span) = object.fields.get(&at) {
                return Some(Site {
                    file: object.file,
                    span: *span,
                });
            }
            field = at.parent();
        }
        Some(Site {
            file: object.file,
            span: object.key,
        })
    }
}

impl Compiler<'_> {
    /// Runs the model's checks on the compiled program and reports each
    /// problem where its subject was written.
    pub(crate) fn report_problems(&mut self) {
        for problem in self.program.problems() {
            // A name defined in the text whose block did not compile has
            // been reported already; its users are not wrong.
            if let Some(undefined) = &problem.undefined
                && self
                    .definitions
                    .contains_key(&(undefined.kind, undefined.name.clone()))
            {
                continue;
            }
            if self.reported.contains(&problem.subject) {
                continue;
            }
            let diagnostic = self.diagnostic(&problem);
            let file = self
                .sites
                .site(&problem.subject)
                .map_or(FileId::default(), |site| site.file);
            self.report_in(file, diagnostic);
        }
    }

    fn diagnostic(&self, problem: &Problem) -> Diagnostic {
        let site = self.sites.site(&problem.subject);
        let span = site.map_or(Span::default(), |site| site.span);
        let code = Code(problem.code.number());
        let mut diagnostic = Diagnostic::error(code, span, problem.message.clone())
            .with_label(problem.label.clone());
        let close = problem.undefined.as_ref().and_then(|undefined| {
            let defined = self
                .definitions
                .keys()
                .filter(|(kind, _)| *kind == undefined.kind)
                .map(|(_, name)| name.as_str());
            did_you_mean(&undefined.name, defined)
        });
        if let Some(close) = close {
            diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
        } else if let Some(help) = &problem.help {
            diagnostic = diagnostic.with_help(help.clone());
        }
        for related in &problem.related {
            let Some(at) = self.sites.site(&related.subject) else {
                continue;
            };
            if site.is_some_and(|site| site.file == at.file) {
                diagnostic = diagnostic.with_secondary(at.span, related.label.clone());
            } else {
                let position = self.loaded.sources.position(at.file, at.span);
                diagnostic = diagnostic.with_note(format!("{}: {position}", related.label));
            }
        }
        if site.is_none() {
            diagnostic = diagnostic.with_note(format!("about {}", problem.subject));
        }
        diagnostic
    }
}
