//! The narrow traits for every kernel side effect of node networking:
//! [`HostNetwork`] for the bridge, network namespaces, veth pairs and the
//! nftables table; [`OverlayHost`] for the VXLAN device and its forwarding
//! (FDB), neighbour (ARP) and route entries towards the other nodes.
//! Arguments are typed so the recording fake can assert on them; every
//! teardown is idempotent (removing what is already gone succeeds) because
//! detach, orphan cleanup and overlay syncs run again after crashes and
//! partial failures.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use cca_model::net::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ipam::Subnet;

/// The node bridge: its name and the gateway address it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeSpec {
    pub name: String,
    pub subnet: Subnet,
    /// The bridge's MTU; `None` leaves the kernel's.
    pub mtu: Option<u32>,
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
    /// Both ends' MTU (the overlay's, so instances never send what the
    /// tunnel cannot carry); `None` leaves the kernel's.
    pub mtu: Option<u32>,
}

/// The node's nftables table: outbound NAT for the subnet leaving through
/// anything but the bridge, and the published-port map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatSpec {
    pub table: String,
    pub bridge: String,
    pub subnet: Subnet,
    /// The overlay device: flows to other nodes' instances keep their
    /// source address (policy judges them by it), so they are not
    /// masqueraded either.
    pub overlay: Option<String>,
    /// The port the node's DNS server listens on at the gateway address:
    /// queries to the gateway's port 53 (what instances' resolv.conf
    /// names) go there, from instances and from host processes alike.
    pub dns_port: Option<u16>,
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
/// Synchronous on purpose: each call is a few short kernel requests, and
/// the agent calls the node service from `spawn_blocking`.
pub trait HostNetwork: Send + Sync + fmt::Debug {
    /// Creates the bridge if missing, gives it the gateway address (and the
    /// MTU, when given), brings it up, and enables forwarding (and
    /// `route_localnet` on the bridge so ports published on 127.0.0.1 can
    /// be forwarded to instances).
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
    /// Deletes a link (in the node's namespace); gone already is fine.
    fn delete_link(&self, name: &str) -> Result<()>;
    /// The names of the links in the node's namespace.
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
    /// Routes `route.range` to the bridge (replacing a route to it), so
    /// that flows to it have a route on a host without a default route.
    fn ensure_range_route(&self, route: &RangeRoute) -> Result<()>;
}

/// A whole range routed to the node bridge, with the gateway as the
/// source of locally started flows: the service range, whose VIPs exist
/// only as DNAT rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRoute {
    pub range: cca_model::net::Ipv4Net,
    pub bridge: String,
    pub source: Ipv4Addr,
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// The node's VXLAN device: where its tunnel starts (`local`, on the
/// underlay link holding that address) and how it is addressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanSpec {
    /// The device name (`cca-vxlan`).
    pub name: String,
    /// The VXLAN network identifier, the same on every node.
    pub vni: u32,
    /// The UDP port tunnels use, the same on every node.
    pub port: u16,
    /// This node's underlay address.
    pub local: Ipv4Addr,
    /// The device's MTU (the underlay's less the 50 bytes of encapsulation).
    pub mtu: u32,
    /// The device's MAC, derived from the node subnet so peers can compute
    /// it.
    pub mac: Mac,
    /// The device's one address (held as `/32`): the node subnet's network
    /// address, the next hop peers route this node's subnet via.
    pub address: Ipv4Addr,
}

/// A forwarding entry on the VXLAN device: frames for a peer's device MAC
/// go in a tunnel to the peer's underlay address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbEntry {
    pub mac: Mac,
    pub underlay: Ipv4Addr,
}

/// A permanent neighbour (ARP) entry on the VXLAN device: a peer's device
/// address has the peer's device MAC, so no ARP crosses the overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NeighbourEntry {
    pub address: Ipv4Addr,
    pub mac: Mac,
}

/// A route to a peer's node subnet: `subnet via via dev DEVICE onlink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerRoute {
    pub subnet: Ipv4Net,
    pub via: Ipv4Addr,
}

/// The kernel side effects of the VXLAN overlay. Adds replace what holds
/// the same key (the MAC of an FDB entry, the address of a neighbour, the
/// subnet of a route); deletes of what is gone succeed; lists show only
/// the entries on the named device (empty when it does not exist).
pub trait OverlayHost: Send + Sync + fmt::Debug {
    /// The MTU of the link that holds `address` (the underlay's).
    fn underlay_mtu(&self, address: Ipv4Addr) -> Result<u32>;
    /// Creates the VXLAN device, or brings an existing one to `vxlan`
    /// (recreating it when its VNI, port or underlay changed), with its
    /// MAC, MTU and address (any other address removed), and up; learning
    /// is off, every entry is ours.
    fn ensure_vxlan(&self, vxlan: &VxlanSpec) -> Result<()>;
    /// Deletes the VXLAN device (and with it every entry on it); gone
    /// already is fine.
    fn delete_vxlan(&self, name: &str) -> Result<()>;
    /// Sets a link's MTU.
    fn set_mtu(&self, link: &str, mtu: u32) -> Result<()>;
    /// The forwarding entries on `device`.
    fn list_fdb(&self, device: &str) -> Result<Vec<FdbEntry>>;
    /// Adds (or replaces, by MAC) a forwarding entry.
    fn add_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()>;
    /// Deletes a forwarding entry.
    fn delete_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()>;
    /// The permanent neighbour entries on `device`.
    fn list_neighbours(&self, device: &str) -> Result<Vec<NeighbourEntry>>;
    /// Adds (or replaces, by address) a permanent neighbour entry.
    fn add_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()>;
    /// Deletes a neighbour entry.
    fn delete_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()>;
    /// The routes through `device` in the main table.
    fn list_routes(&self, device: &str) -> Result<Vec<PeerRoute>>;
    /// Adds (or replaces, by subnet) a route through `device`.
    fn add_route(&self, device: &str, route: &PeerRoute) -> Result<()>;
    /// Deletes a route through `device`.
    fn delete_route(&self, device: &str, route: &PeerRoute) -> Result<()>;
}
