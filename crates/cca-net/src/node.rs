//! [`NodeNetwork`]: the node's network service. It owns the node subnet's
//! leases and published ports, persists them as `network.json` in the
//! agent's data dir (so a restarted agent keeps every assignment), and
//! drives a [`HostNetwork`] to give each instance a namespace, a veth on the
//! node bridge, an address, a default route and its published ports — and
//! to remove all of it again on detach or orphan cleanup.
//!
//! The VXLAN overlay ([`crate::Overlay`]) sits beside it without changing
//! this shape: another link in the node's namespace and routes to the
//! other nodes' subnets, while instances keep their default route via the
//! bridge; [`NetConfig::mtu`] gives the bridge and every veth the
//! overlay's MTU. Service VIPs are more maps and chains in the same
//! nftables table, fed from the attachments' addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::host::{BridgeSpec, HostNetwork, NatSpec, PortMapping, Proto, VethSpec};
use crate::ipam::{Ipam, Subnet};

/// The state file's name inside the data dir.
pub const STATE_FILE: &str = "network.json";
/// The instance's end of its veth pair, inside its namespace.
pub const PEER_NAME: &str = "eth0";
/// Linux interface names hold at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;
/// Hex digits of the instance id's hash in its host veth name.
const VETH_HASH_LEN: usize = 8;

/// Where and under which names the node network lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The node subnet; its first host address is the bridge's.
    pub subnet: Subnet,
    /// The node bridge (`cca0`).
    pub bridge: String,
    /// The nftables table this node owns entirely (`ip cca`).
    pub table: String,
    /// Instance namespaces are `{netns_prefix}{instance id}` (`cca-`).
    pub netns_prefix: String,
    /// Host veth ends are `{veth_prefix}{8 hex of the id's hash}` (`vcca`).
    pub veth_prefix: String,
    /// Where `network.json` lives (the agent's data dir).
    pub state_dir: PathBuf,
    /// The MTU of the bridge and of every veth pair (the overlay's,
    /// [`crate::Overlay::mtu`]); `None` leaves the kernel's.
    pub mtu: Option<u32>,
    /// The overlay device (`cca-vxlan`), when the node has one: traffic
    /// leaving through it is not masqueraded.
    pub overlay: Option<String>,
    /// The node's DNS server's port on the gateway address, when it runs
    /// one: the gateway's port 53 is redirected to it.
    pub dns_port: Option<u16>,
}

impl NetConfig {
    /// The default names for `subnet`, with state under `state_dir`.
    pub fn new(subnet: Subnet, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            subnet,
            bridge: "cca0".into(),
            table: "cca".into(),
            netns_prefix: "cca-".into(),
            veth_prefix: "vcca".into(),
            state_dir: state_dir.into(),
            mtu: None,
            overlay: None,
            dns_port: None,
        }
    }

    /// The names for node `node`: its instances' namespaces are
    /// `cca-{8 hex of the node name's hash}-{id}`. Named namespaces live in
    /// one directory per machine, and each agent removes the namespaces
    /// under its prefix that none of its instances own: with one prefix
    /// per node, agents sharing a machine (test labs, an agent beside a
    /// root `cca dev`) never take each other's.
    pub fn for_node(node: &str, subnet: Subnet, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            netns_prefix: format!("cca-{}-", short_hash(node)),
            ..Self::new(subnet, state_dir)
        }
    }

    fn validate(&self) -> Result<()> {
        let word = |text: &str| {
            !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !word(&self.bridge) || self.bridge.len() > IFNAME_MAX {
            return Err(Error::InvalidConfig(format!(
                "bridge name {:?} must be 1-{IFNAME_MAX} letters, digits, '-' or '_'",
                self.bridge
            )));
        }
        if !word(&self.table) {
            return Err(Error::InvalidConfig(format!(
                "nftables table name {:?} must be letters, digits, '-' or '_'",
                self.table
            )));
        }
        if !word(&self.netns_prefix) {
            return Err(Error::InvalidConfig(format!(
                "namespace prefix {:?} must be letters, digits, '-' or '_'",
                self.netns_prefix
            )));
        }
        if !word(&self.veth_prefix) || self.veth_prefix.len() + VETH_HASH_LEN > IFNAME_MAX {
            return Err(Error::InvalidConfig(format!(
                "veth prefix {:?} must be 1-{} letters, digits, '-' or '_'",
                self.veth_prefix,
                IFNAME_MAX - VETH_HASH_LEN
            )));
        }
        Ok(())
    }

    /// The namespace name of `instance`.
    pub fn netns_name(&self, instance: &str) -> String {
        format!("{}{instance}", self.netns_prefix)
    }

    /// The host veth name of `instance`: a hash, because instance ids are
    /// longer than an interface name may be.
    pub fn veth_name(&self, instance: &str) -> String {
        format!("{}{}", self.veth_prefix, short_hash(instance))
    }
}

/// The first [`VETH_HASH_LEN`] hex digits of `text`'s SHA-256.
fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(VETH_HASH_LEN / 2)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// What an attached instance needs to run in the node network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// The namespace to run the instance in (the OCI spec's network
    /// namespace path, or `nsenter --net=` for processes).
    pub netns_path: PathBuf,
    /// The instance's address in the node subnet.
    pub address: Ipv4Addr,
    /// The subnet prefix length of `address`.
    pub prefix: u8,
    /// The default gateway: the node bridge.
    pub gateway: Ipv4Addr,
}

/// What `cleanup_orphans` removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Instances with a lease but not known any more: fully detached.
    pub instances: Vec<String>,
    /// Namespaces of ours without a known instance.
    pub netns: Vec<String>,
    /// Host veth ends of ours without a known instance.
    pub links: Vec<String>,
    /// Published ports pointing at no known instance's address.
    pub ports: Vec<PortMapping>,
}

/// A published port and the instance that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Published {
    instance: String,
    mapping: PortMapping,
}

/// The persisted state: leases and published ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct NodeState {
    ipam: Ipam,
    ports: Vec<Published>,
}

/// The node's network service over a [`HostNetwork`].
#[derive(Debug)]
pub struct NodeNetwork<H: HostNetwork> {
    config: NetConfig,
    host: H,
    path: PathBuf,
    /// One lock for state and host changes: attach, publish and detach of
    /// one node are rare and short, and serialising them keeps the state
    /// file and the kernel in step.
    state: Mutex<NodeState>,
}

/// Checks an instance id the way the runtime does, so every id the runtime
/// accepts makes a valid namespace (file) name.
fn check_instance_id(id: &str) -> Result<()> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidInstanceId { id: id.into() })
    }
}

impl<H: HostNetwork> NodeNetwork<H> {
    /// Loads the persisted state (or starts empty), then makes sure the
    /// bridge and the nftables table exist and holds every persisted
    /// published port, so the node network is whole after an agent restart
    /// or a host reboot. Instances are re-attached by `attach`.
    pub fn open(config: NetConfig, host: H) -> Result<Self> {
        config.validate()?;
        let path = config.state_dir.join(STATE_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => {
                let state: NodeState =
                    serde_json::from_slice(&bytes).map_err(|source| Error::StateParse {
                        path: path.clone(),
                        error: source,
                    })?;
                if state.ipam.subnet() != config.subnet {
                    return Err(Error::SubnetChanged {
                        path,
                        persisted: state.ipam.subnet().to_string(),
                        configured: config.subnet.to_string(),
                    });
                }
                state.ipam.validate()?;
                state
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => NodeState {
                ipam: Ipam::new(config.subnet),
                ports: Vec::new(),
            },
            Err(source) => {
                return Err(Error::StateIo {
                    action: "read",
                    path,
                    error: source,
                });
            }
        };
        host.ensure_bridge(&BridgeSpec {
            name: config.bridge.clone(),
            subnet: config.subnet,
            mtu: config.mtu,
        })?;
        host.ensure_nat(&NatSpec {
            table: config.table.clone(),
            bridge: config.bridge.clone(),
            subnet: config.subnet,
            overlay: config.overlay.clone(),
            dns_port: config.dns_port,
        })?;
        for published in &state.ports {
            host.add_port(&config.table, &published.mapping)?;
        }
        Ok(Self {
            config,
            host,
            path,
            state: Mutex::new(state),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// The host network underneath (tests inspect the fake through it).
    pub fn host(&self) -> &H {
        &self.host
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // The state is only changed after the host calls succeed, so a
        // panic elsewhere cannot leave it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, state: &NodeState) -> Result<()> {
        let io_error = |action, source| Error::StateIo {
            action,
            path: self.path.clone(),
            error: source,
        };
        fs::create_dir_all(&self.config.state_dir).map_err(|e| io_error("create the dir of", e))?;
        let json = serde_json::to_vec_pretty(state)
            .map_err(|e| io_error("serialise", io::Error::other(e)))?;
        // Write-then-rename so a crash leaves the old file or the new one.
        let mut file = tempfile::NamedTempFile::new_in(&self.config.state_dir)
            .map_err(|e| io_error("write", e))?;
        file.write_all(&json).map_err(|e| io_error("write", e))?;
        file.as_file()
            .sync_all()
            .map_err(|e| io_error("write", e))?;
        file.persist(&self.path)
            .map_err(|e| io_error("replace", e.error))?;
        Ok(())
    }

    fn attachment(&self, address: Ipv4Addr, instance: &str) -> Attachment {
        Attachment {
            netns_path: self.host.netns_path(&self.config.netns_name(instance)),
            address,
            prefix: self.config.subnet.prefix(),
            gateway: self.config.subnet.gateway(),
        }
    }

    /// Gives `instance` a namespace, a veth on the bridge, an address and a
    /// default route. Attaching an attached instance whose namespace and
    /// veth exist returns the same attachment without touching them;
    /// otherwise (after a reboot, say) they are recreated with the same
    /// address. On failure everything created is removed again.
    pub fn attach(&self, instance: &str) -> Result<Attachment> {
        check_instance_id(instance)?;
        let mut state = self.lock();
        let netns = self.config.netns_name(instance);
        let veth = self.config.veth_name(instance);
        if let Some(address) = state.ipam.get(instance)
            && self.host.list_netns()?.contains(&netns)
            && self.host.list_links()?.contains(&veth)
        {
            return Ok(self.attachment(address, instance));
        }
        let had_lease = state.ipam.get(instance).is_some();
        let address = state.ipam.allocate(instance)?;
        self.save(&state)?;
        let created = self.host.create_netns(&netns).and_then(|()| {
            self.host.create_veth(&VethSpec {
                host_name: veth.clone(),
                netns: netns.clone(),
                peer_name: PEER_NAME.into(),
                bridge: self.config.bridge.clone(),
                address,
                subnet: self.config.subnet,
                mtu: self.config.mtu,
            })
        });
        if let Err(error) = created {
            // Best effort: the original error is the one worth reporting;
            // anything left over is found again by cleanup_orphans.
            if let Err(undo) = self.host.delete_link(&veth) {
                tracing::warn!(instance, error = %undo, "removing the veth after a failed attach");
            }
            if let Err(undo) = self.host.delete_netns(&netns) {
                tracing::warn!(instance, error = %undo, "removing the namespace after a failed attach");
            }
            if !had_lease {
                state.ipam.release(instance);
                self.save(&state)?;
            }
            return Err(error);
        }
        tracing::info!(instance, %address, netns, veth, "attached to the node network");
        Ok(self.attachment(address, instance))
    }

    /// The attachment of `instance`, if it has a lease.
    pub fn attachment_of(&self, instance: &str) -> Option<Attachment> {
        let state = self.lock();
        let address = state.ipam.get(instance)?;
        Some(self.attachment(address, instance))
    }

    /// Every instance with a lease and its address.
    pub fn leases(&self) -> BTreeMap<String, Ipv4Addr> {
        self.lock().ipam.leases().clone()
    }

    /// Publishes `proto` `host_port` on every local address (including
    /// 127.0.0.1 and traffic from the host itself) to the instance's
    /// `container_port`. Publishing the same mapping again is a no-op; a
    /// host port another instance holds is refused.
    pub fn publish(
        &self,
        instance: &str,
        host_port: u16,
        container_port: u16,
        proto: Proto,
    ) -> Result<PortMapping> {
        let mut state = self.lock();
        let address = state
            .ipam
            .get(instance)
            .ok_or_else(|| Error::NotAttached(instance.into()))?;
        let mapping = PortMapping {
            proto,
            host_port,
            address,
            container_port,
        };
        let existing = state
            .ports
            .iter()
            .position(|p| (p.mapping.proto, p.mapping.host_port) == (proto, host_port));
        if let Some(index) = existing {
            let current = &state.ports[index];
            if current.instance != instance {
                return Err(Error::PortInUse {
                    proto,
                    host_port,
                    owner: current.instance.clone(),
                });
            }
            if current.mapping == mapping {
                return Ok(mapping);
            }
            // Same instance, new container port: nft refuses to overwrite
            // a map element, so the old one goes first.
            self.host
                .delete_port(&self.config.table, &current.mapping)?;
            state.ports.remove(index);
            self.save(&state)?;
        }
        self.host.add_port(&self.config.table, &mapping)?;
        state.ports.push(Published {
            instance: instance.into(),
            mapping,
        });
        self.save(&state)?;
        Ok(mapping)
    }

    /// The published ports of `instance`.
    pub fn ports_of(&self, instance: &str) -> Vec<PortMapping> {
        self.lock()
            .ports
            .iter()
            .filter(|p| p.instance == instance)
            .map(|p| p.mapping)
            .collect()
    }

    /// Removes the instance's published ports, veth and namespace, then
    /// releases its address. Detaching an unknown or detached instance
    /// succeeds (and still removes a namespace or veth left by a crash).
    /// On a failure the lease stays, so a retry finishes the job.
    pub fn detach(&self, instance: &str) -> Result<()> {
        check_instance_id(instance)?;
        let mut state = self.lock();
        self.detach_locked(&mut state, instance)
    }

    fn detach_locked(&self, state: &mut NodeState, instance: &str) -> Result<()> {
        let mut result = Ok(());
        let mut kept = Vec::new();
        for published in std::mem::take(&mut state.ports) {
            if published.instance != instance {
                kept.push(published);
                continue;
            }
            if let Err(error) = self
                .host
                .delete_port(&self.config.table, &published.mapping)
            {
                kept.push(published);
                result = result.and(Err(error));
            }
        }
        state.ports = kept;
        result = result
            .and_then(|()| self.host.delete_link(&self.config.veth_name(instance)))
            .and_then(|()| self.host.delete_netns(&self.config.netns_name(instance)));
        if result.is_ok() && state.ipam.release(instance).is_some() {
            tracing::info!(instance, "detached from the node network");
        }
        self.save(state)?;
        result
    }

    /// Removes everything of ours that belongs to no instance in `known`:
    /// leases (fully detached), namespaces, host veth ends and published
    /// ports left behind by crashes. The agent calls this at start with the
    /// instances its runtimes still have.
    pub fn cleanup_orphans<'a>(
        &self,
        known: impl IntoIterator<Item = &'a str>,
    ) -> Result<CleanupReport> {
        let known: BTreeSet<&str> = known.into_iter().collect();
        let mut state = self.lock();
        let mut report = CleanupReport::default();

        let leased: Vec<String> = state.ipam.leases().keys().cloned().collect();
        for instance in leased {
            if !known.contains(instance.as_str()) {
                self.detach_locked(&mut state, &instance)?;
                report.instances.push(instance);
            }
        }

        for netns in self.host.list_netns()? {
            let Some(instance) = netns.strip_prefix(&self.config.netns_prefix) else {
                continue;
            };
            if !known.contains(instance) {
                self.host.delete_netns(&netns)?;
                report.netns.push(netns);
            }
        }

        let wanted: BTreeSet<String> = known.iter().map(|id| self.config.veth_name(id)).collect();
        for link in self.host.list_links()? {
            let ours = link
                .strip_prefix(&self.config.veth_prefix)
                .is_some_and(|rest| {
                    rest.len() == VETH_HASH_LEN && rest.chars().all(|c| c.is_ascii_hexdigit())
                });
            if ours && !wanted.contains(&link) {
                self.host.delete_link(&link)?;
                report.links.push(link);
            }
        }

        let live: BTreeSet<PortMapping> = state.ports.iter().map(|p| p.mapping).collect();
        for port in self.host.list_ports(&self.config.table)? {
            if !live.contains(&port) {
                self.host.delete_port(&self.config.table, &port)?;
                report.ports.push(port);
            }
        }
        Ok(report)
    }

    /// Detaches every instance, then removes the nftables table and the
    /// bridge: the node leaves the cluster network. The state file is
    /// removed with them.
    pub fn destroy(&self) -> Result<()> {
        let mut state = self.lock();
        let leased: Vec<String> = state.ipam.leases().keys().cloned().collect();
        for instance in leased {
            self.detach_locked(&mut state, &instance)?;
        }
        self.host.delete_nat(&self.config.table)?;
        self.host.delete_bridge(&self.config.bridge)?;
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::StateIo {
                action: "remove",
                path: self.path.clone(),
                error: source,
            }),
        }
    }

    /// Where the state is persisted.
    pub fn state_path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Call, FakeHost};

    fn config(dir: &Path) -> NetConfig {
        NetConfig::new("10.88.0.0/24".parse().unwrap(), dir)
    }

    fn open(dir: &Path) -> NodeNetwork<FakeHost> {
        NodeNetwork::open(config(dir), FakeHost::new()).unwrap()
    }

    #[test]
    fn open_creates_bridge_and_table() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        assert_eq!(
            net.host().calls(),
            vec![
                Call::EnsureBridge(BridgeSpec {
                    name: "cca0".into(),
                    subnet: "10.88.0.0/24".parse().unwrap(),
                    mtu: None,
                }),
                Call::EnsureNat(NatSpec {
                    table: "cca".into(),
                    bridge: "cca0".into(),
                    subnet: "10.88.0.0/24".parse().unwrap(),
                    overlay: None,
                    dns_port: None,
                }),
            ]
        );
    }

    #[test]
    fn attach_creates_netns_and_veth_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.host().clear_calls();
        let attachment = net.attach("web-1").unwrap();
        assert_eq!(
            attachment,
            Attachment {
                netns_path: "/run/netns/cca-web-1".into(),
                address: Ipv4Addr::new(10, 88, 0, 2),
                prefix: 24,
                gateway: Ipv4Addr::new(10, 88, 0, 1),
            }
        );
        let veth = net.config().veth_name("web-1");
        assert_eq!(veth.len(), 12);
        assert_eq!(
            net.host().calls(),
            vec![
                Call::CreateNetns("cca-web-1".into()),
                Call::CreateVeth(VethSpec {
                    host_name: veth,
                    netns: "cca-web-1".into(),
                    peer_name: "eth0".into(),
                    bridge: "cca0".into(),
                    address: Ipv4Addr::new(10, 88, 0, 2),
                    subnet: "10.88.0.0/24".parse().unwrap(),
                    mtu: None,
                }),
            ]
        );
        net.host().clear_calls();
        assert_eq!(net.attach("web-1").unwrap(), attachment);
        assert_eq!(net.host().calls(), vec![], "a live attachment is kept");
        assert_eq!(
            net.attach("web-2").unwrap().address,
            Ipv4Addr::new(10, 88, 0, 3)
        );
    }

    #[test]
    fn failed_attach_rolls_back_and_releases_the_lease() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.host().fail("create_veth");
        let error = net.attach("web-1").unwrap_err();
        assert_eq!(error.to_string(), "injected failure in create_veth");
        assert!(net.leases().is_empty());
        assert!(net.host().namespaces().is_empty());
        net.host().heal("create_veth");
        // The address was released, so the retry moves on past it.
        assert_eq!(
            net.attach("web-1").unwrap().address,
            Ipv4Addr::new(10, 88, 0, 3)
        );
    }

    #[test]
    fn rejects_ids_that_cannot_name_a_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        for id in ["", ".hidden", "a/b", "a b"] {
            assert!(
                matches!(net.attach(id), Err(Error::InvalidInstanceId { .. })),
                "{id:?}"
            );
        }
    }

    #[test]
    fn each_node_names_its_namespaces_apart() {
        let subnet: Subnet = "10.42.1.0/24".parse().unwrap();
        let one = NetConfig::for_node("n1", subnet, "/tmp/x");
        let two = NetConfig::for_node("n2", subnet, "/tmp/x");
        assert!(one.netns_prefix.starts_with("cca-") && one.netns_prefix.ends_with('-'));
        assert_eq!(one.netns_prefix.len(), "cca-".len() + VETH_HASH_LEN + 1);
        assert_ne!(one.netns_name("web-1"), two.netns_name("web-1"));
        assert!(one.validate().is_ok());
    }

    #[test]
    fn rejects_bad_names_in_config() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = config(dir.path());
        bad.bridge = "a-bridge-name-too-long".into();
        let error = NodeNetwork::open(bad, FakeHost::new()).unwrap_err();
        assert!(error.to_string().contains("bridge name"), "{error}");
        let mut bad = config(dir.path());
        bad.veth_prefix = "toolong8".into();
        let error = NodeNetwork::open(bad, FakeHost::new()).unwrap_err();
        assert!(error.to_string().contains("veth prefix"), "{error}");
    }

    #[test]
    fn publish_checks_owner_and_replaces_container_port() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        assert!(matches!(
            net.publish("web-1", 8080, 80, Proto::Tcp),
            Err(Error::NotAttached(_))
        ));
        let a = net.attach("web-1").unwrap().address;
        net.attach("web-2").unwrap();
        let mapping = net.publish("web-1", 8080, 80, Proto::Tcp).unwrap();
        assert_eq!(net.publish("web-1", 8080, 80, Proto::Tcp).unwrap(), mapping);
        let error = net.publish("web-2", 8080, 80, Proto::Tcp).unwrap_err();
        assert_eq!(
            error.to_string(),
            "host port tcp/8080 is already published by instance web-1"
        );
        // UDP on the same number is another port.
        net.publish("web-2", 8080, 53, Proto::Udp).unwrap();
        net.publish("web-1", 8080, 81, Proto::Tcp).unwrap();
        let ports = net.host().ports("cca").unwrap();
        assert!(ports.contains(&PortMapping {
            proto: Proto::Tcp,
            host_port: 8080,
            address: a,
            container_port: 81,
        }));
        assert_eq!(ports.len(), 2);
    }

    #[test]
    fn detach_removes_everything_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.attach("web-1").unwrap();
        net.publish("web-1", 8080, 80, Proto::Tcp).unwrap();
        net.detach("web-1").unwrap();
        assert!(net.leases().is_empty());
        assert!(net.ports_of("web-1").is_empty());
        assert_eq!(net.host().ports("cca").unwrap().len(), 0);
        assert!(net.host().namespaces().is_empty());
        assert_eq!(net.host().links(), BTreeSet::from(["cca0".to_owned()]));
        net.detach("web-1").unwrap();
        net.detach("never-attached").unwrap();
    }

    #[test]
    fn failed_detach_keeps_the_lease_for_a_retry() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.attach("web-1").unwrap();
        net.publish("web-1", 8080, 80, Proto::Tcp).unwrap();
        net.host().fail("delete_port");
        assert!(net.detach("web-1").is_err());
        assert!(net.leases().contains_key("web-1"));
        assert_eq!(net.ports_of("web-1").len(), 1);
        net.host().heal("delete_port");
        net.detach("web-1").unwrap();
        assert!(net.leases().is_empty());
    }

    #[test]
    fn restart_keeps_leases_and_republishes_ports() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        let a = net.attach("web-1").unwrap();
        let mapping = net.publish("web-1", 8080, 80, Proto::Tcp).unwrap();
        drop(net);

        let net = open(dir.path());
        assert_eq!(net.attachment_of("web-1"), Some(a.clone()));
        assert!(
            net.host()
                .calls()
                .contains(&Call::AddPort("cca".into(), mapping))
        );
        // A fresh host (a reboot): attach recreates with the same address.
        assert_eq!(net.attach("web-1").unwrap(), a);
        assert_eq!(
            net.attach("web-2").unwrap().address,
            Ipv4Addr::new(10, 88, 0, 3)
        );
    }

    #[test]
    fn a_changed_subnet_or_broken_state_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        open(dir.path()).attach("web-1").unwrap();
        let mut other = config(dir.path());
        other.subnet = "10.88.1.0/24".parse().unwrap();
        let error = NodeNetwork::open(other, FakeHost::new()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("holds leases in 10.88.0.0/24, but the node subnet is 10.88.1.0/24"),
            "{error}"
        );
        fs::write(dir.path().join(STATE_FILE), "{").unwrap();
        let error = NodeNetwork::open(config(dir.path()), FakeHost::new()).unwrap_err();
        assert!(error.to_string().contains("is not valid"), "{error}");
    }

    #[test]
    fn cleanup_orphans_removes_unknown_instances_and_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.attach("keep").unwrap();
        net.attach("gone").unwrap();
        net.publish("gone", 9000, 80, Proto::Tcp).unwrap();
        net.host().leave_netns("cca-crashed");
        net.host().leave_netns("someone-else");
        let stray = net.config().veth_name("crashed");
        net.host().leave_link(&stray);
        net.host().leave_link("vccanothex");
        let stale = PortMapping {
            proto: Proto::Udp,
            host_port: 53,
            address: Ipv4Addr::new(10, 88, 0, 99),
            container_port: 53,
        };
        net.host().add_port("cca", &stale).unwrap();

        let report = net.cleanup_orphans(["keep"]).unwrap();
        assert_eq!(
            report,
            CleanupReport {
                instances: vec!["gone".into()],
                netns: vec!["cca-crashed".into()],
                links: vec![stray],
                ports: vec![stale],
            }
        );
        assert_eq!(net.leases().keys().collect::<Vec<_>>(), vec!["keep"]);
        assert!(net.host().namespaces().contains("someone-else"));
        assert!(net.host().links().contains("vccanothex"));
        assert_eq!(
            net.cleanup_orphans(["keep"]).unwrap(),
            CleanupReport::default()
        );
    }

    #[test]
    fn destroy_removes_table_bridge_and_state() {
        let dir = tempfile::tempdir().unwrap();
        let net = open(dir.path());
        net.attach("web-1").unwrap();
        let path = net.state_path().to_owned();
        assert!(path.exists());
        net.destroy().unwrap();
        assert!(!path.exists());
        assert!(net.leases().is_empty());
        assert!(net.host().links().is_empty());
        assert!(net.host().namespaces().is_empty());
        assert_eq!(net.host().ports("cca"), None);
    }
}
