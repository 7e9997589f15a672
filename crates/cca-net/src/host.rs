//! [`HostNetwork`]: the narrow trait for every kernel side effect of node
//! networking — bridge, network namespaces, veth pairs, the nftables table.
//! Arguments are typed so the recording fake can assert on them; every
//! teardown is idempotent (removing what is already gone succeeds) because
//! detach and orphan cleanup run again after crashes and partial failures.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ipam::Subnet;

/// The node bridge: its name and the gateway address it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeSpec {
    pub name: String,
    pub subnet: Subnet,
}

/// One instance's link: a veth pair with `host_name` on the bridge and
/// `peer_name` inside the namespace, addressed, up, with a default route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethSpec {
    pub host_name: String,
    pub netns: String,
    pub peer_name: String,
    pub bridge: String,
    pub address: Ipv4Addr,
    pub subnet: Subnet,
}

/// The node's nftables table: outbound NAT for the subnet leaving through
/// anything but the bridge, and the published-port map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatSpec {
    pub table: String,
    pub bridge: String,
    pub subnet: Subnet,
}

/// A transport protocol of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// A published port: `proto` traffic to any local address on `host_port`
/// goes to `address:container_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortMapping {
    pub proto: Proto,
    pub host_port: u16,
    pub address: Ipv4Addr,
    pub container_port: u16,
}

/// The kernel side effects of node networking.
///
/// Synchronous on purpose: each call is one short command, and the agent
/// calls the node service from `spawn_blocking`.
pub trait HostNetwork: Send + Sync + fmt::Debug {
    /// Creates the bridge if missing, gives it the gateway address, brings
    /// it up, and enables forwarding (and `route_localnet` on the bridge so
    /// ports published on 127.0.0.1 can be forwarded to instances).
    fn ensure_bridge(&self, bridge: &BridgeSpec) -> Result<()>;
    /// Deletes the bridge; gone already is fine.
    fn delete_bridge(&self, name: &str) -> Result<()>;
    /// Creates a named network namespace (`/run/netns/NAME`); existing is fine.
    fn create_netns(&self, name: &str) -> Result<()>;
    /// Deletes a named network namespace; gone already is fine.
    fn delete_netns(&self, name: &str) -> Result<()>;
    /// The path processes join the namespace by (the OCI spec's netns path).
    fn netns_path(&self, name: &str) -> PathBuf;
    /// The names of the named network namespaces.
    fn list_netns(&self) -> Result<Vec<String>>;
    /// Creates the veth pair (replacing a stale one of the same name), moves
    /// the peer into the namespace, addresses it, brings up `lo` and the
    /// peer, and routes by default via the gateway.
    fn create_veth(&self, veth: &VethSpec) -> Result<()>;
    /// Deletes a link in the host namespace; gone already is fine.
    fn delete_link(&self, name: &str) -> Result<()>;
    /// The names of the links in the host namespace.
    fn list_links(&self) -> Result<Vec<String>>;
    /// Creates the table if missing and rewrites its chains' rules (one
    /// atomic transaction), keeping the published-port map's elements.
    fn ensure_nat(&self, nat: &NatSpec) -> Result<()>;
    /// Deletes the whole table; gone already is fine.
    fn delete_nat(&self, table: &str) -> Result<()>;
    /// Adds a published port to the table's map.
    fn add_port(&self, table: &str, port: &PortMapping) -> Result<()>;
    /// Removes a published port from the table's map; gone already is fine.
    fn delete_port(&self, table: &str, port: &PortMapping) -> Result<()>;
    /// The published ports in the table's map (empty if there is no table).
    fn list_ports(&self, table: &str) -> Result<Vec<PortMapping>>;
}
