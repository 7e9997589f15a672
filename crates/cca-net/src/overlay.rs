//! [`Overlay`]: the node's side of the VXLAN overlay that joins every
//! node's subnet. Flannel's design: each node's VXLAN device holds its
//! subnet's network address as a `/32` and a MAC derived from the subnet
//! ([`vtep_mac`]), so every node computes every peer's device from the
//! network map alone, nothing is exchanged and no ARP or flooding crosses
//! the overlay. Per peer the node keeps three entries on its device: a
//! forwarding (FDB) entry "that MAC is behind that underlay address", a
//! permanent neighbour entry "that device address has that MAC", and a
//! route "that subnet via that device address, on-link".
//!
//! [`OverlayPlan::new`] computes the wanted entries from the map, purely;
//! [`Overlay::sync`] lists what the kernel has, sets only what differs
//! and deletes what no peer wants, so a peer that leaves the map loses all
//! its entries and a repeated sync does nothing. Peers the node controller
//! holds unreachable keep theirs: an unreachable node's instances may still
//! answer, and which backends get traffic is the endpoint layer's call.
//! The node's own instances stay behind its bridge, routed by the bridge's
//! connected route.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use cca_model::net::{Ipv4Net, NodeRoute};

use crate::error::{Error, Result};
use crate::host::{FdbEntry, Mac, NeighbourEntry, OverlayHost, PeerRoute, VxlanSpec};

/// Bytes VXLAN adds to every frame on an IPv4 underlay (outer IP 20, UDP 8,
/// VXLAN 8, inner Ethernet 14): the device's MTU is the underlay's less
/// this.
pub const VXLAN_OVERHEAD: u32 = 50;
/// Linux interface names hold at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;
/// The largest VXLAN network identifier (24 bits).
const VNI_MAX: u32 = (1 << 24) - 1;
/// The smallest MTU IPv4 allows.
const MTU_MIN: u32 = 68;

/// How the node's overlay device is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlayConfig {
    /// The VXLAN device (`cca-vxlan`).
    pub device: String,
    /// The VXLAN network identifier, the same on every node (42).
    pub vni: u32,
    /// The UDP port of the tunnels, the same on every node (4789, IANA's).
    pub port: u16,
    /// The device's MTU; `None`: the underlay link's less
    /// [`VXLAN_OVERHEAD`].
    pub mtu: Option<u32>,
    /// The node bridge (`cca0`), whose MTU follows the device's so
    /// instances never send what the tunnel cannot carry; `None` on a node
    /// without one.
    pub bridge: Option<String>,
}

impl Default for OverlayConfig {
    fn default() -> Self {
        Self {
            device: "cca-vxlan".into(),
            vni: 42,
            port: 4789,
            mtu: None,
            bridge: Some("cca0".into()),
        }
    }
}

impl OverlayConfig {
    fn validate(&self) -> Result<()> {
        let name_ok = |name: &str| {
            !name.is_empty()
                && name.len() <= IFNAME_MAX
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        if !name_ok(&self.device) {
            return Err(Error::InvalidConfig(format!(
                "overlay device name {:?} must be 1-{IFNAME_MAX} letters, digits, '-', '_' or '.'",
                self.device
            )));
        }
        if let Some(bridge) = &self.bridge
            && !name_ok(bridge)
        {
            return Err(Error::InvalidConfig(format!(
                "bridge name {bridge:?} must be 1-{IFNAME_MAX} letters, digits, '-', '_' or '.'"
            )));
        }
        if self.vni > VNI_MAX {
            return Err(Error::InvalidConfig(format!(
                "VXLAN network identifier {} is larger than {VNI_MAX} (24 bits)",
                self.vni
            )));
        }
        if self.port == 0 {
            return Err(Error::InvalidConfig(
                "the overlay's UDP port must not be 0".into(),
            ));
        }
        if let Some(mtu) = self.mtu
            && mtu < MTU_MIN
        {
            return Err(Error::InvalidConfig(format!(
                "overlay MTU {mtu} is below IPv4's minimum of {MTU_MIN}"
            )));
        }
        Ok(())
    }
}

/// This node as the overlay needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalNode {
    /// The node's name (its own entry in the map is skipped).
    pub name: String,
    /// The node's subnet.
    pub subnet: Ipv4Net,
    /// The address tunnels start from: one of this host's own, the one
    /// peers know the node by (`NodeRoute::underlay`).
    pub underlay: Ipv4Addr,
}

/// The VXLAN device MAC of the node whose subnet is `subnet`: a locally
/// administered unicast address (`0e:ca:` then the subnet's network
/// address), unique while subnets do not overlap.
pub fn vtep_mac(subnet: Ipv4Net) -> Mac {
    let [a, b, c, d] = subnet.network().octets();
    Mac([0x0e, 0xca, a, b, c, d])
}

/// The VXLAN device address of the node whose subnet is `subnet`: the
/// subnet's network address, never given to an instance.
pub fn vtep_address(subnet: Ipv4Net) -> Ipv4Addr {
    subnet.network()
}

/// A node of the map the plan leaves out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub node: String,
    pub reason: String,
}

/// The entries this node's VXLAN device should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlayPlan {
    pub fdb: BTreeSet<FdbEntry>,
    pub neighbours: BTreeSet<NeighbourEntry>,
    pub routes: BTreeSet<PeerRoute>,
    /// Peers left out: their entries would clash with this node's or with
    /// an earlier peer's (by name). The network controller never hands out
    /// such subnets; a map that has them is reported, not programmed.
    pub skipped: Vec<Skipped>,
}

impl OverlayPlan {
    /// The entries for every peer in `nodes` (this node's own entry is
    /// ignored; unready peers count like ready ones).
    pub fn new<'a>(local: &LocalNode, nodes: impl IntoIterator<Item = &'a NodeRoute>) -> Self {
        let mut peers: Vec<&NodeRoute> = nodes
            .into_iter()
            .filter(|peer| peer.node != local.name)
            .collect();
        peers.sort_by(|a, b| a.node.cmp(&b.node));
        let mut plan = OverlayPlan::default();
        let mut taken: Vec<(&str, Ipv4Net)> = Vec::new();
        for peer in peers {
            let clash = if peer.underlay == local.underlay {
                Some("it has this node's underlay address".to_owned())
            } else if peer.subnet.overlaps(&local.subnet) {
                Some(format!(
                    "its subnet {} overlaps this node's {}",
                    peer.subnet, local.subnet
                ))
            } else {
                taken
                    .iter()
                    .find(|(_, subnet)| subnet.overlaps(&peer.subnet))
                    .map(|(node, subnet)| {
                        format!("its subnet {} overlaps node {node}'s {subnet}", peer.subnet)
                    })
            };
            if let Some(reason) = clash {
                plan.skipped.push(Skipped {
                    node: peer.node.clone(),
                    reason,
                });
                continue;
            }
            taken.push((&peer.node, peer.subnet));
            let mac = vtep_mac(peer.subnet);
            let address = vtep_address(peer.subnet);
            plan.fdb.insert(FdbEntry {
                mac,
                underlay: peer.underlay,
            });
            plan.neighbours.insert(NeighbourEntry { address, mac });
            plan.routes.insert(PeerRoute {
                subnet: peer.subnet,
                via: address,
            });
        }
        plan
    }
}

/// What a sync changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub fdb_set: Vec<FdbEntry>,
    pub fdb_deleted: Vec<FdbEntry>,
    pub neighbours_set: Vec<NeighbourEntry>,
    pub neighbours_deleted: Vec<NeighbourEntry>,
    pub routes_set: Vec<PeerRoute>,
    pub routes_deleted: Vec<PeerRoute>,
    /// Peers the plan left out.
    pub skipped: Vec<Skipped>,
}

impl SyncReport {
    /// Whether the sync changed no entry.
    pub fn unchanged(&self) -> bool {
        self.fdb_set.is_empty()
            && self.fdb_deleted.is_empty()
            && self.neighbours_set.is_empty()
            && self.neighbours_deleted.is_empty()
            && self.routes_set.is_empty()
            && self.routes_deleted.is_empty()
    }
}

/// What to set (wanted, not present) and what to delete (present, and its
/// key wanted by no entry). Entries are replaced by key, so an entry whose
/// value changed is only set: deleting the old one by key would delete the
/// new one.
fn diff<E: Ord + Copy, K: Ord>(
    wanted: &BTreeSet<E>,
    current: &[E],
    key: impl Fn(&E) -> K,
) -> (Vec<E>, Vec<E>) {
    let present: BTreeSet<E> = current.iter().copied().collect();
    let wanted_keys: BTreeSet<K> = wanted.iter().map(&key).collect();
    let set = wanted.difference(&present).copied().collect();
    let delete = present
        .iter()
        .filter(|entry| !wanted_keys.contains(&key(entry)))
        .copied()
        .collect();
    (set, delete)
}

/// The node's overlay over an [`OverlayHost`].
#[derive(Debug)]
pub struct Overlay<H: OverlayHost> {
    local: LocalNode,
    config: OverlayConfig,
    host: H,
    mtu: u32,
}

impl<H: OverlayHost> Overlay<H> {
    /// Checks the config, finds the MTU (the configured one, or the
    /// underlay link's less [`VXLAN_OVERHEAD`]) and makes the VXLAN device.
    /// Open it before the node network, so the node's bridge and veths can
    /// be given [`Overlay::mtu`].
    pub fn open(local: LocalNode, config: OverlayConfig, host: H) -> Result<Self> {
        config.validate()?;
        let mtu = match config.mtu {
            Some(mtu) => mtu,
            None => {
                let underlay = host.underlay_mtu(local.underlay)?;
                underlay
                    .checked_sub(VXLAN_OVERHEAD)
                    .filter(|mtu| *mtu >= MTU_MIN)
                    .ok_or_else(|| {
                        Error::InvalidConfig(format!(
                            "the underlay link of {} has MTU {underlay}, too small to carry VXLAN ({VXLAN_OVERHEAD} bytes of headers): raise it or set the overlay MTU",
                            local.underlay
                        ))
                    })?
            }
        };
        let overlay = Self {
            local,
            config,
            host,
            mtu,
        };
        overlay.host.ensure_vxlan(&overlay.vxlan_spec())?;
        tracing::info!(
            device = overlay.config.device,
            vni = overlay.config.vni,
            port = overlay.config.port,
            mtu,
            local = %overlay.local.underlay,
            "overlay device ready"
        );
        Ok(overlay)
    }

    /// The MTU of the device (and of the bridge and instance links).
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// This node.
    pub fn local(&self) -> &LocalNode {
        &self.local
    }

    /// The configuration.
    pub fn config(&self) -> &OverlayConfig {
        &self.config
    }

    /// The host underneath (tests inspect the fake through it).
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The device as it should be.
    pub fn vxlan_spec(&self) -> VxlanSpec {
        VxlanSpec {
            name: self.config.device.clone(),
            vni: self.config.vni,
            port: self.config.port,
            local: self.local.underlay,
            mtu: self.mtu,
            mac: vtep_mac(self.local.subnet),
            address: vtep_address(self.local.subnet),
        }
    }

    /// Brings the device (and the bridge's MTU) to what it should be, then
    /// the device's entries to the plan for `nodes` (the network map's
    /// nodes): sets what is missing or differs (forwarding, then neighbour,
    /// then route, so a route only leads where the tunnel is ready) and
    /// deletes what no peer wants (in the reverse order). A failure stops
    /// the sync with the entries so far applied; the next sync lists again
    /// and finishes the job.
    pub fn sync<'a>(&self, nodes: impl IntoIterator<Item = &'a NodeRoute>) -> Result<SyncReport> {
        let device = self.config.device.as_str();
        self.host.ensure_vxlan(&self.vxlan_spec())?;
        if let Some(bridge) = &self.config.bridge {
            self.host.set_mtu(bridge, self.mtu)?;
        }
        let plan = OverlayPlan::new(&self.local, nodes);
        for skipped in &plan.skipped {
            tracing::warn!(
                peer = skipped.node,
                reason = skipped.reason,
                "overlay leaves a node out"
            );
        }
        let (fdb_set, fdb_deleted) = diff(&plan.fdb, &self.host.list_fdb(device)?, |e| e.mac);
        let (neighbours_set, neighbours_deleted) =
            diff(&plan.neighbours, &self.host.list_neighbours(device)?, |e| {
                e.address
            });
        let (routes_set, routes_deleted) =
            diff(&plan.routes, &self.host.list_routes(device)?, |e| e.subnet);
        for entry in &fdb_set {
            self.host.add_fdb(device, entry)?;
        }
        for entry in &neighbours_set {
            self.host.add_neighbour(device, entry)?;
        }
        for route in &routes_set {
            self.host.add_route(device, route)?;
        }
        for route in &routes_deleted {
            self.host.delete_route(device, route)?;
        }
        for entry in &neighbours_deleted {
            self.host.delete_neighbour(device, entry)?;
        }
        for entry in &fdb_deleted {
            self.host.delete_fdb(device, entry)?;
        }
        let report = SyncReport {
            fdb_set,
            fdb_deleted,
            neighbours_set,
            neighbours_deleted,
            routes_set,
            routes_deleted,
            skipped: plan.skipped,
        };
        if !report.unchanged() {
            tracing::info!(
                routes_set = report.routes_set.len(),
                routes_deleted = report.routes_deleted.len(),
                "overlay synced"
            );
        }
        Ok(report)
    }

    /// Deletes the device and with it every entry: the node leaves the
    /// overlay.
    pub fn destroy(&self) -> Result<()> {
        self.host.delete_vxlan(&self.config.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Call, FakeHost};
    use crate::host::HostNetwork;

    fn net(text: &str) -> Ipv4Net {
        text.parse().unwrap()
    }

    fn node(name: &str, subnet: &str, underlay: [u8; 4], ready: bool) -> NodeRoute {
        NodeRoute {
            node: name.into(),
            subnet: net(subnet),
            underlay: Ipv4Addr::from(underlay),
            ready,
        }
    }

    fn local() -> LocalNode {
        LocalNode {
            name: "n1".into(),
            subnet: net("10.42.1.0/24"),
            underlay: Ipv4Addr::new(192, 168, 50, 1),
        }
    }

    /// A host with the node bridge, so the overlay can set its MTU.
    fn host() -> FakeHost {
        let host = FakeHost::new();
        host.ensure_bridge(&crate::host::BridgeSpec {
            name: "cca0".into(),
            subnet: "10.42.1.0/24".parse().unwrap(),
            mtu: None,
        })
        .unwrap();
        host.clear_calls();
        host
    }

    fn open(host: FakeHost) -> Overlay<FakeHost> {
        Overlay::open(local(), OverlayConfig::default(), host).unwrap()
    }

    fn peer_entries(subnet: &str, underlay: [u8; 4]) -> (FdbEntry, NeighbourEntry, PeerRoute) {
        let subnet = net(subnet);
        let mac = vtep_mac(subnet);
        (
            FdbEntry {
                mac,
                underlay: Ipv4Addr::from(underlay),
            },
            NeighbourEntry {
                address: subnet.network(),
                mac,
            },
            PeerRoute {
                subnet,
                via: subnet.network(),
            },
        )
    }

    /// Whether `overlay`'s device holds exactly the entries of `peers`.
    fn assert_entries(overlay: &Overlay<FakeHost>, peers: &[(&str, [u8; 4])]) {
        let mut fdb = Vec::new();
        let mut neighbours = Vec::new();
        let mut routes = Vec::new();
        for (subnet, underlay) in peers {
            let (f, n, r) = peer_entries(subnet, *underlay);
            fdb.push(f);
            neighbours.push(n);
            routes.push(r);
        }
        fdb.sort();
        neighbours.sort();
        routes.sort();
        assert_eq!(
            overlay.host().overlay_entries("cca-vxlan"),
            (fdb, neighbours, routes)
        );
    }

    #[test]
    fn the_device_mac_and_address_come_from_the_subnet() {
        assert_eq!(
            vtep_mac(net("10.42.3.0/24")).to_string(),
            "0e:ca:0a:2a:03:00"
        );
        assert_eq!(
            vtep_address(net("10.42.3.0/24")),
            Ipv4Addr::new(10, 42, 3, 0)
        );
        // Locally administered (bit 1), unicast (bit 0 clear).
        assert_eq!(vtep_mac(net("10.42.3.0/24")).0[0] & 0b11, 0b10);
    }

    #[test]
    fn the_plan_routes_every_peer_ready_or_not_and_skips_clashes() {
        let nodes = [
            node("n1", "10.42.1.0/24", [192, 168, 50, 1], true),
            node("n2", "10.42.2.0/24", [192, 168, 50, 2], true),
            node("n3", "10.42.3.0/24", [192, 168, 50, 3], false),
            node("n4", "10.42.1.0/25", [192, 168, 50, 4], true),
            node("n5", "10.42.2.0/23", [192, 168, 50, 5], true),
            node("n6", "10.42.6.0/24", [192, 168, 50, 1], true),
        ];
        let plan = OverlayPlan::new(&local(), &nodes);
        let (f2, n2, r2) = peer_entries("10.42.2.0/24", [192, 168, 50, 2]);
        let (f3, n3, r3) = peer_entries("10.42.3.0/24", [192, 168, 50, 3]);
        assert_eq!(plan.fdb, BTreeSet::from([f2, f3]));
        assert_eq!(plan.neighbours, BTreeSet::from([n2, n3]));
        assert_eq!(plan.routes, BTreeSet::from([r2, r3]));
        let skipped: Vec<(&str, &str)> = plan
            .skipped
            .iter()
            .map(|s| (s.node.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            vec![
                (
                    "n4",
                    "its subnet 10.42.1.0/25 overlaps this node's 10.42.1.0/24"
                ),
                (
                    "n5",
                    "its subnet 10.42.2.0/23 overlaps node n2's 10.42.2.0/24"
                ),
                ("n6", "it has this node's underlay address"),
            ]
        );
    }

    #[test]
    fn open_makes_the_device_with_the_underlay_mtu_less_the_headers() {
        let host = host();
        host.set_underlay_mtu(9000);
        let overlay = open(host);
        assert_eq!(overlay.mtu(), 8950);
        assert_eq!(
            overlay.host().calls(),
            vec![Call::EnsureVxlan(VxlanSpec {
                name: "cca-vxlan".into(),
                vni: 42,
                port: 4789,
                local: Ipv4Addr::new(192, 168, 50, 1),
                mtu: 8950,
                mac: vtep_mac(net("10.42.1.0/24")),
                address: Ipv4Addr::new(10, 42, 1, 0),
            })]
        );
        let configured = OverlayConfig {
            mtu: Some(1400),
            ..OverlayConfig::default()
        };
        assert_eq!(
            Overlay::open(local(), configured, FakeHost::new())
                .unwrap()
                .mtu(),
            1400
        );

        let tiny = FakeHost::new();
        tiny.set_underlay_mtu(100);
        let error = Overlay::open(local(), OverlayConfig::default(), tiny).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid network config: the underlay link of 192.168.50.1 has MTU 100, too small to carry VXLAN (50 bytes of headers): raise it or set the overlay MTU"
        );
    }

    #[test]
    fn bad_configs_are_refused_with_the_fix() {
        let refused = |config: OverlayConfig| {
            Overlay::open(local(), config, FakeHost::new())
                .unwrap_err()
                .to_string()
        };
        let default = OverlayConfig::default;
        assert!(
            refused(OverlayConfig {
                device: "a-name-too-long-for-linux".into(),
                ..default()
            })
            .contains("must be 1-15 letters")
        );
        assert!(
            refused(OverlayConfig {
                vni: 1 << 24,
                ..default()
            })
            .contains("larger than 16777215")
        );
        assert!(
            refused(OverlayConfig {
                port: 0,
                ..default()
            })
            .contains("must not be 0")
        );
        assert!(
            refused(OverlayConfig {
                mtu: Some(60),
                ..default()
            })
            .contains("below IPv4's minimum")
        );
    }

    #[test]
    fn sync_adds_peers_and_a_second_sync_changes_nothing() {
        let overlay = open(host());
        let nodes = [
            node("n1", "10.42.1.0/24", [192, 168, 50, 1], true),
            node("n2", "10.42.2.0/24", [192, 168, 50, 2], true),
            node("n3", "10.42.3.0/24", [192, 168, 50, 3], false),
        ];
        let report = overlay.sync(&nodes).unwrap();
        assert_eq!(report.routes_set.len(), 2);
        assert_eq!(report.fdb_set.len(), 2);
        assert_eq!(report.neighbours_set.len(), 2);
        assert_entries(
            &overlay,
            &[
                ("10.42.2.0/24", [192, 168, 50, 2]),
                ("10.42.3.0/24", [192, 168, 50, 3]),
            ],
        );
        assert_eq!(overlay.host().mtus().get("cca0"), Some(&1450));

        overlay.host().clear_calls();
        let again = overlay.sync(&nodes).unwrap();
        assert!(again.unchanged(), "{again:?}");
        let changes: Vec<&str> = overlay.host().calls().iter().map(Call::operation).collect();
        assert_eq!(
            changes,
            vec!["ensure_vxlan", "set_mtu"],
            "only the device is re-ensured"
        );
    }

    #[test]
    fn a_changed_underlay_replaces_only_the_forwarding_entry() {
        let overlay = open(host());
        let mut nodes = vec![
            node("n2", "10.42.2.0/24", [192, 168, 50, 2], true),
            node("n3", "10.42.3.0/24", [192, 168, 50, 3], true),
        ];
        overlay.sync(&nodes).unwrap();
        nodes[1].underlay = Ipv4Addr::new(192, 168, 50, 33);
        overlay.host().clear_calls();
        let report = overlay.sync(&nodes).unwrap();
        let (moved, _, _) = peer_entries("10.42.3.0/24", [192, 168, 50, 33]);
        assert_eq!(report.fdb_set, vec![moved]);
        assert!(
            report.fdb_deleted.is_empty(),
            "replaced by MAC, not deleted"
        );
        assert!(report.routes_set.is_empty() && report.neighbours_set.is_empty());
        assert_entries(
            &overlay,
            &[
                ("10.42.2.0/24", [192, 168, 50, 2]),
                ("10.42.3.0/24", [192, 168, 50, 33]),
            ],
        );
    }

    #[test]
    fn a_peer_that_leaves_loses_every_entry_route_first() {
        let overlay = open(host());
        let nodes = [
            node("n2", "10.42.2.0/24", [192, 168, 50, 2], true),
            node("n3", "10.42.3.0/24", [192, 168, 50, 3], true),
        ];
        overlay.sync(&nodes).unwrap();
        overlay.host().clear_calls();
        let report = overlay.sync(&nodes[..1]).unwrap();
        let (f3, n3, r3) = peer_entries("10.42.3.0/24", [192, 168, 50, 3]);
        assert_eq!(report.routes_deleted, vec![r3]);
        assert_eq!(report.neighbours_deleted, vec![n3]);
        assert_eq!(report.fdb_deleted, vec![f3]);
        assert_entries(&overlay, &[("10.42.2.0/24", [192, 168, 50, 2])]);
        let deletes: Vec<&str> = overlay
            .host()
            .calls()
            .iter()
            .map(Call::operation)
            .filter(|operation| operation.starts_with("delete"))
            .collect();
        assert_eq!(
            deletes,
            vec!["delete_route", "delete_neighbour", "delete_fdb"]
        );

        // An empty map leaves an empty device.
        overlay.sync(&[]).unwrap();
        assert_entries(&overlay, &[]);
    }

    #[test]
    fn a_failure_mid_sync_is_finished_by_the_next_sync() {
        let overlay = open(host());
        let nodes = [
            node("n2", "10.42.2.0/24", [192, 168, 50, 2], true),
            node("n3", "10.42.3.0/24", [192, 168, 50, 3], true),
        ];
        overlay.host().fail("add_route");
        let error = overlay.sync(&nodes).unwrap_err();
        assert_eq!(error.to_string(), "injected failure in add_route");
        let (fdb, neighbours, routes) = overlay.host().overlay_entries("cca-vxlan");
        assert_eq!((fdb.len(), neighbours.len(), routes.len()), (2, 2, 0));

        overlay.host().heal("add_route");
        let report = overlay.sync(&nodes).unwrap();
        assert_eq!(report.routes_set.len(), 2);
        assert!(report.fdb_set.is_empty() && report.neighbours_set.is_empty());
        assert_entries(
            &overlay,
            &[
                ("10.42.2.0/24", [192, 168, 50, 2]),
                ("10.42.3.0/24", [192, 168, 50, 3]),
            ],
        );

        // A failed delete leaves the rest for the next sync too.
        overlay.host().fail("delete_fdb");
        assert!(overlay.sync(&nodes[..1]).is_err());
        overlay.host().heal("delete_fdb");
        overlay.sync(&nodes[..1]).unwrap();
        assert_entries(&overlay, &[("10.42.2.0/24", [192, 168, 50, 2])]);
    }

    #[test]
    fn a_missing_bridge_and_destroy() {
        let overlay = Overlay::open(local(), OverlayConfig::default(), FakeHost::new()).unwrap();
        let error = overlay.sync(&[]).unwrap_err();
        assert!(
            error.to_string().starts_with("no link named cca0"),
            "{error}"
        );
        let without = OverlayConfig {
            bridge: None,
            ..OverlayConfig::default()
        };
        let overlay = Overlay::open(local(), without, FakeHost::new()).unwrap();
        overlay
            .sync(&[node("n2", "10.42.2.0/24", [192, 168, 50, 2], true)])
            .unwrap();
        overlay.destroy().unwrap();
        assert!(overlay.host().vxlans().is_empty());
        assert_entries(&overlay, &[]);
        overlay.destroy().unwrap();
    }
}
