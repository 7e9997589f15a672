//! What can stop a benchmark run: the store, the API, the workload's
//! compilation, a cluster that never comes up, or a failed verification.

use std::time::Duration;

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("store: {0}")]
    Store(#[from] cca_store::StoreError),

    #[error("API: {0}")]
    Api(#[from] cca_wire::ClientError),

    #[error("I/O: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    #[error("the generated workload does not compile: {0}")]
    Workload(String),

    #[error("{what} did not happen within {timeout:?}")]
    Timeout { what: String, timeout: Duration },

    #[error("the {what} task failed: {problem}")]
    Task { what: String, problem: String },
}

impl BenchError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }
}
