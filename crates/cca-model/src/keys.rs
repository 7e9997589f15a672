//! Key builders and roots of the store's key layout. Facts are grouped by
//! who derives them: `desired/` is written by users through the API,
//! `derived/` by controllers, `observed/` by node agents, `meta/` and
//! `events/` by the server itself. The layout itself is the table in
//! [`facts`](crate::facts); the builders here are shorthands that print a
//! typed [`Key`] for the callers that write facts.

use crate::facts::{Key, Kind};

/// Root of facts compiled from the user's `.cca` files or set by operators.
pub const DESIRED: &str = "desired/";
/// Root of facts computed by controllers.
pub const DERIVED: &str = "derived/";
/// Root of facts reported by node agents.
pub const OBSERVED: &str = "observed/";
/// Root of the control plane's own bookkeeping (leader lease).
pub const META: &str = "meta/";

/// Prefixes of program facts that earlier versions wrote and this one no
/// longer has a kind for (`desired/group/`: groups left the language, see
/// docs/design/groups.md). Nothing reads them; the next apply deletes
/// them, so a store upgraded in place does not keep inert facts.
pub const RETIRED_PREFIXES: &[&str] = &["desired/group/"];

/// Whether `key` is a retired program fact (see [`RETIRED_PREFIXES`]).
pub fn is_retired(key: &str) -> bool {
    RETIRED_PREFIXES
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

/// `desired/service/{svc}`: a service spec.
pub fn desired_service(service: &str) -> String {
    Key::Service {
        service: service.to_owned(),
    }
    .to_string()
}

/// `desired/service/{svc}/tag/{key}`: one user tag of a service.
pub fn desired_service_tag(service: &str, tag: &str) -> String {
    Key::ServiceTag {
        service: service.to_owned(),
        tag: tag.to_owned(),
    }
    .to_string()
}

/// `desired/service/{svc}/secret/{secret}`: a service's grant to read a secret.
pub fn desired_service_secret(service: &str, secret: &str) -> String {
    Key::ServiceGrant {
        service: service.to_owned(),
        secret: secret.to_owned(),
    }
    .to_string()
}

/// `desired/service/{svc}/version/{hash}`: one version of a service's spec.
pub fn desired_service_version(service: &str, version: &str) -> String {
    Key::ServiceVersion {
        service: service.to_owned(),
        version: version.to_owned(),
    }
    .to_string()
}

/// The start of every key of `kind` that belongs to `service`
/// (`desired/service/{svc}/tag/` for [`Kind::ServiceTag`]): what a range or
/// a prefix delete of one service's sub-facts of that kind names. `None`
/// for kinds whose keys do not start with a service name.
pub fn service_sub_prefix(kind: Kind, service: &str) -> Option<String> {
    let mut literals = kind.pattern().split("{}");
    let before = literals.next()?;
    let after = literals.next()?;
    let nested = matches!(
        kind,
        Kind::ServiceTag | Kind::ServiceGrant | Kind::ServiceVersion
    );
    nested.then(|| format!("{before}{service}{after}"))
}

/// `desired/service-meta/{svc}`: when the service was applied.
pub fn desired_service_meta(service: &str) -> String {
    Key::ServiceMeta {
        service: service.to_owned(),
    }
    .to_string()
}

/// `desired/gate/{name}`: external HTTP(S) entry to a service.
pub fn desired_gate(gate: &str) -> String {
    Key::Gate {
        gate: gate.to_owned(),
    }
    .to_string()
}

/// `desired/connection/{name}`: the parts of a connection URL.
pub fn desired_connection(connection: &str) -> String {
    Key::Connection {
        connection: connection.to_owned(),
    }
    .to_string()
}

/// `desired/secret-decl/{name}`: a secret a program declares.
pub fn desired_secret_declaration(secret: &str) -> String {
    Key::SecretDeclaration {
        secret: secret.to_owned(),
    }
    .to_string()
}

/// `desired/secret/{name}`: a secret's sealed value.
pub fn desired_secret(secret: &str) -> String {
    Key::Secret {
        secret: secret.to_owned(),
    }
    .to_string()
}

/// `trust/token/{id}`: a join token's stored record.
pub fn join_token(id: &str) -> String {
    Key::JoinToken { id: id.to_owned() }.to_string()
}

/// `trust/user/{name}`: a user's record.
pub fn user(name: &str) -> String {
    Key::User {
        name: name.to_owned(),
    }
    .to_string()
}

/// `trust/role/{name}`: a custom role.
pub fn role(name: &str) -> String {
    Key::Role {
        name: name.to_owned(),
    }
    .to_string()
}

/// `trust/revoked/{id}`: a revocation (`RevokedTarget::id`).
pub fn revocation(id: &str) -> String {
    Key::Revocation { id: id.to_owned() }.to_string()
}

/// `desired/network/policy/{name}`: allow/deny rules between services.
pub fn desired_network_policy(policy: &str) -> String {
    Key::NetworkPolicy {
        policy: policy.to_owned(),
    }
    .to_string()
}

/// `desired/node/{node}`: an operator's drain/disable intent.
pub fn desired_node(node: &str) -> String {
    Key::NodeControl {
        node: node.to_owned(),
    }
    .to_string()
}

/// `desired/replacement-resume`: an operator ended a pause of lost-node
/// replacement.
pub fn desired_replacement_resume() -> String {
    Key::ReplacementResume {}.to_string()
}

/// `derived/disruption`: whether lost-node replacement is paused.
pub fn derived_disruption() -> String {
    Key::Disruption {}.to_string()
}

/// `derived/instance/{svc}/{id}`: one placed instance.
pub fn derived_instance(service: &str, id: &str) -> String {
    Key::Instance {
        service: service.to_owned(),
        id: id.to_owned(),
    }
    .to_string()
}

/// `derived/node/{node}`: the node's condition, as the node controller sees it.
pub fn derived_node(node: &str) -> String {
    Key::NodeStatus {
        node: node.to_owned(),
    }
    .to_string()
}

/// `derived/unplaced/{svc}`: demand of a service the scheduler could not place.
pub fn derived_unplaced(service: &str) -> String {
    Key::Unplaced {
        service: service.to_owned(),
    }
    .to_string()
}

/// `derived/scale/{svc}`: whether a scale-to-zero service sleeps.
pub fn derived_scale(service: &str) -> String {
    Key::Scale {
        service: service.to_owned(),
    }
    .to_string()
}

/// `derived/rollout/{svc}`: the version a service is rolled to, and why.
pub fn derived_rollout(service: &str) -> String {
    Key::Rollout {
        service: service.to_owned(),
    }
    .to_string()
}

/// `derived/autoscale/{svc}`: the replicas an autoscaled service runs at.
pub fn derived_autoscale(service: &str) -> String {
    Key::Autoscale {
        service: service.to_owned(),
    }
    .to_string()
}

/// `derived/vertical/{svc}`: a service's vertical usage window and sizes.
pub fn derived_vertical(service: &str) -> String {
    Key::Vertical {
        service: service.to_owned(),
    }
    .to_string()
}

/// `desired/rollout/{svc}`: an operator's pause or undo of a rollout.
pub fn desired_rollout(service: &str) -> String {
    Key::RolloutControl {
        service: service.to_owned(),
    }
    .to_string()
}

/// `observed/gate-activity/{node}`: a gate node's last request per service.
pub fn observed_gate_activity(node: &str) -> String {
    Key::GateActivity {
        node: node.to_owned(),
    }
    .to_string()
}

/// `observed/held-ports/{node}`: host ports held on a node by something
/// outside the cluster.
pub fn observed_held_ports(node: &str) -> String {
    Key::HeldPorts {
        node: node.to_owned(),
    }
    .to_string()
}

/// `observed/usage/{node}`: what a node and its instances used over the
/// last period.
pub fn observed_usage(node: &str) -> String {
    Key::Usage {
        node: node.to_owned(),
    }
    .to_string()
}

/// `derived/endpoint/{svc}/{port}`: ready backends of one service port.
pub fn derived_endpoint(service: &str, port: &str) -> String {
    Key::Endpoint {
        service: service.to_owned(),
        port: port.to_owned(),
    }
    .to_string()
}

/// `derived/subnet/{node}`: a node's slice of the cluster CIDR.
pub fn derived_subnet(node: &str) -> String {
    Key::Subnet {
        node: node.to_owned(),
    }
    .to_string()
}

/// `derived/vip/{svc}`: a service's virtual IP.
pub fn derived_vip(service: &str) -> String {
    Key::Vip {
        service: service.to_owned(),
    }
    .to_string()
}

/// `observed/node/{node}`: a node's registration.
pub fn observed_node(node: &str) -> String {
    Key::Node {
        node: node.to_owned(),
    }
    .to_string()
}

/// `observed/heartbeat/{node}`: the agent's leased liveness key.
pub fn observed_heartbeat(node: &str) -> String {
    Key::Heartbeat {
        node: node.to_owned(),
    }
    .to_string()
}

/// `observed/instance/{id}`: an instance's reported state.
pub fn observed_instance(id: &str) -> String {
    Key::InstanceStatus { id: id.to_owned() }.to_string()
}

/// `events/{at:013}-{seq:010}-{origin:08x}`: sorts by time; `seq` (a
/// writer's own counter) tells apart its events of one millisecond, and
/// `origin` (random per writer) tells writers apart. Get them from
/// [`EventIds`].
pub fn event(at_millis: i64, seq: u32, origin: u32) -> String {
    Key::Event {
        id: format!("{at_millis:013}-{seq:010}-{origin:08x}"),
    }
    .to_string()
}

/// Mints event keys for one writer (an API server, a controller runner):
/// never the same key twice from one writer (a counter, not a random draw:
/// 300,000 events with random 32-bit suffixes in one millisecond would
/// collide a dozen times), and from two writers only if their random
/// origins are equal and their counters meet in the same millisecond.
#[derive(Debug)]
pub struct EventIds {
    origin: u32,
    next: std::sync::atomic::AtomicU32,
}

impl EventIds {
    /// A writer whose keys carry `origin` (draw it at random).
    pub fn new(origin: u32) -> Self {
        Self {
            origin,
            next: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The key of an event logged at `at_millis`.
    pub fn key(&self, at_millis: i64) -> String {
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        event(at_millis, seq, self.origin)
    }

    /// The key of an audit record made at `at_millis` (the same order and
    /// uniqueness as events, under `audit/`).
    pub fn audit_key(&self, at_millis: i64) -> String {
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Key::Audit {
            id: format!("{at_millis:013}-{seq:010}-{:08x}", self.origin),
        }
        .to_string()
    }
}

/// `events/{at:013}`: sorts before every event of millisecond `at` and
/// after every earlier one, for ranges of the log by time.
pub fn events_from(at_millis: i64) -> String {
    format!("{}{at_millis:013}", crate::facts::Kind::Event.prefix())
}

/// `audit/{at:013}`: sorts before every audit record of millisecond `at`
/// and after every earlier one.
pub fn audit_from(at_millis: i64) -> String {
    format!("{}{at_millis:013}", crate::facts::Kind::Audit.prefix())
}

/// `meta/desired-generation`: bumped by every program-fact write.
pub fn desired_generation() -> String {
    Key::DesiredGeneration {}.to_string()
}

/// `meta/applying`: the committed staged apply being copied into place.
pub fn applying() -> String {
    Key::ApplyCommit {}.to_string()
}

/// `meta/apply/{apply}/chunk/{index:06}`: one chunk of a staged apply
/// (zero-padded so that key order is chunk order).
pub fn apply_chunk(apply: &str, index: usize) -> String {
    Key::ApplyChunk {
        apply: apply.to_owned(),
        chunk: format!("{index:06}"),
    }
    .to_string()
}

/// `meta/apply/{apply}/`: every chunk of a staged apply.
pub fn apply_chunks(apply: &str) -> String {
    format!("{}{apply}/", crate::facts::Kind::ApplyChunk.prefix())
}

/// `meta/leader`: the leader lease and fencing token.
pub fn leader() -> String {
    Key::Leader {}.to_string()
}

pub fn store_identity() -> String {
    Key::StoreIdentity {}.to_string()
}

pub fn flow_hash_seed() -> String {
    Key::FlowHashSeed {}.to_string()
}

pub fn observed_unclaimed(node: &str) -> String {
    Key::Unclaimed {
        node: node.to_owned(),
    }
    .to_string()
}

/// The smallest key greater than every key starting with `prefix`, or
/// `None` when no such key exists (empty prefix, or all bytes 0xff). Used to
/// turn a prefix into a half-open key range.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"desired/"), Some(b"desired0".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn event_ids_of_one_writer_never_repeat_and_parse() {
        let ids = EventIds::new(7);
        let minted: std::collections::BTreeSet<String> =
            (0..300_000).map(|_| ids.key(1_700_000_000_000)).collect();
        assert_eq!(minted.len(), 300_000);
        assert!(
            minted
                .iter()
                .all(|key| Key::parse(key).is_some_and(|key| key.kind() == crate::Kind::Event))
        );
        let other = EventIds::new(8);
        assert!(!minted.contains(&other.key(1_700_000_000_000)));
    }

    #[test]
    fn builders_spell_the_layout() {
        assert_eq!(desired_service("web"), "desired/service/web");
        assert_eq!(desired_secret("db"), "desired/secret/db");
        assert_eq!(desired_secret_declaration("db"), "desired/secret-decl/db");
        assert_eq!(
            derived_instance("web", "web-1"),
            "derived/instance/web/web-1"
        );
        assert_eq!(observed_node("n1"), "observed/node/n1");
        assert_eq!(observed_instance("web-1"), "observed/instance/web-1");
        assert_eq!(derived_endpoint("web", "http"), "derived/endpoint/web/http");
        assert_eq!(
            event(1_700_000_000_000, 7, 0xab),
            "events/1700000000000-0000000007-000000ab"
        );
        assert_eq!(leader(), "meta/leader");
        assert_eq!(apply_chunk("a1", 7), "meta/apply/a1/chunk/000007");
        assert!(apply_chunk("a1", 7).starts_with(&apply_chunks("a1")));
        assert_eq!(
            desired_service_version("web", "00ff"),
            "desired/service/web/version/00ff"
        );
        assert_eq!(
            service_sub_prefix(Kind::ServiceTag, "web").as_deref(),
            Some("desired/service/web/tag/")
        );
        assert_eq!(
            service_sub_prefix(Kind::ServiceVersion, "web").as_deref(),
            Some("desired/service/web/version/")
        );
        assert_eq!(service_sub_prefix(Kind::Service, "web"), None);
        assert_eq!(service_sub_prefix(Kind::Instance, "web"), None);
        assert!(events_from(1_700_000_000_000) < event(1_700_000_000_000, 0, 0));
        assert!(event(1_699_999_999_999, u32::MAX, u32::MAX) < events_from(1_700_000_000_000));
    }
}
