//! Backups of a store: one file holding every key at one revision plus the
//! files a restore needs besides the store (the cluster CA, the secret
//! key), encrypted with a key the operator keeps. Backend-agnostic: a
//! backup of the embedded store restores into etcd and the other way round.
//!
//! - [`payload`] is the plaintext stream: a header line, then key and file
//!   records, then an end record with the count (a cut stream is caught).
//!   The API server writes it from [`Store::snapshot`](crate::Store) for
//!   `cca backup` (the embedded store's file is locked by its server).
//! - [`file`] is the file around it: a magic line, a header (format,
//!   revision, object count, store identity, the SHA-256 of what follows),
//!   then the payload sealed in AES-256-GCM chunks, the last one marked.
//!   A foreign file, a corrupt or truncated one and a wrong key are each
//!   refused with that reason.
//! - [`restore`] writes a read backup into an empty store: a new embedded
//!   data file in one transaction (its revision moved past the backup's by
//!   a bump, history marked compacted), or an empty etcd in transactions.
//!   Keys bound to a lease (heartbeats, the leader's record) are not
//!   restored: their holders make them again.

pub mod file;
pub mod payload;
pub mod restore;

pub use file::{BackupError, BackupHeader, BackupKey, BackupReader, BackupWriter};
pub use payload::{PayloadHeader, Record};
pub use restore::{RestoreTarget, Restored, restore};
