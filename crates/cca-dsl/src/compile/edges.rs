//! Compiling the blocks around services: `gate`, `connection`, `secret`,
//! `network` and `group`.

use std::collections::BTreeMap;

use cca_model::spec::{
    ConnectionSpec, GateSpec, GroupSpec, NetworkPolicy, NetworkRule, Peer, Protocol, RuleAction,
    SameSite, SecretSpec, Sticky, Tls,
};
use cca_model::validity::Field;

use super::read::{Scalar, Spanned};
use super::{Compiler, Kind, Site};
use crate::ast::Entry;
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::schema::Context;

/// A gate whose target port is given by name; resolved against the
/// service's ports once every service is compiled.
#[derive(Debug, Clone)]
pub(crate) struct PendingGatePort {
    pub gate: String,
    pub service: String,
    pub port: Option<String>,
    pub site: Site,
}

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
    pub(crate) fn gate(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, false) else {
            return;
        };
        let fresh = self.define(Kind::Gate, &name, entry.key_span(), name_span);
        let block = self.block_of(entry);
        let mut hosts = Vec::new();
        let mut target: Option<(String, Option<Spanned>, Span)> = None;
        let mut sticky = None;
        let mut sticky_span = None;
        let mut tls = None;
        for item in self.entries(block, Context::Gate) {
            match item.key() {
                "host" => {
                    for (host, span) in self.hosts(item) {
                        self.mark(Field::from("hosts").index(hosts.len()), span);
                        hosts.push(host);
                    }
                }
                "service" => {
                    if target.is_some() {
                        self.report(
                            Diagnostic::error(
                                codes::DUPLICATE_KEY,
                                item.key_span(),
                                "a gate targets one service",
                            )
                            .with_help("use one `service NAME [port PORT]` line per gate"),
                        );
                        continue;
                    }
                    target = self.gate_target(item);
                }
                "sticky" => {
                    sticky_span = Some(item.key_span());
                    sticky = self.sticky(item);
                }
                "tls" => tls = self.tls(item),
                _ => {}
            }
        }
        if block.is_none() {
            return;
        }
        // A gate without `service` is kept (with none) so that the model's
        // rules report it along with the rest of the gate.
        let (service, port) =
            target.map_or((String::new(), None), |(service, port, _)| (service, port));
        let port_number = match &port {
            Some(Spanned {
                value: Scalar::Number(_),
                ..
            }) => port.as_ref().and_then(|p| self.port_of(p)),
            _ => None,
        };
        let sticky = sticky.map(|s: Sticky| Sticky {
            cookie: if s.cookie.is_empty() {
                format!("__CCA_STICKY_{service}")
            } else {
                s.cookie
            },
            ..s
        });
        if let (Some(s), Some(span)) = (&sticky, sticky_span)
            && s.secure
            && tls.is_none()
        {
            self.report(
                Diagnostic::warning(
                    codes::INSECURE_COOKIE,
                    span,
                    "a `secure` sticky cookie on a gate without TLS is never sent back",
                )
                .with_help("add a `tls { }` block or drop `secure`"),
            );
        }
        if !fresh {
            return;
        }
        if port_number.is_none() && !service.is_empty() {
            let site = Site {
                file: self.file,
                span: port.as_ref().map_or(entry.key_span(), |p| p.span),
            };
            let port_name = port.and_then(|p| match p.value {
                Scalar::Name(name) => Some(name),
                _ => None,
            });
            self.gate_ports.push(PendingGatePort {
                gate: name.clone(),
                service: service.clone(),
                port: port_name,
                site,
            });
        }
        let spec = GateSpec {
            name: name.clone(),
            hosts,
            service,
            port: port_number.unwrap_or(0),
            sticky,
            tls,
            ..GateSpec::default()
        };
        self.program.gates.insert(name, spec);
    }

    /// The hosts of a `host` line, with where each was written.
    fn hosts(&mut self, item: Entry<'_>) -> Vec<(String, Span)> {
        let Some(values) = self.scalars(item) else {
            return Vec::new();
        };
        let mut hosts = Vec::new();
        for value in &values {
            let Some(host) = self.text_of(value) else {
                continue;
            };
            hosts.push((host.to_ascii_lowercase(), value.span));
        }
        hosts
    }

    /// `service NAME [port PORT]`.
    fn gate_target(&mut self, item: Entry<'_>) -> Option<(String, Option<Spanned>, Span)> {
        let values = self.scalars(item)?;
        let (service, port) = match values.as_slice() {
            [service] => (service, None),
            [service, keyword, port] if keyword.value == Scalar::Name("port".into()) => {
                (service, Some(port.clone()))
            }
            _ => {
                self.report(
                    Diagnostic::error(codes::WRONG_ARITY, item.span(), "malformed gate target")
                        .with_label("expected `service NAME [port PORT]`"),
                );
                return None;
            }
        };
        let name = self.name_of(service)?;
        self.mark("service", service.span);
        Some((name, port, item.span()))
    }

    fn sticky(&mut self, item: Entry<'_>) -> Option<Sticky> {
        let mut sticky = Sticky {
            cookie: String::new(),
            secure: false,
            http_only: false,
            same_site: SameSite::Lax,
        };
        if item.block().is_none() {
            return (self.flag(item) == Some(true)).then_some(sticky);
        }
        for entry in self.entries(item.block(), Context::Sticky) {
            match entry.key() {
                "cookie" => {
                    if let Some(cookie) = self.setting_text(entry) {
                        sticky.cookie = cookie;
                    }
                }
                "secure" => sticky.secure = self.flag(entry).unwrap_or(false),
                "http_only" => sticky.http_only = self.flag(entry).unwrap_or(false),
                "same_site" => {
                    self.mark("sticky.same_site", entry.span());
                    if let Some(value) = self.single(entry) {
                        sticky.same_site = self.same_site(&value)?;
                    }
                }
                _ => {}
            }
        }
        Some(sticky)
    }

    fn same_site(&mut self, value: &Spanned) -> Option<SameSite> {
        let text = self.text_of(value)?;
        match text.to_ascii_lowercase().as_str() {
            "strict" => Some(SameSite::Strict),
            "lax" => Some(SameSite::Lax),
            "none" => Some(SameSite::None),
            _ => {
                self.report(
                    Diagnostic::error(
                        codes::WRONG_TYPE,
                        value.span,
                        format!("unknown SameSite value `{text}`"),
                    )
                    .with_label("expected \"Strict\", \"Lax\" or \"None\""),
                );
                None
            }
        }
    }

    fn tls(&mut self, item: Entry<'_>) -> Option<Tls> {
        let block = self.block_of(item)?;
        let (mut self_signed, mut cert, mut key) = (false, None, None);
        for entry in self.entries(Some(block), Context::Tls) {
            let slot = match entry.key() {
                "self_signed" => {
                    self_signed = self.flag(entry).unwrap_or(false);
                    continue;
                }
                "cert" => &mut cert,
                "key" => &mut key,
                _ => continue,
            };
            *slot = self.setting_name(entry);
            if let Some((_, span)) = slot {
                self.mark(format!("tls.{}", entry.key()).as_str(), *span);
            }
        }
        match (self_signed, cert, key) {
            (true, None, None) => Some(Tls::SelfSigned),
            (false, Some((cert, _)), Some((key, _))) => Some(Tls::Secrets { cert, key }),
            (true, _, _) => {
                self.report(
                    Diagnostic::error(
                        codes::CONFLICT,
                        item.key_span(),
                        "`self_signed` and a `cert`/`key` pair exclude each other",
                    )
                    .with_help("use either `self_signed` or `cert = SECRET  key = SECRET`"),
                );
                None
            }
            _ => {
                self.report(
                    Diagnostic::error(
                        codes::MISSING_FIELD,
                        item.key_span(),
                        "TLS needs `self_signed` or both `cert` and `key`",
                    )
                    .with_help(
                        "write `tls { self_signed }` or `tls { cert = site_cert  key = site_key }`",
                    ),
                );
                None
            }
        }
    }

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

    pub(crate) fn group(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, false) else {
            return;
        };
        let fresh = self.define(Kind::Group, &name, entry.key_span(), name_span);
        let block = self.block_of(entry);
        let mut services = Vec::new();
        for item in self.entries(block, Context::Group) {
            let Some(value) = self.single(item) else {
                continue;
            };
            let Scalar::List(members) = &value.value else {
                self.wrong_type(&value, "a list of services `[a, b]`");
                continue;
            };
            for member in members {
                let Some(service) = self.name_of(member) else {
                    continue;
                };
                self.mark(Field::from("services").index(services.len()), member.span);
                services.push(service);
            }
        }
        if fresh && block.is_some() {
            self.program.groups.insert(
                name.clone(),
                GroupSpec {
                    name,
                    services,
                    tenant: None,
                },
            );
        }
    }
}
