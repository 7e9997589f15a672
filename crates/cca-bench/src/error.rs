//! What can stop a benchmark run: settings that make no sense, the store,
//! the API, the workload's compilation, a cluster that never comes up, a
//! failed verification, or a program the gate benchmark runs (nginx,
//! h2load) that is not installed.

use std::time::Duration;

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    // Not `#[from]`: that would make the cause a `source` as well, and a
    // printed chain would repeat it (ARCHITECTURE.md, "An error says its
    // cause once").
    #[error("store: {0}")]
    Store(cca_store::StoreError),

    #[error("API: {0}")]
    Api(cca_wire::ClientError),

    #[error("I/O: {what}: {error}")]
    Io { what: String, error: std::io::Error },

    #[error("the TLS setup of the benchmark's cluster: {0}")]
    Trust(String),

    #[error("invalid benchmark settings: {0}")]
    Config(String),

    #[error("the generated workload does not compile: {0}")]
    Workload(String),

    #[error("{what} did not happen within {timeout:?}")]
    Timeout { what: String, timeout: Duration },

    #[error(
        "`{program}` is not installed: install Debian's package {package} \
         (scripts/test installs it)"
    )]
    MissingProgram { program: String, package: String },

    #[error("the {what} task failed: {problem}")]
    Task { what: String, problem: String },
}

impl From<cca_store::StoreError> for BenchError {
    fn from(error: cca_store::StoreError) -> Self {
        Self::Store(error)
    }
}

impl From<cca_wire::ClientError> for BenchError {
    fn from(error: cca_wire::ClientError) -> Self {
        Self::Api(error)
    }
}

impl BenchError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |error| BenchError::Io { what, error }
    }
}
