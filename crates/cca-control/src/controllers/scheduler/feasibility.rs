//! Feasibility: whether a node can take an instance, and when none can,
//! why. Hard constraints are the service's `restrict` labels (arch, zone
//! and node name are labels too), resources (cpu, memory), host ports, and
//! the node's state (ready, not draining, not disabled). A [`Misfit`] says
//! which one failed on a node; [`diagnose`] turns the misfits of every node
//! into the reason an unplaced-demand fact reports: `unsatisfiable_constraint`
//! when no node could ever take the instance as the cluster is, else
//! `insufficient_capacity`, naming the constraint and the nearest node.

use std::collections::BTreeMap;

use cca_model::cluster::UnplacedReason;
use cca_model::spec::{Resources, ServiceSpec};

use super::cluster::{Amount, Cluster, Liveness, NodeSlot};

/// Requested per instance when a spec names no cpu: 100 millicores.
pub(crate) const DEFAULT_CPU: u64 = 100;
/// Requested per instance when a spec names no memory: 128 MiB.
pub(crate) const DEFAULT_MEMORY: u64 = 128 << 20;

/// What one instance of a service needs from a node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Demand<'s> {
    pub(crate) amount: Amount,
    pub(crate) ports: usize,
    pub(crate) restrict: &'s BTreeMap<String, String>,
}

impl<'s> Demand<'s> {
    /// One instance of `spec` sized to `resources` (its own, or vertical
    /// autoscaling's).
    pub(crate) fn of(spec: &'s ServiceSpec, resources: &Resources) -> Self {
        Demand {
            amount: Amount::of(resources),
            ports: spec.ports.len(),
            restrict: &spec.placement.restrict,
        }
    }
}

impl Amount {
    /// What an instance with `resources` reserves (defaults where unset).
    pub(crate) fn of(resources: &Resources) -> Self {
        Amount {
            cpu: resources.cpu.map_or(DEFAULT_CPU, |cpu| cpu.0),
            memory: resources.memory.map_or(DEFAULT_MEMORY, |memory| memory.0),
        }
    }
}

/// Why one node cannot take an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Misfit {
    /// A `restrict` label the node lacks or has another value for.
    Label {
        label: String,
        wanted: String,
        found: Option<String>,
    },
    /// The instance is bigger than the node's whole capacity.
    CpuCapacity {
        need: u64,
        capacity: u64,
    },
    MemoryCapacity {
        need: u64,
        capacity: u64,
    },
    /// More ports than the host port range holds.
    PortRange {
        need: usize,
        first: u16,
        last: u16,
    },
    NotReady,
    Draining,
    Disabled,
    Cpu {
        need: u64,
        free: i64,
    },
    Memory {
        need: u64,
        free: i64,
    },
    Ports {
        need: usize,
        free: usize,
    },
}

impl Misfit {
    pub(crate) fn describe(&self, node: &str) -> String {
        match self {
            Misfit::Label {
                label,
                wanted,
                found: Some(found),
            } => format!("restrict {label}={wanted}: node {node} has {label}={found}"),
            Misfit::Label { label, wanted, .. } => {
                format!("restrict {label}={wanted}: node {node} has no {label} label")
            }
            Misfit::CpuCapacity { need, capacity } => {
                format!("cpu: needs {need}m, node {node} has {capacity}m in total")
            }
            Misfit::MemoryCapacity { need, capacity } => format!(
                "memory: needs {}, node {node} has {} in total",
                bytes(*need),
                bytes(*capacity)
            ),
            Misfit::PortRange { need, first, last } => format!(
                "host ports: needs {need}, the range {first}-{last} has {}",
                (*first..=*last).len()
            ),
            Misfit::NotReady => format!("node {node} is not ready"),
            Misfit::Draining => format!("node {node} is draining"),
            Misfit::Disabled => format!("node {node} is disabled"),
            Misfit::Cpu { need, free } => {
                format!(
                    "cpu: needs {need}m, at most {}m free (node {node})",
                    free.max(&0)
                )
            }
            Misfit::Memory { need, free } => format!(
                "memory: needs {}, at most {} free (node {node})",
                bytes(*need),
                bytes(u64::try_from(*free).unwrap_or(0))
            ),
            Misfit::Ports { need, free } => {
                format!("host ports: needs {need}, {free} free (node {node})")
            }
        }
    }
}

/// Memory as the CLI's tables show it.
fn bytes(value: u64) -> String {
    cca_model::spec::Memory(value).human()
}

/// The constraints a node fails whatever its state and load.
pub(crate) fn permanent_misfits(slot: &NodeSlot<'_>, demand: &Demand<'_>) -> Vec<Misfit> {
    let mut misfits: Vec<Misfit> = demand
        .restrict
        .iter()
        .filter_map(|(label, wanted)| {
            let found = slot.info.label(label);
            (found != Some(wanted.as_str())).then(|| Misfit::Label {
                label: label.clone(),
                wanted: wanted.clone(),
                found: found.map(str::to_owned),
            })
        })
        .collect();
    if demand.amount.cpu > slot.info.cpu.0 {
        misfits.push(Misfit::CpuCapacity {
            need: demand.amount.cpu,
            capacity: slot.info.cpu.0,
        });
    }
    if demand.amount.memory > slot.info.memory.0 {
        misfits.push(Misfit::MemoryCapacity {
            need: demand.amount.memory,
            capacity: slot.info.memory.0,
        });
    }
    if demand.ports > slot.range.len() {
        misfits.push(Misfit::PortRange {
            need: demand.ports,
            first: *slot.range.start(),
            last: *slot.range.end(),
        });
    }
    misfits
}

/// True when the node's labels satisfy `restrict`.
pub(crate) fn labels_match(slot: &NodeSlot<'_>, demand: &Demand<'_>) -> bool {
    demand
        .restrict
        .iter()
        .all(|(label, wanted)| slot.info.label(label) == Some(wanted.as_str()))
}

/// The first reason the node cannot take the instance now, if any.
pub(crate) fn misfit(slot: &NodeSlot<'_>, demand: &Demand<'_>) -> Option<Misfit> {
    if let Some(first) = permanent_misfits(slot, demand).into_iter().next() {
        return Some(first);
    }
    if slot.liveness != Liveness::Ready {
        return Some(Misfit::NotReady);
    }
    if slot.draining {
        return Some(Misfit::Draining);
    }
    if slot.disabled {
        return Some(Misfit::Disabled);
    }
    let free = slot.free();
    if free.cpu < demand.amount.cpu as i64 {
        return Some(Misfit::Cpu {
            need: demand.amount.cpu,
            free: free.cpu,
        });
    }
    if free.memory < demand.amount.memory as i64 {
        return Some(Misfit::Memory {
            need: demand.amount.memory,
            free: free.memory,
        });
    }
    if slot.free_ports() < demand.ports {
        return Some(Misfit::Ports {
            need: demand.ports,
            free: slot.free_ports(),
        });
    }
    None
}

/// Why demand went unplaced: the fact's reason, constraint and nearest node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Diagnosis {
    pub(crate) reason: UnplacedReason,
    pub(crate) constraint: String,
    pub(crate) nearest_node: Option<String>,
}

/// Explains why no node takes an instance with `demand`.
pub(crate) fn diagnose(cluster: &Cluster<'_>, demand: &Demand<'_>) -> Diagnosis {
    let Some(first) = cluster.nodes.first() else {
        return Diagnosis {
            reason: UnplacedReason::InsufficientCapacity,
            constraint: "no nodes are registered".into(),
            nearest_node: None,
        };
    };
    let eligible: Vec<&NodeSlot<'_>> = cluster
        .nodes
        .iter()
        .filter(|slot| permanent_misfits(slot, demand).is_empty())
        .collect();
    if eligible.is_empty() {
        // The nearest node fails the fewest hard constraints.
        let (nearest, misfits) = cluster
            .nodes
            .iter()
            .map(|slot| (slot, permanent_misfits(slot, demand)))
            .min_by_key(|(_, misfits)| misfits.len())
            .unwrap_or((first, Vec::new()));
        let name = &nearest.info.name;
        let constraint = misfits.first().map_or_else(
            || "no node matches".to_owned(),
            |misfit| misfit.describe(name),
        );
        return Diagnosis {
            reason: UnplacedReason::UnsatisfiableConstraint,
            constraint,
            nearest_node: Some(name.clone()),
        };
    }
    let nearest = eligible
        .iter()
        .max_by_key(|slot| closeness(slot, demand))
        .copied()
        .unwrap_or(first);
    let name = &nearest.info.name;
    let constraint = misfit(nearest, demand).map_or_else(
        || format!("node {name} has room but was taken by other placements this cycle"),
        |misfit| misfit.describe(name),
    );
    Diagnosis {
        reason: UnplacedReason::InsufficientCapacity,
        constraint,
        nearest_node: Some(name.clone()),
    }
}

/// How close a node comes to fitting: schedulable nodes first, then the
/// smaller of its free cpu and memory as a share of the need; ties go to
/// the first node by name.
fn closeness(slot: &NodeSlot<'_>, demand: &Demand<'_>) -> (bool, i64, std::cmp::Reverse<String>) {
    let free = slot.free();
    let share = |free: i64, need: u64| free.max(0).saturating_mul(1000) / (need.max(1) as i64);
    let fit = share(free.cpu, demand.amount.cpu).min(share(free.memory, demand.amount.memory));
    (
        slot.schedulable(),
        fit,
        std::cmp::Reverse(slot.info.name.clone()),
    )
}
