//! The desired facts around services (gates are in [`super::gate`]):
//! connections (database URLs assembled from parts), secret declarations
//! and grants, and network policy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::service::Protocol;

/// `desired/secret/{name}`: a secret's value, sealed by the API server.
/// Format 2 (envelope): the value under its own random data key
/// (AES-256-GCM, the secret's name as associated data), that data key
/// wrapped by the key-encryption key `key_id` (`wrapped_key`, hex).
/// Format 1 (older servers): the value directly under the cluster key
/// file's key `key_id`, no `wrapped_key`. Hex nonce and ciphertext (the
/// 16-byte tag appended) and when the value was set. Holds no value or key
/// in the clear. Never written by a compile or an apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecret {
    pub format: u32,
    pub algorithm: String,
    pub key_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wrapped_key: String,
    pub nonce: String,
    pub ciphertext: String,
    pub set_at: crate::cluster::Millis,
    /// The tenant of the user who set it; `None`: cluster-wide. Only that
    /// tenant's services receive it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `desired/connection/{name}`: parts of a URL the agent assembles (with
/// the secret as password, escaped) and mounts into granted instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionSpec {
    pub name: String,
    pub driver: String,
    pub user: Option<String>,
    pub secret: Option<String>,
    pub host: String,
    pub port: u16,
    pub database: Option<String>,
    pub params: BTreeMap<String, String>,
    /// The tenant it belongs to, stamped by the API from the program's
    /// tenant at apply (never written in a `.cca` file); `None`:
    /// cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `desired/secret-decl/{name}`: a secret the program expects to exist. The
/// value itself is set with `cca secret set` and stored encrypted under
/// `desired/secret/{name}`, which a compile never writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretSpec {
    pub name: String,
    pub description: Option<String>,
    /// The tenant it belongs to, stamped by the API from the program's
    /// tenant at apply (never written in a `.cca` file); `None`:
    /// cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `desired/service/{svc}/secret/{secret}`: a service may read a secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum SecretGrant {
    /// Written in the service block (`secret db_password`).
    Explicit,
    /// Implied by a connection the service references.
    Connection { connection: String },
}

/// `desired/network/policy/{name}`: ordered allow/deny rules; the first
/// rule that matches a flow decides it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub name: String,
    pub rules: Vec<NetworkRule>,
    /// The tenant it belongs to, stamped by the API from the program's
    /// tenant at apply (never written in a `.cca` file); `None`:
    /// cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// One `allow`/`deny` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    pub action: RuleAction,
    pub from: Peer,
    pub to: Peer,
    /// Empty means every port.
    pub ports: Vec<u16>,
    pub protocol: Option<Protocol>,
}

/// Whether a matching flow passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    Allow,
    Deny,
}

/// One side of a flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Peer {
    /// `*`: every service (and, as a source, the outside world).
    Any,
    Service(String),
}
