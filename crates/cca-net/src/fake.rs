//! [`FakeHost`]: a recording [`HostNetwork`] for unit tests. It keeps the
//! state the calls would leave on a real host (links, namespaces, tables,
//! ports) so listing and idempotent teardown behave like the kernel, records
//! every call with its typed arguments, and fails the operations it is told
//! to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{Error, Result};
use crate::host::{BridgeSpec, HostNetwork, NatSpec, PortMapping, VethSpec};

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
}

/// A recording, failure-injecting host network.
#[derive(Debug, Default)]
pub struct FakeHost {
    state: Mutex<State>,
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
}
