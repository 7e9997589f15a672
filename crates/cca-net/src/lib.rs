//! Per-node container networking. The node owns one subnet of the cluster
//! CIDR (`10.88.N.0/24`) with its gateway on a node bridge; each instance
//! gets its own network namespace, a veth pair from the bridge into it, an
//! address leased from the subnet, a default route via the gateway,
//! outbound NAT, and optionally published host ports — all removed again
//! when the instance goes. The [`Overlay`] joins the nodes' subnets over
//! VXLAN.
//!
//! [`ipam`] is the pure lease logic; [`HostNetwork`] and [`OverlayHost`]
//! are the narrow traits for every kernel side effect, with
//! [`KernelNetwork`] doing them for real (netlink, named namespaces, `nft`)
//! in the caller's or a given network namespace, and `FakeHost` (feature
//! `fake`) recording calls for unit tests; [`NodeNetwork`] is the service
//! the agent uses: `attach`, `publish`, `detach`, `cleanup_orphans`;
//! [`Overlay`] plans the node's VXLAN entries from the network map and
//! syncs them.

pub mod dataplane;
pub mod ebpf;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod host;
pub mod ipam;
mod netlink;
pub mod netns;
mod node;
pub mod overlay;
mod real;
mod vxlan;

pub use error::{Error, Result};
pub use host::{
    BridgeSpec, FdbEntry, HostNetwork, Mac, NatSpec, NeighbourEntry, OverlayHost, PeerRoute,
    PortMapping, Proto, RangeRoute, VethSpec, VxlanSpec,
};
pub use ipam::{Ipam, Subnet};
pub use node::{Attachment, CleanupReport, NetConfig, NodeNetwork, PEER_NAME, STATE_FILE};
pub use overlay::{LocalNode, Overlay, OverlayConfig, OverlayPlan, SyncReport};
pub use real::KernelNetwork;
