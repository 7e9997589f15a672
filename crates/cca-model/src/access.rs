//! Who may reach the cluster, as facts: join tokens (only a hash of their
//! secret), and — as the trust work grows — users, roles and revoked
//! credentials. Plain data with no logic: `cca-trust` decides what a
//! record admits, `cca-api` writes and reads them.

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// `trust/revoked/{id}`: certificates taken back before they expire. The
/// id is `serial-{hex}` for one certificate, `{kind}-{name}` (`node-n1`,
/// `user-alice`) for an identity; revoking an identity again moves its
/// cutoff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationRecord {
    pub target: RevokedTarget,
    /// When it was revoked; for an identity, its certificates issued
    /// before this instant are refused, later ones (a node that joined
    /// again) are not.
    pub at: Millis,
    /// Who revoked it (`user:admin`).
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub reason: String,
}

/// What a revocation covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevokedTarget {
    /// The one certificate with this serial (lower-case hex).
    Serial { serial: String },
    /// Every certificate of `kind:name` (`node`, `user` or `server`).
    Identity { kind: String, name: String },
}

impl RevokedTarget {
    /// The record's id: its key's last segment.
    pub fn id(&self) -> String {
        match self {
            RevokedTarget::Serial { serial } => format!("serial-{serial}"),
            RevokedTarget::Identity { kind, name } => format!("{kind}-{name}"),
        }
    }
}

/// `trust/token/{id}`: a join token as the server keeps it. The secret is
/// kept only as its SHA-256, so reading the store does not let anyone
/// join.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub id: String,
    /// SHA-256 of the secret, lower-case hex.
    pub secret_hash: String,
    pub created_at: Millis,
    /// The token admits no one from this instant on.
    pub expires_at: Millis,
    /// The only node this token may enrol, if any.
    #[serde(default)]
    pub node: Option<String>,
    /// How many more enrolments it allows; `None` for any number.
    #[serde(default)]
    pub uses_left: Option<u32>,
    #[serde(default)]
    pub revoked: bool,
    /// What the operator said it is for.
    #[serde(default)]
    pub description: String,
    /// Who made it (an identity such as `user:admin`), for `cca token ls`.
    #[serde(default)]
    pub created_by: String,
}
