//! Errors of the store. Every variant says what failed, on what, and what
//! the caller can do about it; callers match on the variant, people read the
//! message.

use std::path::PathBuf;

use crate::types::{LeaseId, Revision};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached; nothing was changed. Retry later.
    #[error("store unavailable: {reason}")]
    Unavailable { reason: String },

    /// The connection was lost after a transaction was sent: it may or may
    /// not have been applied. Re-read the keys it touched before retrying.
    #[error("transaction outcome unknown: {reason}; re-read the keys it touched before retrying")]
    OutcomeUnknown { reason: String },

    #[error("lease {0} not found: it expired or was revoked")]
    LeaseNotFound(LeaseId),

    /// A read or watch asked for history older than the compaction point.
    #[error("revision {requested} is compacted: the oldest available revision is {}", compact_revision + 1)]
    Compacted {
        requested: Revision,
        compact_revision: Revision,
    },

    /// A revision in the future was asked for (compacting past the head).
    #[error("revision {requested} is in the future: the current revision is {current}")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },

    /// A store URL that names no backend we know.
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),

    /// The request itself is malformed; retrying will not help.
    #[error("invalid store request: {0}")]
    InvalidRequest(String),

    /// The data file could not be used: corrupt, truncated, foreign, or of
    /// a newer format. Nothing was opened; the file was not modified.
    #[error("store data file {}: {problem}", path.display())]
    DataFile { path: PathBuf, problem: String },

    /// Writing to the data file failed; the write was not acknowledged.
    #[error("store data file {}: write failed: {problem}", path.display())]
    Write { path: PathBuf, problem: String },

    /// The store was closed, or its writer stopped after a fatal error.
    #[error("store is closed")]
    Closed,

    /// The backend answered with an error we do not map to a variant above.
    #[error("store backend error: {0}")]
    Backend(String),
}

impl StoreError {
    /// True for errors that may go away on retry (connection trouble).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}
