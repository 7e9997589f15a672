//! Typed desired facts: what a compiled `.cca` program asks the cluster
//! for. The DSL compiler produces a [`Program`]; [`Program::facts`] turns it
//! into the ordered `(key, JSON bytes)` pairs `cca apply` writes under
//! `desired/`. The JSON encoding lives here, next to the types, so every
//! reader of a fact decodes it the same way.

mod edges;
mod gate;
mod quantity;
mod service;
mod version;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use edges::{
    ConnectionSpec, NetworkPolicy, NetworkRule, Peer, RuleAction, SealedSecret, SecretGrant,
    SecretSpec,
};
pub use gate::{
    Balance, CircuitBreaker, DEFAULT_QUEUE, GatePath, GateSpec, GateTimeouts, Rate, RateLimit,
    ResponseCache, Retries, SameSite, Sticky, Tls,
};
pub use quantity::{Cpu, Duration, Memory, Percent, QuantityError};
pub use service::{
    Autoscale, DisruptionBudget, HealthCheck, HorizontalScale, INIT_STEP_TIMEOUT, InitStep,
    Placement, PortSpec, Probe, Protocol, Resources, ServiceSpec, UpdateStrategy, VerticalMode,
    VerticalScale, VolumeSpec, Workload,
};
pub use version::{ServiceVersion, spec_hash};

use crate::keys;

/// Everything one compile asks for, keyed by name. Ordered maps keep the
/// output deterministic: the same program always yields the same bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub services: BTreeMap<String, ServiceSpec>,
    /// Service → tag key → tag value.
    pub tags: BTreeMap<String, BTreeMap<String, String>>,
    /// Service → secret → why the service may read it.
    pub grants: BTreeMap<String, BTreeMap<String, SecretGrant>>,
    pub gates: BTreeMap<String, GateSpec>,
    pub connections: BTreeMap<String, ConnectionSpec>,
    pub secrets: BTreeMap<String, SecretSpec>,
    pub networks: BTreeMap<String, NetworkPolicy>,
    /// The tenant the program's services belong to: set by the API from
    /// who applies it (never by a `.cca` file); `None`: cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// One desired fact: a key under `desired/` and its JSON value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fact {
    pub key: String,
    pub value: Vec<u8>,
}

/// A fact value that could not be encoded (never expected for these types,
/// but encoding is fallible in serde's contract).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode desired fact `{key}`: {error}")]
pub struct EncodeError {
    pub key: String,
    pub error: serde_json::Error,
}

impl Program {
    /// All facts of the program, sorted by key.
    pub fn facts(&self) -> Result<Vec<Fact>, EncodeError> {
        let mut facts = Vec::new();
        for (name, spec) in &self.services {
            push(&mut facts, keys::desired_service(name), spec)?;
        }
        for (service, tags) in &self.tags {
            for (key, value) in tags {
                push(&mut facts, keys::desired_service_tag(service, key), value)?;
            }
        }
        for (service, grants) in &self.grants {
            for (secret, grant) in grants {
                let key = keys::desired_service_secret(service, secret);
                push(&mut facts, key, grant)?;
            }
        }
        for (name, gate) in &self.gates {
            push(&mut facts, keys::desired_gate(name), gate)?;
        }
        for (name, connection) in &self.connections {
            push(&mut facts, keys::desired_connection(name), connection)?;
        }
        for (name, secret) in &self.secrets {
            push(&mut facts, keys::desired_secret_declaration(name), secret)?;
        }
        for (name, policy) in &self.networks {
            push(&mut facts, keys::desired_network_policy(name), policy)?;
        }
        facts.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(facts)
    }
}

/// Two programs being merged both define the same name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{kind} `{name}` is defined in more than one file")]
pub struct DuplicateDefinition {
    pub kind: &'static str,
    pub name: String,
}

impl Program {
    /// Adds `other`'s definitions (several files applied together). All or
    /// nothing: a name both define is an error and leaves `self` as it was.
    pub fn merge(&mut self, other: Program) -> Result<(), DuplicateDefinition> {
        clash("service", &self.services, &other.services)?;
        clash("tags of service", &self.tags, &other.tags)?;
        clash("secret grants of service", &self.grants, &other.grants)?;
        clash("gate", &self.gates, &other.gates)?;
        clash("connection", &self.connections, &other.connections)?;
        clash("secret", &self.secrets, &other.secrets)?;
        clash("network policy", &self.networks, &other.networks)?;
        self.services.extend(other.services);
        self.tags.extend(other.tags);
        self.grants.extend(other.grants);
        self.gates.extend(other.gates);
        self.connections.extend(other.connections);
        self.secrets.extend(other.secrets);
        self.networks.extend(other.networks);
        Ok(())
    }
}

fn clash<T>(
    kind: &'static str,
    held: &BTreeMap<String, T>,
    added: &BTreeMap<String, T>,
) -> Result<(), DuplicateDefinition> {
    match added.keys().find(|name| held.contains_key(*name)) {
        Some(name) => Err(DuplicateDefinition {
            kind,
            name: name.clone(),
        }),
        None => Ok(()),
    }
}

fn push<T: Serialize>(facts: &mut Vec<Fact>, key: String, value: &T) -> Result<(), EncodeError> {
    match serde_json::to_vec(value) {
        Ok(value) => {
            facts.push(Fact { key, value });
            Ok(())
        }
        Err(error) => Err(EncodeError { key, error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> ServiceSpec {
        ServiceSpec {
            replicas: 2,
            ports: vec![PortSpec::tcp("http", 8080)],
            ..ServiceSpec::new(name, Workload::process("cca whoami --port $PORT"))
        }
    }

    #[test]
    fn facts_are_sorted_and_under_desired() {
        let mut program = Program::default();
        program.services.insert("web".into(), service("web"));
        program
            .tags
            .entry("web".into())
            .or_default()
            .insert("team".into(), "payments".into());
        program
            .grants
            .entry("web".into())
            .or_default()
            .insert("db".into(), SecretGrant::Explicit);
        program.secrets.insert(
            "db".into(),
            SecretSpec {
                name: "db".into(),
                description: None,
                tenant: None,
            },
        );
        let facts = program.facts().expect("encodes");
        let keys: Vec<&str> = facts.iter().map(|f| f.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "desired/secret-decl/db",
                "desired/service/web",
                "desired/service/web/secret/db",
                "desired/service/web/tag/team",
            ]
        );
        assert_eq!(facts[2].value, br#"{"source":"explicit"}"#);
        assert_eq!(facts[3].value, br#""payments""#);
    }

    #[test]
    fn merging_is_all_or_nothing_and_names_the_clash() {
        let mut first = Program::default();
        first.services.insert("web".into(), service("web"));
        let mut second = Program::default();
        second.services.insert("db".into(), service("db"));
        first.merge(second).expect("disjoint programs merge");
        assert_eq!(first.services.keys().collect::<Vec<_>>(), ["db", "web"]);

        let mut clashing = Program::default();
        clashing.services.insert("api".into(), service("api"));
        clashing.services.insert("web".into(), service("web"));
        let err = first.merge(clashing).expect_err("web twice");
        assert_eq!(
            err.to_string(),
            "service `web` is defined in more than one file"
        );
        assert!(
            !first.services.contains_key("api"),
            "nothing of a refused merge is kept"
        );
    }

    #[test]
    fn the_kinds_around_services_carry_a_tenant_and_old_facts_decode_without_one() {
        let old: GateSpec = serde_json::from_str(
            r#"{"name":"g","hosts":["a.example"],"service":"web","port":80,"sticky":null,"tls":null}"#,
        )
        .expect("a gate written before tenants decodes");
        assert_eq!(old.tenant, None);
        let mut gate = old;
        gate.tenant = Some("a".into());
        let bytes = serde_json::to_vec(&gate).expect("encodes");
        assert_eq!(
            serde_json::from_slice::<GateSpec>(&bytes).expect("decodes"),
            gate
        );
        let old: ConnectionSpec = serde_json::from_str(
            r#"{"name":"c","driver":"postgresql","user":null,"secret":null,"host":"db",
                "port":5432,"database":null,"params":{}}"#,
        )
        .expect("a connection written before tenants decodes");
        assert_eq!(old.tenant, None);
        let old: NetworkPolicy =
            serde_json::from_str(r#"{"name":"p","rules":[]}"#).expect("old policy decodes");
        assert_eq!(old.tenant, None);
        assert_eq!(
            serde_json::to_string(&old).expect("encodes"),
            r#"{"name":"p","rules":[]}"#,
            "no tenant, no field: a cluster-wide fact is written as before"
        );
        let declared = SecretSpec {
            name: "db".into(),
            description: None,
            tenant: Some("b".into()),
        };
        assert_eq!(
            serde_json::to_string(&declared).expect("encodes"),
            r#"{"name":"db","description":null,"tenant":"b"}"#
        );
        let old: SecretSpec =
            serde_json::from_str(r#"{"name":"db","description":null}"#).expect("old decodes");
        assert_eq!(old.tenant, None);
    }

    #[test]
    fn a_service_round_trips_through_json() {
        let spec = service("web");
        let bytes = serde_json::to_vec(&spec).expect("encodes");
        let back: ServiceSpec = serde_json::from_slice(&bytes).expect("decodes");
        assert_eq!(back, spec);
    }
}
