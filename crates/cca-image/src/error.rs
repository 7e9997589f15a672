//! The image crate's error type: every variant names the image, blob or
//! path it is about and what was being done, so a pull failure shown by
//! `cca describe` needs no further context.

use std::path::PathBuf;

/// Results of image operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    #[error(
        "invalid registry {registry:?} (expected HOST or HOST:PORT, as in references): {reason}"
    )]
    InvalidRegistry { registry: String, reason: String },

    #[error("invalid digest {digest:?}: {reason}")]
    InvalidDigest { digest: String, reason: String },

    /// The registry refused or could not be reached: unknown image or tag,
    /// authentication, connection, TLS.
    #[error("image {image}: registry {registry}: {message}")]
    Registry {
        image: String,
        registry: String,
        message: String,
    },

    #[error(
        "{what} {expected}: the content's digest is {actual} (corrupted at its source or on \
         the way; nothing of it was kept)"
    )]
    DigestMismatch {
        /// What the blob is, e.g. `image 127.0.0.1:5000/a:1: layer`.
        what: String,
        expected: String,
        actual: String,
    },

    #[error("layer {digest}: {reason}")]
    Unpack { digest: String, reason: String },

    #[error("image {image}: config {digest} is not a valid image config: {error}")]
    Config {
        image: String,
        digest: String,
        error: serde_json::Error,
    },

    #[error("image {image}: {reason}")]
    Unsupported { image: String, reason: String },

    /// `cca image import`: the file is not an image archive, lacks a part,
    /// or holds something unsafe.
    #[error("import {}: {reason}", path.display())]
    Import { path: PathBuf, reason: String },

    #[error("image {image}: not in the store")]
    NotFound { image: String },

    #[error("image store: {what} {path}: {error}")]
    Io {
        /// What was being done, e.g. `writing`.
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("image store {}: busy: {reason}", store.display())]
    Busy { store: PathBuf, reason: String },

    #[error("image store: {path} is not a valid image record: {error}")]
    CorruptRecord {
        path: PathBuf,
        error: serde_json::Error,
    },
}

impl Error {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            error: source,
        }
    }
}

/// Attaches "what was done on which path" to an IO result.
pub(crate) trait IoContext<T> {
    fn on(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn on(self, what: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::io(what, path, source))
    }
}

/// The error and its sources, so "connection refused" is not hidden
/// behind "error sending request".
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
