//! The desired shape of one service, as compiled from a `service` block:
//! what to run, how many, on which ports, with which resources, health
//! checks, placement hints, volumes, init steps and rollout rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::quantity::{Cpu, Duration, Memory, Percent};
use crate::net::Affinity;

/// `desired/service/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSpec {
    pub name: String,
    pub workload: Workload,
    pub replicas: u32,
    pub ports: Vec<PortSpec>,
    pub env: BTreeMap<String, String>,
    pub resources: Resources,
    pub health: Option<HealthCheck>,
    pub placement: Placement,
    /// Connections whose assembled URL is mounted as a file in each instance.
    pub connections: Vec<String>,
    pub volumes: Vec<VolumeSpec>,
    pub init: Vec<InitStep>,
    pub update: UpdateStrategy,
    pub budget: Option<DisruptionBudget>,
    pub autoscale: Option<Autoscale>,
    /// Ordinal instance ids, ordered start and stop, per-ordinal volumes.
    pub stateful: bool,
    /// Scale to zero instances after this long without traffic; the gate
    /// or VIP activates the service again on the next request.
    pub scale_to_zero: Option<Duration>,
    /// Containers share their node's network instead of getting their own
    /// namespace and address on the node subnet (`network = "host"`).
    /// Processes always share it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// How the service's VIP spreads new flows over its backends
    /// (`affinity = "client-ip"`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub affinity: Affinity,
    /// The tenant the service belongs to, stamped by the API from the
    /// program's tenant at apply (never written in a `.cca` file); `None`:
    /// cluster-wide, seen only by cluster-wide users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl ServiceSpec {
    /// Service `name` running `workload` with what `service NAME { run … }`
    /// compiles to when nothing else is set: one replica, no ports,
    /// environment, resources, health check, placement rules, connections,
    /// volumes or init steps, the default update strategy. Set the rest
    /// with `ServiceSpec { replicas: 3, ..ServiceSpec::new(…) }`.
    pub fn new(name: impl Into<String>, workload: Workload) -> Self {
        Self {
            name: name.into(),
            workload,
            replicas: 1,
            ports: Vec::new(),
            env: BTreeMap::new(),
            resources: Resources::default(),
            health: None,
            placement: Placement::default(),
            connections: Vec::new(),
            volumes: Vec::new(),
            init: Vec::new(),
            update: UpdateStrategy::default(),
            budget: None,
            autoscale: None,
            stateful: false,
            scale_to_zero: None,
            host_network: false,
            affinity: Affinity::None,
            tenant: None,
        }
    }
}

/// What an instance runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// An OCI container. `command`, when set, replaces the image's command
    /// and is always run as `sh -c COMMAND`.
    Image {
        image: String,
        command: Option<String>,
    },
    /// A host process, run as `sh -c RUN`.
    Process { run: String },
}

impl Workload {
    /// A host process running `sh -c RUN`.
    pub fn process(run: impl Into<String>) -> Self {
        Self::Process { run: run.into() }
    }

    /// `image` with its own command.
    pub fn image(image: impl Into<String>) -> Self {
        Self::Image {
            image: image.into(),
            command: None,
        }
    }
}

/// Transport protocol of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Tcp,
    Udp,
}

/// One port a service listens on. Instances learn the port actually bound
/// to them from `PORT` (the first port) and `CCA_PORT_{NAME}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    /// `None` for an unnamed port (`port 8080`).
    pub name: Option<String>,
    pub number: u16,
    pub protocol: Protocol,
}

impl PortSpec {
    /// TCP port `number` named `name` (`port name number`).
    pub fn tcp(name: impl Into<String>, number: u16) -> Self {
        Self {
            name: Some(name.into()),
            number,
            protocol: Protocol::Tcp,
        }
    }
}

/// Per-instance resource requests, also used as limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
}

/// How the agent decides an instance is healthy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive failures before the instance counts as unhealthy.
    pub retries: u32,
}

/// One kind of health probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Probe {
    /// GET `path` on `port`; any 2xx or 3xx is healthy.
    Http { path: String, port: u16 },
    /// A TCP connect to `port` succeeds.
    Tcp { port: u16 },
    /// `sh -c command` inside the instance exits 0.
    Exec { command: String },
}

/// Where instances may and should run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Soft: prefer nodes already running these services.
    pub colocate: Vec<String>,
    /// Soft: prefer nodes not running these services.
    pub separate: Vec<String>,
    /// Hard: only nodes whose labels have exactly these values.
    pub restrict: BTreeMap<String, String>,
    /// Soft: spread instances evenly across the values of these node labels.
    pub spread: Vec<String>,
}

/// A named volume mounted at `path`; per ordinal for stateful services.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpec {
    pub name: String,
    pub path: String,
    pub size: Option<Memory>,
}

/// A step run to completion, in order, before the main workload starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitStep {
    pub name: String,
    /// Run as `sh -c command`.
    pub command: Option<String>,
    /// The step runs as a container of this image (a `run` service's
    /// step on the host's network); `None`: in the service's own image, or
    /// as a host process for a `run` service.
    pub image: Option<String>,
    /// A connection whose host and port must answer (a TCP connect) before
    /// the step counts as done: an unreachable database stops the start
    /// here, with the reason, rather than in the workload.
    pub probe: Option<String>,
    /// How long the step may take, its command and its probe together
    /// ([`INIT_STEP_TIMEOUT`] when not given); then the start fails and is
    /// tried again after a backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

/// How long an init step may take when it does not say.
pub const INIT_STEP_TIMEOUT: Duration = Duration(120_000);

/// How a new version replaces the old one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateStrategy {
    pub max_unavailable: u32,
    pub max_surge: u32,
    /// Roll back to the previous version once this many new instances
    /// failed during a rollout (gave up, or crash looping); 0 never does.
    pub rollback_after: u32,
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        UpdateStrategy {
            max_unavailable: 1,
            max_surge: 1,
            rollback_after: 3,
        }
    }
}

/// Bounds voluntary moves of a service's instances (drain, rebalancing);
/// rolling updates follow [`UpdateStrategy`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisruptionBudget {
    /// Moves in flight at once; 0 allows none, so a drain waits.
    pub max_unavailable: u32,
}

impl ServiceSpec {
    /// How many of its instances voluntary moves (drain, rebalancing) may
    /// take on at once: the budget's `max_unavailable`, 1 without a budget.
    /// 0 means they never move: a draining node keeps them.
    pub fn voluntary_moves(&self) -> u32 {
        self.budget
            .as_ref()
            .map_or(1, |budget| budget.max_unavailable)
    }

    /// How many of its instances a rolling update may take out of service
    /// at once: `update.max_unavailable`, within the disruption budget
    /// when there is one.
    pub fn rollout_unavailable(&self) -> u32 {
        let budget = self.budget.as_ref().map(|budget| budget.max_unavailable);
        budget.map_or(self.update.max_unavailable, |budget| {
            budget.min(self.update.max_unavailable)
        })
    }
}

/// Automatic scaling: more instances (horizontal), bigger ones (vertical).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscale {
    pub horizontal: Option<HorizontalScale>,
    pub vertical: Option<VerticalScale>,
}

/// Instance count between `min` and `max`, aiming at target utilisation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HorizontalScale {
    pub min: u32,
    pub max: u32,
    pub cpu: Option<Percent>,
    pub memory: Option<Percent>,
    /// Requests per second through the gates each instance should take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
}

/// Per-instance resources adjusted within bounds from observed usage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerticalScale {
    pub min_cpu: Option<Cpu>,
    pub max_cpu: Option<Cpu>,
    pub min_memory: Option<Memory>,
    pub max_memory: Option<Memory>,
    #[serde(default)]
    pub mode: VerticalMode,
}

/// What vertical autoscaling does with its recommendations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerticalMode {
    /// Shows them (`describe`, `cca scale why`); the instances keep their
    /// `resources`.
    #[default]
    Recommend,
    /// Resizes the instances to them.
    Auto,
}
