//! The runtime's error type: every variant names the instance and the
//! operation that failed, so an agent log line or a CLI message says what
//! went wrong where without further context.

use std::fmt;
use std::path::PathBuf;

use crate::InstanceState;

/// Results of runtime operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The operations of [`crate::Runtime`], for error messages and for the
/// fake's failure injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Create,
    Start,
    Stop,
    Remove,
    Inspect,
    List,
    Logs,
    Exec,
    Usage,
    Resize,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Create => "create",
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Remove => "remove",
            Self::Inspect => "inspect",
            Self::List => "list",
            Self::Logs => "logs",
            Self::Exec => "exec",
            Self::Usage => "read usage",
            Self::Resize => "resize",
        };
        f.write_str(name)
    }
}

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("instance {id}: not found")]
    NotFound { id: String },

    #[error("instance {id}: already exists")]
    AlreadyExists { id: String },

    #[error("instance {id}: invalid spec: {reason}")]
    InvalidSpec { id: String, reason: String },

    #[error("instance {id}: cannot {operation} while {state}")]
    InvalidState {
        id: String,
        operation: Operation,
        state: InstanceState,
    },

    #[error("instance {id}: {operation}: {what}: {error}")]
    Io {
        id: String,
        operation: Operation,
        /// What was being done, e.g. `writing /run/cca/instances/a/run.json`.
        what: String,
        error: std::io::Error,
    },

    #[error("instance {id}: {operation}: {path} is not valid: {error}")]
    Corrupt {
        id: String,
        operation: Operation,
        path: PathBuf,
        error: serde_json::Error,
    },

    /// A failure without an underlying IO error: an injected one in the fake,
    /// a refusal from an OCI runtime, a simulated fault.
    #[error("instance {id}: {operation} failed: {message}")]
    Failed {
        id: String,
        operation: Operation,
        message: String,
    },

    /// Something the node is still setting up (its subnet, for an
    /// instance with its own network): try again later; not the
    /// instance's failure.
    #[error("instance {id}: cannot {operation} yet: {reason}")]
    NotYet {
        id: String,
        operation: Operation,
        reason: String,
    },

    #[error("runtime directory {path}: {error}")]
    RuntimeDir {
        path: PathBuf,
        error: std::io::Error,
    },

    /// No usable OCI runtime binary on this host (the message says why and
    /// what to do).
    #[error(transparent)]
    OciBinary(#[from] crate::oci::BinaryError),
}

impl Error {
    /// The id of the instance the error is about (empty for runtime-wide
    /// errors).
    pub fn instance(&self) -> &str {
        match self {
            Self::NotFound { id }
            | Self::AlreadyExists { id }
            | Self::InvalidSpec { id, .. }
            | Self::InvalidState { id, .. }
            | Self::Io { id, .. }
            | Self::Corrupt { id, .. }
            | Self::Failed { id, .. }
            | Self::NotYet { id, .. } => id,
            Self::RuntimeDir { .. } | Self::OciBinary(_) => "",
        }
    }

    pub(crate) fn io(
        id: &str,
        operation: Operation,
        what: impl Into<String>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            id: id.to_owned(),
            operation,
            what: what.into(),
            error: source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_instance_and_the_operation() {
        let error = Error::io(
            "web-1",
            Operation::Start,
            "spawning sh",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(
            error.to_string(),
            "instance web-1: start: spawning sh: entity not found"
        );
        let error = Error::InvalidState {
            id: "web-1".into(),
            operation: Operation::Remove,
            state: InstanceState::Running,
        };
        assert_eq!(
            error.to_string(),
            "instance web-1: cannot remove while running"
        );
        assert_eq!(error.instance(), "web-1");
    }
}
