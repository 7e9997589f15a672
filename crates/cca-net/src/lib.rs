//! Per-node container networking. The node owns one subnet of the cluster
//! CIDR (`10.88.N.0/24`) with its gateway on a node bridge; each instance
//! gets its own network namespace, a veth pair from the bridge into it, an
//! address leased from the subnet, a default route via the gateway,
//! outbound NAT, and optionally published host ports — all removed again
//! when the instance goes.
//!
//! [`ipam`] is the pure lease logic; [`HostNetwork`] is the narrow trait for
//! every kernel side effect, with [`IpNft`] driving `ip` and `nft` for real
//! and `FakeHost` (feature `fake`) recording calls for unit tests;
//! [`NodeNetwork`] is the service the agent will use: `attach`, `publish`,
//! `detach`, `cleanup_orphans`.

mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod host;
pub mod ipam;
mod node;
mod real;

pub use error::{Error, Result};
pub use host::{BridgeSpec, HostNetwork, NatSpec, PortMapping, Proto, VethSpec};
pub use ipam::{Ipam, Subnet};
pub use node::{Attachment, CleanupReport, NetConfig, NodeNetwork, PEER_NAME, STATE_FILE};
pub use real::IpNft;
