//! Work across blocks, run once everything is compiled: gate ports by
//! name, secrets granted through connections, and warnings for placement
//! hints that can never hold, declared-but-unused secrets and connections
//! and `restrict` values no node can have. (Undefined references are
//! `cca_model::validity` rules, reported by `sites`.)

use std::collections::BTreeSet;

use cca_model::spec::SecretGrant;

use cca_model::validity::{Field, Subject};

use super::{Compiler, Kind, Site};
use crate::diagnostic::{Diagnostic, FileId, codes};
use crate::suggest::did_you_mean;

/// Node labels every agent reports, with the values it can report. A
/// `restrict` on one of these with another value matches no node; custom
/// labels cannot be checked before nodes join.
const WELL_KNOWN_LABELS: &[(&str, &[&str])] = &[
    (
        "arch",
        &[
            "amd64", "arm64", "arm", "386", "riscv64", "ppc64le", "s390x",
        ],
    ),
    ("os", &["linux"]),
];

impl Compiler<'_> {
    pub(crate) fn report_in(&mut self, file: FileId, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic.in_file(file));
    }

    pub(crate) fn resolve_gate_ports(&mut self) {
        for pending in std::mem::take(&mut self.gate_ports) {
            let Some(service) = self.program.services.get(&pending.service) else {
                continue;
            };
            let port = match &pending.port {
                None => service.ports.first(),
                Some(name) => service
                    .ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str())),
            };
            if let Some(port) = port {
                let number = port.number;
                let gate = self.program.gates.get_mut(&pending.gate);
                match (gate, &pending.path) {
                    (Some(gate), None) => gate.port = number,
                    (Some(gate), Some((index, _))) => {
                        if let Some(path) = gate.paths.get_mut(*index) {
                            path.port = number;
                        }
                    }
                    (None, _) => {}
                }
                continue;
            }
            let names: Vec<String> = service
                .ports
                .iter()
                .filter_map(|p| p.name.clone())
                .collect();
            let message = match &pending.port {
                Some(name) => format!("service `{}` has no port named `{name}`", pending.service),
                None => format!(
                    "service `{}` declares no port for the gate",
                    pending.service
                ),
            };
            let label = match &pending.path {
                None => format!("gate `{}`", pending.gate),
                Some((_, prefix)) => format!("path `{prefix}` of gate `{}`", pending.gate),
            };
            let mut diagnostic =
                Diagnostic::error(codes::UNDEFINED_REFERENCE, pending.site.span, message)
                    .with_label(label);
            if let Some(close) = pending
                .port
                .as_deref()
                .and_then(|name| did_you_mean(name, names.iter().map(String::as_str)))
            {
                diagnostic = diagnostic.with_help(format!("did you mean `port {close}`?"));
            } else if !names.is_empty() {
                diagnostic = diagnostic.with_help(format!("its ports are: {}", names.join(", ")));
            }
            self.report_in(pending.site.file, diagnostic);
            // The gate stays (port 0) so the model judges the rest of it;
            // its port is reported here, not again as out of range.
            let field = match &pending.path {
                None => Field::from("port"),
                Some((index, _)) => Field::from("paths").index(*index).field("port"),
            };
            self.reported
                .insert(Subject::new(Kind::Gate, &pending.gate, field));
        }
    }

    /// A service that uses a connection may read the connection's secret;
    /// an explicit grant of the same secret wins.
    pub(crate) fn grant_connection_secrets(&mut self) {
        let mut implied: Vec<(String, String, String)> = Vec::new();
        for (service, spec) in &self.program.services {
            for connection in &spec.connections {
                let secret = self
                    .program
                    .connections
                    .get(connection)
                    .and_then(|c| c.secret.clone());
                if let Some(secret) = secret {
                    implied.push((service.clone(), secret, connection.clone()));
                }
            }
        }
        for (service, secret, connection) in implied {
            self.program
                .grants
                .entry(service)
                .or_default()
                .entry(secret)
                .or_insert(SecretGrant::Connection { connection });
        }
    }

    /// Colocation with a service whose `restrict` excludes every node this
    /// service may use is a hint that can never be followed.
    pub(crate) fn check_placement(&mut self) {
        let mut findings = Vec::new();
        for (name, spec) in &self.program.services {
            for (label, value) in &spec.placement.restrict {
                if let Some(finding) = unknown_label_value(label, value) {
                    findings.push((name.clone(), label.clone(), finding));
                }
            }
            for target in &spec.placement.colocate {
                let Some(other) = self.program.services.get(target) else {
                    continue;
                };
                for (label, value) in &spec.placement.restrict {
                    if let Some(theirs) = other.placement.restrict.get(label)
                        && theirs != value
                    {
                        findings.push((
                            name.clone(),
                            label.clone(),
                            Finding::Disjoint {
                                target: target.clone(),
                                ours: value.clone(),
                                theirs: theirs.clone(),
                            },
                        ));
                    }
                }
            }
        }
        for (service, label, finding) in findings {
            let Some(site) = self
                .restrict_sites
                .get(&(service.clone(), label.clone()))
                .copied()
            else {
                continue;
            };
            let diagnostic = finding.diagnostic(&service, &label, site);
            self.report_in(site.file, diagnostic);
        }
    }

    pub(crate) fn warn_unused(&mut self) {
        let mut used: BTreeSet<(Kind, String)> = BTreeSet::new();
        for grants in self.program.grants.values() {
            used.extend(grants.keys().map(|s| (Kind::Secret, s.clone())));
        }
        for connection in self.program.connections.values() {
            if let Some(secret) = &connection.secret {
                used.insert((Kind::Secret, secret.clone()));
            }
        }
        for gate in self.program.gates.values() {
            if let Some(cca_model::spec::Tls::Secrets { cert, key }) = &gate.tls {
                used.insert((Kind::Secret, cert.clone()));
                used.insert((Kind::Secret, key.clone()));
            }
        }
        for service in self.program.services.values() {
            used.extend(
                service
                    .connections
                    .iter()
                    .map(|c| (Kind::Connection, c.clone())),
            );
            used.extend(
                service
                    .init
                    .iter()
                    .filter_map(|step| step.probe.clone())
                    .map(|c| (Kind::Connection, c)),
            );
        }
        let unused: Vec<((Kind, String), Site)> = self
            .definitions
            .iter()
            .filter(|((kind, _), _)| matches!(kind, Kind::Secret | Kind::Connection))
            .filter(|(key, _)| !used.contains(*key))
            .map(|(key, site)| (key.clone(), *site))
            .collect();
        for ((kind, name), site) in unused {
            let (code, help) = match kind {
                Kind::Secret => (
                    codes::UNUSED_SECRET,
                    "grant it to a service (`secret NAME`) or use it in a connection",
                ),
                _ => (
                    codes::UNUSED_CONNECTION,
                    "reference it from a service (`connection NAME`)",
                ),
            };
            self.report_in(
                site.file,
                Diagnostic::warning(
                    code,
                    site.span,
                    format!("{} `{name}` is never used", kind.noun()),
                )
                .with_help(help),
            );
        }
    }
}

enum Finding {
    UnknownValue {
        known: &'static [&'static str],
    },
    Disjoint {
        target: String,
        ours: String,
        theirs: String,
    },
}

fn unknown_label_value(label: &str, value: &str) -> Option<Finding> {
    let (_, known) = WELL_KNOWN_LABELS.iter().find(|(name, _)| *name == label)?;
    (!known.contains(&value)).then_some(Finding::UnknownValue { known })
}

impl Finding {
    fn diagnostic(&self, service: &str, label: &str, site: Site) -> Diagnostic {
        match self {
            Finding::UnknownValue { known } => {
                let value_help = format!("nodes report {label} as one of: {}", known.join(", "));
                Diagnostic::warning(
                    codes::UNKNOWN_LABEL_VALUE,
                    site.span,
                    format!("no node can have this `{label}`: `{service}` will never be placed"),
                )
                .with_label("not a value nodes report")
                .with_help(value_help)
            }
            Finding::Disjoint {
                target,
                ours,
                theirs,
            } => Diagnostic::warning(
                codes::UNSATISFIABLE_HINT,
                site.span,
                format!(
                    "`{service}` colocates with `{target}`, but restricts {label} = \"{ours}\" while `{target}` restricts {label} = \"{theirs}\""
                ),
            )
            .with_label("the two never share a node")
            .with_help("align the restrictions or drop the `colocate` hint"),
        }
    }
}
