//! The eBPF service data plane (`--dataplane ebpf`): service VIPs balanced
//! by programs in the kernel instead of nftables rules. This part balances
//! the node's own processes at the socket: a connect (TCP, connected UDP)
//! or unconnected UDP send to a VIP port is sent to a backend before any
//! packet exists, so there is no per-packet translation and no conntrack;
//! getpeername and recvmsg show the VIP again. A VIP port without ready
//! backends refuses at once (`ECONNREFUSED`).
//!
//! - [`maglev`]: the seeded flow hash and each VIP port's consistent-hash
//!   table, the same on every node for the same seed and backends.
//! - [`layout`]: the maps' keys and values as bytes (`bpf/lb.h`).
//! - [`plan`]: the pure planner — map operations ordered so the programs
//!   never read a half-written change (generation-tagged tables, each
//!   front replaced whole).
//! - [`kernel`]: [`LbMaps`], the seam; [`Attached`] loads the programs
//!   from the checked-in object (`bpf/sock_lb.bpf.o`, rebuilt by
//!   `scripts/bpf`), attaches them to the cgroup v2 root for the calling
//!   thread's network namespace and pins maps and links.
//!
//! [`EbpfPlane`] keeps the maps equal to a [`NetworkMap`], like the
//! nftables [`DataPlane`](crate::dataplane::DataPlane) keeps its table.

pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod kernel;
pub mod layout;
pub mod maglev;
pub mod plan;
pub mod tc;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use cca_model::net::{NetworkMap, Touched};

pub use error::{Error, Result};
pub use kernel::{AttachConfig, Attached, Existing, LbMaps, Stats, remove_pinned};
use plan::{DrainContext, Plan, Programmed, fronts_of};
pub use tc::{TcPrograms, VethPrograms};

/// What one `sync` or `resync` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EbpfReport {
    /// Map operations applied (0: nothing changed).
    pub ops: usize,
    pub resynced: bool,
    /// Sockets' reverse entries to removed backends, deleted.
    pub swept: usize,
}

/// The node's eBPF maps, kept equal to a [`NetworkMap`].
#[derive(Debug)]
pub struct EbpfPlane<M> {
    maps: M,
    seed: u64,
    /// How long backends that leave keep their pinned flows.
    drain: Duration,
    /// What the maps hold; `None` until a resync succeeded, and again
    /// after a failed change.
    programmed: Option<Programmed>,
}

impl<M: LbMaps> EbpfPlane<M> {
    /// A plane over `maps` with the cluster's flow-hash `seed`; it changes
    /// nothing until the first `resync` or `sync`.
    pub fn new(maps: M, seed: u64) -> Self {
        Self {
            maps,
            seed,
            drain: Duration::ZERO,
            programmed: None,
        }
    }

    /// Backends that leave keep the flows already pinned to them this
    /// long (graceful drain); zero, the default: they go at once.
    #[must_use]
    pub fn with_drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    /// Makes the maps hold `map` whatever they held: every front is
    /// written anew under ids the maps do not use, each replacing its old
    /// value in one update, then everything else (a previous agent's
    /// entries) is deleted. Traffic never meets a missing front; backends
    /// the maps hold keep their ids (flows pinned to them stay valid), and
    /// those no table names any more drain.
    pub fn resync(&mut self, map: &NetworkMap) -> Result<EbpfReport> {
        self.resync_at(map, Instant::now())
    }

    pub fn resync_at(&mut self, map: &NetworkMap, now: Instant) -> Result<EbpfReport> {
        self.programmed = None;
        let existing = self.maps.existing()?;
        let mut programmed = Programmed::new(
            self.seed,
            existing
                .tables
                .iter()
                .map(|table| table.front)
                .chain(existing.fronts.values().map(|front| front.id))
                .collect(),
            &existing.backends,
        )
        .with_drain(self.drain);
        let mut plan = Plan::default();
        let mut released = Vec::new();
        let mut desired = std::collections::BTreeMap::new();
        for (name, service) in &map.services {
            let fronts = fronts_of(service);
            for (key, state) in &fronts {
                programmed.update(*key, Some(state), &mut plan, &mut released);
            }
            programmed.set_service(name, fronts.keys().copied().collect());
            desired.extend(fronts);
        }
        for key in existing
            .fronts
            .keys()
            .filter(|key| !desired.contains_key(key))
        {
            plan.ops.push(plan::Op::DeleteFront { key: *key });
        }
        for key in &existing.tables {
            plan.ops.push(plan::Op::DeleteTable { key: *key });
        }
        let context = DrainContext::of(now, map.services.values().map(|service| &**service));
        programmed.drain_unadopted(&context);
        programmed.finish(released, &mut plan, &context);
        self.maps.apply(&plan.ops)?;
        self.maps.set_service_range(service_range(map))?;
        programmed.forget_foreign();
        let swept = self.maps.sweep(&plan.removed_backends)?;
        tracing::debug!(
            fronts = programmed.fronts(),
            backends = programmed.backends(),
            draining = programmed.draining(),
            ops = plan.ops.len(),
            swept,
            "eBPF maps rebuilt"
        );
        self.programmed = Some(programmed);
        Ok(EbpfReport {
            ops: plan.ops.len(),
            resynced: true,
            swept,
        })
    }

    /// Changes what the `touched` services own; a resync when the maps'
    /// state is not known. On error the next call resyncs.
    pub fn sync(&mut self, map: &NetworkMap, touched: &Touched) -> Result<EbpfReport> {
        self.sync_at(map, touched, Instant::now())
    }

    pub fn sync_at(
        &mut self,
        map: &NetworkMap,
        touched: &Touched,
        now: Instant,
    ) -> Result<EbpfReport> {
        let Some(programmed) = self.programmed.as_mut() else {
            return self.resync_at(map, now);
        };
        let mut plan = Plan::default();
        let mut released = Vec::new();
        for name in &touched.services {
            let desired = map
                .services
                .get(name)
                .map(|service| fronts_of(service))
                .unwrap_or_default();
            // Fronts the service had and has no more: its old fronts are
            // those the planner holds for its VIP ports.
            for key in programmed.fronts_of_service(name) {
                if !desired.contains_key(&key) {
                    programmed.update(key, None, &mut plan, &mut released);
                }
            }
            for (key, state) in &desired {
                programmed.update(*key, Some(state), &mut plan, &mut released);
            }
            programmed.set_service(name, desired.keys().copied().collect());
        }
        let context = DrainContext::of(
            now,
            touched
                .services
                .iter()
                .filter_map(|name| map.services.get(name))
                .map(|service| &**service),
        );
        programmed.finish(released, &mut plan, &context);
        if touched.ranges
            && let Err(error) = self.maps.set_service_range(service_range(map))
        {
            self.programmed = None;
            return Err(error);
        }
        self.apply(plan, false)
    }

    /// Ends the drains due by `now`: their backends go and the flows
    /// still pinned to them are swept.
    pub fn expire(&mut self, now: Instant) -> Result<EbpfReport> {
        let Some(programmed) = self.programmed.as_mut() else {
            return Ok(EbpfReport::default());
        };
        let mut plan = Plan::default();
        programmed.expire(now, &mut plan);
        self.apply(plan, false)
    }

    /// When the next drain ends (for [`EbpfPlane::expire`]).
    pub fn next_drain_end(&self) -> Option<Instant> {
        self.programmed
            .as_ref()
            .and_then(Programmed::next_drain_end)
    }

    fn apply(&mut self, plan: Plan, resynced: bool) -> Result<EbpfReport> {
        if plan.ops.is_empty() {
            return Ok(EbpfReport::default());
        }
        if let Err(error) = self.maps.apply(&plan.ops) {
            self.programmed = None;
            return Err(error);
        }
        let swept = self.maps.sweep(&plan.removed_backends)?;
        Ok(EbpfReport {
            ops: plan.ops.len(),
            resynced,
            swept,
        })
    }

    /// Hashes flows with `seed` from now on (the cluster's, once the map
    /// brings it): the programs at once, the tables at the next sync (a
    /// rebuild). Flows already pinned keep their backends.
    pub fn set_seed(&mut self, seed: u64) -> Result<()> {
        if seed == self.seed {
            return Ok(());
        }
        self.maps.set_seed(seed)?;
        self.seed = seed;
        self.programmed = None;
        Ok(())
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Where instances' veths get the tc programs.
    pub fn veth_programs(&self) -> std::sync::Arc<dyn VethPrograms> {
        self.maps.veth_programs()
    }

    pub fn stats(&self) -> Result<Stats> {
        self.maps.stats()
    }

    /// Detaches the programs and removes the maps.
    pub fn remove(&mut self) -> Result<()> {
        self.programmed = None;
        self.maps.remove()
    }
}

/// The service range of `map` as the tc programs take it.
fn service_range(map: &NetworkMap) -> Option<(std::net::Ipv4Addr, u8)> {
    map.ranges
        .map(|ranges| (ranges.services.network(), ranges.services.prefix()))
}
