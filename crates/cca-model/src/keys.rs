//! The key layout of the fact store. Facts are grouped by who derives them:
//! `desired/` is written by users through the API, `derived/` by
//! controllers, `observed/` by node agents and `meta/` by the server itself.
//! Builders here are the only place key strings are spelled out.

/// Root of facts compiled from the user's `.cca` files.
pub const DESIRED: &str = "desired/";
/// Root of facts computed by controllers.
pub const DERIVED: &str = "derived/";
/// Root of facts reported by node agents.
pub const OBSERVED: &str = "observed/";
/// Root of the control plane's own bookkeeping (leader lease, schema).
pub const META: &str = "meta/";

/// `desired/service/{svc}`: a service spec.
pub fn desired_service(service: &str) -> String {
    format!("{DESIRED}service/{service}")
}

/// `desired/service/{svc}/tag/{key}`: one user tag of a service.
pub fn desired_service_tag(service: &str, key: &str) -> String {
    format!("{DESIRED}service/{service}/tag/{key}")
}

/// `desired/service/{svc}/secret/{secret}`: a service's grant to read a secret.
pub fn desired_service_secret(service: &str, secret: &str) -> String {
    format!("{DESIRED}service/{service}/secret/{secret}")
}

/// `desired/gate/{name}`: external HTTP(S) entry to a service.
pub fn desired_gate(name: &str) -> String {
    format!("{DESIRED}gate/{name}")
}

/// `desired/connection/{name}`: the parts of a connection URL.
pub fn desired_connection(name: &str) -> String {
    format!("{DESIRED}connection/{name}")
}

/// `desired/secret-decl/{name}`: a secret a program declares. Kept apart
/// from `desired/secret/{name}` (the encrypted value) so compiling a program
/// never overwrites a secret's value.
pub fn desired_secret_declaration(name: &str) -> String {
    format!("{DESIRED}secret-decl/{name}")
}

/// `desired/secret/{name}`: a secret's value, encrypted by the API server
/// under the cluster's secret key. Written only by `cca secret set|rm`,
/// never by a compile or an apply.
pub fn desired_secret(name: &str) -> String {
    format!("{DESIRED_SECRETS}{name}")
}

/// `desired/network/policy/{name}`: allow/deny rules between services.
pub fn desired_network_policy(name: &str) -> String {
    format!("{DESIRED}network/policy/{name}")
}

/// `desired/group/{name}`: services co-scheduled on one node.
pub fn desired_group(name: &str) -> String {
    format!("{DESIRED}group/{name}")
}

/// `derived/instance/{svc}/{id}`: one placed instance.
pub fn derived_instance(service: &str, instance: &str) -> String {
    format!("{DERIVED}instance/{service}/{instance}")
}

/// `observed/node/{node}`: a node's registration, attached to its lease.
pub fn observed_node(node: &str) -> String {
    format!("{OBSERVED}node/{node}")
}

/// `observed/instance/{id}`: an instance's reported state.
pub fn observed_instance(instance: &str) -> String {
    format!("{OBSERVED}instance/{instance}")
}

/// `meta/leader`: the leader lease and fencing token.
pub const LEADER: &str = "meta/leader";

/// Root of the event log (`events/{at:013}-{seq:06}`).
pub const EVENTS: &str = "events/";

/// Prefixes of the collections controllers and the API read.
pub const DESIRED_SERVICES: &str = "desired/service/";
pub const DESIRED_NODES: &str = "desired/node/";
pub const DESIRED_SECRETS: &str = "desired/secret/";
pub const DESIRED_SECRET_DECLARATIONS: &str = "desired/secret-decl/";
pub const DESIRED_CONNECTIONS: &str = "desired/connection/";
pub const DERIVED_INSTANCES: &str = "derived/instance/";
pub const DERIVED_NODES: &str = "derived/node/";
pub const DERIVED_UNPLACED: &str = "derived/unplaced/";
pub const DERIVED_ENDPOINTS: &str = "derived/endpoint/";
pub const OBSERVED_NODES: &str = "observed/node/";
pub const OBSERVED_HEARTBEATS: &str = "observed/heartbeat/";
pub const OBSERVED_INSTANCES: &str = "observed/instance/";

/// `desired/node/{node}`: an operator's drain/disable intent.
pub fn desired_node(node: &str) -> String {
    format!("{DESIRED_NODES}{node}")
}

/// `derived/node/{node}`: the node's condition, as the node controller sees it.
pub fn derived_node(node: &str) -> String {
    format!("{DERIVED_NODES}{node}")
}

/// `derived/unplaced/{svc}`: demand of a service the scheduler could not place.
pub fn derived_unplaced(service: &str) -> String {
    format!("{DERIVED_UNPLACED}{service}")
}

/// `derived/endpoint/{svc}/{port}`: ready backends of one service port.
pub fn derived_endpoint(service: &str, port: &str) -> String {
    format!("{DERIVED_ENDPOINTS}{service}/{port}")
}

/// `observed/heartbeat/{node}`: the agent's leased liveness key.
pub fn observed_heartbeat(node: &str) -> String {
    format!("{OBSERVED_HEARTBEATS}{node}")
}

/// `events/{at:013}-{seq:06}`: sorts by time; `seq` tells apart events of
/// one millisecond.
pub fn event(at_millis: i64, seq: u32) -> String {
    format!("{EVENTS}{at_millis:013}-{seq:06}")
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
    fn builders_spell_the_layout() {
        assert_eq!(desired_service("web"), "desired/service/web");
        assert_eq!(desired_secret("db"), "desired/secret/db");
        assert!(!desired_secret_declaration("db").starts_with(DESIRED_SECRETS));
        assert_eq!(
            derived_instance("web", "web-1"),
            "derived/instance/web/web-1"
        );
        assert_eq!(observed_node("n1"), "observed/node/n1");
        assert_eq!(observed_instance("web-1"), "observed/instance/web-1");
        assert_eq!(derived_endpoint("web", "http"), "derived/endpoint/web/http");
        assert_eq!(event(1_700_000_000_000, 7), "events/1700000000000-000007");
    }
}
