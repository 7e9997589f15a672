//! [`FakeHost`]: a recording [`HostNetwork`] and [`OverlayHost`] for unit
//! tests. It keeps the state the calls would leave on a real host (links,
//! namespaces, tables, ports, the VXLAN device and its entries) so listing
//! and idempotent teardown behave like the kernel, records every call that
//! changes something with its typed arguments, and fails the operations it
//! is told to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{Error, Result};
use cca_model::net::Ipv4Net;

use crate::host::{
    BridgeSpec, FdbEntry, HostNetwork, Mac, NatSpec, NeighbourEntry, OverlayHost, PeerRoute,
    PortMapping, RangeRoute, VethSpec, VxlanSpec,
};

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    EnsureBridge(BridgeSpec),
    DeleteBridge(String),
    CreateNetns(String),
    DeleteNetns(String),
    CreateVeth(VethSpec),
    DeleteLink(String),
    EnsureNat(NatSpec),
    DeleteNat(String),
    AddPort(String, PortMapping),
    DeletePort(String, PortMapping),
    EnsureVxlan(VxlanSpec),
    DeleteVxlan(String),
    SetMtu(String, u32),
    AddFdb(String, FdbEntry),
    DeleteFdb(String, FdbEntry),
    AddNeighbour(String, NeighbourEntry),
    DeleteNeighbour(String, NeighbourEntry),
    AddRoute(String, PeerRoute),
    DeleteRoute(String, PeerRoute),
    EnsureRangeRoute(RangeRoute),
}

impl Call {
    /// The operation name `fail` matches on, e.g. `"create_veth"`.
    pub fn operation(&self) -> &'static str {
        match self {
            Call::EnsureBridge(_) => "ensure_bridge",
            Call::DeleteBridge(_) => "delete_bridge",
            Call::CreateNetns(_) => "create_netns",
            Call::DeleteNetns(_) => "delete_netns",
            Call::CreateVeth(_) => "create_veth",
            Call::DeleteLink(_) => "delete_link",
            Call::EnsureNat(_) => "ensure_nat",
            Call::DeleteNat(_) => "delete_nat",
            Call::AddPort(..) => "add_port",
            Call::DeletePort(..) => "delete_port",
            Call::EnsureVxlan(_) => "ensure_vxlan",
            Call::DeleteVxlan(_) => "delete_vxlan",
            Call::SetMtu(..) => "set_mtu",
            Call::AddFdb(..) => "add_fdb",
            Call::DeleteFdb(..) => "delete_fdb",
            Call::AddNeighbour(..) => "add_neighbour",
            Call::DeleteNeighbour(..) => "delete_neighbour",
            Call::AddRoute(..) => "add_route",
            Call::DeleteRoute(..) => "delete_route",
            Call::EnsureRangeRoute(_) => "ensure_range_route",
        }
    }
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    failing: BTreeSet<&'static str>,
    links: BTreeSet<String>,
    netns: BTreeSet<String>,
    /// Peer links inside each namespace, gone with the namespace.
    peers: BTreeMap<String, String>,
    tables: BTreeMap<String, BTreeSet<PortMapping>>,
    /// The MTU `underlay_mtu` answers (1500 unless set).
    underlay_mtu: Option<u32>,
    vxlans: BTreeMap<String, VxlanSpec>,
    mtus: BTreeMap<String, u32>,
    fdb: BTreeMap<(String, Mac), Ipv4Addr>,
    neighbours: BTreeMap<(String, Ipv4Addr), Mac>,
    routes: BTreeMap<(String, Ipv4Net), Ipv4Addr>,
}

impl State {
    /// The error the kernel gives for an entry on a missing device.
    fn device(&self, device: &str) -> Result<()> {
        if self.vxlans.contains_key(device) {
            Ok(())
        } else {
            Err(Error::NoLink {
                name: device.into(),
                place: String::new(),
                hint: "(fake) no such device".into(),
            })
        }
    }

    fn forget_entries(&mut self, device: &str) {
        self.fdb.retain(|(d, _), _| d != device);
        self.neighbours.retain(|(d, _), _| d != device);
        self.routes.retain(|(d, _), _| d != device);
    }
}

/// A recording, failure-injecting host network. Clones share one state:
/// the node network and the overlay of one node see one kernel.
#[derive(Clone, Debug, Default)]
pub struct FakeHost {
    state: std::sync::Arc<Mutex<State>>,
}

impl FakeHost {
    /// An empty host.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test must not poison every later assertion.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every later call of `operation` (e.g. `"create_veth"`) fail.
    pub fn fail(&self, operation: &'static str) {
        self.lock().failing.insert(operation);
    }

    /// Stops failing `operation`.
    pub fn heal(&self, operation: &'static str) {
        self.lock().failing.remove(operation);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Forgets the recorded calls (the simulated host state stays).
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// The host-namespace links that exist now.
    pub fn links(&self) -> BTreeSet<String> {
        self.lock().links.clone()
    }

    /// The named namespaces that exist now.
    pub fn namespaces(&self) -> BTreeSet<String> {
        self.lock().netns.clone()
    }

    /// The published ports of `table` (`None`: no such table).
    pub fn ports(&self, table: &str) -> Option<BTreeSet<PortMapping>> {
        self.lock().tables.get(table).cloned()
    }

    /// Makes `underlay_mtu` answer `mtu`.
    pub fn set_underlay_mtu(&self, mtu: u32) {
        self.lock().underlay_mtu = Some(mtu);
    }

    /// The VXLAN devices that exist now.
    pub fn vxlans(&self) -> BTreeMap<String, VxlanSpec> {
        self.lock().vxlans.clone()
    }

    /// The MTUs `set_mtu` gave links.
    pub fn mtus(&self) -> BTreeMap<String, u32> {
        self.lock().mtus.clone()
    }

    /// Every overlay entry now on `device`: forwarding, neighbour, route.
    pub fn overlay_entries(
        &self,
        device: &str,
    ) -> (Vec<FdbEntry>, Vec<NeighbourEntry>, Vec<PeerRoute>) {
        let state = self.lock();
        let fdb = state
            .fdb
            .iter()
            .filter(|((d, _), _)| d == device)
            .map(|((_, mac), underlay)| FdbEntry {
                mac: *mac,
                underlay: *underlay,
            })
            .collect();
        let neighbours = state
            .neighbours
            .iter()
            .filter(|((d, _), _)| d == device)
            .map(|((_, address), mac)| NeighbourEntry {
                address: *address,
                mac: *mac,
            })
            .collect();
        let routes = state
            .routes
            .iter()
            .filter(|((d, _), _)| d == device)
            .map(|((_, subnet), via)| PeerRoute {
                subnet: *subnet,
                via: *via,
            })
            .collect();
        (fdb, neighbours, routes)
    }

    /// Simulates a namespace left behind by a crashed agent.
    pub fn leave_netns(&self, name: &str) {
        self.lock().netns.insert(name.into());
    }

    /// Simulates a host link left behind by a crashed agent.
    pub fn leave_link(&self, name: &str) {
        self.lock().links.insert(name.into());
    }

    /// Records `call`, failing it if asked to, then applies `change`.
    fn record<T>(&self, call: Call, change: impl FnOnce(&mut State) -> T) -> Result<T> {
        let mut state = self.lock();
        let operation = call.operation();
        state.calls.push(call);
        if state.failing.contains(operation) {
            return Err(Error::Injected {
                operation: operation.into(),
            });
        }
        Ok(change(&mut state))
    }
}

impl HostNetwork for FakeHost {
    fn ensure_bridge(&self, bridge: &BridgeSpec) -> Result<()> {
        let name = bridge.name.clone();
        self.record(Call::EnsureBridge(bridge.clone()), |s| {
            s.links.insert(name);
        })
    }

    fn delete_bridge(&self, name: &str) -> Result<()> {
        self.record(Call::DeleteBridge(name.into()), |s| {
            s.links.remove(name);
        })
    }

    fn create_netns(&self, name: &str) -> Result<()> {
        self.record(Call::CreateNetns(name.into()), |s| {
            s.netns.insert(name.into());
        })
    }

    fn delete_netns(&self, name: &str) -> Result<()> {
        self.record(Call::DeleteNetns(name.into()), |s| {
            s.netns.remove(name);
            // Destroying a namespace destroys its veth end, and with it
            // the host end, as the kernel does.
            if let Some(host) = s.peers.remove(name) {
                s.links.remove(&host);
            }
        })
    }

    fn netns_path(&self, name: &str) -> PathBuf {
        Path::new("/run/netns").join(name)
    }

    fn list_netns(&self) -> Result<Vec<String>> {
        Ok(self.lock().netns.iter().cloned().collect())
    }

    fn create_veth(&self, veth: &VethSpec) -> Result<()> {
        let (host, netns) = (veth.host_name.clone(), veth.netns.clone());
        self.record(Call::CreateVeth(veth.clone()), |s| {
            s.links.insert(host.clone());
            s.peers.insert(netns, host);
        })
    }

    fn delete_link(&self, name: &str) -> Result<()> {
        self.record(Call::DeleteLink(name.into()), |s| {
            s.links.remove(name);
            s.peers.retain(|_, host| host != name);
        })
    }

    fn list_links(&self) -> Result<Vec<String>> {
        Ok(self.lock().links.iter().cloned().collect())
    }

    fn ensure_nat(&self, nat: &NatSpec) -> Result<()> {
        let table = nat.table.clone();
        self.record(Call::EnsureNat(nat.clone()), |s| {
            s.tables.entry(table).or_default();
        })
    }

    fn delete_nat(&self, table: &str) -> Result<()> {
        self.record(Call::DeleteNat(table.into()), |s| {
            s.tables.remove(table);
        })
    }

    fn add_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let port = *port;
        self.record(Call::AddPort(table.into(), port), |s| {
            s.tables.get_mut(table).map(|ports| ports.insert(port))
        })?
        .map(drop)
        .ok_or_else(|| Error::Command {
            command: format!("nft add element ip {table} ports"),
            status: "exit status: 1".into(),
            stderr: "Error: No such file or directory".into(),
        })
    }

    fn delete_port(&self, table: &str, port: &PortMapping) -> Result<()> {
        let port = *port;
        self.record(Call::DeletePort(table.into(), port), |s| {
            if let Some(ports) = s.tables.get_mut(table) {
                ports.retain(|p| (p.proto, p.host_port) != (port.proto, port.host_port));
            }
        })
    }

    fn list_ports(&self, table: &str) -> Result<Vec<PortMapping>> {
        Ok(self
            .lock()
            .tables
            .get(table)
            .map(|ports| ports.iter().copied().collect())
            .unwrap_or_default())
    }

    fn ensure_range_route(&self, route: &RangeRoute) -> Result<()> {
        self.record(Call::EnsureRangeRoute(route.clone()), |_| ())
    }
}

impl OverlayHost for FakeHost {
    fn underlay_mtu(&self, _address: Ipv4Addr) -> Result<u32> {
        let state = self.lock();
        if state.failing.contains("underlay_mtu") {
            return Err(Error::Injected {
                operation: "underlay_mtu".into(),
            });
        }
        Ok(state.underlay_mtu.unwrap_or(1500))
    }

    fn ensure_vxlan(&self, vxlan: &VxlanSpec) -> Result<()> {
        let spec = vxlan.clone();
        self.record(Call::EnsureVxlan(vxlan.clone()), |s| {
            let recreate = s.vxlans.get(&spec.name).is_some_and(|old| {
                (old.vni, old.port, old.local) != (spec.vni, spec.port, spec.local)
            });
            if recreate {
                // A new device starts without entries, as the kernel's does.
                s.forget_entries(&spec.name);
            }
            s.links.insert(spec.name.clone());
            s.vxlans.insert(spec.name.clone(), spec);
        })
    }

    fn delete_vxlan(&self, name: &str) -> Result<()> {
        self.record(Call::DeleteVxlan(name.into()), |s| {
            s.vxlans.remove(name);
            s.links.remove(name);
            s.forget_entries(name);
        })
    }

    fn set_mtu(&self, link: &str, mtu: u32) -> Result<()> {
        self.record(Call::SetMtu(link.into(), mtu), |s| {
            if !s.links.contains(link) {
                return Err(Error::NoLink {
                    name: link.into(),
                    place: String::new(),
                    hint: "(fake) no such link".into(),
                });
            }
            s.mtus.insert(link.into(), mtu);
            Ok(())
        })?
    }

    fn list_fdb(&self, device: &str) -> Result<Vec<FdbEntry>> {
        Ok(self.overlay_entries(device).0)
    }

    fn add_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()> {
        let entry = *entry;
        self.record(Call::AddFdb(device.into(), entry), |s| {
            s.device(device)?;
            s.fdb.insert((device.into(), entry.mac), entry.underlay);
            Ok(())
        })?
    }

    fn delete_fdb(&self, device: &str, entry: &FdbEntry) -> Result<()> {
        let entry = *entry;
        self.record(Call::DeleteFdb(device.into(), entry), |s| {
            let key = (device.to_owned(), entry.mac);
            if s.fdb.get(&key) == Some(&entry.underlay) {
                s.fdb.remove(&key);
            }
        })
    }

    fn list_neighbours(&self, device: &str) -> Result<Vec<NeighbourEntry>> {
        Ok(self.overlay_entries(device).1)
    }

    fn add_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()> {
        let entry = *entry;
        self.record(Call::AddNeighbour(device.into(), entry), |s| {
            s.device(device)?;
            s.neighbours
                .insert((device.into(), entry.address), entry.mac);
            Ok(())
        })?
    }

    fn delete_neighbour(&self, device: &str, entry: &NeighbourEntry) -> Result<()> {
        let entry = *entry;
        self.record(Call::DeleteNeighbour(device.into(), entry), |s| {
            // The kernel deletes a neighbour by its address alone.
            s.neighbours.remove(&(device.to_owned(), entry.address));
        })
    }

    fn list_routes(&self, device: &str) -> Result<Vec<PeerRoute>> {
        Ok(self.overlay_entries(device).2)
    }

    fn add_route(&self, device: &str, route: &PeerRoute) -> Result<()> {
        let route = *route;
        self.record(Call::AddRoute(device.into(), route), |s| {
            s.device(device)?;
            s.routes.insert((device.into(), route.subnet), route.via);
            Ok(())
        })?
    }

    fn delete_route(&self, device: &str, route: &PeerRoute) -> Result<()> {
        let route = *route;
        self.record(Call::DeleteRoute(device.into(), route), |s| {
            let key = (device.to_owned(), route.subnet);
            if s.routes.get(&key) == Some(&route.via) {
                s.routes.remove(&key);
            }
        })
    }
}
