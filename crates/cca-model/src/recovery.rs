//! What lets a cluster notice that its store is not the one it followed,
//! and recover without restarting what already runs: the store's identity
//! ([`StoreIdentity`] at `meta/store`: made with the store, kept by its
//! backups, replaced by a restore), and the instances a node runs that the
//! store does not know ([`Unclaimed`] at `observed/unclaimed/{node}`),
//! which the scheduler adopts where they match what it would place.

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;
use crate::spec::{Cpu, Memory};

/// `meta/store`: who this store is. Agents remember it with the
/// assignments they follow; a different one (a new or restored store) makes
/// them resync from scratch instead of trusting what they cached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreIdentity {
    /// 32 hex digits, random.
    pub id: String,
    pub created_at: Millis,
    /// The identity of the store a restore copied this one from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
}

impl StoreIdentity {
    /// A new identity from 16 random bytes.
    pub fn new(random: [u8; 16], created_at: Millis) -> Self {
        let id = random.iter().map(|byte| format!("{byte:02x}")).collect();
        StoreIdentity {
            id,
            created_at,
            restored_from: None,
        }
    }
}

/// `observed/unclaimed/{node}`: instances running on the node that its
/// store does not place there (the node resynced with a new, restored or
/// rewound store), offered for adoption. The agent keeps each one while
/// the store does not know its service yet, and stops it a grace period
/// after the service appears unless the scheduler placed it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unclaimed {
    pub instances: Vec<UnclaimedInstance>,
}

/// One instance a node runs without a placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnclaimedInstance {
    pub id: String,
    pub service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<u32>,
    /// The spec it runs: it is adopted only by a placement of this version.
    pub spec_hash: String,
    pub cpu: Cpu,
    pub memory: Memory,
    /// Host ports it holds, by service port name or number.
    #[serde(default)]
    pub host_ports: std::collections::BTreeMap<String, u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_its_random_bytes_in_hex() {
        let identity = StoreIdentity::new([0xab; 16], 7);
        assert_eq!(identity.id, "ab".repeat(16));
        assert_eq!(identity.created_at, 7);
        assert_eq!(identity.restored_from, None);
    }
}
