//! Compiling the blocks around services other than gates (`gate.rs`):
//! `connection`, `secret` and `network`.

use std::collections::BTreeMap;

use cca_model::spec::{
    ConnectionSpec, NetworkPolicy, NetworkRule, Peer, Protocol, RuleAction, SecretSpec,
};
use cca_model::validity::Field;

use super::read::{Scalar, Spanned};
use super::{Compiler, Kind};
use crate::ast::Entry;
use crate::diagnostic::{Diagnostic, codes};
use crate::schema::Context;

/// Default ports for well-known connection drivers.
const DRIVER_PORTS: &[(&str, u16)] = &[
    ("postgresql", 5432),
    ("postgres", 5432),
    ("mysql", 3306),
    ("mariadb", 3306),
    ("redis", 6379),
    ("mongodb", 27017),
    ("amqp", 5672),
];

impl Compiler<'_> {
    pub(crate) fn connection(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, false) else {
            return;
        };
        let fresh = self.define(Kind::Connection, &name, entry.key_span(), name_span);
        let Some(block) = self.block_of(entry) else {
            return;
        };
        let mut spec = ConnectionSpec {
            name: name.clone(),
            driver: String::new(),
            user: None,
            secret: None,
            host: String::new(),
            port: 0,
            database: None,
            params: BTreeMap::new(),
            tenant: None,
        };
        for item in self.entries(Some(block), Context::Connection) {
            match item.key() {
                "driver" => spec.driver = self.setting_text(item).unwrap_or_default(),
                "user" => spec.user = self.setting_text(item),
                "secret" => {
                    if let Some((secret, span)) = self.setting_name(item) {
                        self.mark("secret", span);
                        spec.secret = Some(secret);
                    }
                }
                "host" => spec.host = self.setting_text(item).unwrap_or_default(),
                "port" => {
                    if let Some(value) = self.single(item) {
                        spec.port = self.port_of(&value).unwrap_or(0);
                    }
                }
                "database" => spec.database = self.setting_text(item),
                "params" => spec.params = self.string_map(item, Context::Params),
                _ => {}
            }
        }
        if spec.port == 0
            && let Some((_, port)) = DRIVER_PORTS
                .iter()
                .find(|(driver, _)| *driver == spec.driver)
        {
            spec.port = *port;
        }
        if fresh {
            self.program.connections.insert(name, spec);
        }
    }

    pub(crate) fn secret(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, false) else {
            return;
        };
        let fresh = self.define(Kind::Secret, &name, entry.key_span(), name_span);
        let mut description = None;
        for item in self.entries(entry.block(), Context::Secret) {
            if item.key() == "description" {
                description = self.setting_text(item);
            }
        }
        if fresh {
            self.program.secrets.insert(
                name.clone(),
                SecretSpec {
                    name,
                    description,
                    tenant: None,
                },
            );
        }
    }

    pub(crate) fn network(&mut self, entry: Entry<'_>) {
        let values = entry.values();
        let name = if values.is_empty() {
            Some(("default".to_owned(), entry.key_span()))
        } else {
            self.block_name(entry, false)
        };
        let Some((name, name_span)) = name else {
            return;
        };
        let fresh = self.define(Kind::Network, &name, entry.key_span(), name_span);
        let block = self.block_of(entry);
        let mut rules = Vec::new();
        for item in self.entries(block, Context::Network) {
            if let Some(rule) = self.rule(rules.len(), item) {
                rules.push(rule);
            }
        }
        if fresh {
            self.program.networks.insert(
                name.clone(),
                NetworkPolicy {
                    name,
                    rules,
                    tenant: None,
                },
            );
        }
    }

    /// `allow|deny FROM -> TO [port N]... [tcp|udp]`.
    fn rule(&mut self, index: usize, item: Entry<'_>) -> Option<NetworkRule> {
        let action = if item.key() == "allow" {
            RuleAction::Allow
        } else {
            RuleAction::Deny
        };
        let values = self.scalars(item)?;
        let malformed = |this: &mut Self| {
            this.report(
                Diagnostic::error(codes::WRONG_ARITY, item.span(), "malformed network rule")
                    .with_label("expected `allow|deny FROM -> TO [port N] [tcp|udp]`")
                    .with_help("FROM and TO are service names or `*`"),
            );
        };
        let [from, arrow, to, rest @ ..] = values.as_slice() else {
            malformed(self);
            return None;
        };
        if arrow.value != Scalar::Arrow {
            malformed(self);
            return None;
        }
        let rule = Field::from("rules").index(index);
        let from = self.peer(from, rule.clone().field("from"))?;
        let to = self.peer(to, rule.field("to"))?;
        let mut ports = Vec::new();
        let mut protocol = None;
        let mut rest = rest.iter();
        while let Some(value) = rest.next() {
            match &value.value {
                Scalar::Name(word) if word == "port" => {
                    let Some(port) = rest.next() else {
                        malformed(self);
                        return None;
                    };
                    ports.push(self.port_of(port)?);
                }
                Scalar::Name(word) if word == "tcp" => protocol = Some(Protocol::Tcp),
                Scalar::Name(word) if word == "udp" => protocol = Some(Protocol::Udp),
                _ => {
                    malformed(self);
                    return None;
                }
            }
        }
        Some(NetworkRule {
            action,
            from,
            to,
            ports,
            protocol,
        })
    }

    fn peer(&mut self, value: &Spanned, field: Field) -> Option<Peer> {
        if value.value == Scalar::Star {
            return Some(Peer::Any);
        }
        let name = self.name_of(value)?;
        self.mark(field, value.span);
        Some(Peer::Service(name))
    }
}
