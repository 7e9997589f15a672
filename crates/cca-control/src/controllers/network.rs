//! The network controller: gives every registered node a subnet of the
//! cluster CIDR (`derived/subnet/{node}`) and every service with ports a
//! virtual IP from the service CIDR (`derived/vip/{service}`).
//!
//! An address is never handed to a second owner while any node may still
//! route to it. When its owner goes (the node is deleted, the service is
//! deleted or loses its ports) the fact turns `released` and stays, holding
//! the address, for [`NetworkConfig::release_hold`] — long enough for every
//! connected node to have dropped its rules — and for as long after as any
//! node that was unreachable during the hold is still unreachable (such a
//! node may keep old rules; it takes a fresh map when it comes back, or goes
//! when an operator deletes it). Only then is the fact deleted and the
//! address free. An owner that comes back while its address is released
//! (a node re-registering, a service re-applied) gets the same address.
//!
//! Free addresses are taken lowest first. When a pool has none left the
//! owner's fact says `exhausted` (with an event) instead of holding an
//! address; every pass retries it. Addresses held outside the configured
//! pools (after a server restart with other CIDRs) are left alone: a live
//! address never moves under running instances.

use std::collections::BTreeSet;
use std::time::Duration;

use cca_model::clock::span_millis;
use cca_model::cluster::{Millis, NodeCondition};
use cca_model::net::{Allocation, Ipv4Net, NetError};
use cca_model::{Kind, keys};

use crate::controller::{Context, Controller, EventDraft, Plan, Write};
use crate::view::{Table, View};

/// The address plan; `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    /// Node subnets are cut from it (10.42.0.0/16).
    pub cluster_cidr: Ipv4Net,
    /// The length of each node's subnet (24: 254 instance addresses).
    pub node_prefix: u8,
    /// Service VIPs come from it (10.43.0.0/16).
    pub service_cidr: Ipv4Net,
    /// How long a released address stays reserved (60 s).
    pub release_hold: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            cluster_cidr: Ipv4Net::new([10, 42, 0, 0].into(), 16)
                .unwrap_or_else(|_| unreachable!()),
            node_prefix: 24,
            service_cidr: Ipv4Net::new([10, 43, 0, 0].into(), 16)
                .unwrap_or_else(|_| unreachable!()),
            release_hold: Duration::from_secs(60),
        }
    }
}

/// Why an address plan cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "--cluster-cidr {cluster} and --service-cidr {service} overlap: give them disjoint ranges"
    )]
    Overlap { cluster: Ipv4Net, service: Ipv4Net },
    #[error("--node-subnet-size: {0}")]
    NodePrefix(NetError),
    #[error("--service-cidr {0} holds no VIPs: use /30 or shorter")]
    ServicesTooSmall(Ipv4Net),
}

impl NetworkConfig {
    /// Checks that the pools are usable and disjoint.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.cluster_cidr.overlaps(&self.service_cidr) {
            return Err(PlanError::Overlap {
                cluster: self.cluster_cidr,
                service: self.service_cidr,
            });
        }
        self.cluster_cidr
            .subnet_count(self.node_prefix)
            .map_err(PlanError::NodePrefix)?;
        if self.service_cidr.prefix() > 30 {
            return Err(PlanError::ServicesTooSmall(self.service_cidr));
        }
        Ok(())
    }
}

/// Writes `derived/subnet/*` and `derived/vip/*`; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct NetworkController {
    pub config: NetworkConfig,
}

impl Controller for NetworkController {
    fn name(&self) -> &'static str {
        "network"
    }

    fn interests(&self) -> &'static [Kind] {
        &[
            Kind::Node,
            Kind::NodeStatus,
            Kind::Service,
            Kind::Subnet,
            Kind::Vip,
        ]
    }

    fn reconcile(&self, view: &View, context: &Context) -> Plan {
        let mut plan = Plan::default();
        let stale = stale_since(view);
        let subnets = SubnetPool {
            pool: self.config.cluster_cidr,
            per: self.config.node_prefix,
        };
        let wanted = view.nodes.keys().cloned().collect();
        self.allocate(&subnets, &view.subnets, &wanted, &stale, context, &mut plan);
        let vips = VipPool {
            pool: self.config.service_cidr,
        };
        let wanted = view
            .services
            .iter()
            .filter(|(_, spec)| !spec.ports.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        self.allocate(&vips, &view.vips, &wanted, &stale, context, &mut plan);
        plan
    }
}

/// One pool of addresses of type `A`: how its facts are keyed and how an
/// address maps to a slot index and back.
trait Pool {
    type Address: Clone + PartialEq + serde::Serialize;
    /// What the owners are called in events (`node`, `service`).
    const OWNER: &'static str;
    fn key(&self, owner: &str) -> String;
    fn cidr(&self) -> Ipv4Net;
    /// How many slots the pool has.
    fn slots(&self) -> u64;
    /// The first usable slot.
    fn first(&self) -> u64;
    fn slot(&self, address: &Self::Address) -> Option<u64>;
    fn address(&self, slot: u64) -> Option<Self::Address>;
}

struct SubnetPool {
    pool: Ipv4Net,
    per: u8,
}

impl Pool for SubnetPool {
    type Address = Ipv4Net;
    const OWNER: &'static str = "node";

    fn key(&self, owner: &str) -> String {
        keys::derived_subnet(owner)
    }
    fn cidr(&self) -> Ipv4Net {
        self.pool
    }
    fn slots(&self) -> u64 {
        self.pool.subnet_count(self.per).unwrap_or(0)
    }
    fn first(&self) -> u64 {
        0
    }
    fn slot(&self, address: &Ipv4Net) -> Option<u64> {
        self.pool.subnet_index(self.per, address)
    }
    fn address(&self, slot: u64) -> Option<Ipv4Net> {
        self.pool.subnet(self.per, slot)
    }
}

struct VipPool {
    pool: Ipv4Net,
}

impl Pool for VipPool {
    type Address = core::net::Ipv4Addr;
    const OWNER: &'static str = "service";

    fn key(&self, owner: &str) -> String {
        keys::derived_vip(owner)
    }
    fn cidr(&self) -> Ipv4Net {
        self.pool
    }
    // The network and broadcast addresses are never VIPs.
    fn slots(&self) -> u64 {
        self.pool.size().saturating_sub(1)
    }
    fn first(&self) -> u64 {
        1
    }
    fn slot(&self, address: &core::net::Ipv4Addr) -> Option<u64> {
        self.pool.index_of(*address)
    }
    fn address(&self, slot: u64) -> Option<core::net::Ipv4Addr> {
        (slot >= self.first() && slot < self.slots())
            .then(|| self.pool.nth(slot))
            .flatten()
    }
}

impl NetworkController {
    /// Allocates for every owner in `wanted` without an address, releases
    /// what departed owners held, frees what has been released long enough.
    fn allocate<P: Pool>(
        &self,
        pool: &P,
        facts: &Table<Allocation<P::Address>>,
        wanted: &BTreeSet<String>,
        stale: &Option<Millis>,
        context: &Context,
        plan: &mut Plan,
    ) where
        Allocation<P::Address>: serde::Serialize,
    {
        let hold = span_millis(self.config.release_hold);
        let mut taken: Option<BTreeSet<u64>> = None;
        for owner in wanted {
            let held = facts.get(owner).map(|held| &*held.value);
            let address = match held {
                Some(Allocation::Held { .. }) => continue,
                // Its own address comes back to a returning owner.
                Some(Allocation::Released { address, .. }) => Some(address.clone()),
                Some(Allocation::Exhausted { .. }) | None => {
                    let taken = taken.get_or_insert_with(|| reserved_slots(pool, facts));
                    let free = lowest_free(pool, taken);
                    if let Some(slot) = free {
                        taken.insert(slot);
                    }
                    free.and_then(|slot| pool.address(slot))
                }
            };
            let key = pool.key(owner);
            match address {
                Some(address) => plan
                    .writes
                    .push(Write::put_json(key, &Allocation::Held { address })),
                None if matches!(held, Some(Allocation::Exhausted { .. })) => {}
                None => {
                    plan.writes.push(Write::put_json(
                        key,
                        &Allocation::<P::Address>::Exhausted {
                            pool: pool.cidr(),
                            since: context.now,
                        },
                    ));
                    plan.events.push(EventDraft::warning(
                        format!("{}/{owner}", P::OWNER),
                        format!(
                            "no address for {} {owner}: {} has none free",
                            P::OWNER,
                            pool.cidr()
                        ),
                    ));
                }
            }
        }
        self.release(pool, facts, wanted, stale, hold, context, plan);
    }

    #[allow(clippy::too_many_arguments, reason = "one pass over one pool's facts")]
    fn release<P: Pool>(
        &self,
        pool: &P,
        facts: &Table<Allocation<P::Address>>,
        wanted: &BTreeSet<String>,
        stale: &Option<Millis>,
        hold: Millis,
        context: &Context,
        plan: &mut Plan,
    ) where
        Allocation<P::Address>: serde::Serialize,
    {
        for (owner, held) in facts.iter() {
            if wanted.contains(owner) {
                continue;
            }
            let key = pool.key(owner);
            match &*held.value {
                Allocation::Held { address } => {
                    plan.writes.push(Write::put_json(
                        key,
                        &Allocation::Released {
                            address: address.clone(),
                            at: context.now,
                        },
                    ));
                    requeue(plan, hold);
                }
                Allocation::Exhausted { .. } => plan.writes.push(Write::delete(key)),
                Allocation::Released { at, .. } => {
                    let hold_end = at.saturating_add(hold);
                    // A node unreachable since before the hold ended may
                    // still route to the address.
                    let node_may_route = stale.is_some_and(|since| since < hold_end);
                    if context.now >= hold_end && !node_may_route {
                        plan.writes.push(Write::delete(key));
                    } else if !node_may_route {
                        requeue(plan, hold_end - context.now);
                    }
                }
            }
        }
    }
}

fn requeue(plan: &mut Plan, after: Millis) {
    let after = after.max(1);
    plan.requeue_after = Some(plan.requeue_after.map_or(after, |held| held.min(after)));
}

/// The slots of every address held or released in the pool.
fn reserved_slots<P: Pool>(pool: &P, facts: &Table<Allocation<P::Address>>) -> BTreeSet<u64> {
    facts
        .values()
        .filter_map(|held| held.value.reserved().and_then(|address| pool.slot(address)))
        .collect()
}

/// The lowest slot of the pool not in `taken`.
fn lowest_free<P: Pool>(pool: &P, taken: &BTreeSet<u64>) -> Option<u64> {
    let mut candidate = pool.first();
    for &slot in taken.range(pool.first()..) {
        if slot != candidate {
            break;
        }
        candidate += 1;
    }
    (candidate < pool.slots()).then_some(candidate)
}

/// The earliest moment a registered node became unreachable, if any is.
fn stale_since(view: &View) -> Option<Millis> {
    view.node_statuses
        .iter()
        .filter(|(node, _)| view.nodes.contains_key(*node))
        .filter(|(_, status)| status.condition == NodeCondition::Unreachable)
        .map(|(_, status)| status.since)
        .min()
}

#[cfg(test)]
mod tests {
    use core::net::Ipv4Addr;

    use cca_model::cluster::NodeStatus;
    use cca_model::net::{NodeSubnet, ServiceVip};
    use cca_model::spec::{ServiceSpec, Workload};

    use super::*;
    use crate::controllers::fixtures::{ViewBuilder, context, service};

    fn controller() -> NetworkController {
        NetworkController {
            config: NetworkConfig {
                cluster_cidr: "10.42.0.0/22".parse().unwrap(),
                node_prefix: 24,
                service_cidr: "10.43.0.0/30".parse().unwrap(),
                release_hold: Duration::from_secs(60),
            },
        }
    }

    /// Reconciles and applies the plan until it is empty; returns the view
    /// and every event.
    fn converge(mut view: View, now: Millis) -> (View, Vec<EventDraft>) {
        let mut events = vec![];
        for _ in 0..10 {
            let plan = controller().reconcile(&view, &context(now));
            if plan.writes.is_empty() {
                return (view, events);
            }
            events.extend(plan.events.clone());
            view = ViewBuilder::from(view).apply(&plan).build();
        }
        panic!("the network controller did not converge");
    }

    fn subnet(view: &View, node: &str) -> Option<NodeSubnet> {
        view.subnets.get(node).map(|held| (*held.value).clone())
    }

    fn vip(view: &View, service: &str) -> Option<ServiceVip> {
        view.vips.get(service).map(|held| (*held.value).clone())
    }

    fn held<A>(address: A) -> Allocation<A> {
        Allocation::Held { address }
    }

    #[test]
    fn nodes_get_subnets_and_services_with_ports_get_vips() {
        let view = ViewBuilder::new()
            .node("n1", 1000, 1024)
            .node("n2", 1000, 1024)
            .put(&keys::desired_service("web"), &service("web", 1))
            .put(
                &keys::desired_service("batch"),
                &ServiceSpec::new("batch", Workload::process("true")),
            )
            .build();
        let (view, events) = converge(view, 1_000);
        assert_eq!(
            subnet(&view, "n1"),
            Some(held("10.42.0.0/24".parse().unwrap()))
        );
        assert_eq!(
            subnet(&view, "n2"),
            Some(held("10.42.1.0/24".parse().unwrap()))
        );
        // The network address is never a VIP.
        assert_eq!(vip(&view, "web"), Some(held(Ipv4Addr::new(10, 43, 0, 1))));
        assert_eq!(vip(&view, "batch"), None, "no ports, no VIP");
        assert!(events.is_empty());
        // Converged: nothing more to write.
        assert!(controller().reconcile(&view, &context(1_000)).is_noop());
    }

    #[test]
    fn an_exhausted_pool_is_a_reason_not_a_crash_and_heals() {
        // A /30 has two VIPs (.1 and .2).
        let mut builder = ViewBuilder::new();
        for name in ["a", "b", "c"] {
            builder = builder.put(&keys::desired_service(name), &service(name, 1));
        }
        let (view, events) = converge(builder.build(), 1_000);
        assert_eq!(vip(&view, "a"), Some(held(Ipv4Addr::new(10, 43, 0, 1))));
        assert_eq!(vip(&view, "b"), Some(held(Ipv4Addr::new(10, 43, 0, 2))));
        assert_eq!(
            vip(&view, "c"),
            Some(Allocation::Exhausted {
                pool: "10.43.0.0/30".parse().unwrap(),
                since: 1_000
            })
        );
        assert_eq!(events.len(), 1);
        assert!(
            events[0].message.contains("10.43.0.0/30 has none free"),
            "{}",
            events[0].message
        );
        // `a` goes: its VIP is held for the hold, then `c` gets it.
        let view = ViewBuilder::from(view)
            .delete(&keys::desired_service("a"))
            .build();
        let (view, _) = converge(view, 2_000);
        assert!(matches!(
            vip(&view, "a"),
            Some(Allocation::Released { at: 2_000, .. })
        ));
        assert!(matches!(
            vip(&view, "c"),
            Some(Allocation::Exhausted { .. })
        ));
        let plan = controller().reconcile(&view, &context(2_000));
        assert_eq!(plan.requeue_after, Some(60_000));
        let (view, _) = converge(view, 62_000);
        assert_eq!(vip(&view, "a"), None);
        let (view, _) = converge(view, 62_000);
        assert_eq!(vip(&view, "c"), Some(held(Ipv4Addr::new(10, 43, 0, 1))));
    }

    #[test]
    fn a_returning_owner_gets_its_released_address_back() {
        let view = ViewBuilder::new()
            .put(&keys::desired_service("a"), &service("a", 1))
            .put(&keys::desired_service("b"), &service("b", 1))
            .build();
        let (view, _) = converge(view, 1_000);
        let view = ViewBuilder::from(view)
            .delete(&keys::desired_service("a"))
            .build();
        let (view, _) = converge(view, 2_000);
        let view = ViewBuilder::from(view)
            .put(&keys::desired_service("a"), &service("a", 1))
            .build();
        let (view, _) = converge(view, 3_000);
        assert_eq!(vip(&view, "a"), Some(held(Ipv4Addr::new(10, 43, 0, 1))));
        assert_eq!(vip(&view, "b"), Some(held(Ipv4Addr::new(10, 43, 0, 2))));
    }

    #[test]
    fn an_unreachable_node_keeps_released_addresses_reserved() {
        let view = ViewBuilder::new()
            .node("n1", 1000, 1024)
            .node("n2", 1000, 1024)
            .put(&keys::desired_service("a"), &service("a", 1))
            .build();
        let (view, _) = converge(view, 1_000);
        // n2 goes unreachable, then `a` is deleted: n2 may still route to
        // a's VIP after the hold, so it stays reserved.
        let view = ViewBuilder::from(view)
            .put(
                &keys::derived_node("n2"),
                &NodeStatus {
                    condition: NodeCondition::Unreachable,
                    since: 1_500,
                },
            )
            .delete(&keys::desired_service("a"))
            .build();
        let (view, _) = converge(view, 2_000);
        let (view, _) = converge(view, 100_000);
        assert!(matches!(vip(&view, "a"), Some(Allocation::Released { .. })));
        // n2 is deleted (or comes back): the address is free.
        let view = ViewBuilder::from(view)
            .delete(&keys::observed_node("n2"))
            .build();
        let (view, _) = converge(view, 100_000);
        assert_eq!(vip(&view, "a"), None);
        // n2's subnet is released in the same pass and held in turn.
        assert!(matches!(
            subnet(&view, "n2"),
            Some(Allocation::Released { at: 100_000, .. })
        ));
    }

    #[test]
    fn addresses_outside_the_pool_are_left_alone() {
        let view = ViewBuilder::new()
            .put(&keys::desired_service("a"), &service("a", 1))
            .put(
                &keys::derived_vip("a"),
                &held(Ipv4Addr::new(192, 168, 9, 9)),
            )
            .build();
        let (view, _) = converge(view, 1_000);
        assert_eq!(vip(&view, "a"), Some(held(Ipv4Addr::new(192, 168, 9, 9))));
    }

    #[test]
    fn plans_are_checked() {
        let mut config = NetworkConfig::default();
        assert_eq!(config.validate(), Ok(()));
        config.service_cidr = "10.42.128.0/20".parse().unwrap();
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "--cluster-cidr 10.42.0.0/16 and --service-cidr 10.42.128.0/20 overlap: give them disjoint ranges"
        );
        let config = NetworkConfig {
            node_prefix: 8,
            ..NetworkConfig::default()
        };
        assert!(matches!(config.validate(), Err(PlanError::NodePrefix(_))));
    }
}
