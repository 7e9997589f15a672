//! Compiling `gate` blocks into `GateSpec`s: hosts, the target and the
//! path routes (a port given by name, or not at all, is resolved in
//! `checks` once every service is compiled), balancing, sticky sessions,
//! TLS and its HTTPS redirect, and the proxy's timeouts, retries, circuit
//! breaker, rate limits, cache and queue. What a gate's values may be
//! (ranges, prefixes, references) is `cca_model::validity`'s to judge.

use cca_model::spec::{
    Balance, CircuitBreaker, Duration, GatePath, GateSpec, GateTimeouts, Memory, Percent, Rate,
    RateLimit, ResponseCache, Retries, SameSite, Sticky, Tls,
};
use cca_model::validity::{Field, Subject};

use super::read::{Scalar, Spanned};
use super::{Compiler, Kind, Site};
use crate::ast::Entry;
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::schema::Context;

/// A gate target (the gate's own or a path's) whose port is given by
/// name or not at all; resolved against the service's ports once every
/// service is compiled.
#[derive(Debug, Clone)]
pub(crate) struct PendingGatePort {
    pub gate: String,
    /// The path route's index and prefix; `None` for the gate's own target.
    pub path: Option<(usize, String)>,
    pub service: String,
    pub port: Option<String>,
    pub site: Site,
}

/// `balance = "…"`, spelled like the service's `affinity` values.
const BALANCES: &[(&str, Balance)] = &[
    ("round-robin", Balance::RoundRobin),
    ("least-connections", Balance::LeastConnections),
    ("source-ip", Balance::SourceIp),
];

/// One rate of a `rate_limit` block as written; `Some(None)` is a value
/// written in error (reported).
#[derive(Clone, Copy, Default)]
struct WrittenRate {
    per_second: Option<Option<u32>>,
    /// With the key's span, for a burst without its rate.
    burst: Option<(Option<u32>, Span)>,
}

/// A target as written: a service and maybe its port.
struct Target {
    service: String,
    port: Option<Spanned>,
    /// Where a missing port is reported.
    at: Span,
}

impl Compiler<'_> {
    pub(crate) fn gate(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, false) else {
            return;
        };
        let fresh = self.define(Kind::Gate, &name, entry.key_span(), name_span);
        let block = self.block_of(entry);
        let mut spec = GateSpec {
            name: name.clone(),
            ..GateSpec::default()
        };
        let mut target: Option<Target> = None;
        let mut paths: Vec<(GatePath, Target)> = Vec::new();
        let mut sticky_span = None;
        for item in self.entries(block, Context::Gate) {
            match item.key() {
                "host" => {
                    for (host, span) in self.hosts(item) {
                        self.mark(Field::from("hosts").index(spec.hosts.len()), span);
                        spec.hosts.push(host);
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
                            .with_help(
                                "use one `service NAME [port PORT]` line per gate, and \
                                 `path \"/prefix\" service NAME` for other services",
                            ),
                        );
                        continue;
                    }
                    target = self.gate_target(item);
                }
                "path" => {
                    if let Some(path) = self.gate_path(item, paths.len()) {
                        paths.push(path);
                    }
                }
                "balance" => {
                    self.mark("balance", item.span());
                    if let Some(balance) = self.setting_choice(item, BALANCES) {
                        spec.balance = balance;
                    }
                }
                "sticky" => {
                    sticky_span = Some(item.key_span());
                    spec.sticky = self.sticky(item);
                }
                "tls" => {
                    let (tls, redirect) = self.tls(item);
                    // A `redirect` in a `tls` block that did not compile
                    // (reported) is not reported again as lacking TLS.
                    spec.redirect_https = redirect && tls.is_some();
                    spec.tls = tls;
                }
                "timeouts" => self.timeouts(item, &mut spec.timeouts),
                "retries" => self.retries(item, &mut spec.retries),
                "circuit_breaker" => self.circuit_breaker(item, &mut spec.circuit_breaker),
                "rate_limit" => spec.rate_limit = self.rate_limit(item),
                "cache" => spec.cache = self.cache(item),
                "queue" => {
                    self.mark("queue", item.span());
                    if let Some(queue) = self.setting_count(item) {
                        spec.queue = queue;
                    }
                }
                _ => {}
            }
        }
        if block.is_none() {
            return;
        }
        // A gate without `service` is kept (with none) so that the model's
        // rules report it along with the rest of the gate.
        if let Some(target) = target {
            spec.service = target.service.clone();
            spec.port = self.target_port(&name, None, target, fresh);
        }
        for (index, (mut path, target)) in paths.into_iter().enumerate() {
            let route = Some((index, path.prefix.clone()));
            path.port = self.target_port(&name, route, target, fresh);
            spec.paths.push(path);
        }
        let service = spec.service.clone();
        if let Some(sticky) = &mut spec.sticky
            && sticky.cookie.is_empty()
        {
            sticky.cookie = format!("__CCA_STICKY_{service}");
        }
        if let (Some(sticky), Some(span)) = (&spec.sticky, sticky_span)
            && sticky.secure
            && spec.tls.is_none()
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
        if fresh {
            self.program.gates.insert(name, spec);
        }
    }

    /// The port number of a target written with one; a port name, or no
    /// port (the service's first), is queued for `resolve_gate_ports` and
    /// is 0 until then. A port in error is reported here, not again by
    /// the model's rules.
    fn target_port(
        &mut self,
        gate: &str,
        path: Option<(usize, String)>,
        target: Target,
        fresh: bool,
    ) -> u16 {
        let field = match &path {
            Some((index, _)) => Field::from("paths").index(*index).field("port"),
            None => Field::from("port"),
        };
        let name = match &target.port {
            Some(
                port @ Spanned {
                    value: Scalar::Number(_),
                    ..
                },
            ) => {
                if let Some(number) = self.port_of(port) {
                    return number;
                }
                self.reported.insert(Subject::new(Kind::Gate, gate, field));
                return 0;
            }
            Some(port) => {
                let Some(name) = self.name_of(port) else {
                    self.reported.insert(Subject::new(Kind::Gate, gate, field));
                    return 0;
                };
                Some(name)
            }
            None => None,
        };
        if fresh {
            let span = target.port.as_ref().map_or(target.at, |port| port.span);
            self.gate_ports.push(PendingGatePort {
                gate: gate.to_owned(),
                path,
                service: target.service,
                port: name,
                site: Site {
                    file: self.file,
                    span,
                },
            });
        }
        0
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
    fn gate_target(&mut self, item: Entry<'_>) -> Option<Target> {
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
        if let Some(port) = &port {
            self.mark("port", port.span);
        }
        Some(Target {
            service: name,
            port,
            at: item.span(),
        })
    }

    /// `path "/prefix" service NAME [port PORT]`, the `index`th route.
    fn gate_path(&mut self, item: Entry<'_>, index: usize) -> Option<(GatePath, Target)> {
        let values = self.scalars(item)?;
        let word = |value: &Spanned, word: &str| value.value == Scalar::Name(word.into());
        let (prefix, service, port) = match values.as_slice() {
            [prefix, keyword, service] if word(keyword, "service") => (prefix, service, None),
            [prefix, keyword, service, port_keyword, port]
                if word(keyword, "service") && word(port_keyword, "port") =>
            {
                (prefix, service, Some(port.clone()))
            }
            _ => {
                self.report(
                    Diagnostic::error(codes::WRONG_ARITY, item.span(), "malformed gate path")
                        .with_label("expected `path \"/prefix\" service NAME [port PORT]`")
                        .with_help("for example `path \"/api\" service api port http`"),
                );
                return None;
            }
        };
        let text = self.text_of(prefix)?;
        let name = self.name_of(service)?;
        let field = Field::from("paths").index(index);
        self.mark(field.clone(), item.span());
        self.mark(field.clone().field("prefix"), prefix.span);
        self.mark(field.clone().field("service"), service.span);
        if let Some(port) = &port {
            self.mark(field.field("port"), port.span);
        }
        let path = GatePath {
            prefix: text,
            service: name.clone(),
            port: 0,
        };
        let target = Target {
            service: name,
            port,
            at: item.span(),
        };
        Some((path, target))
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

    /// The certificate's source, and whether plain HTTP is redirected.
    fn tls(&mut self, item: Entry<'_>) -> (Option<Tls>, bool) {
        let Some(block) = self.block_of(item) else {
            return (None, false);
        };
        let (mut self_signed, mut cert, mut key, mut redirect) = (false, None, None, false);
        for entry in self.entries(Some(block), Context::Tls) {
            let slot = match entry.key() {
                "self_signed" => {
                    self_signed = self.flag(entry).unwrap_or(false);
                    continue;
                }
                "redirect" => {
                    self.mark("redirect_https", entry.span());
                    redirect = self.flag(entry).unwrap_or(false);
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
        let tls = match (self_signed, cert, key) {
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
        };
        (tls, redirect)
    }

    fn timeouts(&mut self, item: Entry<'_>, timeouts: &mut GateTimeouts) {
        let block = self.block_of(item);
        self.mark("timeouts", item.key_span());
        for entry in self.entries(block, Context::Timeouts) {
            let slot = match entry.key() {
                "connect" => &mut timeouts.connect,
                "response" => &mut timeouts.response,
                "idle" => &mut timeouts.idle,
                "wake" => &mut timeouts.wake,
                _ => continue,
            };
            self.mark(format!("timeouts.{}", entry.key()).as_str(), entry.span());
            if let Some(duration) = self.setting_quantity(entry, "a duration", Duration::parse) {
                *slot = duration;
            }
        }
    }

    fn retries(&mut self, item: Entry<'_>, retries: &mut Retries) {
        let block = self.block_of(item);
        self.mark("retries", item.key_span());
        for entry in self.entries(block, Context::Retries) {
            match entry.key() {
                "attempts" => {
                    self.mark("retries.attempts", entry.span());
                    if let Some(attempts) = self.setting_count(entry) {
                        retries.attempts = attempts;
                    }
                }
                "budget" => {
                    self.mark("retries.budget", entry.span());
                    if let Some(budget) =
                        self.setting_quantity(entry, "a percentage", Percent::parse)
                    {
                        retries.budget = budget;
                    }
                }
                _ => {}
            }
        }
    }

    fn circuit_breaker(&mut self, item: Entry<'_>, breaker: &mut CircuitBreaker) {
        let block = self.block_of(item);
        self.mark("circuit_breaker", item.key_span());
        for entry in self.entries(block, Context::CircuitBreaker) {
            let key = entry.key();
            self.mark(format!("circuit_breaker.{key}").as_str(), entry.span());
            match key {
                "failures" => {
                    if let Some(failures) = self.setting_count(entry) {
                        breaker.failures = failures;
                    }
                }
                "ejection" => {
                    if let Some(ejection) =
                        self.setting_quantity(entry, "a duration", Duration::parse)
                    {
                        breaker.ejection = ejection;
                    }
                }
                "max_ejected" => {
                    if let Some(share) =
                        self.setting_quantity(entry, "a percentage", Percent::parse)
                    {
                        breaker.max_ejected = share;
                    }
                }
                _ => {}
            }
        }
    }

    /// `rate_limit { per_client = N  per_client_burst = N  per_gate = N
    /// per_gate_burst = N }`, in requests per second; a burst defaults to
    /// its rate. A block that yields no rate from what it says (each entry
    /// in error, reported) limits nothing rather than being reported again
    /// as empty; an empty block is the model's to report.
    fn rate_limit(&mut self, item: Entry<'_>) -> Option<RateLimit> {
        let block = self.block_of(item)?;
        self.mark("rate_limit", item.key_span());
        // Per client, then per gate.
        let mut written = [WrittenRate::default(); 2];
        for entry in self.entries(Some(block), Context::RateLimit) {
            let (index, who, burst) = match entry.key() {
                "per_client" => (0, "per_client", false),
                "per_client_burst" => (0, "per_client", true),
                "per_gate" => (1, "per_gate", false),
                "per_gate_burst" => (1, "per_gate", true),
                _ => continue,
            };
            let part = if burst { "burst" } else { "per_second" };
            self.mark(format!("rate_limit.{who}.{part}").as_str(), entry.span());
            let count = self.setting_count(entry);
            if burst {
                written[index].burst = Some((count, entry.key_span()));
            } else {
                written[index].per_second = Some(count);
            }
        }
        let mut limit = RateLimit::default();
        for (index, who) in ["per_client", "per_gate"].into_iter().enumerate() {
            let WrittenRate { per_second, burst } = written[index];
            let rate = match (per_second, burst) {
                (Some(Some(per_second)), burst) => match burst {
                    None => Some(per_second),
                    Some((Some(burst), _)) => Some(burst),
                    Some((None, _)) => None,
                }
                .map(|burst| Rate { per_second, burst }),
                (None, Some((_, span))) => {
                    self.report(
                        Diagnostic::error(
                            codes::MISSING_FIELD,
                            span,
                            format!("`{who}_burst` without `{who}`"),
                        )
                        .with_label("a burst of which rate?")
                        .with_help(format!(
                            "add `{who} = N` (requests per second); a burst is how many \
                             requests the bucket lets through at once above that rate"
                        )),
                    );
                    None
                }
                (Some(None), _) | (None, None) => None,
            };
            match index {
                0 => limit.per_client = rate,
                _ => limit.per_gate = rate,
            }
        }
        let wrote = block.entries().next().is_some();
        if wrote && limit.per_client.is_none() && limit.per_gate.is_none() {
            return None;
        }
        Some(limit)
    }

    /// `cache` (the defaults), `cache = false`, or `cache { ... }`.
    fn cache(&mut self, item: Entry<'_>) -> Option<ResponseCache> {
        self.mark("cache", item.key_span());
        let mut cache = ResponseCache::default();
        if item.block().is_none() {
            return (self.flag(item) == Some(true)).then_some(cache);
        }
        for entry in self.entries(item.block(), Context::Cache) {
            let key = entry.key();
            self.mark(format!("cache.{key}").as_str(), entry.span());
            match key {
                "size" | "max_entry" => {
                    let slot = if key == "size" {
                        &mut cache.size
                    } else {
                        &mut cache.max_entry
                    };
                    if let Some(size) = self.setting_quantity(entry, "a memory size", Memory::parse)
                    {
                        *slot = size;
                    }
                }
                "ttl" => {
                    if let Some(ttl) = self.setting_quantity(entry, "a duration", Duration::parse) {
                        cache.ttl = ttl;
                    }
                }
                _ => {}
            }
        }
        Some(cache)
    }
}

#[cfg(test)]
mod tests {
    use cca_model::spec::{
        Balance, CircuitBreaker, Duration, GatePath, GateSpec, GateTimeouts, Memory, Percent, Rate,
        RateLimit, ResponseCache, Retries, Tls,
    };

    use crate::compile::compile_str;
    use crate::diagnostic::codes;
    use crate::template::Values;

    const SERVICES: &str = "service web {\n  run = \"web\"\n  port http 8080\n  port admin 8081\n}\n\
                            service api {\n  run = \"api\"\n  port grpc 9000\n  port http 9001\n}\n";

    /// The gate `g` that `body` compiles to, next to services `web` and
    /// `api`; any diagnostic but "not enforced yet" fails the test.
    fn gate(body: &str) -> GateSpec {
        let text = format!("{SERVICES}gate g {{\n  host \"g.example\"\n{body}\n}}\n");
        let compiled = compile_str(&text, &Values::default());
        let found: Vec<String> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.code != codes::NOT_ENFORCED)
            .map(|d| format!("{} {}", d.code, d.message))
            .collect();
        assert!(found.is_empty(), "{body}: {found:#?}");
        compiled.program.gates["g"].clone()
    }

    /// The diagnostics (but "not enforced yet") of a gate `g` with `body`.
    fn errors(body: &str) -> Vec<String> {
        let text = format!("{SERVICES}gate g {{\n  host \"g.example\"\n{body}\n}}\n");
        compile_str(&text, &Values::default())
            .diagnostics
            .iter()
            .filter(|d| d.code != codes::NOT_ENFORCED)
            .map(|d| format!("{} {}", d.code, d.message))
            .collect()
    }

    #[test]
    fn a_gate_with_hosts_and_target_only_has_every_default() {
        let g = gate("service web");
        assert_eq!(
            g,
            GateSpec {
                name: "g".into(),
                hosts: vec!["g.example".into()],
                service: "web".into(),
                port: 8080,
                ..GateSpec::default()
            }
        );
        assert_eq!(g.balance, Balance::RoundRobin);
        assert_eq!(g.queue, 1000);
        assert_eq!(g.rate_limit, None);
        assert_eq!(g.cache, None);
        assert!(!g.redirect_https);
    }

    #[test]
    fn paths_resolve_their_ports_like_the_gates_own_target() {
        let g = gate(
            "service web port admin\n\
             path \"/api\" service api port http\n\
             path \"/rpc\" service api\n\
             path \"/raw\" service api port 9100",
        );
        assert_eq!(g.port, 8081);
        let path = |prefix: &str, port| GatePath {
            prefix: prefix.into(),
            service: "api".into(),
            port,
        };
        assert_eq!(
            g.paths,
            [path("/api", 9001), path("/rpc", 9000), path("/raw", 9100)]
        );
        assert_eq!(g.services(), ["web", "api"]);
        assert_eq!(
            errors("service web\npath \"/api\" service api port htp"),
            ["cca::E018 service `api` has no port named `htp`"]
        );
        assert_eq!(
            errors("service web\npath \"/api\" api"),
            ["cca::E012 malformed gate path"]
        );
    }

    #[test]
    fn balance_takes_its_three_values() {
        for (written, balance) in [
            ("round-robin", Balance::RoundRobin),
            ("least-connections", Balance::LeastConnections),
            ("source-ip", Balance::SourceIp),
        ] {
            let g = gate(&format!("service web\nbalance = \"{written}\""));
            assert_eq!(g.balance, balance, "{written}");
        }
        assert_eq!(
            errors("service web\nbalance = \"fastest\""),
            ["cca::E013 unknown `balance` value `fastest`"]
        );
    }

    #[test]
    fn redirect_is_a_flag_of_tls() {
        let g = gate("service web\ntls { self_signed; redirect }");
        assert_eq!(g.tls, Some(Tls::SelfSigned));
        assert!(g.redirect_https);
        let g = gate("service web\ntls { self_signed; redirect = false }");
        assert!(!g.redirect_https);
        // The TLS block's own error is the one reported.
        assert_eq!(
            errors("service web\ntls { redirect }"),
            ["cca::E017 TLS needs `self_signed` or both `cert` and `key`"]
        );
    }

    #[test]
    fn timeouts_retries_and_the_circuit_breaker_set_what_is_written() {
        let g = gate(
            "service web\n\
             timeouts { connect = 1s  response = 3s  idle = 4s  wake = 5s }\n\
             retries { attempts = 0  budget = 5% }\n\
             circuit_breaker { failures = 7  ejection = 1m  max_ejected = 25% }\n\
             queue = 12",
        );
        assert_eq!(
            g.timeouts,
            GateTimeouts {
                connect: Duration(1000),
                response: Duration(3000),
                idle: Duration(4000),
                wake: Duration(5000),
            }
        );
        assert_eq!(
            g.retries,
            Retries {
                attempts: 0,
                budget: Percent(5),
            }
        );
        assert_eq!(
            g.circuit_breaker,
            CircuitBreaker {
                failures: 7,
                ejection: Duration(60_000),
                max_ejected: Percent(25),
            }
        );
        assert_eq!(g.queue, 12);
        // A block sets only what it names.
        let g = gate("service web\ntimeouts { wake = 2m }\nretries { attempts = 4 }");
        assert_eq!(g.timeouts.wake, Duration(120_000));
        assert_eq!(g.timeouts.connect, GateTimeouts::default().connect);
        assert_eq!(g.retries.budget, Retries::default().budget);
        assert_eq!(
            errors("service web\ntimeouts { idle = 60 }\nretries { budget = 20 }"),
            [
                "cca::E014 invalid duration `60`: unknown unit `(none)`; expected one of: ms, s, m, h, d",
                "cca::E014 invalid percentage `20`: unknown unit `(none)`; expected one of: %",
            ]
        );
    }

    #[test]
    fn a_burst_defaults_to_its_rate_and_needs_one() {
        let g = gate("service web\nrate_limit { per_client = 100 }");
        let rate = |per_second, burst| Some(Rate { per_second, burst });
        assert_eq!(
            g.rate_limit,
            Some(RateLimit {
                per_client: rate(100, 100),
                per_gate: None,
            })
        );
        let g = gate(
            "service web\n\
             rate_limit { per_client = 10  per_client_burst = 50  per_gate = 5000 }",
        );
        assert_eq!(
            g.rate_limit,
            Some(RateLimit {
                per_client: rate(10, 50),
                per_gate: rate(5000, 5000),
            })
        );
        assert_eq!(
            errors("service web\nrate_limit { per_gate_burst = 10 }"),
            ["cca::E017 `per_gate_burst` without `per_gate`"]
        );
        // A rate in error is reported once, not again as an empty block.
        assert_eq!(
            errors("service web\nrate_limit { per_client = -1 }"),
            ["cca::E013 `per_client` must be a non-negative whole number, not `-1`"]
        );
        assert_eq!(
            errors("service web\nrate_limit {}"),
            ["cca::E017 gate `g`: `rate_limit` sets no rate"]
        );
    }

    #[test]
    fn cache_is_a_flag_for_its_defaults_or_a_block() {
        assert_eq!(
            gate("service web\ncache").cache,
            Some(ResponseCache::default())
        );
        assert_eq!(
            gate("service web\ncache = true").cache,
            Some(ResponseCache::default())
        );
        assert_eq!(gate("service web\ncache = false").cache, None);
        assert_eq!(
            gate("service web\ncache { size = 8Mi  ttl = 10s }").cache,
            Some(ResponseCache {
                size: Memory(8 << 20),
                max_entry: Memory(1 << 20),
                ttl: Duration(10_000),
            })
        );
        assert_eq!(
            errors("service web\ncache { size = 1Mi  max_entry = 2Mi }"),
            ["cca::E019 gate `g`: `cache.max_entry` (2Mi) is larger than `cache.size` (1Mi)"]
        );
    }

    #[test]
    fn unknown_keys_of_every_gate_block_get_a_suggestion() {
        for (body, close) in [
            ("balanse = \"source-ip\"", "balance"),
            ("timeouts { conect = 1s }", "connect"),
            ("retries { attempt = 1 }", "attempts"),
            ("circuit_breaker { failure = 1 }", "failures"),
            ("rate_limit { per_clients = 1 }", "per_client"),
            ("cache { max_entries = 1Mi }", "max_entry"),
            ("tls { self_signed; redirct }", "redirect"),
        ] {
            let found = errors(&format!("service web\n{body}"));
            assert_eq!(found.len(), 1, "{body}: {found:?}");
            assert!(
                found[0].starts_with("cca::E011 unknown key")
                    && found[0].ends_with(&format!("did you mean `{close}`?")),
                "{body}: {found:?}"
            );
        }
    }
}
