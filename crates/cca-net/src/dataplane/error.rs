//! Errors of the data plane: each names what failed on what (the table,
//! the `nft` command and its stderr, the conntrack request) and, where the
//! caller can do something, what.

use std::io;

/// `Result` with the data plane's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while programming the node's packet filter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `nft` ran and refused the batch; nothing of it was applied.
    #[error(
        "nft refused a batch of {commands} commands for table {table} ({status}): {stderr}; nothing was applied, the next sync rebuilds the table"
    )]
    Apply {
        table: String,
        commands: usize,
        status: String,
        stderr: String,
    },
    /// A command could not be started or fed (binary missing, no permission).
    #[error("could not run `{command}`: {error}")]
    Spawn { command: String, error: io::Error },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// A conntrack request over netlink failed.
    #[error("conntrack {action} over netlink failed: {error}")]
    Conntrack {
        action: &'static str,
        error: io::Error,
    },
    /// The kernel's conntrack answer could not be decoded.
    #[error("could not decode the kernel's conntrack {action} answer: {reason}")]
    ConntrackDecode {
        action: &'static str,
        reason: String,
    },
    /// A configured name the kernel would refuse.
    #[error("invalid data plane config: {0}")]
    Config(String),
    /// A failure the recording fake was told to inject.
    #[error("injected failure in {operation}")]
    Injected { operation: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_error_names_table_stderr_and_what_follows() {
        let error = Error::Apply {
            table: "cca-svc".into(),
            commands: 3,
            status: "exit status: 1".into(),
            stderr: "Error: No such file or directory".into(),
        };
        assert_eq!(
            error.to_string(),
            "nft refused a batch of 3 commands for table cca-svc (exit status: 1): Error: No such file or directory; nothing was applied, the next sync rebuilds the table"
        );
    }
}
