//! The node's packet-filter data plane: service VIPs to ready backends,
//! hairpin, and network policy, programmed from the
//! `NetworkMap` into one nftables table of
//! its own (`ip cca-svc` by default). [`DataPlane::resync`] rebuilds the
//! table in one transaction (at start, and by itself after any failed
//! change); [`DataPlane::sync`] changes only what the touched entries own,
//! also in one transaction. [`PacketFilter`] is the seam to the kernel
//! ([`Nft`] for real, `fake::FakeFilter` with feature `fake`).
//!
//! # Layout
//!
//! - map `services` (`VIP . l4proto . port : goto …`) — the one lookup
//!   per new flow, from base chains `nat-prerouting` (containers, other
//!   hosts) and `nat-output` (this node's processes), both at `dstnat`. A
//!   VIP port with N ready backends goes to chain `pick-{proto}-{N}`
//!   (`numgen random mod N`) or, with `Affinity::ClientIp`, to
//!   `hash-{proto}-{N}` (`jhash ip saddr mod N`); each picks slot `i` and
//!   goes to `slot-{proto}-{i}`, which DNATs to the port's `i`th backend
//!   through the maps `addr-{i}` and `port-{i}` (keyed by `VIP . l4proto .
//!   port`, like `services`). A port without backends goes to
//!   `refuse-{proto}`: TCP reset or ICMP port-unreachable, at once. These
//!   chains are shared by every port with as many backends, so a service
//!   is only map elements and an endpoint change is a few element changes
//!   whatever the number of services: chains and rules per service would
//!   make each change slower as services grow (`nft` fetches every chain
//!   before each transaction, and the kernel named the anonymous map of
//!   each per-service rule by scanning the table: 17 s to build 10,000),
//!   and nft 1.0.6's JSON cannot declare one map `index : addr . port`, so
//!   address and port are two maps.
//! - `nat-postrouting`: masquerade of (a) hairpin flows — `ip saddr . ip
//!   daddr` in set `hairpin` (`a . a` for this node's members), a member
//!   DNATed back to itself — and (b) DNATed flows of this node's own
//!   processes (`fib saddr type local`) leaving by any interface but `lo`:
//!   the overlay's device (address `node_subnet.network()`) or the bridge
//!   (the gateway), so a remote target answers to an address that routes
//!   back here. Both only for flows to a VIP in set `vips`. Flows from
//!   containers keep their source address.
//! - sets `members` (every service's VIP and non-host-network members, in
//!   the whole cluster), `local` (this node's members), `m-{service}` (one
//!   per service a policy names: its VIP and members); chains
//!   `policy-prerouting`, `policy-output`, `policy`, `policy-deny`.
//!
//! Endpoints that leave the map get no new flows from the moment `sync`
//! returns; established flows keep their conntrack binding. UDP entries
//! whose backend left are deleted ([`UdpCleanup`]), so the next datagram
//! is balanced afresh instead of following a dead binding.
//!
//! # Network policy: what is judged
//!
//! The rules of every policy, policies in name order and rules as written,
//! become one rule each in chain `policy`; the first that matches a new
//! flow decides (allow: accept; deny: TCP reset, else ICMP
//! port-unreachable); a flow no rule matches passes, so a service no rule
//! names is open. A service peer matches that service's VIP and its
//! members' addresses (on every node; not host-network members); `*` as a
//! source matches anything, as a destination any service's VIP or member.
//! Flows are judged once per node when they start (`ct state new`), just
//! before DNAT: on `prerouting` for flows arriving from containers (also
//! between two containers of this node: bridged traffic passes the IPv4
//! hooks, the kernel's `bridge-nf-call-iptables`, on by default) and from
//! other nodes, and on `output` for flows this node's processes open, except
//! to members on this node (the agent probes them). A flow to a VIP is
//! judged by the VIP's service and the VIP port, so a refusal comes from
//! the address the client asked; a flow straight to a member, by the
//! member's service and port. What cannot be judged: host-network members
//! share their node's address, so as a source they match only `*` rules
//! (like any host process or outside client), and as a destination no
//! service rule protects them; a flow that started before a rule changed
//! keeps its verdict.
//!
//! With `bridge-nf-call-iptables` on, a hairpin flow (a member DNATed back
//! to itself) leaves by the bridge port it came in on, which the bridge
//! allows only in hairpin mode: `HostNetwork::create_veth` sets it.

mod batch;
pub(crate) mod compile;
mod conntrack;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod kernel;
mod names;
#[cfg(test)]
pub(crate) mod tests;

use cca_model::net::{NetworkMap, Touched};

pub use batch::{AddVerdictMap, Batch, Command};
pub use error::{Error, Result};
pub use kernel::{Nft, PacketFilter, UdpCleanup};

use compile::{PolicyState, Programmed, ServiceState};

/// The table's name unless configured otherwise.
pub const DEFAULT_TABLE: &str = "cca-svc";

/// What a node's data plane needs to know about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPlaneConfig {
    /// The `ip` table the data plane owns (replaced whole on resync).
    pub table: String,
    /// This node's name, as members' `node` fields spell it: its members
    /// get hairpin masquerade and are always reachable from the node.
    pub node: String,
}

impl DataPlaneConfig {
    /// The default table for node `node`.
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
            node: node.into(),
        }
    }
}

/// What one `sync` or `resync` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Commands in the transaction (0: nothing changed, nothing applied).
    pub commands: usize,
    /// The whole table was rebuilt.
    pub resynced: bool,
    /// UDP conntrack entries deleted because their backend left.
    pub conntrack_deleted: usize,
}

/// The node's VIP rules and policy, kept equal to a [`NetworkMap`].
#[derive(Debug)]
pub struct DataPlane<F> {
    config: DataPlaneConfig,
    filter: F,
    /// What the table holds; `None` until a resync succeeded, and again
    /// after any failed change (the table may then hold anything).
    programmed: Option<Programmed>,
}

impl<F: PacketFilter> DataPlane<F> {
    /// A data plane that will program `config.table` through `filter`; it
    /// touches nothing until the first `resync` or `sync`.
    pub fn new(config: DataPlaneConfig, filter: F) -> Result<Self> {
        let table = &config.table;
        let valid = !table.is_empty()
            && table.len() <= names::MAX_NAME
            && table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(Error::Config(format!(
                "table name {table:?} must be 1-{} letters, digits, '-' or '_'",
                names::MAX_NAME
            )));
        }
        Ok(Self {
            config,
            filter,
            programmed: None,
        })
    }

    pub fn config(&self) -> &DataPlaneConfig {
        &self.config
    }

    /// The kernel side (the fake, in tests).
    pub fn filter(&self) -> &F {
        &self.filter
    }

    /// Replaces the table with one built from `map`, in one transaction
    /// (traffic never sees it half built), then deletes UDP conntrack
    /// entries through its VIP ports that lead to anything but their
    /// current backends.
    pub fn resync(&mut self, map: &NetworkMap) -> Result<SyncReport> {
        self.programmed = None;
        let mut programmed = Programmed::default();
        let mut batch = Batch::new(&self.config.table);
        // `add` first makes the `delete` succeed on a node without the table.
        batch.add_table();
        batch.delete_table();
        compile::skeleton(&mut batch);
        // Conntrack after a rebuild is judged below, against every port.
        let mut ignored = UdpCleanup::default();
        for (name, service) in &map.services {
            let state = ServiceState::of(service, &self.config.node);
            programmed.update_service(name, Some(state), &mut batch, &mut ignored);
        }
        programmed.update_shared(&Default::default(), &mut batch);
        programmed.update_policy(PolicyState::of_map(map), &mut batch);
        self.filter.apply(&batch)?;
        let cleanup = programmed.udp_backends();
        self.programmed = Some(programmed);
        let conntrack_deleted = self.filter.delete_conntrack(&cleanup)?;
        tracing::debug!(
            table = self.config.table,
            services = map.services.len(),
            commands = batch.len(),
            conntrack_deleted,
            "data plane rebuilt"
        );
        Ok(SyncReport {
            commands: batch.len(),
            resynced: true,
            conntrack_deleted,
        })
    }

    /// Makes the table hold `map`'s state for the `touched` entries only,
    /// in one transaction; a resync instead when the table's state is not
    /// known (first call, or after a failure). On error the next call
    /// rebuilds the table.
    pub fn sync(&mut self, map: &NetworkMap, touched: &Touched) -> Result<SyncReport> {
        let Some(programmed) = self.programmed.as_mut() else {
            return self.resync(map);
        };
        let mut batch = Batch::new(&self.config.table);
        let mut cleanup = UdpCleanup::default();
        let dispatches = programmed.dispatches();
        for name in &touched.services {
            let state = map
                .services
                .get(name)
                .map(|service| ServiceState::of(service, &self.config.node));
            programmed.update_service(name, state, &mut batch, &mut cleanup);
        }
        programmed.update_shared(&dispatches, &mut batch);
        if touched.policies {
            programmed.update_policy(PolicyState::of_map(map), &mut batch);
        }
        if batch.is_empty() {
            return Ok(SyncReport::default());
        }
        if let Err(error) = self.filter.apply(&batch) {
            self.programmed = None;
            return Err(error);
        }
        let conntrack_deleted = self.filter.delete_conntrack(&cleanup)?;
        Ok(SyncReport {
            commands: batch.len(),
            resynced: false,
            conntrack_deleted,
        })
    }

    /// Deletes the table (the node leaves, or the data plane is turned
    /// off); gone already is fine.
    pub fn remove(&mut self) -> Result<()> {
        self.programmed = None;
        self.filter.delete_table(&self.config.table)
    }
}
