//! Cluster networking vocabulary: IPv4 prefixes ([`Ipv4Net`]), the address
//! facts the network controller allocates (a subnet per node, a virtual IP
//! per service, each an [`Allocation`]), and the [`NetworkMap`]: the one
//! picture of the cluster's network every node programs its data plane
//! (overlay routes, VIP rules, policy sets) and answers DNS from. The map
//! changes by [`NetworkChange`]s, so a node's rules and its DNS answers
//! always come from the same view of the facts.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;
use crate::spec::{GateSpec, NetworkPolicy, PortSpec, Protocol};

/// The DNS zone services are named in: `{svc}.cca.local`.
pub const DNS_ZONE: &str = "cca.local";
/// The port cluster DNS servers listen on (nodes and servers alike).
pub const DNS_PORT: u16 = 15353;

/// An IPv4 prefix, `10.42.0.0/16`, always held as its network address (the
/// host bits are zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    network: Ipv4Addr,
    prefix: u8,
}

/// Why a prefix did not parse or does not fit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("{text:?} is not an IPv4 prefix: write it as ADDRESS/LENGTH, e.g. 10.42.0.0/16")]
    Syntax { text: String },
    #[error("{text:?}: the prefix length must be 0-32")]
    Length { text: String },
    #[error("{text:?} has host bits set: its network is {network}")]
    HostBits { text: String, network: Ipv4Net },
    #[error("/{per} subnets do not fit in {pool}: give a longer subnet length than /{pool_len}", pool_len = pool.prefix())]
    SubnetTooLarge { pool: Ipv4Net, per: u8 },
    #[error("/{per} subnets hold no instance addresses: use /30 or shorter")]
    SubnetTooSmall { per: u8 },
}

impl Ipv4Net {
    /// The prefix of `address` with `prefix` bits; host bits are cleared.
    pub fn new(address: Ipv4Addr, prefix: u8) -> Result<Ipv4Net, NetError> {
        if prefix > 32 {
            return Err(NetError::Length {
                text: format!("{address}/{prefix}"),
            });
        }
        Ok(Ipv4Net {
            network: Ipv4Addr::from(u32::from(address) & mask(prefix)),
            prefix,
        })
    }

    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// How many addresses the prefix spans (2^(32 - prefix)).
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    pub fn contains(&self, address: Ipv4Addr) -> bool {
        u32::from(address) & mask(self.prefix) == u32::from(self.network)
    }

    /// Whether the two prefixes share any address.
    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        self.contains(other.network) || other.contains(self.network)
    }

    /// The `index`th address of the prefix (0 is the network address).
    pub fn nth(&self, index: u64) -> Option<Ipv4Addr> {
        (index < self.size()).then(|| Ipv4Addr::from(u32::from(self.network) + index as u32))
    }

    /// The offset of `address` in the prefix, if it is inside.
    pub fn index_of(&self, address: Ipv4Addr) -> Option<u64> {
        self.contains(address)
            .then(|| u64::from(u32::from(address) - u32::from(self.network)))
    }

    /// How many `/per` subnets the prefix splits into.
    pub fn subnet_count(&self, per: u8) -> Result<u64, NetError> {
        if per < self.prefix || per > 32 {
            return Err(NetError::SubnetTooLarge { pool: *self, per });
        }
        if per > 30 {
            return Err(NetError::SubnetTooSmall { per });
        }
        Ok(1u64 << (per - self.prefix))
    }

    /// The `index`th `/per` subnet of the prefix.
    pub fn subnet(&self, per: u8, index: u64) -> Option<Ipv4Net> {
        let count = self.subnet_count(per).ok()?;
        (index < count).then(|| Ipv4Net {
            network: Ipv4Addr::from(u32::from(self.network) + ((index as u32) << (32 - per))),
            prefix: per,
        })
    }

    /// Which `/per` subnet of the prefix `subnet` is, if it is one.
    pub fn subnet_index(&self, per: u8, subnet: &Ipv4Net) -> Option<u64> {
        (subnet.prefix == per && self.contains(subnet.network))
            .then(|| {
                self.index_of(subnet.network)
                    .map(|offset| offset >> (32 - per))
            })
            .flatten()
    }

    /// The node bridge's address in a node subnet: the first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }
}

fn mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        bits => u32::MAX << (32 - u32::from(bits)),
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = NetError;

    /// Parses `A.B.C.D/LEN`, refusing host bits (`10.42.0.1/16` is a typo
    /// for something, and guessing which is worse than asking).
    fn from_str(text: &str) -> Result<Ipv4Net, NetError> {
        let syntax = || NetError::Syntax {
            text: text.to_owned(),
        };
        let (address, prefix) = text.trim().split_once('/').ok_or_else(syntax)?;
        let address: Ipv4Addr = address.parse().map_err(|_| syntax())?;
        let prefix: u8 = prefix.parse().map_err(|_| syntax())?;
        let net = Ipv4Net::new(address, prefix).map_err(|_| NetError::Length {
            text: text.to_owned(),
        })?;
        if net.network != address {
            return Err(NetError::HostBits {
                text: text.to_owned(),
                network: net,
            });
        }
        Ok(net)
    }
}

impl Serialize for Ipv4Net {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Net {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An address the network controller gave out, given back, or could not
/// give: the value of `derived/subnet/{node}` and `derived/vip/{service}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Allocation<A> {
    /// In use by its owner.
    Held { address: A },
    /// Its owner is gone; the address is not given to anyone else until no
    /// node may still route to it (see the network controller).
    Released { address: A, at: Millis },
    /// The pool had no free address when the owner asked; retried whenever
    /// an address is freed.
    Exhausted { pool: Ipv4Net, since: Millis },
}

impl<A> Allocation<A> {
    /// The address while its owner holds it.
    pub fn held(&self) -> Option<&A> {
        match self {
            Allocation::Held { address } => Some(address),
            _ => None,
        }
    }

    /// The address, held or released: either way nobody else may have it.
    pub fn reserved(&self) -> Option<&A> {
        match self {
            Allocation::Held { address } | Allocation::Released { address, .. } => Some(address),
            Allocation::Exhausted { .. } => None,
        }
    }
}

/// `derived/subnet/{node}`: the slice of the cluster CIDR a node's
/// instances take their addresses from.
pub type NodeSubnet = Allocation<Ipv4Net>;
/// `derived/vip/{service}`: the service's virtual IP, from the service CIDR.
pub type ServiceVip = Allocation<Ipv4Addr>;

/// How a service's VIP spreads new flows over its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Affinity {
    /// Each new flow to any backend, uniformly at random.
    #[default]
    None,
    /// Flows from one client address go to the same backend while the set
    /// of backends is unchanged (a hash of the source address).
    ClientIp,
}

/// One node as every other node routes to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRoute {
    pub node: String,
    /// Where its instances live.
    pub subnet: Ipv4Net,
    /// Where the overlay reaches it: the address its VXLAN tunnel ends at.
    pub underlay: Ipv4Addr,
    /// False while the node controller holds it unreachable.
    pub ready: bool,
}

/// One service as the data plane and DNS see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceNet {
    pub name: String,
    /// `None` until the network controller allocates one (or while the
    /// service CIDR is exhausted): no VIP rules and no DNS name then.
    pub vip: Option<Ipv4Addr>,
    pub ports: Vec<PortSpec>,
    pub affinity: Affinity,
    /// Ready backends per port, by port key (the port's name, or its
    /// number when it has none), as the endpoint controller wrote them.
    pub endpoints: BTreeMap<String, Vec<Target>>,
    /// Every placed instance that has an address, ready or not: network
    /// policy matches flows by these, and DNS names a stateful service's
    /// ordinals by them.
    pub members: Vec<Member>,
    /// The service scales to zero and sleeps now: it has no backends
    /// because it is asleep, not broken, so a gate holds its requests and
    /// asks the control plane to wake it instead of answering 503.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asleep: bool,
    /// Its idle window in ms (`scale_to_zero`); `None`: it never sleeps.
    /// A woken service has no backends until its first instance is ready:
    /// a gate keeps holding requests for one that has a window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_to_zero: Option<crate::cluster::Millis>,
}

impl ServiceNet {
    /// The backends of `port`, if the service has such a port.
    pub fn targets(&self, port: &PortSpec) -> &[Target] {
        let key = port.name.clone().unwrap_or_else(|| port.number.to_string());
        self.endpoints.get(&key).map_or(&[], Vec::as_slice)
    }
}

/// Where a VIP port's flows may go: an instance's address and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Target {
    pub instance: String,
    pub node: String,
    pub address: Ipv4Addr,
    pub port: u16,
}

/// A placed instance with an address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Member {
    pub instance: String,
    pub node: String,
    pub address: Ipv4Addr,
    /// The ordinal of a stateful service's instance: DNS answers
    /// `{svc}-{k}.{svc}.cca.local` with its address.
    pub ordinal: Option<u32>,
    /// The instance shares its node's network (a process, or a container
    /// that asked for the host's network): its address is the node's, so
    /// policy cannot tell it from the node's other host-network instances.
    pub host_network: bool,
}

/// The cluster's address ranges, as the control plane allocates from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressRanges {
    /// Node subnets come from it.
    pub cluster: Ipv4Net,
    /// Service VIPs come from it: every node routes it to its bridge, so
    /// a host process's flow to a VIP has a route (and is DNATed) even on
    /// a host without a default route.
    pub services: Ipv4Net,
    /// The cluster's flow-hash seed ([`FlowHashSeed`]); `None` from a
    /// server that has none (nodes then use one of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_hash_seed: Option<u64>,
}

/// `meta/flow-hash-seed`: the seed every node's eBPF data plane hashes
/// flows with, so every node picks the same backend for a flow and a
/// client cannot choose source ports that pile onto one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowHashSeed {
    pub seed: u64,
}

/// One change to a [`NetworkMap`]: a whole entry put or removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum NetworkChange {
    Ranges(AddressRanges),
    Node(NodeRoute),
    NodeGone {
        node: String,
    },
    Service(Arc<ServiceNet>),
    ServiceGone {
        service: String,
    },
    Policy(Arc<NetworkPolicy>),
    PolicyGone {
        policy: String,
    },
    /// A gate: what gate nodes route external traffic by.
    Gate(Arc<GateSpec>),
    GateGone {
        gate: String,
    },
}

/// The network as one node sees it: every node's subnet, every service's
/// VIP, ports, backends and members, every policy. Maps are persistent, so a
/// clone (a snapshot for the DNS server) costs nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkMap {
    /// `None` from a control plane that does not say.
    pub ranges: Option<AddressRanges>,
    pub nodes: imbl::OrdMap<String, NodeRoute>,
    pub services: imbl::OrdMap<String, Arc<ServiceNet>>,
    pub policies: imbl::OrdMap<String, Arc<NetworkPolicy>>,
    pub gates: imbl::OrdMap<String, Arc<GateSpec>>,
}

/// Which entries a batch of changes touched, for a data plane that
/// updates only those.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub ranges: bool,
    pub nodes: std::collections::BTreeSet<String>,
    pub services: std::collections::BTreeSet<String>,
    pub policies: bool,
    pub gates: bool,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        !self.ranges
            && self.nodes.is_empty()
            && self.services.is_empty()
            && !self.policies
            && !self.gates
    }
}

impl NetworkMap {
    /// Applies `change`, noting what it touched in `touched` (a put equal
    /// to what is held touches nothing). True when it changed the map.
    pub fn apply(&mut self, change: NetworkChange, touched: &mut Touched) -> bool {
        match change {
            NetworkChange::Ranges(ranges) => {
                let changed = self.ranges != Some(ranges);
                self.ranges = Some(ranges);
                touched.ranges |= changed;
                changed
            }
            NetworkChange::Node(route) => {
                let changed = self.nodes.get(&route.node) != Some(&route);
                if changed {
                    touched.nodes.insert(route.node.clone());
                    self.nodes.insert(route.node.clone(), route);
                }
                changed
            }
            NetworkChange::NodeGone { node } => {
                let changed = self.nodes.remove(&node).is_some();
                if changed {
                    touched.nodes.insert(node);
                }
                changed
            }
            NetworkChange::Service(service) => {
                let changed = self.services.get(&service.name) != Some(&service);
                if changed {
                    touched.services.insert(service.name.clone());
                    self.services.insert(service.name.clone(), service);
                }
                changed
            }
            NetworkChange::ServiceGone { service } => {
                let changed = self.services.remove(&service).is_some();
                if changed {
                    touched.services.insert(service);
                }
                changed
            }
            NetworkChange::Policy(policy) => {
                let changed = self.policies.get(&policy.name) != Some(&policy);
                if changed {
                    touched.policies = true;
                    self.policies.insert(policy.name.clone(), policy);
                }
                changed
            }
            NetworkChange::PolicyGone { policy } => {
                let changed = self.policies.remove(&policy).is_some();
                touched.policies |= changed;
                changed
            }
            NetworkChange::Gate(gate) => {
                let changed = self.gates.get(&gate.name) != Some(&gate);
                if changed {
                    touched.gates = true;
                    self.gates.insert(gate.name.clone(), gate);
                }
                changed
            }
            NetworkChange::GateGone { gate } => {
                let changed = self.gates.remove(&gate).is_some();
                touched.gates |= changed;
                changed
            }
        }
    }

    /// The entries that differ between `before` and this map: what a data
    /// plane that last programmed `before` must update. Cheap when the two
    /// share most entries (each shared service compares by pointer).
    pub fn touched_since(&self, before: &NetworkMap) -> Touched {
        let mut touched = Touched {
            ranges: before.ranges != self.ranges,
            ..Touched::default()
        };
        for item in before.nodes.diff(&self.nodes) {
            touched.nodes.insert(diff_key(item).clone());
        }
        for item in before.services.diff(&self.services) {
            touched.services.insert(diff_key(item).clone());
        }
        touched.policies = before.policies != self.policies;
        touched.gates = before.gates != self.gates;
        touched
    }

    /// Every entry, as a data plane starting from nothing must program it.
    pub fn everything(&self) -> Touched {
        Touched {
            ranges: true,
            nodes: self.nodes.keys().cloned().collect(),
            services: self.services.keys().cloned().collect(),
            policies: true,
            gates: true,
        }
    }

    /// Every entry as a change: what a follower starting from nothing
    /// applies to get this map.
    pub fn changes(&self) -> Vec<NetworkChange> {
        let ranges = self.ranges.map(NetworkChange::Ranges);
        let nodes = self.nodes.values().cloned().map(NetworkChange::Node);
        let services = self.services.values().cloned().map(NetworkChange::Service);
        let policies = self.policies.values().cloned().map(NetworkChange::Policy);
        let gates = self.gates.values().cloned().map(NetworkChange::Gate);
        ranges
            .into_iter()
            .chain(nodes)
            .chain(services)
            .chain(policies)
            .chain(gates)
            .collect()
    }

    /// The service whose VIP is `address`.
    pub fn service_by_vip(&self, address: Ipv4Addr) -> Option<&Arc<ServiceNet>> {
        self.services
            .values()
            .find(|service| service.vip == Some(address))
    }
}

fn diff_key<'a, V>(item: imbl::ordmap::DiffItem<'a, 'a, String, V>) -> &'a String {
    match item {
        imbl::ordmap::DiffItem::Add(key, _)
        | imbl::ordmap::DiffItem::Remove(key, _)
        | imbl::ordmap::DiffItem::Update { new: (key, _), .. } => key,
    }
}

/// The DNS name of a service's VIP: `{svc}.cca.local`.
pub fn service_name(service: &str) -> String {
    format!("{service}.{DNS_ZONE}")
}

/// The SRV owner name of a named port: `_{port}._{proto}.{svc}.cca.local`.
pub fn srv_name(service: &str, port: &str, protocol: Protocol) -> String {
    let proto = match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    format!("_{port}._{proto}.{service}.{DNS_ZONE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> Ipv4Net {
        text.parse().expect("a prefix")
    }

    #[test]
    fn prefixes_parse_print_and_refuse_typos() {
        assert_eq!(net("10.42.0.0/16").to_string(), "10.42.0.0/16");
        assert_eq!(net("0.0.0.0/0").size(), 1 << 32);
        let host_bits = "10.42.0.1/16".parse::<Ipv4Net>().unwrap_err();
        assert_eq!(
            host_bits.to_string(),
            "\"10.42.0.1/16\" has host bits set: its network is 10.42.0.0/16"
        );
        assert!(matches!(
            "10.42.0.0".parse::<Ipv4Net>(),
            Err(NetError::Syntax { .. })
        ));
        assert!(matches!(
            "10.42.0.0/33".parse::<Ipv4Net>(),
            Err(NetError::Length { .. })
        ));
        let json = serde_json::to_string(&net("10.43.0.0/16")).unwrap();
        assert_eq!(json, "\"10.43.0.0/16\"");
        assert_eq!(
            serde_json::from_str::<Ipv4Net>(&json).unwrap(),
            net("10.43.0.0/16")
        );
    }

    #[test]
    fn subnets_split_the_pool_and_index_back() {
        let pool = net("10.42.0.0/16");
        assert_eq!(pool.subnet_count(24), Ok(256));
        assert_eq!(pool.subnet(24, 3), Some(net("10.42.3.0/24")));
        assert_eq!(pool.subnet(24, 256), None);
        assert_eq!(pool.subnet_index(24, &net("10.42.3.0/24")), Some(3));
        assert_eq!(pool.subnet_index(24, &net("10.41.3.0/24")), None);
        assert_eq!(net("10.42.3.0/24").gateway(), Ipv4Addr::new(10, 42, 3, 1));
        assert!(matches!(
            pool.subnet_count(8),
            Err(NetError::SubnetTooLarge { .. })
        ));
        assert!(matches!(
            pool.subnet_count(31),
            Err(NetError::SubnetTooSmall { .. })
        ));
        assert!(pool.overlaps(&net("10.42.7.0/24")));
        assert!(!pool.overlaps(&net("10.43.0.0/16")));
    }

    #[test]
    fn addresses_index_both_ways() {
        let pool = net("10.43.0.0/16");
        assert_eq!(pool.nth(258), Some(Ipv4Addr::new(10, 43, 1, 2)));
        assert_eq!(pool.index_of(Ipv4Addr::new(10, 43, 1, 2)), Some(258));
        assert_eq!(pool.nth(1 << 16), None);
        assert_eq!(pool.index_of(Ipv4Addr::new(10, 44, 0, 0)), None);
    }

    #[test]
    fn a_map_reports_only_real_changes() {
        let mut map = NetworkMap::default();
        let route = NodeRoute {
            node: "n1".into(),
            subnet: net("10.42.1.0/24"),
            underlay: Ipv4Addr::new(192, 168, 0, 1),
            ready: true,
        };
        let mut touched = Touched::default();
        map.apply(NetworkChange::Node(route.clone()), &mut touched);
        assert_eq!(touched.nodes.len(), 1);
        let mut again = Touched::default();
        map.apply(NetworkChange::Node(route), &mut again);
        assert!(again.is_empty());
        map.apply(NetworkChange::NodeGone { node: "n1".into() }, &mut again);
        assert!(map.nodes.is_empty());
        assert!(again.nodes.contains("n1"));
    }

    #[test]
    fn a_map_says_what_changed_since_another() {
        let mut before = NetworkMap::default();
        let service = |name: &str, vip: u8| {
            Arc::new(ServiceNet {
                name: name.into(),
                vip: Some(Ipv4Addr::new(10, 43, 0, vip)),
                ports: vec![],
                affinity: Affinity::None,
                endpoints: BTreeMap::new(),
                members: vec![],
                asleep: false,
                scale_to_zero: None,
            })
        };
        let mut ignored = Touched::default();
        for name in ["a", "b", "c"] {
            before.apply(NetworkChange::Service(service(name, 1)), &mut ignored);
        }
        let mut after = before.clone();
        after.apply(NetworkChange::Service(service("b", 2)), &mut ignored);
        after.apply(
            NetworkChange::ServiceGone {
                service: "c".into(),
            },
            &mut ignored,
        );
        after.apply(NetworkChange::Service(service("d", 3)), &mut ignored);
        let touched = after.touched_since(&before);
        assert_eq!(
            touched.services.into_iter().collect::<Vec<_>>(),
            ["b", "c", "d"]
        );
        assert!(touched.nodes.is_empty() && !touched.policies);
        assert_eq!(before.everything().services.len(), 3);
    }

    #[test]
    fn allocations_say_what_is_reserved() {
        let held: ServiceVip = Allocation::Held {
            address: Ipv4Addr::new(10, 43, 0, 1),
        };
        let json = serde_json::to_value(&held).unwrap();
        assert_eq!(json["state"], "held");
        let released: ServiceVip = Allocation::Released {
            address: Ipv4Addr::new(10, 43, 0, 1),
            at: 5,
        };
        assert_eq!(released.held(), None);
        assert_eq!(released.reserved(), Some(&Ipv4Addr::new(10, 43, 0, 1)));
    }
}

/// One target of a gate as a gate node sees it now (`cca describe gate`):
/// the path prefix that leads to it (`None`: the gate's own target), and
/// its backends with their health on that node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateTargetHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    pub service: String,
    pub port: u16,
    pub backends: Vec<GateBackendHealth>,
}

/// A backend of a gate's target on one gate node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateBackendHealth {
    pub target: Target,
    /// Requests from this gate node in flight to it.
    pub in_flight: u32,
    pub state: BackendState,
}

/// What a gate node's circuit breaker holds of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BackendState {
    Healthy,
    /// Ejected for this many more milliseconds.
    Ejected {
        for_ms: u64,
    },
    /// Its ejection is over; the next request probes it.
    Probing,
}
