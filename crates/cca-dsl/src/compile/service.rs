//! Compiling `service` blocks into `ServiceSpec`s: workload, replicas,
//! ports, env, resources, health, placement, tags, secret grants,
//! connections, volumes, init steps, update, budget, autoscale, stateful and
//! scale-to-zero, with the checks local to one service.

use std::collections::BTreeMap;

use cca_model::spec::{
    Autoscale, Cpu, DisruptionBudget, Duration, HealthCheck, HorizontalScale, InitStep, Memory,
    Percent, Placement, PortSpec, Probe, Protocol, Resources, SecretGrant, ServiceSpec,
    UpdateStrategy, VerticalMode, VerticalScale, VolumeSpec, Workload,
};

use cca_model::net::Affinity;
use cca_model::validity::Field;

use super::read::{Scalar, Spanned};
use super::{Compiler, Kind};
use crate::ast::Entry;
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::schema::Context;

const DEFAULT_INTERVAL: Duration = Duration(10_000);
const DEFAULT_TIMEOUT: Duration = Duration(2_000);
const DEFAULT_RETRIES: u32 = 3;
const DEFAULT_CPU_TARGET: Percent = Percent(80);

/// What a service block says, before the workload is settled.
#[derive(Default)]
struct Draft {
    image: Option<(String, Span)>,
    run: Option<(String, Span)>,
    command: Option<(String, Span)>,
    replicas: Option<(u32, Span)>,
    ports: Vec<PortSpec>,
    env: BTreeMap<String, String>,
    resources: Resources,
    placement: Placement,
    tags: BTreeMap<String, String>,
    secrets: Vec<(String, Span)>,
    connections: Vec<String>,
    volumes: Vec<VolumeSpec>,
    init: Vec<InitStep>,
    update: UpdateStrategy,
    budget: Option<DisruptionBudget>,
    autoscale: Option<Autoscale>,
    stateful: bool,
    scale_to_zero: Option<Duration>,
    /// `network = "own"|"host"`, where it was written.
    network: Option<(NetworkMode, Span)>,
    affinity: Affinity,
    /// `image` or `run` was written, even if its value was invalid.
    wrote_workload: bool,
}

/// Where a service's containers live: `network = "own"` (the default for
/// images) or `"host"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NetworkMode {
    Own,
    Host,
}

const NETWORK_MODES: &[(&str, NetworkMode)] =
    &[("own", NetworkMode::Own), ("host", NetworkMode::Host)];

const AFFINITIES: &[(&str, Affinity)] =
    &[("none", Affinity::None), ("client-ip", Affinity::ClientIp)];

const VERTICAL_MODES: &[(&str, VerticalMode)] = &[
    ("recommend", VerticalMode::Recommend),
    ("auto", VerticalMode::Auto),
];

impl Compiler<'_> {
    pub(crate) fn service(&mut self, entry: Entry<'_>) {
        let Some((name, name_span)) = self.block_name(entry, true) else {
            return;
        };
        let fresh = self.define(Kind::Service, &name, entry.key_span(), name_span);
        let block = self.block_of(entry);
        let mut draft = Draft::default();
        let mut health = None;
        for item in self.entries(block, Context::Service) {
            if item.key() == "health" {
                health = Some(item);
                continue;
            }
            self.service_entry(&name, item, &mut draft);
        }
        let health = health.and_then(|item| self.health(item, &draft.ports));
        // A service whose workload is in error (reported) is still built,
        // so that the model's rules judge the rest of it.
        let workload = self
            .workload(&draft, entry.key_span())
            .unwrap_or(Workload::Process { run: String::new() });
        self.own_network_needs_an_image(&draft, &workload);
        self.replicas_within_autoscale(&draft);
        if !fresh {
            return;
        }
        let grants: BTreeMap<String, SecretGrant> = draft
            .secrets
            .iter()
            .map(|(secret, _)| (secret.clone(), SecretGrant::Explicit))
            .collect();
        if !grants.is_empty() {
            self.program.grants.insert(name.clone(), grants);
        }
        if !draft.tags.is_empty() {
            self.program.tags.insert(name.clone(), draft.tags);
        }
        let spec = ServiceSpec {
            name: name.clone(),
            workload,
            replicas: draft.replicas.map_or(1, |(count, _)| count),
            ports: draft.ports,
            env: draft.env,
            resources: draft.resources,
            health,
            placement: draft.placement,
            connections: draft.connections,
            volumes: draft.volumes,
            init: draft.init,
            update: draft.update,
            budget: draft.budget,
            autoscale: draft.autoscale,
            stateful: draft.stateful,
            scale_to_zero: draft.scale_to_zero,
            host_network: draft
                .network
                .is_some_and(|(mode, _)| mode == NetworkMode::Host),
            affinity: draft.affinity,
            tenant: None,
        };
        self.program.services.insert(name, spec);
    }

    fn service_entry(&mut self, service: &str, item: Entry<'_>, draft: &mut Draft) {
        draft.wrote_workload |= matches!(item.key(), "image" | "run");
        match item.key() {
            "image" => draft.image = self.setting_text(item).map(|t| (t, item.span())),
            "run" => draft.run = self.setting_text(item).map(|t| (t, item.span())),
            "command" => draft.command = self.setting_text(item).map(|t| (t, item.span())),
            "replicas" => {
                self.mark("replicas", item.span());
                draft.replicas = self.setting_count(item).map(|n| (n, item.span()));
            }
            "port" => self.port(item, draft),
            "env" => draft.env.extend(self.string_map(item, Context::Env)),
            "resources" => self.resources(item, &mut draft.resources),
            "placement" => self.placement(service, item, &mut draft.placement),
            "tags" => draft.tags.extend(self.string_map(item, Context::Tags)),
            "secret" => {
                for (name, span) in self.names(item) {
                    self.mark(Field::from("secrets").key(&name), span);
                    draft.secrets.push((name, span));
                }
            }
            "connection" => {
                for (name, span) in self.names(item) {
                    self.mark(
                        Field::from("connections").index(draft.connections.len()),
                        span,
                    );
                    draft.connections.push(name);
                }
            }
            "volume" => self.volume(item, &mut draft.volumes),
            "init" => self.init_step(item, &mut draft.init),
            "update" => {
                self.mark("update", item.key_span());
                self.update(item, &mut draft.update);
            }
            "budget" => self.budget(item, &mut draft.budget),
            "autoscale" => {
                self.mark("autoscale", item.key_span());
                draft.autoscale = self.autoscale(item);
            }
            "stateful" => {
                self.mark("stateful", item.span());
                draft.stateful = self.flag(item) == Some(true);
            }
            "scale_to_zero" => {
                self.mark("scale_to_zero", item.span());
                draft.scale_to_zero =
                    self.setting_quantity(item, "an idle duration", Duration::parse);
            }
            "network" => {
                self.mark("host_network", item.span());
                draft.network = self
                    .setting_choice(item, NETWORK_MODES)
                    .map(|mode| (mode, item.span()));
            }
            "affinity" => {
                self.mark("affinity", item.span());
                if let Some(affinity) = self.setting_choice(item, AFFINITIES) {
                    draft.affinity = affinity;
                }
            }
            _ => {}
        }
    }

    /// A process always shares its node's network: asking for its own is a
    /// mistake worth saying, not a setting to drop silently.
    fn own_network_needs_an_image(&mut self, draft: &Draft, workload: &Workload) {
        if let (Some((NetworkMode::Own, span)), Workload::Process { .. }) =
            (&draft.network, workload)
        {
            self.report(
                Diagnostic::error(
                    codes::CONFLICT,
                    *span,
                    "a `run` service is a host process and shares its node's network",
                )
                .with_label("only `image` services get a network of their own")
                .with_help("remove this line, or run the service from an image"),
            );
        }
    }

    /// One or more names as the values of an entry: `secret a b`.
    pub(crate) fn names(&mut self, item: Entry<'_>) -> Vec<(String, Span)> {
        let Some(values) = self.scalars(item) else {
            return Vec::new();
        };
        if values.is_empty() {
            self.report(
                Diagnostic::error(
                    codes::WRONG_ARITY,
                    item.span(),
                    format!("`{}` needs at least one name", item.key()),
                )
                .with_label("name expected"),
            );
        }
        values
            .iter()
            .filter_map(|value| self.name_of(value).map(|name| (name, value.span)))
            .collect()
    }

    fn workload(&mut self, draft: &Draft, at: Span) -> Option<Workload> {
        if draft.image.is_none() && draft.run.is_none() && draft.wrote_workload {
            return None;
        }
        match (&draft.image, &draft.run) {
            (Some((image, _)), None) => Some(Workload::Image {
                image: image.clone(),
                command: draft.command.as_ref().map(|(command, _)| command.clone()),
            }),
            (None, Some((run, _))) => {
                if let Some((_, span)) = &draft.command {
                    self.report(
                        Diagnostic::error(
                            codes::CONFLICT,
                            *span,
                            "`command` only applies to an `image`",
                        )
                        .with_help(
                            "a `run` service is already a shell command: put it all in `run`",
                        ),
                    );
                }
                Some(Workload::Process { run: run.clone() })
            }
            (Some((_, image_span)), Some((_, run_span))) => {
                self.report(
                    Diagnostic::error(
                        codes::CONFLICT,
                        *run_span,
                        "a service has either `image` or `run`, not both",
                    )
                    .with_label("`run` given here")
                    .with_secondary(*image_span, "`image` given here")
                    .with_help("`image` runs a container; `run` runs a host process"),
                );
                None
            }
            (None, None) => {
                self.report(
                    Diagnostic::error(
                        codes::MISSING_FIELD,
                        at,
                        "service has neither `image` nor `run`",
                    )
                    .with_label("nothing to run")
                    .with_help("add `image = \"repo/name:tag\"` (a container) or `run = \"command\"` (a host process)"),
                );
                None
            }
        }
    }

    fn replicas_within_autoscale(&mut self, draft: &Draft) {
        let horizontal = draft.autoscale.as_ref().and_then(|a| a.horizontal.as_ref());
        if let (Some((replicas, span)), Some(h)) = (draft.replicas, horizontal)
            && h.min <= h.max
            && (replicas < h.min || replicas > h.max)
        {
            self.report(
                Diagnostic::warning(
                    codes::REPLICAS_OVERRIDDEN,
                    span,
                    format!(
                        "`replicas = {replicas}` is outside autoscale's {}..{}",
                        h.min, h.max
                    ),
                )
                .with_label("an autoscaler would override this")
                .with_help(
                    "set replicas within the autoscale bounds, or drop it \
                     (autoscale is not enforced yet: today `replicas` holds)",
                ),
            );
        }
    }

    /// `port [NAME] NUMBER [tcp|udp]`.
    fn port(&mut self, item: Entry<'_>, draft: &mut Draft) {
        let Some(values) = self.scalars(item) else {
            return;
        };
        let Some(port) = self.port_shape(item, &values) else {
            return;
        };
        self.mark(Field::from("ports").index(draft.ports.len()), item.span());
        draft.ports.push(port);
    }

    fn port_shape(&mut self, item: Entry<'_>, values: &[Spanned]) -> Option<PortSpec> {
        let (name, rest) = match values {
            [first, second, ..]
                if matches!(first.value, Scalar::Name(_))
                    && matches!(second.value, Scalar::Number(_)) =>
            {
                (self.name_of(first), &values[1..])
            }
            _ => (None, values),
        };
        let (number, protocol) = match rest {
            [number] => (number, None),
            [number, protocol] => (number, Some(protocol)),
            _ => {
                self.report(
                    Diagnostic::error(codes::WRONG_ARITY, item.span(), "malformed port")
                        .with_label("expected `port [name] number [tcp|udp]`")
                        .with_help("for example `port http 8080` or `port dns 53 udp`"),
                );
                return None;
            }
        };
        let number = self.port_of(number)?;
        let protocol = match protocol.map(|p| (&p.value, p)) {
            None => Protocol::Tcp,
            Some((Scalar::Name(word), _)) if word == "tcp" => Protocol::Tcp,
            Some((Scalar::Name(word), _)) if word == "udp" => Protocol::Udp,
            Some((_, other)) => {
                self.wrong_type(other, "`tcp` or `udp`");
                return None;
            }
        };
        Some(PortSpec {
            name,
            number,
            protocol,
        })
    }

    fn resources(&mut self, item: Entry<'_>, resources: &mut Resources) {
        let block = self.block_of(item);
        for entry in self.entries(block, Context::Resources) {
            match entry.key() {
                "cpu" => {
                    self.mark("resources.cpu", entry.span());
                    resources.cpu = self.setting_quantity(entry, "a CPU amount", Cpu::parse);
                }
                "memory" => {
                    resources.memory = self.setting_quantity(entry, "a memory size", Memory::parse);
                }
                _ => {}
            }
        }
    }

    fn health(&mut self, item: Entry<'_>, ports: &[PortSpec]) -> Option<HealthCheck> {
        let block = self.block_of(item)?;
        let mut probe: Option<(Probe, Span)> = None;
        let mut wrote_probe = false;
        let mut check = HealthCheck {
            probe: Probe::Tcp { port: 0 },
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
        };
        for entry in self.entries(Some(block), Context::Health) {
            match entry.key() {
                "interval" => {
                    if let Some(d) = self.setting_quantity(entry, "a duration", Duration::parse) {
                        check.interval = d;
                    }
                }
                "timeout" => {
                    if let Some(d) = self.setting_quantity(entry, "a duration", Duration::parse) {
                        check.timeout = d;
                    }
                }
                "retries" => {
                    if let Some(n) = self.setting_count(entry) {
                        check.retries = n;
                    }
                }
                _ => {
                    wrote_probe = true;
                    let Some(found) = self.probe(entry, ports) else {
                        continue;
                    };
                    if let Some((_, first)) = &probe {
                        self.report(
                            Diagnostic::error(
                                codes::CONFLICT,
                                entry.span(),
                                "a health check has one probe",
                            )
                            .with_secondary(*first, "first probe here")
                            .with_help("keep one of `http`, `tcp` or `exec`"),
                        );
                        continue;
                    }
                    probe = Some((found, entry.span()));
                }
            }
        }
        let Some((probe, _)) = probe else {
            if wrote_probe {
                return None;
            }
            self.report(
                Diagnostic::error(
                    codes::MISSING_FIELD,
                    item.key_span(),
                    "health check has no probe",
                )
                .with_help("add `http \"/health\"`, `tcp PORT` or `exec \"command\"`"),
            );
            return None;
        };
        if check.timeout > check.interval {
            self.report(
                Diagnostic::error(
                    codes::CONFLICT,
                    item.key_span(),
                    "health `timeout` is longer than its `interval`",
                )
                .with_help("a probe must finish before the next one starts"),
            );
        }
        check.probe = probe;
        Some(check)
    }

    /// `http PATH [port P]`, `tcp [P]` or `exec COMMAND`.
    fn probe(&mut self, entry: Entry<'_>, ports: &[PortSpec]) -> Option<Probe> {
        let values = self.scalars(entry)?;
        match (entry.key(), values.as_slice()) {
            ("http", [path]) => {
                let path = self.text_of(path)?;
                let port = self.default_port(entry, ports)?;
                Some(Probe::Http { path, port })
            }
            ("http", [path, keyword, port]) if keyword.value == Scalar::Name("port".into()) => {
                let path = self.text_of(path)?;
                let port = self.port_ref(port, ports)?;
                Some(Probe::Http { path, port })
            }
            ("tcp", []) => self
                .default_port(entry, ports)
                .map(|port| Probe::Tcp { port }),
            ("tcp", [port]) => self.port_ref(port, ports).map(|port| Probe::Tcp { port }),
            ("exec", [command]) => self.text_of(command).map(|command| Probe::Exec { command }),
            (key, _) => {
                let shape = match key {
                    "http" => "`http \"/path\" [port PORT]`",
                    "tcp" => "`tcp [PORT]`",
                    _ => "`exec \"command\"`",
                };
                self.report(
                    Diagnostic::error(
                        codes::WRONG_ARITY,
                        entry.span(),
                        format!("malformed `{key}` probe"),
                    )
                    .with_label(format!("expected {shape}")),
                );
                None
            }
        }
    }

    fn default_port(&mut self, entry: Entry<'_>, ports: &[PortSpec]) -> Option<u16> {
        match ports.first() {
            Some(port) => Some(port.number),
            None => {
                self.report(
                    Diagnostic::error(
                        codes::MISSING_FIELD,
                        entry.span(),
                        "this probe needs a port, and the service declares none",
                    )
                    .with_help("declare `port NAME NUMBER` in the service or name the port here"),
                );
                None
            }
        }
    }

    /// A port by number, or by the name of one of the service's ports.
    fn port_ref(&mut self, value: &Spanned, ports: &[PortSpec]) -> Option<u16> {
        match &value.value {
            Scalar::Name(name) => {
                let found = ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()));
                if let Some(port) = found {
                    return Some(port.number);
                }
                let names: Vec<&str> = ports.iter().filter_map(|p| p.name.as_deref()).collect();
                let mut diagnostic = Diagnostic::error(
                    codes::UNDEFINED_REFERENCE,
                    value.span,
                    format!("the service has no port named `{name}`"),
                )
                .with_label("unknown port name");
                if let Some(close) = crate::suggest::did_you_mean(name, names.iter().copied()) {
                    diagnostic = diagnostic.with_help(format!("did you mean `{close}`?"));
                }
                self.report(diagnostic);
                None
            }
            _ => self.port_of(value),
        }
    }

    fn placement(&mut self, service: &str, item: Entry<'_>, placement: &mut Placement) {
        let block = self.block_of(item);
        self.mark("placement", item.key_span());
        for entry in self.entries(block, Context::Placement) {
            match entry.key() {
                hint @ ("colocate" | "separate") => {
                    for (name, span) in self.names(entry) {
                        let list = if hint == "colocate" {
                            &mut placement.colocate
                        } else {
                            &mut placement.separate
                        };
                        let field = Field::from("placement").field(hint).index(list.len());
                        list.push(name);
                        self.mark(field, span);
                    }
                }
                "restrict" => {
                    for (key, value, span) in self.string_pairs(entry, Context::Restrict) {
                        let site = super::Site {
                            file: self.file,
                            span,
                        };
                        self.restrict_sites
                            .entry((service.to_owned(), key.clone()))
                            .or_insert(site);
                        placement.restrict.insert(key, value);
                    }
                }
                "spread" => {
                    for (label, _) in self.names(entry) {
                        placement.spread.push(label);
                    }
                }
                _ => {}
            }
        }
    }

    /// `volume NAME PATH [SIZE]`.
    fn volume(&mut self, item: Entry<'_>, volumes: &mut Vec<VolumeSpec>) {
        let Some(values) = self.scalars(item) else {
            return;
        };
        let (name, path, size) = match values.as_slice() {
            [name, path] => (name, path, None),
            [name, path, size] => (name, path, Some(size)),
            _ => {
                self.report(
                    Diagnostic::error(codes::WRONG_ARITY, item.span(), "malformed volume")
                        .with_label("expected `volume NAME \"/path\" [SIZE]`"),
                );
                return;
            }
        };
        let (Some(name), Some(mount)) = (self.name_of(name), self.text_of(path)) else {
            return;
        };
        let size = match size {
            Some(written) => match self.quantity(written, "a volume size", Memory::parse) {
                Some(size) => {
                    self.check_enforced(Context::Service, "volume.size", written.span);
                    Some(size)
                }
                None => return,
            },
            None => None,
        };
        let field = Field::from("volumes").index(volumes.len());
        self.mark(field.clone(), item.span());
        self.mark(field.field("path"), path.span);
        volumes.push(VolumeSpec {
            name,
            path: mount,
            size,
        });
    }

    /// `init NAME { command = ... image = ... probe = CONNECTION timeout = D }`.
    fn init_step(&mut self, item: Entry<'_>, steps: &mut Vec<InitStep>) {
        let Some((name, _)) = self.block_name(item, false) else {
            return;
        };
        let block = self.block_of(item);
        let field = Field::from("init").index(steps.len());
        self.mark(field.clone(), item.key_span());
        let mut step = InitStep {
            name,
            command: None,
            image: None,
            probe: None,
            timeout: None,
        };
        for entry in self.entries(block, Context::Init) {
            match entry.key() {
                "command" => step.command = self.setting_text(entry),
                "image" => step.image = self.setting_text(entry),
                "probe" => {
                    if let Some((connection, span)) = self.setting_name(entry) {
                        self.mark(field.clone().field("probe"), span);
                        step.probe = Some(connection);
                    }
                }
                "timeout" => {
                    self.mark(field.clone().field("timeout"), entry.span());
                    step.timeout = self.setting_quantity(entry, "a step timeout", Duration::parse);
                }
                _ => {}
            }
        }
        steps.push(step);
    }

    fn update(&mut self, item: Entry<'_>, update: &mut UpdateStrategy) {
        let block = self.block_of(item);
        for entry in self.entries(block, Context::Update) {
            let Some(count) = self.setting_count(entry) else {
                continue;
            };
            match entry.key() {
                "max_unavailable" => update.max_unavailable = count,
                "max_surge" => update.max_surge = count,
                "rollback_after" => update.rollback_after = count,
                _ => {}
            }
        }
    }

    fn budget(&mut self, item: Entry<'_>, budget: &mut Option<DisruptionBudget>) {
        let block = self.block_of(item);
        for entry in self.entries(block, Context::Budget) {
            if let Some(max_unavailable) = self.setting_count(entry) {
                if max_unavailable == 0 {
                    self.report(
                        Diagnostic::warning(
                            codes::BUDGET_BLOCKS_DRAIN,
                            entry.span(),
                            "`max_unavailable = 0` blocks every drain of this service",
                        )
                        .with_label("no instance is ever moved off a draining node")
                        .with_help(
                            "allow at least 1 unless the service must never be disturbed; \
                             rolling updates follow `update`, not the budget",
                        ),
                    );
                }
                *budget = Some(DisruptionBudget { max_unavailable });
            }
        }
        if budget.is_none() {
            self.report(
                Diagnostic::error(
                    codes::MISSING_FIELD,
                    item.key_span(),
                    "budget without `max_unavailable`",
                )
                .with_help("write `budget { max_unavailable = 1 }`"),
            );
        }
    }

    fn autoscale(&mut self, item: Entry<'_>) -> Option<Autoscale> {
        let block = self.block_of(item)?;
        let mut autoscale = Autoscale::default();
        let (mut min, mut max, mut cpu, mut memory) = (None, None, None, None);
        let mut requests_per_second = None;
        for entry in self.entries(Some(block), Context::Autoscale) {
            match entry.key() {
                "min" => min = self.setting_count(entry),
                "max" => {
                    self.mark("autoscale.horizontal.max", entry.span());
                    max = self.setting_count(entry);
                }
                "cpu" => {
                    self.mark("autoscale.horizontal.cpu", entry.span());
                    cpu = self.setting_quantity(entry, "a percentage", Percent::parse);
                }
                "memory" => {
                    self.mark("autoscale.horizontal.memory", entry.span());
                    memory = self.setting_quantity(entry, "a percentage", Percent::parse);
                }
                "requests_per_second" => {
                    self.mark("autoscale.horizontal.requests_per_second", entry.span());
                    requests_per_second = self.setting_count(entry);
                }
                "vertical" => autoscale.vertical = self.vertical(entry),
                _ => {}
            }
        }
        let any_horizontal = min.is_some()
            || max.is_some()
            || cpu.is_some()
            || memory.is_some()
            || requests_per_second.is_some();
        if any_horizontal {
            let Some(max) = max else {
                self.report(
                    Diagnostic::error(
                        codes::MISSING_FIELD,
                        item.key_span(),
                        "autoscale needs `max`",
                    )
                    .with_help("write `autoscale { min = 2  max = 10  cpu = 70% }`"),
                );
                return None;
            };
            let min = min.unwrap_or(1);
            let cpu = if cpu.is_none() && memory.is_none() && requests_per_second.is_none() {
                Some(DEFAULT_CPU_TARGET)
            } else {
                cpu
            };
            autoscale.horizontal = Some(HorizontalScale {
                min,
                max,
                cpu,
                memory,
                requests_per_second,
            });
        }
        Some(autoscale)
    }

    fn vertical(&mut self, item: Entry<'_>) -> Option<VerticalScale> {
        let block = self.block_of(item)?;
        self.mark("autoscale.vertical", item.key_span());
        let mut vertical = VerticalScale::default();
        for entry in self.entries(Some(block), Context::Vertical) {
            match entry.key() {
                "min_cpu" => {
                    vertical.min_cpu = self.setting_quantity(entry, "a CPU amount", Cpu::parse)
                }
                "max_cpu" => {
                    vertical.max_cpu = self.setting_quantity(entry, "a CPU amount", Cpu::parse)
                }
                "min_memory" => {
                    vertical.min_memory =
                        self.setting_quantity(entry, "a memory size", Memory::parse);
                }
                "max_memory" => {
                    vertical.max_memory =
                        self.setting_quantity(entry, "a memory size", Memory::parse);
                }
                "mode" => {
                    self.mark("autoscale.vertical.mode", entry.span());
                    if let Some(mode) = self.setting_choice(entry, VERTICAL_MODES) {
                        vertical.mode = mode;
                    }
                }
                _ => {}
            }
        }
        Some(vertical)
    }
}

#[cfg(test)]
mod tests {
    use cca_model::spec::{ServiceSpec, Workload};

    use crate::compile::compile_str;
    use crate::template::Values;

    /// `ServiceSpec::new` is what tests build on: it must be what a
    /// service block that sets only its workload compiles to.
    #[test]
    fn a_bare_service_compiles_to_the_models_defaults() {
        let compiled = compile_str(
            "service web {\n  run = \"sleep 1\"\n}\n",
            &Values::default(),
        );
        assert!(!compiled.has_errors(), "{:?}", compiled.diagnostics);
        assert_eq!(
            compiled.program.services.get("web"),
            Some(&ServiceSpec::new("web", Workload::process("sleep 1")))
        );
    }
}
