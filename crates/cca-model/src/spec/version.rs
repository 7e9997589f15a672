//! Service versions: what an instance runs is its service's spec at one
//! version, named by [`spec_hash`]. The scheduler stamps the hash on every
//! instance it places (`Instance::spec_hash`); `cca apply` keeps the spec
//! of each version at `desired/service/{svc}/version/{hash}` as a
//! [`ServiceVersion`], so an instance placed with an older version (during
//! a rolling update) is sent that version's spec rather than the current
//! one. The hash is computed here and only here, so the scheduler's stamp
//! and apply's key always agree.

use serde::{Deserialize, Serialize};

use super::ServiceSpec;
use crate::cluster::Millis;

/// A stable fingerprint of what an instance runs (FNV-1a over the spec's
/// JSON, which is deterministic: structs in field order, maps ordered),
/// 16 hex digits. Fields about the service as a whole — replicas, rollout,
/// disruption budget, autoscaling, scale to zero — are left out: changing
/// them rolls nothing, and no agent reads them.
pub fn spec_hash(spec: &ServiceSpec) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut instance_shape = spec.clone();
    instance_shape.replicas = 0;
    instance_shape.update = Default::default();
    instance_shape.budget = None;
    instance_shape.autoscale = None;
    instance_shape.scale_to_zero = None;
    let json = serde_json::to_vec(&instance_shape).unwrap_or_default();
    let hash = json.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    });
    format!("{hash:016x}")
}

/// `desired/service/{svc}/version/{hash}`: one version of a service, written
/// by the apply that made it the service's spec. Which apply is the fact's
/// mod revision (the apply's revision, as `cca apply` prints it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceVersion {
    /// The spec as that apply wrote it; its [`spec_hash`] is the key's hash.
    pub spec: ServiceSpec,
    /// When an apply first made this version the service's spec.
    pub created_at: Millis,
    /// When an apply last made it the service's spec (the same as
    /// `created_at` unless the spec went back to it, or only fields outside
    /// the hash such as replicas changed).
    pub applied_at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Workload;

    fn spec(replicas: u32) -> ServiceSpec {
        ServiceSpec {
            replicas,
            ..ServiceSpec::new("web", Workload::process("sleep 1000"))
        }
    }

    #[test]
    fn spec_hash_changes_with_what_instances_run() {
        let spec = spec(2);
        let mut changed = spec.clone();
        changed.env.insert("A".into(), "1".into());
        assert_eq!(spec_hash(&spec), spec_hash(&spec.clone()));
        assert_ne!(spec_hash(&spec), spec_hash(&changed));
        assert_eq!(spec_hash(&spec).len(), 16);
        let mut rollout = spec.clone();
        rollout.update.max_surge = 7;
        assert_eq!(
            spec_hash(&spec),
            spec_hash(&rollout),
            "rollout rolls nothing"
        );
    }

    #[test]
    fn spec_hash_ignores_replicas() {
        assert_eq!(
            spec_hash(&spec(2)),
            spec_hash(&spec(9)),
            "scaling rolls nothing"
        );
    }
}
