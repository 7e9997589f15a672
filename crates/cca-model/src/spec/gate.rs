//! `desired/gate/{name}`: a gate, the external HTTP(S) entry to services —
//! which hosts and paths go where, and how the gate's proxy balances,
//! retries, ejects, limits, caches and times out. Every setting beyond
//! hosts and target has a default a user need not touch; a gate written
//! before a setting existed decodes with its default.

use serde::{Deserialize, Serialize};

use super::quantity::{Duration, Memory, Percent};

/// `desired/gate/{name}`: external traffic for `hosts` goes to a service
/// port, or, for a path under one of `paths`, to that path's target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateSpec {
    pub name: String,
    pub hosts: Vec<String>,
    pub service: String,
    /// The target port number, resolved from a port name when one was used.
    pub port: u16,
    /// Path-prefix routes to other targets; the longest matching prefix
    /// wins and every other path goes to `service`/`port`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<GatePath>,
    pub sticky: Option<Sticky>,
    pub tls: Option<Tls>,
    /// With `tls`: plain-HTTP requests are redirected to HTTPS (308).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redirect_https: bool,
    #[serde(default)]
    pub balance: Balance,
    #[serde(default)]
    pub timeouts: GateTimeouts,
    #[serde(default)]
    pub retries: Retries,
    #[serde(default)]
    pub circuit_breaker: CircuitBreaker,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<ResponseCache>,
    /// Requests a gate node holds for this gate while its service wakes
    /// from zero; more are answered 503 at once.
    #[serde(default = "default_queue")]
    pub queue: u32,
    /// The tenant it belongs to, stamped by the API from the program's
    /// tenant at apply (never written in a `.cca` file); `None`:
    /// cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl Default for GateSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            hosts: Vec::new(),
            service: String::new(),
            port: 0,
            paths: Vec::new(),
            sticky: None,
            tls: None,
            redirect_https: false,
            balance: Balance::default(),
            timeouts: GateTimeouts::default(),
            retries: Retries::default(),
            circuit_breaker: CircuitBreaker::default(),
            rate_limit: None,
            cache: None,
            queue: DEFAULT_QUEUE,
            tenant: None,
        }
    }
}

impl GateSpec {
    /// Every service the gate sends traffic to: its own target, then its
    /// paths' (each once).
    pub fn services(&self) -> Vec<&str> {
        let mut services = vec![self.service.as_str()];
        for path in &self.paths {
            if !services.contains(&path.service.as_str()) {
                services.push(&path.service);
            }
        }
        services
    }
}

pub const DEFAULT_QUEUE: u32 = 1000;

fn default_queue() -> u32 {
    DEFAULT_QUEUE
}

/// `path "/api" service api [port P]`: requests whose path starts with
/// `prefix` (whole segments: `/api` matches `/api` and `/api/x`, not
/// `/apix`) go to another service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatePath {
    pub prefix: String,
    pub service: String,
    /// Resolved like the gate's own port.
    pub port: u16,
}

/// Cookie-based session affinity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sticky {
    /// Defaults to `__CCA_STICKY_{service}`.
    pub cookie: String,
    pub secure: bool,
    pub http_only: bool,
    pub same_site: SameSite,
}

/// The cookie's `SameSite` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SameSite {
    Strict,
    Lax,
    None,
}

/// Where a gate's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Tls {
    /// The server issues a certificate for the gate's hosts from its CA.
    SelfSigned,
    /// PEM certificate chain and key, each held in a secret.
    Secrets { cert: String, key: String },
}

/// How a request without (valid) stickiness picks a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// In turn, skipping ejected backends.
    #[default]
    RoundRobin,
    /// The backend with the fewest requests in flight from this gate node
    /// (ties in turn).
    LeastConnections,
    /// Consistent hashing of the client's address: a client keeps its
    /// backend, and a backend joining or leaving moves only its share.
    SourceIp,
}

/// The gate's clocks. (How long a client may take to send a request's
/// headers is the gate node's, `--gate-header-timeout`: the gate is not
/// known before the headers are read.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GateTimeouts {
    /// To open a connection to a backend.
    pub connect: Duration,
    /// For a backend to send a response's headers.
    pub response: Duration,
    /// A keep-alive connection with no request is closed after this.
    pub idle: Duration,
    /// A request for a service at zero instances is held this long for
    /// one to become ready, then answered 503.
    pub wake: Duration,
}

impl Default for GateTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration(5_000),
            response: Duration(60_000),
            idle: Duration(60_000),
            wake: Duration(30_000),
        }
    }
}

/// Retries of idempotent requests (GET, HEAD, OPTIONS, PUT, DELETE
/// without a body in flight) that failed to connect or got no response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Retries {
    /// Further tries of one request, each on another backend.
    pub attempts: u32,
    /// Retries may add at most this share of the gate's recent requests,
    /// so a failing service is not hit with a retry storm.
    pub budget: Percent,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            attempts: 2,
            budget: Percent(20),
        }
    }
}

/// Per-backend outlier ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CircuitBreaker {
    /// Consecutive failures (refused or reset connections, timeouts, 502,
    /// 503, 504) that eject a backend.
    pub failures: u32,
    /// How long a first ejection lasts; each further one doubles it (to
    /// 10×). After it, one probe request decides: success restores the
    /// backend, failure ejects it again.
    pub ejection: Duration,
    /// At most this share of a target's backends is ejected at once.
    pub max_ejected: Percent,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            failures: 5,
            ejection: Duration(30_000),
            max_ejected: Percent(50),
        }
    }
}

/// Token buckets: requests per second, with a burst.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Per client address, on each gate node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<Rate>,
    /// For the whole gate, on each gate node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gate: Option<Rate>,
}

/// A sustained rate and the burst above it a bucket allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub per_second: u32,
    /// Defaults to `per_second`.
    pub burst: u32,
}

/// A small in-memory cache of GET responses that say they may be cached
/// (`Cache-Control: public`/`max-age`/`s-maxage`, or `Expires`), and never
/// of responses that set cookies or vary on anything but encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResponseCache {
    /// Total size of cached bodies on each gate node.
    pub size: Memory,
    /// A larger body is never cached.
    pub max_entry: Memory,
    /// Freshness is capped at this, whatever the response says.
    pub ttl: Duration,
}

impl Default for ResponseCache {
    fn default() -> Self {
        Self {
            size: Memory(64 << 20),
            max_entry: Memory(1 << 20),
            ttl: Duration(60_000),
        }
    }
}
