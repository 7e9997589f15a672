//! The rules themselves, one function per kind of object. Each reports
//! every problem it finds (never only the first) with the words the DSL
//! compiler shows, so a program refused by the server reads the same as
//! one refused by `cca lint`.

use std::collections::BTreeMap;

use super::{Code, Field, ObjectKind, Problem, Subject, Undefined};
use crate::spec::{
    ConnectionSpec, GateSpec, NetworkPolicy, Peer, Probe, Program, SameSite, SecretGrant,
    ServiceSpec, Tls,
};

/// More replicas than any cluster we target could run: a typo guard.
pub const MAX_REPLICAS: u32 = 100_000;

/// Most requests a gate node holds for one gate while its service wakes.
pub const MAX_GATE_QUEUE: u32 = 1_000_000;

/// Longest name of an object other than a service.
const MAX_NAME_LEN: usize = 253;

/// How the name rule is explained.
pub const NAME_HELP: &str = "names use letters, digits, `_` and `-`, at most 253 characters";
/// How the service name rule is explained.
pub const SERVICE_NAME_HELP: &str =
    "service names are DNS labels: lowercase letters, digits and `-`, at most 63 characters";

/// Names that may appear in keys: letters, digits, `_`, `-`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Service names are DNS labels (`{svc}.cca.local`).
pub fn is_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Host names a gate answers for: letters, digits, `.`, `-` and `*`.
pub fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'*'))
}

/// The problem of a name that breaks the name rule of its kind, if any:
/// what the DSL compiler reports where a name is written, and what the
/// server reports for a program posted by hand.
pub fn name_problem(kind: ObjectKind, name: &str) -> Option<Problem> {
    let (valid, what, help) = match kind {
        ObjectKind::Service => (is_service_name(name), "service name", SERVICE_NAME_HELP),
        _ => (is_valid_name(name), "name", NAME_HELP),
    };
    (!valid).then(|| {
        Problem::new(
            Code::InvalidName,
            Subject::new(kind, name, "name"),
            format!("`{}` is not a valid {what}", name.escape_debug()),
        )
        .with_label("invalid name")
        .with_help(help)
    })
}

pub(super) fn check(program: &Program) -> Vec<Problem> {
    let mut check = Check {
        program,
        problems: Vec::new(),
    };
    for (name, spec) in &program.services {
        check.service(name, spec);
    }
    check.tags_and_grants();
    for (name, gate) in &program.gates {
        check.gate(name, gate);
    }
    check.hosts();
    for (name, connection) in &program.connections {
        check.connection(name, connection);
    }
    for (name, secret) in &program.secrets {
        check.named(ObjectKind::Secret, name, &secret.name);
    }
    for (name, policy) in &program.networks {
        check.network(name, policy);
    }
    check.problems
}

struct Check<'p> {
    program: &'p Program,
    problems: Vec<Problem>,
}

impl<'p> Check<'p> {
    fn report(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    /// The object's key is a valid name and the spec under it has it.
    fn named(&mut self, kind: ObjectKind, key: &str, inner: &str) {
        if let Some(problem) = name_problem(kind, key) {
            self.report(problem);
        }
        if inner != key {
            self.report(Problem::new(
                Code::Conflict,
                Subject::new(kind, key, "name"),
                format!(
                    "{} `{key}` holds a spec named `{}`",
                    kind.noun(),
                    inner.escape_debug()
                ),
            ));
        }
    }

    /// `name` (of `kind`) exists in the program; `subject` uses it.
    /// Whether it does.
    fn refer(&mut self, kind: ObjectKind, name: &str, subject: Subject, user: String) -> bool {
        let defined = match kind {
            ObjectKind::Service => self.program.services.contains_key(name),
            ObjectKind::Gate => self.program.gates.contains_key(name),
            ObjectKind::Connection => self.program.connections.contains_key(name),
            ObjectKind::Secret => self.program.secrets.contains_key(name),
            ObjectKind::Network => self.program.networks.contains_key(name),
        };
        if defined {
            return true;
        }
        let mut problem = Problem::new(
            Code::UndefinedReference,
            subject,
            format!("undefined {} `{}`", kind.noun(), name.escape_debug()),
        )
        .with_label(format!("used by {user}"))
        .with_help(format!(
            "declare it: `{} {} {{ ... }}`",
            kind.keyword(),
            name.escape_debug()
        ));
        problem.undefined = Some(Undefined {
            kind,
            name: name.to_owned(),
        });
        self.report(problem);
        false
    }

    fn port_number(&mut self, number: u16, subject: Subject) {
        if number == 0 {
            self.report(
                Problem::new(Code::OutOfRange, subject, "port 0 is out of range")
                    .with_label("ports are 1 to 65535"),
            );
        }
    }

    fn service(&mut self, name: &str, spec: &ServiceSpec) {
        let at = |field: Field| Subject::new(ObjectKind::Service, name, field);
        let user = || format!("service `{name}`");
        self.named(ObjectKind::Service, name, &spec.name);
        if spec.replicas > MAX_REPLICAS {
            self.report(
                Problem::new(
                    Code::OutOfRange,
                    at("replicas".into()),
                    format!(
                        "{} replicas is more than the limit of {MAX_REPLICAS}",
                        spec.replicas
                    ),
                )
                .with_label(format!("at most {MAX_REPLICAS}")),
            );
        }
        for (index, port) in spec.ports.iter().enumerate() {
            let field = Field::from("ports").index(index);
            self.port_number(port.number, at(field.clone().field("number")));
            if let Some(port_name) = &port.name
                && !is_valid_name(port_name)
            {
                self.report(
                    Problem::new(
                        Code::InvalidName,
                        at(field.clone().field("name")),
                        format!("`{}` is not a valid port name", port_name.escape_debug()),
                    )
                    .with_help(NAME_HELP),
                );
            }
            let first = spec.ports[..index].iter().position(|p| {
                (p.number == port.number && p.protocol == port.protocol)
                    || (p.name.is_some() && p.name == port.name)
            });
            if let Some(first) = first {
                self.report(
                    Problem::new(
                        Code::DuplicateName,
                        at(field),
                        "this port is declared twice",
                    )
                    .with_label("same name or number as an earlier port")
                    .with_related(at(Field::from("ports").index(first)), "declared first here"),
                );
            }
        }
        if let Some(health) = &spec.health
            && let Probe::Http { port, .. } | Probe::Tcp { port } = &health.probe
        {
            self.port_number(*port, at("health.probe.port".into()));
        }
        if spec.resources.cpu.is_some_and(|cpu| cpu.0 == 0) {
            self.report(
                Problem::new(
                    Code::OutOfRange,
                    at("resources.cpu".into()),
                    "CPU must be more than zero",
                )
                .with_help("write millicores (`250m`) or cores (`2`)"),
            );
        }
        for (index, connection) in spec.connections.iter().enumerate() {
            let subject = at(Field::from("connections").index(index));
            self.refer(ObjectKind::Connection, connection, subject, user());
        }
        self.placement(name, spec);
        self.volumes(name, spec);
        self.init_steps(name, spec);
        if spec.update.max_unavailable == 0 && spec.update.max_surge == 0 {
            self.report(
                Problem::new(
                    Code::Conflict,
                    at("update".into()),
                    "an update with `max_unavailable = 0` and `max_surge = 0` can never progress",
                )
                .with_help("allow at least one of them to be 1"),
            );
        }
        self.autoscale(name, spec);
        if spec.stateful && spec.scale_to_zero.is_some() {
            self.report(
                Problem::new(
                    Code::Conflict,
                    at("scale_to_zero".into()),
                    "a stateful service cannot scale to zero",
                )
                .with_related(at("stateful".into()), "stateful here")
                .with_help("stateful instances keep ordinals and volumes; remove one of the two"),
            );
        }
    }

    fn placement(&mut self, name: &str, spec: &ServiceSpec) {
        let at = |field: Field| Subject::new(ObjectKind::Service, name, field);
        let placement = &spec.placement;
        for (hint, list) in [
            ("colocate", &placement.colocate),
            ("separate", &placement.separate),
        ] {
            for (index, target) in list.iter().enumerate() {
                let subject = at(Field::from("placement").field(hint).index(index));
                if target == name {
                    self.report(
                        Problem::new(
                            Code::Conflict,
                            subject,
                            format!("`{name}` cannot {hint} itself"),
                        )
                        .with_label("names the service itself"),
                    );
                    continue;
                }
                let user = format!("placement of `{name}`");
                self.refer(ObjectKind::Service, target, subject, user);
            }
        }
        let both = placement
            .colocate
            .iter()
            .find(|target| *target != name && placement.separate.contains(target));
        if let Some(target) = both {
            self.report(
                Problem::new(
                    Code::Conflict,
                    at("placement".into()),
                    format!("`{name}` both colocates with and separates from `{target}`"),
                )
                .with_help("keep one of the two hints"),
            );
        }
    }

    fn volumes(&mut self, name: &str, spec: &ServiceSpec) {
        let at = |field: Field| Subject::new(ObjectKind::Service, name, field);
        for (index, volume) in spec.volumes.iter().enumerate() {
            let field = Field::from("volumes").index(index);
            if !is_valid_name(&volume.name) {
                self.report(
                    Problem::new(
                        Code::InvalidName,
                        at(field.clone().field("name")),
                        format!(
                            "`{}` is not a valid volume name",
                            volume.name.escape_debug()
                        ),
                    )
                    .with_help(NAME_HELP),
                );
            }
            if !volume.path.starts_with('/') {
                self.report(
                    Problem::new(
                        Code::WrongType,
                        at(field.clone().field("path")),
                        format!(
                            "volume path `{}` is not absolute",
                            volume.path.escape_debug()
                        ),
                    )
                    .with_label("expected a path starting with `/`"),
                );
            }
            if spec.volumes[..index].iter().any(|v| v.name == volume.name) {
                self.report(Problem::new(
                    Code::DuplicateName,
                    at(field),
                    format!("volume `{}` is declared twice", volume.name),
                ));
            }
        }
    }

    fn init_steps(&mut self, name: &str, spec: &ServiceSpec) {
        let at = |field: Field| Subject::new(ObjectKind::Service, name, field);
        for (index, step) in spec.init.iter().enumerate() {
            let field = Field::from("init").index(index);
            if !is_valid_name(&step.name) {
                self.report(
                    Problem::new(
                        Code::InvalidName,
                        at(field.clone().field("name")),
                        format!(
                            "`{}` is not a valid init step name",
                            step.name.escape_debug()
                        ),
                    )
                    .with_help(NAME_HELP),
                );
            }
            if step.command.is_none() && step.probe.is_none() {
                self.report(
                    Problem::new(
                        Code::MissingField,
                        at(field.clone()),
                        format!("init step `{}` does nothing", step.name),
                    )
                    .with_help("give it a `command`, a `probe` connection, or both"),
                );
            }
            if step.timeout.is_some_and(|timeout| timeout.0 == 0) {
                self.report(
                    Problem::new(
                        Code::OutOfRange,
                        at(field.clone().field("timeout")),
                        format!("init step `{}` has a timeout of 0", step.name),
                    )
                    .with_help("give the step time to run, e.g. `timeout = 2m`"),
                );
            }
            if let Some(connection) = &step.probe {
                let user = format!("init step `{}` of `{name}`", step.name);
                self.refer(
                    ObjectKind::Connection,
                    connection,
                    at(field.clone().field("probe")),
                    user,
                );
            }
            if spec.init[..index].iter().any(|s| s.name == step.name) {
                self.report(Problem::new(
                    Code::DuplicateName,
                    at(field),
                    format!("init step `{}` is declared twice", step.name),
                ));
            }
        }
    }

    fn autoscale(&mut self, name: &str, spec: &ServiceSpec) {
        let at = |field: &str| Subject::new(ObjectKind::Service, name, field);
        let Some(autoscale) = &spec.autoscale else {
            return;
        };
        if autoscale.horizontal.is_none() && autoscale.vertical.is_none() {
            self.report(
                Problem::new(
                    Code::MissingField,
                    at("autoscale"),
                    "autoscale says nothing",
                )
                .with_help("give `min`/`max`/`cpu` (horizontal) or a `vertical { }` block"),
            );
        }
        if let Some(h) = &autoscale.horizontal {
            if h.min > h.max {
                self.report(Problem::new(
                    Code::Conflict,
                    at("autoscale.horizontal.max"),
                    format!("autoscale `max = {}` is below `min = {}`", h.max, h.min),
                ));
            }
            for (field, target) in [
                ("autoscale.horizontal.cpu", h.cpu),
                ("autoscale.horizontal.memory", h.memory),
            ] {
                if let Some(percent) = target
                    && (percent.0 == 0 || percent.0 > 100)
                {
                    self.report(
                        Problem::new(
                            Code::OutOfRange,
                            at(field),
                            format!("target {}% is out of range", percent.0),
                        )
                        .with_label("targets are 1% to 100%"),
                    );
                }
            }
            if h.requests_per_second == Some(0) {
                self.report(
                    Problem::new(
                        Code::OutOfRange,
                        at("autoscale.horizontal.requests_per_second"),
                        "a target of 0 requests per second per instance is out of range",
                    )
                    .with_label("at least 1"),
                );
            }
        }
        if let Some(v) = &autoscale.vertical {
            let inverted = matches!((v.min_cpu, v.max_cpu), (Some(a), Some(b)) if a > b)
                || matches!((v.min_memory, v.max_memory), (Some(a), Some(b)) if a > b);
            if inverted {
                self.report(Problem::new(
                    Code::Conflict,
                    at("autoscale.vertical"),
                    "vertical autoscale has a minimum above its maximum",
                ));
            }
        }
    }

    /// Tags and grants belong to a service of the same program (an apply
    /// writes a service with its sub-facts); grants name declared secrets.
    fn tags_and_grants(&mut self) {
        let program = self.program;
        let at = |service: &str, field: Field| Subject::new(ObjectKind::Service, service, field);
        for (service, tags) in &program.tags {
            if !program.services.contains_key(service) {
                self.report(Problem::new(
                    Code::UndefinedReference,
                    at(service, "tags".into()),
                    format!("tags for service `{service}`, which the program does not define"),
                ));
            }
            for key in tags.keys().filter(|key| !is_valid_name(key)) {
                self.report(
                    Problem::new(
                        Code::InvalidName,
                        at(service, Field::from("tags").key(key)),
                        format!("`{}` is not a valid tag name", key.escape_debug()),
                    )
                    .with_help(NAME_HELP),
                );
            }
        }
        for (service, grants) in &program.grants {
            let Some(spec) = program.services.get(service) else {
                self.report(Problem::new(
                    Code::UndefinedReference,
                    at(service, "secrets".into()),
                    format!(
                        "secret grants for service `{service}`, which the program does not define"
                    ),
                ));
                continue;
            };
            for (secret, grant) in grants {
                let subject = at(service, Field::from("secrets").key(secret));
                match grant {
                    SecretGrant::Explicit => {
                        self.refer(
                            ObjectKind::Secret,
                            secret,
                            subject,
                            format!("service `{service}`"),
                        );
                    }
                    SecretGrant::Connection { connection } => {
                        let used = spec.connections.contains(connection);
                        let carries = program
                            .connections
                            .get(connection)
                            .is_some_and(|c| c.secret.as_ref() == Some(secret));
                        if !(used && carries) {
                            self.report(
                                Problem::new(
                                    Code::Conflict,
                                    subject,
                                    format!(
                                        "secret `{secret}` is granted through connection \
                                         `{connection}`, which service `{service}` does not \
                                         use with that secret"
                                    ),
                                )
                                .with_help(
                                    "grant it explicitly, or have the service use a connection \
                                     whose `secret` it is",
                                ),
                            );
                        }
                    }
                }
            }
        }
    }

    fn gate(&mut self, name: &str, gate: &GateSpec) {
        let at = |field: &str| Subject::new(ObjectKind::Gate, name, field);
        self.named(ObjectKind::Gate, name, &gate.name);
        if gate.hosts.is_empty() {
            self.report(
                Problem::new(
                    Code::MissingField,
                    at("hosts"),
                    format!("gate `{name}` has no `host`"),
                )
                .with_help("add `host \"app.example.com\"`"),
            );
        }
        for (index, host) in gate.hosts.iter().enumerate() {
            if !is_host_name(host) {
                self.report(
                    Problem::new(
                        Code::InvalidName,
                        Subject::new(ObjectKind::Gate, name, Field::from("hosts").index(index)),
                        format!("`{}` is not a host name", host.escape_debug()),
                    )
                    .with_label("letters, digits, `.`, `-` and a leading `*.` only"),
                );
            }
        }
        if gate.service.is_empty() {
            self.report(
                Problem::new(
                    Code::MissingField,
                    at("service"),
                    format!("gate `{name}` has no `service`"),
                )
                .with_help("add `service NAME port PORT`"),
            );
        } else {
            let user = format!("gate `{name}`");
            if self.refer(ObjectKind::Service, &gate.service, at("service"), user) {
                self.port_number(gate.port, at("port"));
            }
        }
        if let Some(sticky) = &gate.sticky
            && sticky.same_site == SameSite::None
            && !sticky.secure
        {
            self.report(
                Problem::new(
                    Code::Conflict,
                    at("sticky.same_site"),
                    "`same_site \"None\"` requires `secure`",
                )
                .with_help("browsers drop SameSite=None cookies that are not Secure"),
            );
        }
        if let Some(Tls::Secrets { cert, key }) = &gate.tls {
            let user = format!("TLS of gate `{name}`");
            self.refer(ObjectKind::Secret, cert, at("tls.cert"), user.clone());
            self.refer(ObjectKind::Secret, key, at("tls.key"), user);
        }
        if gate.redirect_https && gate.tls.is_none() {
            self.report(
                Problem::new(
                    Code::Conflict,
                    at("redirect_https"),
                    format!("gate `{name}` redirects to HTTPS but has no `tls`"),
                )
                .with_help("add `self_signed` or a `cert`/`key` pair to a `tls { }` block"),
            );
        }
        self.gate_paths(name, gate);
        self.gate_proxy(name, gate);
    }

    /// Path routes: a prefix is an absolute path of whole segments, other
    /// than `/` (the gate's own target), written once; its target is a
    /// service of the program and a port.
    fn gate_paths(&mut self, name: &str, gate: &GateSpec) {
        let at = |field: Field| Subject::new(ObjectKind::Gate, name, field);
        for (index, path) in gate.paths.iter().enumerate() {
            let field = Field::from("paths").index(index);
            let prefix = at(field.clone().field("prefix"));
            let shown = path.prefix.escape_debug();
            if !path.prefix.starts_with('/') {
                self.report(
                    Problem::new(
                        Code::WrongType,
                        prefix.clone(),
                        format!("gate `{name}`: path `{shown}` does not start with `/`"),
                    )
                    .with_label("expected a path like \"/api\""),
                );
            } else if path.prefix == "/" {
                self.report(
                    Problem::new(
                        Code::Conflict,
                        prefix.clone(),
                        format!("gate `{name}`: path `/` is the gate's own target"),
                    )
                    .with_help(
                        "every request no other `path` takes goes to the gate's `service`: \
                         drop this line or change that `service`",
                    ),
                );
            } else if path.prefix.ends_with('/') {
                let trimmed = path.prefix.trim_end_matches('/').escape_debug().to_string();
                self.report(
                    Problem::new(
                        Code::WrongType,
                        prefix.clone(),
                        format!("gate `{name}`: path `{shown}` ends with `/`"),
                    )
                    .with_help(format!(
                        "write `{trimmed}`: a prefix matches whole segments, so it takes \
                         `{trimmed}` and everything under `{trimmed}/`"
                    )),
                );
            }
            if path
                .prefix
                .chars()
                .any(|c| matches!(c, '?' | '#') || c.is_whitespace() || c.is_control())
            {
                self.report(
                    Problem::new(
                        Code::WrongType,
                        prefix.clone(),
                        format!(
                            "gate `{name}`: path `{shown}` holds `?`, `#`, a space or a \
                             control character"
                        ),
                    )
                    .with_label("a prefix is matched against the request's path only"),
                );
            }
            if let Some(first) = gate.paths[..index]
                .iter()
                .position(|p| p.prefix == path.prefix)
            {
                self.report(
                    Problem::new(
                        Code::DuplicateName,
                        prefix,
                        format!("gate `{name}`: path `{shown}` is routed twice"),
                    )
                    .with_related(
                        at(Field::from("paths").index(first).field("prefix")),
                        "first routed here",
                    )
                    .with_help("a prefix goes to one target: remove one of the two"),
                );
            }
            let user = format!("path `{shown}` of gate `{name}`");
            if self.refer(
                ObjectKind::Service,
                &path.service,
                at(field.clone().field("service")),
                user,
            ) {
                self.port_number(path.port, at(field.field("port")));
            }
        }
    }

    /// The proxy's settings: clocks that never fire at once, shares that
    /// are shares, at least one failure to eject, rates and a queue that
    /// let something through, a cache entry that fits the cache.
    fn gate_proxy(&mut self, name: &str, gate: &GateSpec) {
        let at = |field: &str| Subject::new(ObjectKind::Gate, name, field);
        let out_of_range = |field: &str, message: String, label: &str| {
            Problem::new(
                Code::OutOfRange,
                at(field),
                format!("gate `{name}`: {message}"),
            )
            .with_label(label.to_owned())
        };
        let mut problems = Vec::new();
        let t = &gate.timeouts;
        let clocks = [
            ("connect", t.connect),
            ("response", t.response),
            ("idle", t.idle),
            ("wake", t.wake),
        ];
        for (clock, span) in clocks {
            if span.0 == 0 {
                problems.push(
                    out_of_range(
                        &format!("timeouts.{clock}"),
                        format!("`timeouts.{clock}` is zero"),
                        "at least 1ms",
                    )
                    .with_help(format!(
                        "a zero timeout fails every request; leave `{clock}` out for the default"
                    )),
                );
            }
        }
        if gate.retries.budget.0 > 100 {
            problems.push(out_of_range(
                "retries.budget",
                format!(
                    "`retries.budget` {}% is out of range",
                    gate.retries.budget.0
                ),
                "0% to 100%",
            ));
        }
        let breaker = &gate.circuit_breaker;
        if breaker.failures == 0 {
            problems.push(out_of_range(
                "circuit_breaker.failures",
                "`circuit_breaker.failures` is 0".to_owned(),
                "at least 1 failure ejects a backend",
            ));
        }
        if breaker.ejection.0 == 0 {
            problems.push(out_of_range(
                "circuit_breaker.ejection",
                "`circuit_breaker.ejection` is zero".to_owned(),
                "at least 1ms",
            ));
        }
        if breaker.max_ejected.0 == 0 || breaker.max_ejected.0 > 100 {
            problems.push(out_of_range(
                "circuit_breaker.max_ejected",
                format!(
                    "`circuit_breaker.max_ejected` {}% is out of range",
                    breaker.max_ejected.0
                ),
                "1% to 100%",
            ));
        }
        if let Some(limit) = &gate.rate_limit {
            if limit.per_client.is_none() && limit.per_gate.is_none() {
                problems.push(
                    Problem::new(
                        Code::MissingField,
                        at("rate_limit"),
                        format!("gate `{name}`: `rate_limit` sets no rate"),
                    )
                    .with_help("write `per_client = 100` or `per_gate = 5000` (requests/second)"),
                );
            }
            for (who, rate) in [
                ("per_client", limit.per_client),
                ("per_gate", limit.per_gate),
            ] {
                let Some(rate) = rate else {
                    continue;
                };
                if rate.per_second == 0 {
                    problems.push(out_of_range(
                        &format!("rate_limit.{who}.per_second"),
                        format!("`rate_limit.{who}` is 0 requests per second"),
                        "at least 1",
                    ));
                } else if rate.burst == 0 {
                    problems.push(out_of_range(
                        &format!("rate_limit.{who}.burst"),
                        format!("`rate_limit.{who}_burst` is 0"),
                        "at least 1",
                    ));
                }
            }
        }
        if let Some(cache) = &gate.cache {
            if cache.size.0 == 0 {
                problems.push(out_of_range(
                    "cache.size",
                    "`cache.size` is zero".to_owned(),
                    "at least 1 byte; remove `cache` to cache nothing",
                ));
            } else if cache.max_entry > cache.size {
                problems.push(
                    Problem::new(
                        Code::Conflict,
                        at("cache.max_entry"),
                        format!(
                            "gate `{name}`: `cache.max_entry` ({}) is larger than `cache.size` ({})",
                            cache.max_entry.human(),
                            cache.size.human()
                        ),
                    )
                    .with_related(at("cache.size"), "the cache's size")
                    .with_help("an entry must fit in the cache: lower `max_entry` or raise `size`"),
                );
            }
            if cache.ttl.0 == 0 {
                problems.push(out_of_range(
                    "cache.ttl",
                    "`cache.ttl` is zero".to_owned(),
                    "at least 1ms; remove `cache` to cache nothing",
                ));
            }
        }
        if gate.queue == 0 || gate.queue > MAX_GATE_QUEUE {
            problems.push(out_of_range(
                "queue",
                format!("`queue = {}` is out of range", gate.queue),
                "1 to 1,000,000 requests",
            ));
        }
        for problem in problems {
            self.report(problem);
        }
    }

    /// A host is served by one gate only: two would race for its traffic.
    fn hosts(&mut self) {
        let mut first: BTreeMap<&str, Subject> = BTreeMap::new();
        for (name, gate) in &self.program.gates {
            for (index, host) in gate.hosts.iter().enumerate() {
                let subject =
                    Subject::new(ObjectKind::Gate, name, Field::from("hosts").index(index));
                let Some(earlier) = first.get(host.as_str()) else {
                    first.insert(host, subject);
                    continue;
                };
                let message = if earlier.name == *name {
                    format!("host `{host}` is listed twice")
                } else {
                    format!("host `{host}` is already served by gate `{}`", earlier.name)
                };
                let problem = Problem::new(Code::DuplicateName, subject, message)
                    .with_related(earlier.clone(), "first served here")
                    .with_help("a host is served by one gate: remove it from all but one");
                self.report(problem);
            }
        }
    }

    fn connection(&mut self, name: &str, connection: &ConnectionSpec) {
        self.named(ObjectKind::Connection, name, &connection.name);
        let missing: Vec<&str> = [
            ("driver", connection.driver.is_empty()),
            ("host", connection.host.is_empty()),
            ("port", connection.port == 0),
        ]
        .iter()
        .filter(|(_, missing)| *missing)
        .map(|(field, _)| *field)
        .collect();
        if !missing.is_empty() {
            self.report(
                Problem::new(
                    Code::MissingField,
                    Subject::new(ObjectKind::Connection, name, Field::root()),
                    format!("connection `{name}` is missing `{}`", missing.join("`, `")),
                )
                .with_help(
                    "a connection needs `driver` and `host`; `port` too unless the driver is \
                     well known",
                ),
            );
        }
        if let Some(secret) = &connection.secret {
            self.refer(
                ObjectKind::Secret,
                secret,
                Subject::new(ObjectKind::Connection, name, "secret"),
                format!("connection `{name}`"),
            );
        }
    }

    fn network(&mut self, name: &str, policy: &NetworkPolicy) {
        self.named(ObjectKind::Network, name, &policy.name);
        for (index, rule) in policy.rules.iter().enumerate() {
            let field = Field::from("rules").index(index);
            for (side, peer) in [("from", &rule.from), ("to", &rule.to)] {
                if let Peer::Service(service) = peer {
                    let subject =
                        Subject::new(ObjectKind::Network, name, field.clone().field(side));
                    let user = format!("network policy `{name}`");
                    self.refer(ObjectKind::Service, service, subject, user);
                }
            }
            for (at, port) in rule.ports.iter().enumerate() {
                let subject = Subject::new(
                    ObjectKind::Network,
                    name,
                    field.clone().field("ports").index(at),
                );
                self.port_number(*port, subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spec::{
        Autoscale, CircuitBreaker, ConnectionSpec, Cpu, Duration, GatePath, GateTimeouts,
        HorizontalScale, InitStep, Memory, Percent, PortSpec, Protocol, Rate, RateLimit,
        ResponseCache, SecretSpec, Sticky, UpdateStrategy, VerticalScale, VolumeSpec, Workload,
    };

    fn service(name: &str) -> ServiceSpec {
        let mut spec = ServiceSpec::new(name, Workload::process("cca whoami --port $PORT"));
        spec.ports.push(PortSpec::tcp("http", 8080));
        spec
    }

    fn gate(name: &str, service: &str, hosts: &[&str]) -> GateSpec {
        GateSpec {
            name: name.to_owned(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            service: service.to_owned(),
            port: 8080,
            sticky: None,
            tls: None,
            ..GateSpec::default()
        }
    }

    fn connection(name: &str, secret: Option<&str>) -> ConnectionSpec {
        ConnectionSpec {
            name: name.to_owned(),
            driver: "postgresql".to_owned(),
            user: None,
            secret: secret.map(str::to_owned),
            host: "db.internal".to_owned(),
            port: 5432,
            database: None,
            params: BTreeMap::new(),
            tenant: None,
        }
    }

    /// Checks `program` and compares every problem, printed, with `expect`.
    fn check(program: &Program, expect: &[&str]) {
        let found: Vec<String> = program
            .problems()
            .iter()
            .map(|problem| format!("{} {}: {}", problem.code, problem.subject, problem.message))
            .collect();
        assert_eq!(found, expect);
    }

    #[test]
    fn a_sound_program_has_no_problems() {
        let mut program = Program::default();
        let mut web = service("web");
        web.connections.push("db".into());
        program.services.insert("web".into(), web);
        program
            .connections
            .insert("db".into(), connection("db", Some("db-password")));
        let secret = SecretSpec {
            name: "db-password".into(),
            description: None,
            tenant: None,
        };
        program.secrets.insert("db-password".into(), secret);
        program.grants.entry("web".into()).or_default().insert(
            "db-password".into(),
            SecretGrant::Connection {
                connection: "db".into(),
            },
        );
        program
            .gates
            .insert("shop".into(), gate("shop", "web", &["shop.example.com"]));
        check(&program, &[]);
    }

    #[test]
    fn names_and_references_are_checked_everywhere() {
        let mut program = Program::default();
        let mut web = service("Web");
        web.connections.push("nope".into());
        web.placement.colocate.push("Web".into());
        web.placement.separate.push("ghost".into());
        program.services.insert("Web".into(), web);
        program
            .connections
            .insert("db".into(), connection("db", Some("missing")));
        program
            .gates
            .insert("a b".into(), gate("a b", "api", &["x"]));
        program
            .tags
            .entry("ghost".into())
            .or_default()
            .insert("team".into(), "x".into());
        program
            .grants
            .entry("Web".into())
            .or_default()
            .insert("token".into(), SecretGrant::Explicit);
        check(
            &program,
            &[
                "cca::E021 service `Web` name: `Web` is not a valid service name",
                "cca::E018 service `Web` connections[0]: undefined connection `nope`",
                "cca::E019 service `Web` placement.colocate[0]: `Web` cannot colocate itself",
                "cca::E018 service `Web` placement.separate[0]: undefined service `ghost`",
                "cca::E018 service `ghost` tags: tags for service `ghost`, which the program does not define",
                "cca::E018 service `Web` secrets[\"token\"]: undefined secret `token`",
                "cca::E021 gate `a b` name: `a b` is not a valid name",
                "cca::E018 gate `a b` service: undefined service `api`",
                "cca::E018 connection `db` secret: undefined secret `missing`",
            ],
        );
    }

    #[test]
    fn ports_ranges_and_conflicts_of_a_service() {
        let mut web = service("web");
        web.replicas = MAX_REPLICAS + 1;
        web.ports.push(PortSpec {
            name: Some("http".into()),
            number: 0,
            protocol: Protocol::Udp,
        });
        web.resources.cpu = Some(Cpu(0));
        web.volumes = vec![
            VolumeSpec {
                name: "data".into(),
                path: "data".into(),
                size: None,
            },
            VolumeSpec {
                name: "data".into(),
                path: "/data".into(),
                size: None,
            },
        ];
        web.init = vec![InitStep {
            name: "wait".into(),
            command: None,
            image: None,
            probe: None,
            timeout: Some(Duration(0)),
        }];
        web.update = UpdateStrategy {
            max_unavailable: 0,
            max_surge: 0,
            rollback_after: 3,
        };
        web.autoscale = Some(Autoscale {
            horizontal: Some(HorizontalScale {
                min: 5,
                max: 2,
                cpu: Some(Percent(0)),
                memory: Some(Percent(150)),
                requests_per_second: Some(0),
            }),
            vertical: Some(VerticalScale {
                min_cpu: Some(Cpu(2000)),
                max_cpu: Some(Cpu(1000)),
                ..VerticalScale::default()
            }),
        });
        web.stateful = true;
        web.scale_to_zero = Some(Duration(60_000));
        let mut program = Program::default();
        program.services.insert("web".into(), web);
        check(
            &program,
            &[
                "cca::E015 service `web` replicas: 100001 replicas is more than the limit of 100000",
                "cca::E015 service `web` ports[1].number: port 0 is out of range",
                "cca::E016 service `web` ports[1]: this port is declared twice",
                "cca::E015 service `web` resources.cpu: CPU must be more than zero",
                "cca::E013 service `web` volumes[0].path: volume path `data` is not absolute",
                "cca::E016 service `web` volumes[1]: volume `data` is declared twice",
                "cca::E017 service `web` init[0]: init step `wait` does nothing",
                "cca::E015 service `web` init[0].timeout: init step `wait` has a timeout of 0",
                "cca::E019 service `web` update: an update with `max_unavailable = 0` and `max_surge = 0` can never progress",
                "cca::E019 service `web` autoscale.horizontal.max: autoscale `max = 2` is below `min = 5`",
                "cca::E015 service `web` autoscale.horizontal.cpu: target 0% is out of range",
                "cca::E015 service `web` autoscale.horizontal.memory: target 150% is out of range",
                "cca::E015 service `web` autoscale.horizontal.requests_per_second: a target of 0 requests per second per instance is out of range",
                "cca::E019 service `web` autoscale.vertical: vertical autoscale has a minimum above its maximum",
                "cca::E019 service `web` scale_to_zero: a stateful service cannot scale to zero",
            ],
        );
    }

    #[test]
    fn gates_and_connections() {
        let mut program = Program::default();
        let mut api = service("api");
        api.placement.separate.push("web".into());
        program.services.insert("api".into(), api);
        program.services.insert("web".into(), service("web"));
        program.gates.insert(
            "a".into(),
            gate("a", "web", &["shop.example.com", "bad host"]),
        );
        let mut b = gate("b", "web", &["shop.example.com"]);
        b.sticky = Some(Sticky {
            cookie: "c".into(),
            secure: false,
            http_only: false,
            same_site: SameSite::None,
        });
        b.tls = Some(Tls::Secrets {
            cert: "cert".into(),
            key: "key".into(),
        });
        program.gates.insert("b".into(), b);
        program.gates.insert("c".into(), gate("c", "", &[]));
        let mut broken = connection("broken", None);
        broken.driver.clear();
        broken.port = 0;
        program.connections.insert("broken".into(), broken);
        check(
            &program,
            &[
                "cca::E021 gate `a` hosts[1]: `bad host` is not a host name",
                "cca::E019 gate `b` sticky.same_site: `same_site \"None\"` requires `secure`",
                "cca::E018 gate `b` tls.cert: undefined secret `cert`",
                "cca::E018 gate `b` tls.key: undefined secret `key`",
                "cca::E017 gate `c` hosts: gate `c` has no `host`",
                "cca::E017 gate `c` service: gate `c` has no `service`",
                "cca::E016 gate `b` hosts[0]: host `shop.example.com` is already served by gate `a`",
                "cca::E017 connection `broken`: connection `broken` is missing `driver`, `port`",
            ],
        );
    }

    #[test]
    fn a_gates_paths_are_absolute_prefixes_of_existing_services_written_once() {
        let mut program = Program::default();
        program.services.insert("web".into(), service("web"));
        program.services.insert("api".into(), service("api"));
        let path = |prefix: &str, service: &str, port: u16| GatePath {
            prefix: prefix.into(),
            service: service.into(),
            port,
        };
        let mut shop = gate("shop", "web", &["shop.example.com"]);
        shop.paths = vec![
            path("/api", "api", 8080),
            path("/static/v1", "web", 8080),
            path("api", "api", 8080),
            path("/", "api", 8080),
            path("/docs/", "api", 8080),
            path("/a?b", "api", 8080),
            path("/a b", "api", 8080),
            path("/api", "web", 8080),
            path("/nope", "nope", 8080),
            path("/zero", "api", 0),
        ];
        program.gates.insert("shop".into(), shop);
        check(
            &program,
            &[
                "cca::E013 gate `shop` paths[2].prefix: gate `shop`: path `api` does not start with `/`",
                "cca::E019 gate `shop` paths[3].prefix: gate `shop`: path `/` is the gate's own target",
                "cca::E013 gate `shop` paths[4].prefix: gate `shop`: path `/docs/` ends with `/`",
                "cca::E013 gate `shop` paths[5].prefix: gate `shop`: path `/a?b` holds `?`, `#`, a space or a control character",
                "cca::E013 gate `shop` paths[6].prefix: gate `shop`: path `/a b` holds `?`, `#`, a space or a control character",
                "cca::E016 gate `shop` paths[7].prefix: gate `shop`: path `/api` is routed twice",
                "cca::E018 gate `shop` paths[8].service: undefined service `nope`",
                "cca::E015 gate `shop` paths[9].port: port 0 is out of range",
            ],
        );
        assert_eq!(program.gates["shop"].services(), ["web", "api", "nope"]);
    }

    #[test]
    fn a_gates_proxy_settings_are_within_their_ranges() {
        let mut program = Program::default();
        program.services.insert("web".into(), service("web"));
        let mut sound = gate("sound", "web", &["sound.example.com"]);
        sound.tls = Some(Tls::SelfSigned);
        sound.redirect_https = true;
        sound.retries.budget = Percent(100);
        sound.circuit_breaker.max_ejected = Percent(1);
        sound.rate_limit = Some(RateLimit {
            per_client: Some(Rate {
                per_second: 1,
                burst: 1,
            }),
            per_gate: None,
        });
        sound.cache = Some(ResponseCache {
            size: Memory(1 << 20),
            max_entry: Memory(1 << 20),
            ttl: Duration(1),
        });
        sound.queue = MAX_GATE_QUEUE;
        program.gates.insert("sound".into(), sound);
        check(&program, &[]);

        let mut shop = gate("shop", "web", &["shop.example.com"]);
        shop.redirect_https = true;
        shop.timeouts = GateTimeouts {
            connect: Duration(0),
            response: Duration(0),
            idle: Duration(0),
            wake: Duration(0),
        };
        shop.retries.budget = Percent(101);
        shop.circuit_breaker = CircuitBreaker {
            failures: 0,
            ejection: Duration(0),
            max_ejected: Percent(0),
        };
        shop.rate_limit = Some(RateLimit {
            per_client: Some(Rate {
                per_second: 0,
                burst: 0,
            }),
            per_gate: Some(Rate {
                per_second: 10,
                burst: 0,
            }),
        });
        shop.cache = Some(ResponseCache {
            size: Memory(1 << 20),
            max_entry: Memory(2 << 20),
            ttl: Duration(0),
        });
        shop.queue = 0;
        program.gates.insert("shop".into(), shop);
        let mut empty = gate("empty", "web", &["empty.example.com"]);
        empty.rate_limit = Some(RateLimit::default());
        empty.cache = Some(ResponseCache {
            size: Memory(0),
            ..ResponseCache::default()
        });
        empty.circuit_breaker.max_ejected = Percent(101);
        empty.queue = MAX_GATE_QUEUE + 1;
        program.gates.insert("empty".into(), empty);
        check(
            &program,
            &[
                "cca::E015 gate `empty` circuit_breaker.max_ejected: gate `empty`: `circuit_breaker.max_ejected` 101% is out of range",
                "cca::E017 gate `empty` rate_limit: gate `empty`: `rate_limit` sets no rate",
                "cca::E015 gate `empty` cache.size: gate `empty`: `cache.size` is zero",
                "cca::E015 gate `empty` queue: gate `empty`: `queue = 1000001` is out of range",
                "cca::E019 gate `shop` redirect_https: gate `shop` redirects to HTTPS but has no `tls`",
                "cca::E015 gate `shop` timeouts.connect: gate `shop`: `timeouts.connect` is zero",
                "cca::E015 gate `shop` timeouts.response: gate `shop`: `timeouts.response` is zero",
                "cca::E015 gate `shop` timeouts.idle: gate `shop`: `timeouts.idle` is zero",
                "cca::E015 gate `shop` timeouts.wake: gate `shop`: `timeouts.wake` is zero",
                "cca::E015 gate `shop` retries.budget: gate `shop`: `retries.budget` 101% is out of range",
                "cca::E015 gate `shop` circuit_breaker.failures: gate `shop`: `circuit_breaker.failures` is 0",
                "cca::E015 gate `shop` circuit_breaker.ejection: gate `shop`: `circuit_breaker.ejection` is zero",
                "cca::E015 gate `shop` circuit_breaker.max_ejected: gate `shop`: `circuit_breaker.max_ejected` 0% is out of range",
                "cca::E015 gate `shop` rate_limit.per_client.per_second: gate `shop`: `rate_limit.per_client` is 0 requests per second",
                "cca::E015 gate `shop` rate_limit.per_gate.burst: gate `shop`: `rate_limit.per_gate_burst` is 0",
                "cca::E019 gate `shop` cache.max_entry: gate `shop`: `cache.max_entry` (2Mi) is larger than `cache.size` (1Mi)",
                "cca::E015 gate `shop` cache.ttl: gate `shop`: `cache.ttl` is zero",
                "cca::E015 gate `shop` queue: gate `shop`: `queue = 0` is out of range",
            ],
        );
    }
}
