//! The agent's errors: what failed, on what, and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent cache {}: {problem}", path.display())]
    Cache { path: PathBuf, problem: String },

    // Not `#[from]`: the cause is in the message, so it is not also a
    // `source` (ARCHITECTURE.md, "An error says its cause once").
    #[error("runtime: {0}")]
    Runtime(cca_runtime::Error),

    #[error("instance {instance}: {problem}")]
    Instance { instance: String, problem: String },

    #[error("the node's TLS credentials: {0}")]
    Trust(String),

    #[error("agent API: cannot listen on {address}: {problem}")]
    Listen { address: String, problem: String },
}

impl From<cca_runtime::Error> for AgentError {
    fn from(error: cca_runtime::Error) -> Self {
        Self::Runtime(error)
    }
}
