//! Who may reach the cluster, as facts: join tokens (only a hash of their
//! secret), and — as the trust work grows — users, roles and revoked
//! credentials. Plain data with no logic: `cca-trust` decides what a
//! record admits, `cca-api` writes and reads them.

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

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
