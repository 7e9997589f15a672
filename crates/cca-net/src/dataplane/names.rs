//! The names of everything the data plane puts in its table: fixed ones,
//! ones derived from a protocol and a count or index (the shared dispatch
//! chains and backend maps), and ones derived from service names (policy
//! member sets) — so an agent that restarts finds (and replaces) its own
//! objects. A service name the kernel might refuse — too long, or with
//! characters outside `[a-z0-9_-]` — is shortened to a readable prefix and
//! a hash of the whole, which stays deterministic.

use sha2::{Digest, Sha256};

use cca_model::spec::Protocol;

/// Longest name we give an object. The kernel allows 255 bytes for chains
/// and sets; staying far below keeps `nft list` output readable.
pub(crate) const MAX_NAME: usize = 64;

/// Base chain: DNAT of VIP traffic arriving from containers and other hosts.
pub(crate) const NAT_PREROUTING: &str = "nat-prerouting";
/// Base chain: DNAT of VIP traffic from this node's own processes.
pub(crate) const NAT_OUTPUT: &str = "nat-output";
/// Base chain: masquerade of hairpin and host-originated VIP flows.
pub(crate) const NAT_POSTROUTING: &str = "nat-postrouting";
/// Base chain: policy on flows arriving (from containers, other nodes),
/// before DNAT.
pub(crate) const POLICY_PREROUTING: &str = "policy-prerouting";
/// Base chain: policy on flows this node's processes open, before DNAT.
pub(crate) const POLICY_OUTPUT: &str = "policy-output";
/// Regular chain: the policy rules in order.
pub(crate) const POLICY: &str = "policy";
/// Regular chain: how a denied flow is refused.
pub(crate) const POLICY_DENY: &str = "policy-deny";
/// Verdict map `VIP . l4proto . port : goto svc-chain`.
pub(crate) const SERVICES: &str = "services";
/// Set of the VIPs that have rules (postrouting masquerades only our flows).
pub(crate) const VIPS: &str = "vips";
/// Set of `addr . addr` of this node's members: a flow DNATed back to its
/// own source.
pub(crate) const HAIRPIN: &str = "hairpin";
/// Set of this node's member addresses.
pub(crate) const LOCAL: &str = "local";
/// Set of every member address and VIP in the cluster (policy's `to *`).
pub(crate) const MEMBERS: &str = "members";

fn proto(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// The chain a VIP port with `count` backends goes to: `pick-{proto}-{n}`
/// (uniformly random) or `hash-{proto}-{n}` (by client address).
pub(crate) fn dispatch_chain(by_client: bool, protocol: Protocol, count: usize) -> String {
    let mode = if by_client { "hash" } else { "pick" };
    format!("{mode}-{}-{count}", proto(protocol))
}

/// The chain that DNATs to the `index`th backend: `slot-{proto}-{i}`.
pub(crate) fn slot_chain(protocol: Protocol, index: usize) -> String {
    format!("slot-{}-{index}", proto(protocol))
}

/// The chain a VIP port without backends goes to: `refuse-{proto}`.
pub(crate) fn refuse_chain(protocol: Protocol) -> String {
    format!("refuse-{}", proto(protocol))
}

/// The map `VIP . proto . port : address` of every port's `index`th backend.
pub(crate) fn address_map(index: usize) -> String {
    format!("addr-{index}")
}

/// The map `VIP . proto . port : port` of every port's `index`th backend.
pub(crate) fn port_map(index: usize) -> String {
    format!("port-{index}")
}

/// The set of one service's member addresses, for policy: `m-{service}`.
pub(crate) fn member_set(service: &str) -> String {
    bounded("m-", service, "")
}

/// `{prefix}{name}{suffix}`, or, when that is too long or `name` holds
/// characters a name should not, `{prefix}{readable part}-{hash}{suffix}`.
fn bounded(prefix: &str, name: &str, suffix: &str) -> String {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    let full = format!("{prefix}{name}{suffix}");
    if plain && !name.is_empty() && full.len() <= MAX_NAME {
        return full;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let room = MAX_NAME - prefix.len() - suffix.len() - hash.len() - 1;
    let readable: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(room.min(24))
        .collect();
    format!("{prefix}{readable}-{hash}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_read_as_written() {
        assert_eq!(dispatch_chain(false, Protocol::Tcp, 3), "pick-tcp-3");
        assert_eq!(dispatch_chain(true, Protocol::Udp, 2), "hash-udp-2");
        assert_eq!(slot_chain(Protocol::Udp, 0), "slot-udp-0");
        assert_eq!(address_map(1), "addr-1");
        assert_eq!(member_set("postgres"), "m-postgres");
    }

    #[test]
    fn long_or_odd_names_are_hashed_deterministically_and_stay_short() {
        let long = "a".repeat(70);
        let set = member_set(&long);
        assert!(set.len() <= MAX_NAME, "{set}");
        assert!(set.starts_with("m-aaaa"), "{set}");
        assert_eq!(set, member_set(&long));
        // Two long names with one prefix do not collide.
        let other = format!("{}b", "a".repeat(69));
        assert_ne!(set, member_set(&other));
        let odd = member_set("Web App");
        assert!(odd.starts_with("m-web_app-"), "{odd}");
        assert_ne!(odd, member_set("web_app"));
    }
}
