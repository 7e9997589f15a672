//! Adoption: instances a node runs that the store does not place (the
//! node resynced with a new, restored or rewound store, and reported them
//! at `observed/unclaimed/{node}`). A pass that would create an instance
//! of a service first looks for an unclaimed one of the same service,
//! spec version and ordinal on a node that can take it, and places that
//! one where it runs, with its id and host ports: the agent then finds it
//! running and carries on, nothing restarts. What no pass adopts, the
//! agent stops after its grace period.

use std::collections::{BTreeSet, HashMap, VecDeque};

use cca_model::recovery::UnclaimedInstance;

use super::cluster::Cluster;
use super::scoring::{Placer, Request};
use crate::view::View;

/// Unclaimed instances of one service version, each with its node.
type Candidates<'v> = VecDeque<(&'v str, &'v UnclaimedInstance)>;

/// The unclaimed instances of the view by service and spec version, each
/// with its node, taken at most once per pass.
#[derive(Debug, Default)]
pub(crate) struct Claims<'v> {
    /// Service → spec hash → (node, instance).
    by_version: HashMap<&'v str, HashMap<&'v str, Candidates<'v>>>,
    /// Ids adopted this pass (a node may report an id twice after a move).
    taken: BTreeSet<&'v str>,
}

impl<'v> Claims<'v> {
    /// Indexes `view`'s reports; empty (and free) when there are none.
    pub(crate) fn of(view: &'v View) -> Self {
        let mut claims = Claims::default();
        for (node, reported) in view.unclaimed.iter() {
            for instance in &reported.value.instances {
                claims
                    .by_version
                    .entry(instance.service.as_str())
                    .or_default()
                    .entry(instance.spec_hash.as_str())
                    .or_default()
                    .push_back((node.as_str(), instance));
            }
        }
        claims
    }

    /// An unclaimed instance of `placer`'s service at `spec_hash` with
    /// `ordinal`, on a node that can take it now with the host ports it
    /// holds, and that no placement of the view already uses; removed from
    /// the claims. Returns its node's slot id with it.
    pub(crate) fn take(
        &mut self,
        view: &View,
        cluster: &Cluster<'_>,
        placer: &Placer<'_>,
        spec_hash: &str,
        ordinal: Option<u32>,
    ) -> Option<(u32, &'v UnclaimedInstance)> {
        let candidates = self
            .by_version
            .get_mut(placer.service)?
            .get_mut(spec_hash)?;
        let position = candidates.iter().position(|(node, instance)| {
            instance.ordinal == ordinal
                && !self.taken.contains(instance.id.as_str())
                && !view.instances.contains_key(&instance.id)
                && cluster.node_id(node).is_some_and(|id| {
                    placer.fits(cluster, id, Request::ANYWHERE)
                        && instance
                            .host_ports
                            .values()
                            .all(|port| cluster.node(id).port_free(*port))
                })
        })?;
        let (node, instance) = candidates.remove(position)?;
        self.taken.insert(instance.id.as_str());
        Some((cluster.node_id(node)?, instance))
    }
}
