//! What a runtime reports: [`InstanceStatus`] (state, pid, times, exit,
//! whether limits are enforced), [`ExitInfo`] with its [`ExitReason`], and
//! the request and result of `exec`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::InstanceSpec;

/// Where an instance is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Created, never started.
    Created,
    /// Its main process is alive.
    Running,
    /// Its main process has ended; [`InstanceStatus::exit`] says how.
    Exited,
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
        })
    }
}

/// One instance as the runtime sees it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub id: String,
    /// Shared: a runtime lists its instances often (every agent tick), and
    /// a deep copy of every spec per list was most of a 5,000-node
    /// benchmark's allocation work.
    pub spec: Arc<InstanceSpec>,
    pub state: InstanceState,
    /// The main process while running (also kept after exit, for the record).
    pub pid: Option<u32>,
    /// Unix milliseconds of the last start.
    pub started_at_ms: Option<i64>,
    /// How the last run ended; `None` unless exited.
    pub exit: Option<ExitInfo>,
    /// Whether the spec's cpu/memory limits are in force.
    pub limits: LimitsEnforcement,
    /// True when this runtime object did not start the running process
    /// itself: it was found on disk, started by an earlier agent.
    pub adopted: bool,
}

impl InstanceStatus {
    /// Refuses `operation` unless the instance runs (exec, usage).
    pub(crate) fn require_running(&self, operation: crate::Operation) -> crate::Result<()> {
        if self.state == InstanceState::Running {
            return Ok(());
        }
        Err(crate::Error::InvalidState {
            id: self.id.clone(),
            operation,
            state: self.state,
        })
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// The exit code when the process exited normally and it is known.
    pub code: Option<i32>,
    /// The signal that killed it, when it was killed and that is known.
    pub signal: Option<i32>,
    pub reason: ExitReason,
    /// Unix milliseconds when the end was seen (for `AgentAway`: when the
    /// agent noticed, not when it happened).
    pub finished_at_ms: i64,
}

/// Why a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ExitReason {
    /// It ended by itself (or by a signal from someone other than the runtime).
    Exited,
    /// The runtime stopped it (`stop`).
    Stopped,
    /// The kernel killed a process of the instance for exceeding its memory
    /// limit (the memory cgroup counted an OOM kill during this run).
    OutOfMemory { limit_bytes: Option<u64> },
    /// It ended while no agent was its parent, so its exit code is lost.
    AgentAway,
    /// The command could not be launched at all.
    FailedToStart { message: String },
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            ExitReason::AgentAway => {
                return f.write_str("exited (code unknown: ended while the agent was away)");
            }
            ExitReason::FailedToStart { message } => {
                return write!(f, "failed to start: {message}");
            }
            ExitReason::Exited => f.write_str("exited")?,
            ExitReason::Stopped => f.write_str("stopped")?,
            ExitReason::OutOfMemory {
                limit_bytes: Some(limit),
            } => {
                write!(f, "out of memory (limit {limit} bytes)")?;
            }
            ExitReason::OutOfMemory { limit_bytes: None } => f.write_str("out of memory")?,
        }
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, " with code {code}"),
            (None, Some(signal)) => write!(f, " by signal {signal}"),
            (None, None) => Ok(()),
        }
    }
}

/// Whether an instance's cpu and memory limits are enforced. Never silent:
/// a runtime that cannot apply a limit says so here and in a warning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LimitsEnforcement {
    /// The spec asks for no limits.
    NotRequested,
    /// Every requested limit is in force, `by` says how (e.g. `cgroup v1`).
    Enforced { by: String },
    /// At least one requested limit is not in force, and why.
    Unenforced { reason: String },
}

impl fmt::Display for LimitsEnforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRequested => f.write_str("none requested"),
            Self::Enforced { by } => write!(f, "enforced ({by})"),
            Self::Unenforced { reason } => write!(f, "unenforced ({reason})"),
        }
    }
}

/// A command to run in an instance's context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The program and its arguments (not through a shell).
    pub argv: Vec<String>,
    /// Killed (with its whole process group) after this long.
    pub timeout: Duration,
}

impl ExecRequest {
    pub fn new(argv: impl IntoIterator<Item = impl Into<String>>, timeout: Duration) -> Self {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            timeout,
        }
    }
}

/// What an exec'd command did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// It ran past the request's timeout and was killed.
    pub timed_out: bool,
}

impl ExecOutput {
    /// Exited with code 0 within the timeout.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(reason: ExitReason, code: Option<i32>, signal: Option<i32>) -> String {
        ExitInfo {
            code,
            signal,
            reason,
            finished_at_ms: 0,
        }
        .to_string()
    }

    #[test]
    fn exits_read_as_sentences() {
        assert_eq!(
            exit(ExitReason::Exited, Some(3), None),
            "exited with code 3"
        );
        assert_eq!(
            exit(ExitReason::Stopped, None, Some(9)),
            "stopped by signal 9"
        );
        assert_eq!(
            exit(
                ExitReason::OutOfMemory {
                    limit_bytes: Some(1024)
                },
                Some(137),
                None
            ),
            "out of memory (limit 1024 bytes) with code 137"
        );
        assert_eq!(
            exit(ExitReason::AgentAway, None, None),
            "exited (code unknown: ended while the agent was away)"
        );
    }

    #[test]
    fn unenforced_limits_give_their_reason() {
        let limits = LimitsEnforcement::Unenforced {
            reason: "no memory cgroup".into(),
        };
        assert_eq!(limits.to_string(), "unenforced (no memory cgroup)");
    }
}
