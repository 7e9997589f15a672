//! The vocabulary of the language: which keys each block accepts, in which
//! form, and which block a nested `{ }` opens. The compiler uses it for
//! "unknown key — did you mean" and the formatter for the canonical form
//! of each entry: settings (`key = value`) versus directives (`key args`).

/// The kind of block an entry sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Context {
    File,
    Service,
    Resources,
    Health,
    Placement,
    Restrict,
    Tags,
    Env,
    Update,
    Budget,
    Autoscale,
    Vertical,
    Init,
    Gate,
    Sticky,
    Tls,
    Timeouts,
    Retries,
    CircuitBreaker,
    RateLimit,
    Cache,
    Connection,
    Params,
    Secret,
    Network,
    /// Inside a block the language does not know: anything goes.
    Unknown,
}

/// How an entry is written canonically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One value, may appear once: `replicas = 3`.
    Setting,
    /// No value (or `= true`/`= false`): `stateful`.
    Flag,
    /// Arguments and maybe a block, may repeat: `port http 8080`.
    Directive,
}

/// One key a block accepts.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub name: &'static str,
    pub form: Form,
    /// The context of a `{ }` block after this key, if it takes one.
    pub block: Option<Context>,
}

const fn setting(name: &'static str) -> Key {
    Key {
        name,
        form: Form::Setting,
        block: None,
    }
}

const fn flag(name: &'static str) -> Key {
    Key {
        name,
        form: Form::Flag,
        block: None,
    }
}

const fn directive(name: &'static str) -> Key {
    Key {
        name,
        form: Form::Directive,
        block: None,
    }
}

const fn block(name: &'static str, context: Context) -> Key {
    Key {
        name,
        form: Form::Directive,
        block: Some(context),
    }
}

const fn flag_block(name: &'static str, context: Context) -> Key {
    Key {
        name,
        form: Form::Flag,
        block: Some(context),
    }
}

const FILE: &[Key] = &[
    block("service", Context::Service),
    block("gate", Context::Gate),
    block("connection", Context::Connection),
    block("secret", Context::Secret),
    block("network", Context::Network),
    directive("from"),
];

const SERVICE: &[Key] = &[
    setting("image"),
    setting("run"),
    setting("command"),
    setting("replicas"),
    directive("port"),
    block("env", Context::Env),
    block("resources", Context::Resources),
    block("health", Context::Health),
    block("placement", Context::Placement),
    block("tags", Context::Tags),
    directive("secret"),
    directive("connection"),
    directive("volume"),
    block("init", Context::Init),
    block("update", Context::Update),
    block("budget", Context::Budget),
    block("autoscale", Context::Autoscale),
    flag("stateful"),
    setting("scale_to_zero"),
    setting("network"),
    setting("affinity"),
];

const RESOURCES: &[Key] = &[setting("cpu"), setting("memory")];

const HEALTH: &[Key] = &[
    directive("http"),
    directive("tcp"),
    directive("exec"),
    setting("interval"),
    setting("timeout"),
    setting("retries"),
];

const PLACEMENT: &[Key] = &[
    directive("colocate"),
    directive("separate"),
    block("restrict", Context::Restrict),
    directive("spread"),
];

const UPDATE: &[Key] = &[
    setting("max_unavailable"),
    setting("max_surge"),
    setting("rollback_after"),
];

const BUDGET: &[Key] = &[setting("max_unavailable")];

const AUTOSCALE: &[Key] = &[
    setting("min"),
    setting("max"),
    setting("cpu"),
    setting("memory"),
    setting("requests_per_second"),
    block("vertical", Context::Vertical),
];

const VERTICAL: &[Key] = &[
    setting("min_cpu"),
    setting("max_cpu"),
    setting("min_memory"),
    setting("max_memory"),
    setting("mode"),
];

const INIT: &[Key] = &[
    setting("command"),
    setting("image"),
    setting("probe"),
    setting("timeout"),
];

const GATE: &[Key] = &[
    directive("host"),
    directive("service"),
    directive("path"),
    setting("balance"),
    flag_block("sticky", Context::Sticky),
    block("tls", Context::Tls),
    block("timeouts", Context::Timeouts),
    block("retries", Context::Retries),
    block("circuit_breaker", Context::CircuitBreaker),
    block("rate_limit", Context::RateLimit),
    flag_block("cache", Context::Cache),
    setting("queue"),
];

const STICKY: &[Key] = &[
    setting("cookie"),
    flag("secure"),
    flag("http_only"),
    setting("same_site"),
];

const TLS: &[Key] = &[
    flag("self_signed"),
    setting("cert"),
    setting("key"),
    flag("redirect"),
];

const TIMEOUTS: &[Key] = &[
    setting("connect"),
    setting("response"),
    setting("idle"),
    setting("wake"),
];

const RETRIES: &[Key] = &[setting("attempts"), setting("budget")];

const CIRCUIT_BREAKER: &[Key] = &[
    setting("failures"),
    setting("ejection"),
    setting("max_ejected"),
];

const RATE_LIMIT: &[Key] = &[
    setting("per_client"),
    setting("per_client_burst"),
    setting("per_gate"),
    setting("per_gate_burst"),
];

const CACHE: &[Key] = &[setting("size"), setting("max_entry"), setting("ttl")];

const CONNECTION: &[Key] = &[
    setting("driver"),
    setting("user"),
    setting("secret"),
    setting("host"),
    setting("port"),
    setting("database"),
    block("params", Context::Params),
];

const SECRET: &[Key] = &[setting("description")];

const NETWORK: &[Key] = &[directive("allow"), directive("deny")];

/// The keys a context accepts; empty for free-form maps.
pub fn keys(context: Context) -> &'static [Key] {
    match context {
        Context::File => FILE,
        Context::Service => SERVICE,
        Context::Resources => RESOURCES,
        Context::Health => HEALTH,
        Context::Placement => PLACEMENT,
        Context::Update => UPDATE,
        Context::Budget => BUDGET,
        Context::Autoscale => AUTOSCALE,
        Context::Vertical => VERTICAL,
        Context::Init => INIT,
        Context::Gate => GATE,
        Context::Sticky => STICKY,
        Context::Tls => TLS,
        Context::Timeouts => TIMEOUTS,
        Context::Retries => RETRIES,
        Context::CircuitBreaker => CIRCUIT_BREAKER,
        Context::RateLimit => RATE_LIMIT,
        Context::Cache => CACHE,
        Context::Connection => CONNECTION,
        Context::Secret => SECRET,
        Context::Network => NETWORK,
        Context::Restrict | Context::Tags | Context::Env | Context::Params | Context::Unknown => {
            &[]
        }
    }
}

/// Whether any name is a valid key here (`env`, `tags`, `restrict`, `params`).
pub fn is_free_form(context: Context) -> bool {
    matches!(
        context,
        Context::Restrict | Context::Tags | Context::Env | Context::Params
    )
}

/// The schema entry for `name` in `context`. Free-form maps treat every
/// key as a setting.
pub fn lookup(context: Context, name: &str) -> Option<Key> {
    if is_free_form(context) {
        return Some(setting("*"));
    }
    keys(context).iter().find(|key| key.name == name).copied()
}

/// The context of the block that follows `name` in `context`.
pub fn block_context(context: Context, name: &str) -> Context {
    lookup(context, name)
        .and_then(|key| key.block)
        .unwrap_or(Context::Unknown)
}

/// The names a context accepts, for suggestions.
pub fn names(context: Context) -> impl Iterator<Item = &'static str> {
    keys(context).iter().map(|key| key.name)
}
