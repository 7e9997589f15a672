//! The names of everything the data plane puts in its table, derived from
//! service names and port numbers alone, so an agent that restarts finds
//! (and replaces) its own objects. Names the kernel might refuse — too
//! long, or with characters outside `[a-z0-9_-]` — are shortened to a
//! readable prefix and a hash of the whole, which stays deterministic.

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

/// The chain of one VIP port: `svc-{service}-{proto}-{port}`.
pub(crate) fn service_chain(service: &str, protocol: Protocol, port: u16) -> String {
    let proto = match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    bounded("svc-", service, &format!("-{proto}-{port}"))
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
        assert_eq!(
            service_chain("web", Protocol::Tcp, 8080),
            "svc-web-tcp-8080"
        );
        assert_eq!(service_chain("dns", Protocol::Udp, 53), "svc-dns-udp-53");
        assert_eq!(member_set("postgres"), "m-postgres");
    }

    #[test]
    fn long_or_odd_names_are_hashed_deterministically_and_stay_short() {
        let long = "a".repeat(63);
        let chain = service_chain(&long, Protocol::Tcp, 65535);
        assert!(chain.len() <= MAX_NAME, "{chain}");
        assert!(chain.starts_with("svc-aaaa"), "{chain}");
        assert!(chain.ends_with("-tcp-65535"), "{chain}");
        assert_eq!(chain, service_chain(&long, Protocol::Tcp, 65535));
        // Two long names with one prefix do not collide.
        let other = format!("{}b", "a".repeat(62));
        assert_ne!(chain, service_chain(&other, Protocol::Tcp, 65535));
        let odd = member_set("Web App");
        assert!(odd.starts_with("m-web_app-"), "{odd}");
        assert_ne!(odd, member_set("web_app"));
    }
}
