//! Scoring: among the nodes that can take an instance, which one should.
//! The default is a fair share with bin-packing: among the nodes that can
//! take it under the pressure line, those running the fewest instances of
//! the service, and among them the most allocated one — one best-fit seek
//! per level in the capacity index. So a service's instances per node
//! differ by at most one (base `n / nodes`, plus one on `n % nodes` nodes)
//! while capacity allows and one lost node never takes a whole service
//! down, while different services still pack onto the same nodes.
//! Placement hints refine it, strongest first: `spread` picks the label
//! value that has the fewest instances of the service (placing one at a
//! time this way gives every value its fair base `n / values` plus one
//! for the first `n % values` values), `colocate` prefers nodes already
//! running a named service, `separate` prefers nodes running none of the
//! named services. Within every tier the fair share and bin-packing decide.
//! Hints are soft: when the preferred nodes are full the next tier is
//! tried.

use std::collections::BTreeMap;

use cca_model::spec::{Resources, ServiceSpec};

use super::cluster::Cluster;
use super::feasibility::{Demand, labels_match, misfit};
use super::index::{CapacityIndex, Fit};

/// Where a particular instance should or should not go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    /// Try this node first (a stateful instance's previous node).
    pub(crate) prefer: Option<u32>,
    /// Never this node (the node a rebalancing move leaves).
    pub(crate) avoid: Option<u32>,
    pub(crate) fit: Fit,
}

impl Request {
    pub(crate) const ANYWHERE: Request = Request {
        prefer: None,
        avoid: None,
        fit: Fit::Anywhere,
    };
}

/// Spread bookkeeping for one service: each node's label-value key and the
/// instance count per key.
#[derive(Debug)]
struct Spread {
    key_of: Vec<Option<Vec<String>>>,
    counts: BTreeMap<Vec<String>, u32>,
}

/// Chooses nodes for the instances of one service during one reconcile.
#[derive(Debug)]
pub(crate) struct Placer<'s> {
    pub(crate) service: &'s str,
    pub(crate) demand: Demand<'s>,
    /// What vertical autoscaling sizes new instances to, if it does.
    pub(crate) resized: Option<Resources>,
    spec: &'s ServiceSpec,
    /// Per node: do its labels satisfy `restrict`? `None` when unrestricted.
    eligible: Option<Vec<bool>>,
    /// A private index of the eligible nodes, when they are few: seeking
    /// the shared index would walk past every ineligible node. Its levels
    /// are the service's staying instances, like the shared index's.
    pool: Option<CapacityIndex>,
    spread: Option<Spread>,
}

/// Below this share of all nodes (1 / N), a restricted service gets its own index.
const PRIVATE_POOL_DIVISOR: usize = 4;

impl<'s> Placer<'s> {
    /// Prepares placement for `spec` and focuses the cluster on it:
    /// O(nodes) when it has `restrict` or `spread`, otherwise
    /// O(log nodes) per node the service (and the previous focus) runs on.
    pub(crate) fn new(
        cluster: &mut Cluster<'s>,
        service: &'s str,
        spec: &'s ServiceSpec,
        resized: Option<&Resources>,
    ) -> Self {
        cluster.focus(service);
        let demand = Demand::of(spec, resized.unwrap_or(&spec.resources));
        let eligible: Option<Vec<bool>> = (!demand.restrict.is_empty()).then(|| {
            cluster
                .nodes
                .iter()
                .map(|slot| labels_match(slot, &demand))
                .collect()
        });
        let pool = eligible
            .as_ref()
            .and_then(|eligible| private_pool(cluster, eligible));
        let mut placer = Placer {
            service,
            demand,
            resized: resized.cloned(),
            spec,
            eligible,
            pool,
            spread: None,
        };
        if !spec.placement.spread.is_empty() {
            placer.spread = Some(placer.spread_of(cluster));
        }
        placer
    }

    fn spread_of(&self, cluster: &Cluster<'_>) -> Spread {
        let labels = &self.spec.placement.spread;
        let key_of: Vec<Option<Vec<String>>> = cluster
            .nodes
            .iter()
            .map(|slot| {
                labels
                    .iter()
                    .map(|label| slot.info.label(label).map(str::to_owned))
                    .collect()
            })
            .collect();
        let mut counts = BTreeMap::new();
        for (id, key) in key_of.iter().enumerate() {
            let usable = self.is_eligible(id as u32) && cluster.node(id as u32).schedulable();
            if let (Some(key), true) = (key, usable) {
                counts.entry(key.clone()).or_insert(0);
            }
        }
        for (id, count) in cluster.nodes_running(self.service).into_iter().flatten() {
            if let Some(key) = &key_of[*id as usize] {
                *counts.entry(key.clone()).or_insert(0) += count;
            }
        }
        Spread { key_of, counts }
    }

    fn is_eligible(&self, id: u32) -> bool {
        self.eligible
            .as_ref()
            .is_none_or(|eligible| eligible[id as usize])
    }

    /// The node an instance should go to, or `None` when none can take it.
    pub(crate) fn choose(&self, cluster: &mut Cluster<'s>, request: Request) -> Option<u32> {
        // Another placer may have focused the cluster since.
        cluster.focus(self.service);
        let cluster = &*cluster;
        if let Some(preferred) = request.prefer
            && self.fits(cluster, preferred, request)
        {
            return Some(preferred);
        }
        let Some(spread) = &self.spread else {
            return self.tiered(cluster, request, |_| true);
        };
        let mut keys: Vec<(&u32, &Vec<String>)> = spread
            .counts
            .iter()
            .map(|(key, count)| (count, key))
            .collect();
        keys.sort();
        keys.into_iter()
            .find_map(|(_, key)| {
                self.tiered(cluster, request, |id| {
                    spread.key_of[id as usize].as_ref() == Some(key)
                })
            })
            // Nodes without the spread labels are the last resort.
            .or_else(|| self.tiered(cluster, request, |id| spread.key_of[id as usize].is_none()))
    }

    /// Records that an instance went to node `id`.
    pub(crate) fn placed(&mut self, cluster: &Cluster<'_>, id: u32) {
        if let Some(pool) = &mut self.pool {
            match cluster.index_keys(id) {
                Some((free, headroom)) => pool.set(id, cluster.level(id), free, headroom),
                None => pool.remove(id),
            }
        }
        if let Some(spread) = &mut self.spread
            && let Some(key) = &spread.key_of[id as usize]
        {
            *spread.counts.entry(key.clone()).or_insert(0) += 1;
        }
    }

    /// Whether node `id` can take an instance now.
    pub(crate) fn fits(&self, cluster: &Cluster<'_>, id: u32, request: Request) -> bool {
        let slot = cluster.node(id);
        request.avoid != Some(id)
            && self.is_eligible(id)
            && misfit(slot, &self.demand).is_none()
            && (request.fit == Fit::Anywhere || cluster.stays_under_line(id, self.demand.amount))
    }

    /// Colocate, then separate, then plain bin-packing, each limited to
    /// the nodes `within` accepts.
    fn tiered(
        &self,
        cluster: &Cluster<'_>,
        request: Request,
        within: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        let accept = |id: u32| {
            within(id)
                && request.avoid != Some(id)
                && self.is_eligible(id)
                && cluster.node(id).free_ports() >= self.demand.ports
        };
        let placement = &self.spec.placement;
        if !placement.colocate.is_empty()
            && let Some(id) = self.colocated(cluster, request, &within)
        {
            return Some(id);
        }
        if !placement.separate.is_empty() {
            let apart = self.best_fit(cluster, request.fit, |id| {
                accept(id) && !cluster.node(id).runs_any(&placement.separate)
            });
            if apart.is_some() {
                return apart;
            }
        }
        self.best_fit(cluster, request.fit, accept)
    }

    /// Best fit in the private pool when there is one, else the shared index.
    fn best_fit(
        &self,
        cluster: &Cluster<'_>,
        fit: Fit,
        accept: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        match &self.pool {
            Some(pool) => pool.best_fit(self.demand.amount.room(), fit, accept),
            None => cluster.best_fit(self.demand.amount, fit, accept),
        }
    }

    /// The node already running a service to colocate with that runs the
    /// fewest of this service, fullest first.
    fn colocated(
        &self,
        cluster: &Cluster<'_>,
        request: Request,
        within: &impl Fn(u32) -> bool,
    ) -> Option<u32> {
        self.spec
            .placement
            .colocate
            .iter()
            .filter_map(|name| cluster.nodes_running(name))
            .flat_map(|nodes| nodes.keys().copied())
            .filter(|id| within(*id) && self.fits(cluster, *id, request))
            .min_by_key(|id| {
                let free = cluster.node(*id).free();
                let over_line = !cluster.stays_under_line(*id, self.demand.amount);
                (over_line, cluster.level(*id), free.cpu, free.memory, *id)
            })
    }
}

/// An index of just the eligible schedulable nodes, when they are fewer
/// than one in [`PRIVATE_POOL_DIVISOR`].
fn private_pool(cluster: &Cluster<'_>, eligible: &[bool]) -> Option<CapacityIndex> {
    let count = eligible.iter().filter(|eligible| **eligible).count();
    if count * PRIVATE_POOL_DIVISOR >= eligible.len() {
        return None;
    }
    let mut pool = CapacityIndex::with_nodes(eligible.len());
    for (id, _) in eligible
        .iter()
        .enumerate()
        .filter(|(_, eligible)| **eligible)
    {
        if let Some((free, headroom)) = cluster.index_keys(id as u32) {
            pool.set(id as u32, cluster.level(id as u32), free, headroom);
        }
    }
    Some(pool)
}
