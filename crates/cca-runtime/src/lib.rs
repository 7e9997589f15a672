//! Runtimes run instances on one node. [`Runtime`] is the narrow trait the
//! agent drives — create, start, stop, remove, inspect, list, logs, exec —
//! and every host side effect of running a workload sits behind it: only
//! runtimes spawn processes. [`ProcessRuntime`] runs host processes (own
//! session and process group, cgroup limits where the host allows them,
//! rotated log files, state on disk so a restarted agent adopts what it
//! finds); `FakeRuntime` (feature `fake`) records calls and injects failures
//! for the agent's unit tests. [`OciRuntime`] runs containers from the
//! node's image store with runc; `sim` simulates instances (seeded start
//! latency, failures, crashes) for benchmarks.

mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod logs;
mod memory;
pub mod oci;
pub mod process;
mod records;
mod resolv;
pub mod sim;
mod spec;
mod status;
pub mod usage;

use std::time::Duration;

use async_trait::async_trait;

pub use error::{Error, Operation, Result};
pub use logs::{LogOptions, LogStream};
pub use oci::{OciConfig, OciRuntime};
pub use process::{ProcessConfig, ProcessRuntime};
pub use spec::{
    DEFAULT_LOG_LIMIT_BYTES, DnsConfig, InstanceSpec, Mount, NetworkAttachment, PortBinding,
    Protocol, env_name_for_port, env_name_part,
};
pub use status::{
    ExecOutput, ExecRequest, ExitInfo, ExitReason, InstanceState, InstanceStatus, LimitsEnforcement,
};
pub use usage::Usage;

/// One node's way of running instances. Object safe: the agent holds an
/// `Arc<dyn Runtime>` and never knows which kind it drives.
///
/// Every method names its instance by the id given in [`InstanceSpec::id`];
/// ids are unique per node and chosen by the caller.
#[async_trait]
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// The runtime's name as written in a service's `runtime` key:
    /// `process`, `oci`, `sim`, `fake`.
    fn kind(&self) -> &'static str;

    /// Records a new instance in state [`InstanceState::Created`]; nothing
    /// runs yet. Fails with [`Error::AlreadyExists`] when the id is taken.
    async fn create(&self, spec: InstanceSpec) -> Result<String>;

    /// Starts a created or exited instance (a restart reuses the id, its log
    /// files and its limits). Fails with [`Error::InvalidState`] when it runs.
    async fn start(&self, id: &str) -> Result<()>;

    /// Asks the instance to end (SIGTERM to its whole process group), waits
    /// up to `grace`, then kills whatever is left (SIGKILL). Returns the
    /// status once it has exited; stopping an instance that is not running
    /// just returns its status.
    async fn stop(&self, id: &str, grace: Duration) -> Result<InstanceStatus>;

    /// Forgets an instance that is not running: its files, logs and cgroups.
    async fn remove(&self, id: &str) -> Result<()>;

    /// The instance's current status.
    async fn inspect(&self, id: &str) -> Result<InstanceStatus>;

    /// Every instance this runtime knows on this node, including those
    /// started by an earlier agent process: the input of adoption and
    /// garbage collection.
    async fn list(&self) -> Result<Vec<InstanceStatus>>;

    /// The instance's output lines (stdout and stderr interleaved in write
    /// order), optionally only the last `tail` lines, optionally following
    /// new output until the instance exits or the stream is dropped.
    async fn logs(&self, id: &str, options: LogOptions) -> Result<LogStream>;

    /// Runs a command in the instance's context (for processes: its
    /// environment, working directory and cgroups) and collects its output.
    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecOutput>;

    /// What a running instance uses of the node now: the CPU time it has
    /// used since it started and the memory it holds. Fails with
    /// [`Error::InvalidState`] when it does not run.
    async fn usage(&self, id: &str) -> Result<Usage>;

    /// Sets an instance's CPU and memory limits (`None`: no limit) and
    /// keeps them as its spec's, so its next start applies them; a running
    /// one takes them in place, without a restart. Fails with
    /// [`Error::Failed`], changing nothing, where the run cannot take them
    /// (no cgroup for a limit): they then wait for a restart.
    async fn resize(&self, id: &str, limits: Limits) -> Result<()>;
}

/// An instance's CPU and memory limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Limits {
    /// The limits `spec` asks for.
    pub fn of(spec: &InstanceSpec) -> Self {
        Limits {
            cpu_millis: spec.cpu_millis,
            memory_bytes: spec.memory_bytes,
        }
    }

    /// Writes them into `spec`.
    pub fn set_on(self, spec: &mut InstanceSpec) {
        spec.cpu_millis = self.cpu_millis;
        spec.memory_bytes = self.memory_bytes;
    }
}
