//! The pure compiler from [`NetworkMap`] entries to nftables commands, no
//! IO. [`ServiceState`] and [`PolicyState`] are what one service and the
//! policies put in the table; [`Programmed`] is what the table holds now
//! and turns a change of one entry into the commands that make the table
//! hold the new state — and nothing else. A full rebuild is the same
//! updates applied to an empty [`Programmed`] after the [`skeleton`], so
//! both paths share every rule the compiler writes.
//!
//! A service's VIP ports are map elements only: `services` sends a port
//! with N backends to a chain shared by every port with N backends, which
//! picks an index and DNATs through the maps `addr-{i}`/`port-{i}` keyed
//! by the port. So an endpoint change is a few element changes, whatever
//! the number of services: no rule, no chain per service (nft fetches
//! every chain of the ruleset before each transaction, and the kernel
//! revalidates jumps on every rule change, both growing with chains).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use nftables::expr::{CTDir, Expression, MetaKey};
use nftables::schema::SetType;
use nftables::stmt::{Operator, Statement};
use nftables::types::{NfChainType, NfHook};

use cca_model::net::{Affinity, NetworkMap, ServiceNet};
use cca_model::spec::{NetworkPolicy, Peer, Protocol, RuleAction};

use super::batch::{
    Batch, Hook, accept, address, anonymous_set, concat, ct, dnat, equals, fib_saddr_type, goto,
    goto_verdict, jump, l4proto, lookup, mapping, masquerade, matches, meta, number, payload,
    port_unreachable, protocol_name, random, reset, set_ref, source_hash, string, vmap, vmap_goto,
};
use super::kernel::UdpCleanup;
use super::names;

/// What each VIP port of `service` balances over: its ready backends,
/// sorted and without duplicates; nothing while the service has no VIP.
/// Both data planes (nftables, eBPF) program from this.
pub(crate) fn vip_ports(service: &ServiceNet) -> BTreeMap<PortKey, PortState> {
    let mut ports = BTreeMap::new();
    if service.vip.is_none() {
        return ports;
    }
    for spec in &service.ports {
        let key = PortKey {
            protocol: spec.protocol,
            port: spec.number,
        };
        // A port written twice keeps its first endpoints.
        ports.entry(key).or_insert_with(|| {
            let mut backends: Vec<Backend> = service
                .targets(spec)
                .iter()
                .map(|target| (target.address, target.port))
                .collect();
            backends.sort_unstable();
            backends.dedup();
            PortState {
                backends,
                affinity: service.affinity,
            }
        });
    }
    ports
}

/// Where a VIP port sends flows: an instance's address and port.
pub(crate) type Backend = (Ipv4Addr, u16);

/// A VIP port: protocol and number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PortKey {
    pub protocol: Protocol,
    pub port: u16,
}

/// What one VIP port balances over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PortState {
    /// Sorted, so nothing changes when only the order of the endpoint
    /// list does (and `jhash` keeps mapping clients alike).
    pub backends: Vec<Backend>,
    pub affinity: Affinity,
}

/// How a port with backends picks one: the dispatch chain it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Dispatch {
    pub by_client: bool,
    pub protocol: Protocol,
    pub count: usize,
}

impl PortState {
    /// The dispatch of this port; `None` without backends (refused).
    fn dispatch(&self, protocol: Protocol) -> Option<Dispatch> {
        let count = self.backends.len();
        (count > 0).then_some(Dispatch {
            // One backend needs no choice, however it would be made.
            by_client: self.affinity == Affinity::ClientIp && count > 1,
            protocol,
            count,
        })
    }

    /// The chain the `services` map sends this port to.
    fn target(&self, protocol: Protocol) -> String {
        match self.dispatch(protocol) {
            Some(d) => names::dispatch_chain(d.by_client, d.protocol, d.count),
            None => names::refuse_chain(protocol),
        }
    }
}

/// What one service puts in the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServiceState {
    pub vip: Option<Ipv4Addr>,
    /// Empty while the service has no VIP.
    pub ports: BTreeMap<PortKey, PortState>,
    /// Every member's address but host-network ones (policy sets).
    pub members: BTreeSet<Ipv4Addr>,
    /// The members on this node, host-network ones aside.
    pub local: BTreeSet<Ipv4Addr>,
}

impl ServiceState {
    /// The state of `service` as node `node` programs it.
    pub(crate) fn of(service: &ServiceNet, node: &str) -> ServiceState {
        let plain = service.members.iter().filter(|m| !m.host_network);
        ServiceState {
            vip: service.vip,
            ports: vip_ports(service),
            members: plain.clone().map(|m| m.address).collect(),
            local: plain
                .filter(|m| m.node == node)
                .map(|m| m.address)
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.vip.is_none() && self.members.is_empty()
    }

    /// The addresses policy knows the service by: its members' and its VIP.
    fn addresses(&self) -> BTreeSet<Ipv4Addr> {
        self.members.iter().copied().chain(self.vip).collect()
    }

    fn vmap_keys(&self) -> impl Iterator<Item = (Ipv4Addr, PortKey)> + '_ {
        self.vip
            .into_iter()
            .flat_map(|vip| self.ports.keys().map(move |key| (vip, *key)))
    }
}

/// One policy rule, as the table holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RuleState {
    pub action: RuleAction,
    /// `None`: any source.
    pub from: Option<String>,
    /// `None`: any service's member.
    pub to: Option<String>,
    /// Sorted; empty means every port.
    pub ports: Vec<u16>,
    pub protocol: Option<Protocol>,
}

/// The policy rules in the order they are judged, and the services they
/// name (each has a member set).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PolicyState {
    pub rules: Vec<RuleState>,
    pub services: BTreeSet<String>,
}

impl PolicyState {
    /// Every policy's rules, policies in name order, rules as written.
    pub(crate) fn of<'a>(policies: impl IntoIterator<Item = &'a NetworkPolicy>) -> PolicyState {
        let mut state = PolicyState::default();
        for policy in policies {
            for rule in &policy.rules {
                let peer = |peer: &Peer| match peer {
                    Peer::Any => None,
                    Peer::Service(name) => Some(name.clone()),
                };
                let (from, to) = (peer(&rule.from), peer(&rule.to));
                state.services.extend(from.iter().chain(&to).cloned());
                let mut ports = rule.ports.clone();
                ports.sort_unstable();
                ports.dedup();
                state.rules.push(RuleState {
                    action: rule.action,
                    from,
                    to,
                    ports,
                    protocol: rule.protocol,
                });
            }
        }
        state
    }

    pub(crate) fn of_map(map: &NetworkMap) -> PolicyState {
        PolicyState::of(map.policies.values().map(|policy| policy.as_ref()))
    }
}

/// How many services hold an address in one shared set: the element goes
/// in with the first and out with the last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts(BTreeMap<Ipv4Addr, usize>);

impl Counts {
    /// True when `address` just entered.
    fn add(&mut self, address: Ipv4Addr) -> bool {
        let count = self.0.entry(address).or_default();
        *count += 1;
        *count == 1
    }

    /// True when `address` just left.
    fn remove(&mut self, address: Ipv4Addr) -> bool {
        match self.0.get_mut(&address) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                self.0.remove(&address);
                true
            }
            None => false,
        }
    }
}

/// What the table holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Programmed {
    pub services: BTreeMap<String, ServiceState>,
    /// Which service a `VIP . proto . port` key is programmed for.
    owners: BTreeMap<(Ipv4Addr, PortKey), String>,
    vips: Counts,
    members: Counts,
    local: Counts,
    /// How many VIP ports use each dispatch chain: the shared chains and
    /// maps exist while some port needs them.
    dispatch: BTreeMap<Dispatch, usize>,
    pub policy: PolicyState,
}

/// The hooks and priorities of the base chains: DNAT before the routing
/// decision (`dstnat`, -100), masquerade after it (`srcnat`, 100), policy
/// just before DNAT (-110): a flow to a VIP is judged by the VIP's service
/// and ports, and a refusal then comes from the VIP the client asked (a
/// reset sent after DNAT would come from the backend's address, which the
/// client does not know, and would be ignored).
const HOOK_NAT_PREROUTING: Hook = Hook {
    kind: NfChainType::NAT,
    hook: NfHook::Prerouting,
    priority: -100,
};
const HOOK_NAT_OUTPUT: Hook = Hook {
    kind: NfChainType::NAT,
    hook: NfHook::Output,
    priority: -100,
};
const HOOK_NAT_POSTROUTING: Hook = Hook {
    kind: NfChainType::NAT,
    hook: NfHook::Postrouting,
    priority: 100,
};
const HOOK_FILTER_PREROUTING: Hook = Hook {
    kind: NfChainType::Filter,
    hook: NfHook::Prerouting,
    priority: -110,
};
const HOOK_FILTER_OUTPUT: Hook = Hook {
    kind: NfChainType::Filter,
    hook: NfHook::Output,
    priority: -110,
};

/// The table with its fixed objects and empty sets: what every state is
/// built on. Appended to `batch` after it replaced the old table.
pub(crate) fn skeleton(batch: &mut Batch) {
    use names::{
        HAIRPIN, LOCAL, MEMBERS, POLICY, POLICY_DENY, POLICY_OUTPUT, POLICY_PREROUTING, SERVICES,
        VIPS,
    };
    batch.add_table();
    batch.add_set(VIPS, &[SetType::Ipv4Addr]);
    batch.add_set(HAIRPIN, &[SetType::Ipv4Addr, SetType::Ipv4Addr]);
    batch.add_set(LOCAL, &[SetType::Ipv4Addr]);
    batch.add_set(MEMBERS, &[SetType::Ipv4Addr]);
    batch.add_verdict_map(
        SERVICES,
        &[SetType::Ipv4Addr, SetType::InetProto, SetType::InetService],
    );
    batch.add_chain(POLICY, None);
    batch.add_chain(POLICY_DENY, None);
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let refuse = names::refuse_chain(protocol);
        batch.add_chain(&refuse, None);
        let refusal = match protocol {
            Protocol::Tcp => reset(),
            Protocol::Udp => port_unreachable(),
        };
        batch.add_rule(&refuse, vec![l4proto(protocol), refusal]);
    }
    batch.add_chain(names::NAT_PREROUTING, Some(HOOK_NAT_PREROUTING));
    batch.add_chain(names::NAT_OUTPUT, Some(HOOK_NAT_OUTPUT));
    batch.add_chain(names::NAT_POSTROUTING, Some(HOOK_NAT_POSTROUTING));
    batch.add_chain(POLICY_PREROUTING, Some(HOOK_FILTER_PREROUTING));
    batch.add_chain(POLICY_OUTPUT, Some(HOOK_FILTER_OUTPUT));

    // One lookup per new flow, however many services there are.
    batch.add_rule(names::NAT_PREROUTING, vec![vmap(port_key(), SERVICES)]);
    batch.add_rule(names::NAT_OUTPUT, vec![vmap(port_key(), SERVICES)]);

    let ours = || {
        vec![
            matches(ct("status", None), Operator::IN, string("dnat")),
            equals(ct("ip daddr", Some(CTDir::Original)), set_ref(VIPS)),
        ]
    };
    // Hairpin: a member DNATed back to itself would see its own address as
    // the source and drop the packet as a martian.
    let mut hairpin = ours();
    hairpin.push(equals(
        concat(vec![payload("ip", "saddr"), payload("ip", "daddr")]),
        set_ref(HAIRPIN),
    ));
    hairpin.push(masquerade());
    batch.add_rule(names::NAT_POSTROUTING, hairpin);
    // This node's processes: their source is whatever address routing
    // picked for the VIP (the underlay's, say), which a target behind the
    // overlay or the bridge may not route back to this node; the outgoing
    // interface's address always comes back.
    let mut host = ours();
    host.push(equals(fib_saddr_type(), string("local")));
    host.push(matches(meta(MetaKey::Oifname), Operator::NEQ, string("lo")));
    host.push(masquerade());
    batch.add_rule(names::NAT_POSTROUTING, host);

    // Every new flow arriving, bridged between this node's containers
    // (br_netfilter passes them through the IPv4 hooks) or routed.
    let new_flow = || matches(ct("state", None), Operator::IN, string("new"));
    batch.add_rule(POLICY_PREROUTING, vec![new_flow(), jump(POLICY)]);
    // The node always reaches the instances it runs (the agent probes
    // their health); other flows it opens are judged like anyone's.
    batch.add_rule(
        POLICY_OUTPUT,
        vec![equals(payload("ip", "daddr"), set_ref(LOCAL)), accept()],
    );
    batch.add_rule(POLICY_OUTPUT, vec![new_flow(), jump(POLICY)]);
    batch.add_rule(POLICY_DENY, vec![l4proto(Protocol::Tcp), reset()]);
    batch.add_rule(POLICY_DENY, vec![port_unreachable()]);
}

/// `ip daddr . meta l4proto . th dport`: the key of a VIP port.
fn port_key() -> Expression<'static> {
    concat(vec![
        payload("ip", "daddr"),
        meta(MetaKey::L4proto),
        payload("th", "dport"),
    ])
}

/// The rule of a dispatch chain: pick one of `count` slots, uniformly at
/// random or by a hash of the client's address.
fn dispatch_rule(dispatch: Dispatch) -> Vec<Statement<'static>> {
    let slots: Vec<String> = (0..dispatch.count)
        .map(|i| names::slot_chain(dispatch.protocol, i))
        .collect();
    if let [only] = slots.as_slice() {
        return vec![goto(only)];
    }
    let index = if dispatch.by_client {
        source_hash(dispatch.count as u32, 0)
    } else {
        random(dispatch.count as u32)
    };
    vec![vmap_goto(index, &slots)]
}

/// The rule of a slot chain: DNAT to the port's `index`th backend.
fn slot_rule(protocol: Protocol, index: usize) -> Vec<Statement<'static>> {
    vec![
        l4proto(protocol),
        dnat(
            lookup(port_key(), &names::address_map(index)),
            lookup(port_key(), &names::port_map(index)),
        ),
    ]
}

/// What the shared dispatch objects are for a set of dispatches in use:
/// the dispatch chains, the slot chains `(protocol, index)`, the map
/// indexes.
fn shared(
    dispatch: &BTreeMap<Dispatch, usize>,
) -> (
    BTreeSet<Dispatch>,
    BTreeSet<(Protocol, usize)>,
    BTreeSet<usize>,
) {
    let chains: BTreeSet<Dispatch> = dispatch.keys().copied().collect();
    let slots: BTreeSet<(Protocol, usize)> = chains
        .iter()
        .flat_map(|d| (0..d.count).map(move |i| (d.protocol, i)))
        .collect();
    let maps = slots.iter().map(|(_, i)| *i).collect();
    (chains, slots, maps)
}

fn vmap_key(vip: Ipv4Addr, key: PortKey) -> Expression<'static> {
    concat(vec![
        address(vip),
        string(protocol_name(key.protocol)),
        number(u32::from(key.port)),
    ])
}

fn policy_rule(rule: &RuleState) -> Vec<Statement<'static>> {
    let mut statements = Vec::new();
    if let Some(from) = &rule.from {
        statements.push(equals(
            payload("ip", "saddr"),
            set_ref(&names::member_set(from)),
        ));
    }
    let to = match &rule.to {
        Some(service) => names::member_set(service),
        None => names::MEMBERS.to_owned(),
    };
    statements.push(equals(payload("ip", "daddr"), set_ref(&to)));
    match (rule.protocol, rule.ports.is_empty()) {
        (Some(protocol), _) => statements.push(l4proto(protocol)),
        // Ports without a protocol: either, but never ICMP's bytes.
        (None, false) => statements.push(equals(
            meta(MetaKey::L4proto),
            anonymous_set(vec![string("tcp"), string("udp")]),
        )),
        (None, true) => {}
    }
    match rule.ports.as_slice() {
        [] => {}
        [port] => statements.push(equals(payload("th", "dport"), number(u32::from(*port)))),
        ports => statements.push(equals(
            payload("th", "dport"),
            anonymous_set(ports.iter().map(|p| number(u32::from(*p))).collect()),
        )),
    }
    statements.push(match rule.action {
        RuleAction::Allow => accept(),
        RuleAction::Deny => goto(names::POLICY_DENY),
    });
    statements
}

impl Programmed {
    /// Makes the table hold `new` for service `name` (`None`: the service
    /// is gone), appending the commands to `batch` and the UDP flows whose
    /// backend went to `cleanup`.
    pub(crate) fn update_service(
        &mut self,
        name: &str,
        new: Option<ServiceState>,
        batch: &mut Batch,
        cleanup: &mut UdpCleanup,
    ) {
        let old = self.services.remove(name).unwrap_or_default();
        let new = self.admit(name, new.unwrap_or_default());
        if old == new {
            if !new.is_empty() {
                self.services.insert(name.to_owned(), new);
            }
            return;
        }
        // Each VIP port: its `services` element (where it dispatches) and
        // its backends' elements in `addr-{i}`/`port-{i}`, by key.
        let old_ports: BTreeMap<(Ipv4Addr, PortKey), &PortState> = old
            .vmap_keys()
            .map(|(vip, key)| ((vip, key), &old.ports[&key]))
            .collect();
        let new_ports: BTreeMap<(Ipv4Addr, PortKey), &PortState> = new
            .vmap_keys()
            .map(|(vip, key)| ((vip, key), &new.ports[&key]))
            .collect();
        for (&(vip, key), &port) in &old_ports {
            let next = new_ports.get(&(vip, key)).copied();
            let element = vmap_key(vip, key);
            if next.is_none_or(|next| next.target(key.protocol) != port.target(key.protocol)) {
                batch.delete_elements(names::SERVICES, vec![element.clone()]);
            }
            if next.is_none() {
                self.owners.remove(&(vip, key));
            }
            for (i, backend) in port.backends.iter().enumerate() {
                let replaced = next.and_then(|next| next.backends.get(i));
                if replaced.is_none_or(|b| b.0 != backend.0) {
                    batch.delete_elements(&names::address_map(i), vec![element.clone()]);
                }
                if replaced.is_none_or(|b| b.1 != backend.1) {
                    batch.delete_elements(&names::port_map(i), vec![element.clone()]);
                }
            }
            if let Some(dispatch) = port.dispatch(key.protocol) {
                release(&mut self.dispatch, dispatch);
            }
        }
        for (&(vip, key), &port) in &new_ports {
            let before = old_ports.get(&(vip, key)).copied();
            let element = vmap_key(vip, key);
            let target = port.target(key.protocol);
            if before.is_none_or(|before| before.target(key.protocol) != target) {
                batch.add_elements(
                    names::SERVICES,
                    vec![mapping(element.clone(), goto_verdict(&target))],
                );
            }
            self.owners.insert((vip, key), name.to_owned());
            for (i, backend) in port.backends.iter().enumerate() {
                let was = before.and_then(|before| before.backends.get(i));
                if was.is_none_or(|b| b.0 != backend.0) {
                    batch.add_elements(
                        &names::address_map(i),
                        vec![mapping(element.clone(), address(backend.0))],
                    );
                }
                if was.is_none_or(|b| b.1 != backend.1) {
                    batch.add_elements(
                        &names::port_map(i),
                        vec![mapping(element.clone(), number(u32::from(backend.1)))],
                    );
                }
            }
            if let Some(dispatch) = port.dispatch(key.protocol) {
                *self.dispatch.entry(dispatch).or_default() += 1;
            }
        }

        // UDP flows keep their backend through conntrack: those whose
        // backend left are cleared so the next datagram picks anew.
        for (&(vip, key), &port) in &old_ports {
            if key.protocol != Protocol::Udp {
                continue;
            }
            let allowed: BTreeSet<Backend> = new_ports
                .get(&(vip, key))
                .map(|next| next.backends.iter().copied().collect())
                .unwrap_or_default();
            if port.backends.iter().any(|b| !allowed.contains(b)) {
                cleanup.ports.insert((vip, key.port), allowed);
            }
        }

        // Masquerade only flows to VIPs that have rules.
        let with_rules = |state: &ServiceState| state.vip.filter(|_| !state.ports.is_empty());
        if with_rules(&old) != with_rules(&new) {
            if let Some(vip) = with_rules(&old)
                && self.vips.remove(vip)
            {
                batch.delete_elements(names::VIPS, vec![address(vip)]);
            }
            if let Some(vip) = with_rules(&new)
                && self.vips.add(vip)
            {
                batch.add_elements(names::VIPS, vec![address(vip)]);
            }
        }

        let policy_set = self
            .policy
            .services
            .contains(name)
            .then(|| names::member_set(name));
        let (old_addresses, new_addresses) = (old.addresses(), new.addresses());
        for &gone in old_addresses.difference(&new_addresses) {
            if self.members.remove(gone) {
                batch.delete_elements(names::MEMBERS, vec![address(gone)]);
            }
            if let Some(set) = &policy_set {
                batch.delete_elements(set, vec![address(gone)]);
            }
        }
        for &came in new_addresses.difference(&old_addresses) {
            if self.members.add(came) {
                batch.add_elements(names::MEMBERS, vec![address(came)]);
            }
            if let Some(set) = &policy_set {
                batch.add_elements(set, vec![address(came)]);
            }
        }
        for &gone in old.local.difference(&new.local) {
            if self.local.remove(gone) {
                batch.delete_elements(names::LOCAL, vec![address(gone)]);
                batch.delete_elements(names::HAIRPIN, vec![pair(gone)]);
            }
        }
        for &came in new.local.difference(&old.local) {
            if self.local.add(came) {
                batch.add_elements(names::LOCAL, vec![address(came)]);
                batch.add_elements(names::HAIRPIN, vec![pair(came)]);
            }
        }

        if !new.is_empty() {
            self.services.insert(name.to_owned(), new);
        }
    }

    /// Creates the shared dispatch chains, slot chains and backend maps
    /// that ports now need and deletes those no port needs any more; call
    /// after the services' updates, with `before` the dispatches in use
    /// before them. Creations come before the batch's element additions
    /// (which go last), deletions after the element deletions that were
    /// the last references.
    pub(crate) fn update_shared(&mut self, before: &BTreeMap<Dispatch, usize>, batch: &mut Batch) {
        let (old_chains, old_slots, old_maps) = shared(before);
        let (new_chains, new_slots, new_maps) = shared(&self.dispatch);
        for &index in new_maps.difference(&old_maps) {
            let key = [SetType::Ipv4Addr, SetType::InetProto, SetType::InetService];
            batch.add_map(&names::address_map(index), &key, SetType::Ipv4Addr);
            batch.add_map(&names::port_map(index), &key, SetType::InetService);
        }
        for &(protocol, index) in new_slots.difference(&old_slots) {
            let chain = names::slot_chain(protocol, index);
            batch.add_chain(&chain, None);
            batch.add_rule(&chain, slot_rule(protocol, index));
        }
        for &dispatch in new_chains.difference(&old_chains) {
            let chain =
                names::dispatch_chain(dispatch.by_client, dispatch.protocol, dispatch.count);
            batch.add_chain(&chain, None);
            batch.add_rule(&chain, dispatch_rule(dispatch));
        }
        for &dispatch in old_chains.difference(&new_chains) {
            let chain =
                names::dispatch_chain(dispatch.by_client, dispatch.protocol, dispatch.count);
            batch.flush_chain(&chain);
            batch.delete_chain(&chain);
        }
        for &(protocol, index) in old_slots.difference(&new_slots) {
            let chain = names::slot_chain(protocol, index);
            batch.flush_chain(&chain);
            batch.delete_chain(&chain);
        }
        for &index in old_maps.difference(&new_maps) {
            batch.delete_map(&names::address_map(index));
            batch.delete_map(&names::port_map(index));
        }
    }

    /// The dispatches in use now (for [`Programmed::update_shared`]).
    pub(crate) fn dispatches(&self) -> BTreeMap<Dispatch, usize> {
        self.dispatch.clone()
    }

    /// `state` without the VIP ports another service already programs: a
    /// VIP is one service's (the allocator's promise); should two claim
    /// one, the first keeps it until it lets go (a resync settles it by
    /// name order).
    fn admit(&self, name: &str, mut state: ServiceState) -> ServiceState {
        if let Some(vip) = state.vip {
            state
                .ports
                .retain(|key, _| match self.owners.get(&(vip, *key)) {
                    Some(owner) if owner != name => {
                        tracing::warn!(
                            service = name,
                            %vip,
                            port = key.port,
                            owner = owner.as_str(),
                            "VIP port already programmed for another service; skipped"
                        );
                        false
                    }
                    _ => true,
                });
        }
        state
    }

    /// Makes the policy chain and member sets hold `new`.
    pub(crate) fn update_policy(&mut self, new: PolicyState, batch: &mut Batch) {
        if new == self.policy {
            return;
        }
        for service in new.services.difference(&self.policy.services) {
            let set = names::member_set(service);
            batch.add_set(&set, &[SetType::Ipv4Addr]);
            let members = self
                .services
                .get(service)
                .map(|state| state.addresses().into_iter().map(address).collect())
                .unwrap_or_default();
            batch.add_elements(&set, members);
        }
        batch.flush_chain(names::POLICY);
        for rule in &new.rules {
            batch.add_rule(names::POLICY, policy_rule(rule));
        }
        for service in self.policy.services.difference(&new.services) {
            batch.delete_set(&names::member_set(service));
        }
        self.policy = new;
    }

    /// Every UDP VIP port with its backends: after a rebuild (an agent
    /// restart) the old backends are unknown, so any flow through these
    /// ports to another backend is stale.
    pub(crate) fn udp_backends(&self) -> UdpCleanup {
        let mut cleanup = UdpCleanup::default();
        for state in self.services.values() {
            let Some(vip) = state.vip else { continue };
            for (key, port) in &state.ports {
                if key.protocol == Protocol::Udp {
                    cleanup
                        .ports
                        .insert((vip, key.port), port.backends.iter().copied().collect());
                }
            }
        }
        cleanup
    }
}

fn release(counts: &mut BTreeMap<Dispatch, usize>, dispatch: Dispatch) {
    if let Some(count) = counts.get_mut(&dispatch) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&dispatch);
        }
    }
}

fn pair(address_: Ipv4Addr) -> Expression<'static> {
    concat(vec![address(address_), address(address_)])
}
