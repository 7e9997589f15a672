//! The agent's errors: what failed, on what, and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent cache {}: {problem}", path.display())]
    Cache { path: PathBuf, problem: String },

    #[error("runtime: {0}")]
    Runtime(#[from] cca_runtime::Error),

    #[error("instance {instance}: {problem}")]
    Instance { instance: String, problem: String },

    #[error("agent API: cannot listen on {address}: {problem}")]
    Listen { address: String, problem: String },
}
