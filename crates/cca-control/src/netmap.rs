//! [`NetworkProjection`]: the cluster's [`NetworkMap`] as the control plane
//! hands it to nodes, projected from the cache's [`View`] and kept current
//! from its decoded changes. Each change touches a few entries (a service,
//! a node, the policies); only those are projected again, and only entries
//! whose projection really changed become [`NetworkChange`]s — so a status
//! report that changes nothing a data plane uses costs no line to any node.
//!
//! A service's entry holds its VIP (`derived/vip`), ports, affinity and
//! idle window (`desired/service`), whether it sleeps (`derived/scale`),
//! ready targets per port (`derived/endpoint`) and
//! its members: every placed instance whose agent reports an address from
//! the node it was placed on, ready or not (network policy matches flows
//! by them; DNS names a stateful service's ordinals by them). A node's
//! entry needs its registration (an IPv4 address to tunnel to) and a held
//! subnet.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use cca_model::cluster::{Backend, Instance, InstanceStatus, NodeCondition};
use cca_model::net::{
    AddressRanges, Member, NetworkChange, NetworkMap, NodeRoute, ServiceNet, Target, Touched,
};
use cca_model::{Key, Value};

use crate::view::{FactChange, View};

/// The network map and the index that keeps it current.
#[derive(Clone, Debug, Default)]
pub struct NetworkProjection {
    map: NetworkMap,
    /// Service → ids of its placed instances.
    instances: HashMap<String, BTreeSet<String>>,
}

impl NetworkProjection {
    /// Projects every entry of `view`.
    pub fn from_view(view: &View) -> Self {
        let mut projection = Self::default();
        for (id, instance) in view.instances.iter() {
            projection
                .instances
                .entry(instance.service.clone())
                .or_default()
                .insert(id.clone());
        }
        let touched = Touched {
            ranges: false,
            nodes: view.nodes.keys().cloned().collect(),
            services: view.services.keys().cloned().collect(),
            policies: true,
            gates: true,
        };
        projection.project(view, &touched);
        projection
    }

    /// The map as projected so far.
    pub fn map(&self) -> &NetworkMap {
        &self.map
    }

    /// Sets the ranges the control plane allocates from (they come from its
    /// configuration, not from facts).
    pub fn set_ranges(&mut self, ranges: AddressRanges) {
        self.map.ranges = Some(ranges);
    }

    /// Every entry of the map as a change: what a new follower starts from.
    pub fn snapshot(&self) -> Vec<NetworkChange> {
        self.map.changes()
    }

    /// Applies one revision's fact changes; `view` is at that revision or
    /// later. Returns the map changes they made.
    pub fn apply(&mut self, view: &View, facts: &[FactChange]) -> Vec<NetworkChange> {
        let mut touched = Touched::default();
        for fact in facts {
            self.note(fact, &mut touched);
        }
        self.project(view, &touched)
    }

    /// Records in `touched` which entries `fact` may change, and keeps the
    /// service → instances index.
    fn note(&mut self, fact: &FactChange, touched: &mut Touched) {
        match &fact.key {
            Key::Service { service }
            | Key::Vip { service }
            | Key::Endpoint { service, .. }
            | Key::Scale { service } => {
                touched.services.insert(service.clone());
            }
            Key::Instance { service, id } => {
                if fact.new.is_some() {
                    self.instances
                        .entry(service.clone())
                        .or_default()
                        .insert(id.clone());
                } else if let Some(ids) = self.instances.get_mut(service) {
                    ids.remove(id);
                    if ids.is_empty() {
                        self.instances.remove(service);
                    }
                }
                touched.services.insert(service.clone());
            }
            Key::InstanceStatus { .. } => {
                let old = status_of(fact.old.as_ref());
                let new = status_of(fact.new.as_ref());
                if old.map(addressing) != new.map(addressing) {
                    touched
                        .services
                        .extend(old.into_iter().chain(new).map(|s| s.service.clone()));
                }
            }
            Key::Node { node } | Key::Subnet { node } | Key::NodeStatus { node } => {
                touched.nodes.insert(node.clone());
            }
            Key::NetworkPolicy { .. } => touched.policies = true,
            Key::Gate { .. } => touched.gates = true,
            _ => {}
        }
    }

    /// Projects the touched entries again; returns those that changed.
    fn project(&mut self, view: &View, touched: &Touched) -> Vec<NetworkChange> {
        let mut changes = Vec::new();
        for node in &touched.nodes {
            changes.push(match node_route(view, node) {
                Some(route) => NetworkChange::Node(route),
                None => NetworkChange::NodeGone { node: node.clone() },
            });
        }
        for service in &touched.services {
            let ids = self.instances.get(service);
            let members = ids
                .into_iter()
                .flatten()
                .filter_map(|id| view.instances.get(id))
                .map(|held| &*held.value);
            changes.push(match service_net(view, service, members) {
                Some(net) => NetworkChange::Service(Arc::new(net)),
                None => NetworkChange::ServiceGone {
                    service: service.clone(),
                },
            });
        }
        if touched.policies {
            for (name, policy) in view.network_policies.iter() {
                changes.push(NetworkChange::Policy(Arc::clone(&policy.value)));
                debug_assert_eq!(name, &policy.name);
            }
            for name in self.map.policies.keys() {
                if !view.network_policies.contains_key(name) {
                    changes.push(NetworkChange::PolicyGone {
                        policy: name.clone(),
                    });
                }
            }
        }
        if touched.gates {
            for (name, gate) in view.gates.iter() {
                changes.push(NetworkChange::Gate(Arc::clone(&gate.value)));
                debug_assert_eq!(name, &gate.name);
            }
            for name in self.map.gates.keys() {
                if !view.gates.contains_key(name) {
                    changes.push(NetworkChange::GateGone { gate: name.clone() });
                }
            }
        }
        let mut effective = Touched::default();
        changes.retain(|change| self.map.apply(change.clone(), &mut effective));
        changes
    }
}

/// What of a status the map uses.
fn addressing(status: &InstanceStatus) -> (&str, Option<&str>, bool) {
    (
        status.node.as_str(),
        status.address.as_deref(),
        status.own_network,
    )
}

fn status_of(value: Option<&Value>) -> Option<&InstanceStatus> {
    match value {
        Some(Value::InstanceStatus(status)) => Some(status),
        _ => None,
    }
}

/// A node's route: its subnet and where its tunnel ends. `None` until it
/// has both (and once it is deregistered).
pub fn node_route(view: &View, node: &str) -> Option<NodeRoute> {
    let info = view.nodes.get(node)?;
    let subnet = *view.subnets.get(node)?.value.held()?;
    let underlay = info
        .addresses
        .iter()
        .find_map(|address| address.parse::<Ipv4Addr>().ok())?;
    let ready = view
        .node_statuses
        .get(node)
        .is_none_or(|status| status.condition == NodeCondition::Ready);
    Some(NodeRoute {
        node: node.to_owned(),
        subnet,
        underlay,
        ready,
    })
}

/// A service's entry from `view` and its placed `instances`; `None` when
/// the service does not exist.
pub fn service_net<'a>(
    view: &View,
    service: &str,
    instances: impl Iterator<Item = &'a Instance>,
) -> Option<ServiceNet> {
    let spec = view.services.get(service)?;
    let vip = view
        .vips
        .get(service)
        .and_then(|held| held.value.held().copied());
    let endpoints = spec
        .ports
        .iter()
        .map(|port| {
            let key = port.name.clone().unwrap_or_else(|| port.number.to_string());
            let targets = view
                .endpoints
                .get(service)
                .and_then(|ports| ports.get(&key))
                .map(|held| held.backends.iter().filter_map(target).collect())
                .unwrap_or_default();
            (key, targets)
        })
        .collect::<BTreeMap<_, _>>();
    let mut members: Vec<Member> = instances.filter_map(|i| member(view, i)).collect();
    members.sort();
    Some(ServiceNet {
        name: service.to_owned(),
        vip,
        ports: spec.ports.clone(),
        affinity: spec.affinity,
        endpoints,
        members,
        asleep: view.is_asleep(service),
        scale_to_zero: spec
            .scale_to_zero
            .map(|window| i64::try_from(window.0).unwrap_or(i64::MAX)),
    })
}

fn target(backend: &Backend) -> Option<Target> {
    Some(Target {
        instance: backend.instance.clone(),
        node: backend.node.clone(),
        address: backend.address.parse().ok()?,
        port: backend.port,
    })
}

fn member(view: &View, instance: &Instance) -> Option<Member> {
    let status = view.statuses.get(&instance.id)?;
    // A status from another node is a stale report of an earlier placement.
    if status.node != instance.node {
        return None;
    }
    Some(Member {
        instance: instance.id.clone(),
        node: instance.node.clone(),
        address: status.address.as_deref()?.parse().ok()?,
        ordinal: instance.ordinal,
        host_network: !status.own_network,
    })
}

#[cfg(test)]
mod tests {
    use cca_model::cluster::{InstanceState, NodeStatus};
    use cca_model::keys;
    use cca_model::net::Allocation;
    use cca_model::spec::{NetworkPolicy, NetworkRule, Peer, RuleAction};

    use super::*;
    use crate::controllers::fixtures::{ViewBuilder, instance, service, status};

    fn own(id: &str, node: &str, address: &str) -> InstanceStatus {
        let mut status = status(id, "web", node, InstanceState::Starting);
        status.address = Some(address.into());
        status.own_network = true;
        status
    }

    fn base() -> ViewBuilder {
        ViewBuilder::new()
            .node("n1", 1000, 1024)
            .put(
                &keys::derived_subnet("n1"),
                &Allocation::Held {
                    address: "10.42.0.0/24".parse::<cca_model::net::Ipv4Net>().unwrap(),
                },
            )
            .service(service("web", 1))
            .put(
                &keys::derived_vip("web"),
                &Allocation::Held {
                    address: Ipv4Addr::new(10, 43, 0, 1),
                },
            )
            .instance(instance("web-a", "web", "n1"))
            .status(own("web-a", "n1", "10.42.0.2"))
    }

    /// Feeds the projection a change of every fact of `next` (what
    /// changed since `view` among them) and returns what it emitted.
    fn follow(projection: &mut NetworkProjection, view: &View, next: &View) -> Vec<NetworkChange> {
        // The fixtures have no change feed: diff the two views' keys the
        // way the cache would report them.
        let mut facts = vec![];
        for (node, _) in next.nodes.iter() {
            facts.push(change(Key::Node { node: node.clone() }));
        }
        for (id, held) in next.instances.iter() {
            facts.push(FactChange {
                key: Key::Instance {
                    service: held.service.clone(),
                    id: id.clone(),
                },
                old: None,
                new: Some(Value::Instance(Arc::clone(&held.value))),
            });
        }
        for (id, held) in next.statuses.iter() {
            let old = view
                .statuses
                .get(id)
                .map(|old| Value::InstanceStatus(Arc::clone(&old.value)));
            facts.push(FactChange {
                key: Key::InstanceStatus { id: id.clone() },
                old,
                new: Some(Value::InstanceStatus(Arc::clone(&held.value))),
            });
        }
        for (service, _) in next.services.iter() {
            facts.push(change(Key::Service {
                service: service.clone(),
            }));
        }
        facts.push(change(Key::NetworkPolicy { policy: "p".into() }));
        projection.apply(next, &facts)
    }

    fn change(key: Key) -> FactChange {
        FactChange {
            key,
            old: None,
            new: None,
        }
    }

    #[test]
    fn a_view_projects_to_nodes_services_and_members() {
        let view = base().build();
        let projection = NetworkProjection::from_view(&view);
        let map = projection.map();
        let route = &map.nodes["n1"];
        assert_eq!(route.subnet.to_string(), "10.42.0.0/24");
        assert_eq!(route.underlay, Ipv4Addr::LOCALHOST);
        assert!(route.ready);
        let web = &map.services["web"];
        assert_eq!(web.vip, Some(Ipv4Addr::new(10, 43, 0, 1)));
        assert_eq!(web.members.len(), 1);
        assert!(!web.members[0].host_network);
        assert_eq!(web.endpoints["http"], vec![], "not running: no targets");
        assert_eq!(projection.snapshot().len(), 2);
    }

    #[test]
    fn only_real_changes_become_lines() {
        let view = base().build();
        let mut projection = NetworkProjection::from_view(&view);
        // A status change the map does not use (state) emits nothing.
        let mut running = own("web-a", "n1", "10.42.0.2");
        running.state = InstanceState::Running;
        let next = ViewBuilder::from(view.clone()).status(running).build();
        assert_eq!(follow(&mut projection, &view, &next), vec![]);
        // A new address does; so does the node going unreachable and a
        // new policy.
        let moved = own("web-a", "n1", "10.42.0.9");
        let policy = NetworkPolicy {
            name: "p".into(),
            tenant: None,
            rules: vec![NetworkRule {
                action: RuleAction::Deny,
                from: Peer::Any,
                to: Peer::Service("web".into()),
                ports: vec![],
                protocol: None,
            }],
        };
        let after = ViewBuilder::from(next.clone())
            .status(moved)
            .node_status(
                "n1",
                &NodeStatus {
                    condition: NodeCondition::Unreachable,
                    since: 1,
                },
            )
            .put(&keys::desired_network_policy("p"), &policy)
            .build();
        let changes = follow(&mut projection, &next, &after);
        let kinds: Vec<&str> = changes
            .iter()
            .map(|change| match change {
                NetworkChange::Node(route) if !route.ready => "node unready",
                NetworkChange::Service(net) if net.members[0].address.octets()[3] == 9 => {
                    "new address"
                }
                NetworkChange::Policy(_) => "policy",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, vec!["node unready", "new address", "policy"]);
    }

    #[test]
    fn deleted_entries_go() {
        let view = base().build();
        let mut projection = NetworkProjection::from_view(&view);
        let next = ViewBuilder::from(view)
            .remove_service("web")
            .delete(&keys::derived_subnet("n1"))
            .build();
        let facts = vec![
            change(Key::Service {
                service: "web".into(),
            }),
            change(Key::Subnet { node: "n1".into() }),
        ];
        let changes = projection.apply(&next, &facts);
        assert_eq!(
            changes,
            vec![
                NetworkChange::NodeGone { node: "n1".into() },
                NetworkChange::ServiceGone {
                    service: "web".into()
                },
            ]
        );
        assert!(projection.map().services.is_empty());
    }

    #[test]
    fn gates_come_and_go() {
        let view = base().build();
        let mut projection = NetworkProjection::from_view(&view);
        let gate = cca_model::spec::GateSpec {
            name: "shop".into(),
            hosts: vec!["shop.example.com".into()],
            service: "web".into(),
            port: 80,
            ..Default::default()
        };
        let with_gate = ViewBuilder::from(view.clone())
            .put(&keys::desired_gate("shop"), &gate)
            .build();
        let put = change(Key::Gate {
            gate: "shop".into(),
        });
        let changes = projection.apply(&with_gate, std::slice::from_ref(&put));
        assert_eq!(changes, vec![NetworkChange::Gate(Arc::new(gate))]);
        assert_eq!(projection.snapshot().len(), 3, "node, service, gate");
        // The same gate again is no line.
        assert_eq!(
            projection.apply(&with_gate, std::slice::from_ref(&put)),
            vec![]
        );
        let without = ViewBuilder::from(with_gate)
            .delete(&keys::desired_gate("shop"))
            .build();
        assert_eq!(
            projection.apply(&without, &[put]),
            vec![NetworkChange::GateGone {
                gate: "shop".into()
            }]
        );
    }

    #[test]
    fn a_sleeping_service_is_asleep_in_the_map_and_wakes_in_one_line() {
        use cca_model::scale::{ScaleCause, ScaleState};
        let mut web = service("web", 1);
        web.scale_to_zero = Some(cca_model::spec::Duration(60_000));
        let asleep = ScaleState {
            asleep: true,
            since: 5,
            cause: ScaleCause::Idle {
                window: 60_000,
                last_activity: 1,
            },
        };
        let view = base()
            .service(web.clone())
            .put(&keys::derived_scale("web"), &asleep)
            .build();
        let mut projection = NetworkProjection::from_view(&view);
        let entry = &projection.map().services["web"];
        assert!(entry.asleep);
        assert_eq!(entry.scale_to_zero, Some(60_000));
        let woken = ScaleState {
            asleep: false,
            since: 9,
            cause: ScaleCause::Woken { node: "g1".into() },
        };
        let next = ViewBuilder::from(view)
            .put(&keys::derived_scale("web"), &woken)
            .build();
        let scale = change(Key::Scale {
            service: "web".into(),
        });
        let changes = projection.apply(&next, std::slice::from_ref(&scale));
        let [NetworkChange::Service(entry)] = changes.as_slice() else {
            panic!("one service line: {changes:?}");
        };
        assert!(!entry.asleep, "woken");
        assert_eq!(entry.scale_to_zero, Some(60_000), "still scales to zero");
        // Without `scale_to_zero` a leftover sleep fact means nothing.
        let plain = ViewBuilder::from(next)
            .service(service("web", 1))
            .put(&keys::derived_scale("web"), &asleep)
            .build();
        projection.apply(&plain, &[scale]);
        let entry = &projection.map().services["web"];
        assert!(!entry.asleep && entry.scale_to_zero.is_none());
    }
}
