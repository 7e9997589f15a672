//! The pure planner of the eBPF data plane: what the maps must hold for a
//! `NetworkMap` (one front per VIP port, its backends and its table) and
//! the map operations that take them from what they hold now to that, in
//! an order the programs may read at any point. No IO.
//!
//! Order is what makes a change safe to read half-done: backends are
//! written before any table names them; a front's new table is written
//! under its other generation, then the front is replaced whole (one map
//! update, so a reader sees the old count and table or the new ones, never
//! a mix), then the old table goes; backends no table names any more go
//! last, and only then are the flows and sockets' reverse entries to them
//! swept.
//!
//! A backend no table names any more drains first: it stays in the
//! backend map, so the flows already pinned to it keep it, for the drain
//! window ([`Programmed::with_drain`]); it goes at once when its address
//! turns up as another instance's (a reused address), and comes back
//! under the same id when it is ready again. New flows never get it: no
//! table names it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cca_model::net::{Affinity, ServiceNet};
use cca_model::spec::Protocol;

use super::layout::{FRONT_AFFINITY, FRONT_SMALL, Front, FrontKey, TableKey};
use super::maglev::{self, SMALL_MAX};
use crate::dataplane::compile::vip_ports;

/// One change to the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend {
        id: u32,
        address: SocketAddr,
    },
    /// `slots` holds backend ids; its length says the table's size.
    PutTable {
        key: TableKey,
        slots: Vec<u32>,
    },
    PutFront {
        key: FrontKey,
        front: Front,
    },
    DeleteFront {
        key: FrontKey,
    },
    DeleteTable {
        key: TableKey,
    },
    DeleteBackend {
        id: u32,
    },
}

/// What one front balances over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontState {
    /// Sorted, without duplicates.
    pub backends: Vec<SocketAddr>,
    pub affinity: bool,
    /// The instance at each backend address (a drain ends when another
    /// instance turns up at its address).
    pub instances: BTreeMap<IpAddr, String>,
}

/// The fronts of `service`: one per VIP port.
pub fn fronts_of(service: &ServiceNet) -> BTreeMap<FrontKey, FrontState> {
    let Some(vip) = service.vip else {
        return BTreeMap::new();
    };
    vip_ports(service)
        .into_iter()
        .map(|(port, state)| {
            let key = FrontKey {
                address: SocketAddr::new(IpAddr::V4(vip), port.port),
                protocol: protocol_number(port.protocol),
            };
            let backends = state
                .backends
                .iter()
                .map(|(address, port)| SocketAddr::new(IpAddr::V4(*address), *port))
                .collect();
            let affinity = state.affinity == Affinity::ClientIp;
            let instances = service
                .members
                .iter()
                .filter(|member| {
                    state
                        .backends
                        .iter()
                        .any(|(address, _)| *address == member.address)
                })
                .map(|member| (IpAddr::V4(member.address), member.instance.clone()))
                .collect();
            let state = FrontState {
                backends,
                affinity,
                instances,
            };
            (key, state)
        })
        .collect()
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
    }
}

/// A front as the maps hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ProgrammedFront {
    id: u32,
    generation: u8,
    state: FrontState,
}

impl ProgrammedFront {
    fn small(&self) -> bool {
        self.state.backends.len() <= SMALL_MAX
    }

    /// Its table's key; `None` without backends (no table).
    fn table_key(&self) -> Option<TableKey> {
        (!self.state.backends.is_empty()).then_some(TableKey {
            front: self.id,
            generation: self.generation,
            small: self.small(),
        })
    }
}

/// A backend tables name: its id, how many fronts' tables, its instance.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Live {
    id: u32,
    refs: usize,
    instance: Option<String>,
}

/// A backend no table names, kept for the flows pinned to it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Draining {
    id: u32,
    until: Instant,
    /// The instance at its address when it left (`None`: none was).
    instance: Option<String>,
}

/// What a change knows beyond the map's fronts: the time, and which
/// instance holds each address among the services it touched.
#[derive(Clone, Debug)]
pub struct DrainContext {
    pub now: Instant,
    pub members: BTreeMap<IpAddr, String>,
}

impl DrainContext {
    /// The members of `services` at `now`.
    pub fn of<'a>(now: Instant, services: impl IntoIterator<Item = &'a ServiceNet>) -> Self {
        let members = services
            .into_iter()
            .flat_map(|service| &service.members)
            .map(|member| (IpAddr::V4(member.address), member.instance.clone()))
            .collect();
        Self { now, members }
    }
}

/// What the maps hold, as far as this planner wrote them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Programmed {
    seed: u64,
    drain: Duration,
    fronts: BTreeMap<FrontKey, ProgrammedFront>,
    /// Each service's fronts, as last planned.
    services: BTreeMap<String, BTreeSet<FrontKey>>,
    /// The backends tables name.
    backends: BTreeMap<SocketAddr, Live>,
    draining: BTreeMap<SocketAddr, Draining>,
    /// Backends a previous agent wrote, by address: taken over (same id,
    /// so flows pinned to them stay valid) when a table names them.
    adoptable: BTreeMap<SocketAddr, u32>,
    /// Ids the maps use that this planner did not hand out (a previous
    /// agent's): never handed out while they are in use.
    foreign_fronts: BTreeSet<u32>,
    foreign_backends: BTreeSet<u32>,
    next_front: u32,
    next_backend: u32,
    free_fronts: Vec<u32>,
    free_backends: Vec<u32>,
}

/// What a sync did beyond its operations: the backends no front names any
/// more (their sockets' reverse entries are swept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub removed_backends: BTreeSet<SocketAddr>,
}

impl Programmed {
    /// Maps that hold nothing of ours yet but may hold a previous agent's
    /// fronts with these ids and its `backends` (a restart): new fronts
    /// take other ids, so the old ones keep serving until they are
    /// replaced; its backends are taken over where the new tables name
    /// them and drain where they do not.
    pub fn new(
        seed: u64,
        foreign_fronts: BTreeSet<u32>,
        backends: &BTreeMap<u32, SocketAddr>,
    ) -> Self {
        Self {
            seed,
            foreign_fronts,
            foreign_backends: backends.keys().copied().collect(),
            adoptable: backends
                .iter()
                .map(|(id, address)| (*address, *id))
                .collect(),
            ..Self::default()
        }
    }

    /// Backends no table names any more keep their pinned flows this long
    /// (zero: they go at once).
    #[must_use]
    pub fn with_drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Backends draining now.
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// When the next drain ends.
    pub fn next_drain_end(&self) -> Option<Instant> {
        self.draining.values().map(|draining| draining.until).min()
    }

    pub fn fronts(&self) -> usize {
        self.fronts.len()
    }

    pub fn backends(&self) -> usize {
        self.backends.len()
    }

    /// The fronts last planned for service `name`.
    pub fn fronts_of_service(&self, name: &str) -> BTreeSet<FrontKey> {
        self.services.get(name).cloned().unwrap_or_default()
    }

    /// Records service `name`'s fronts (none: the service is gone).
    pub fn set_service(&mut self, name: &str, fronts: BTreeSet<FrontKey>) {
        if fronts.is_empty() {
            self.services.remove(name);
        } else {
            self.services.insert(name.to_owned(), fronts);
        }
    }

    /// The operations that make `key` balance over `desired` (`None`:
    /// remove it), appended to `plan`; backend releases are finished by
    /// [`Programmed::finish`].
    pub fn update(
        &mut self,
        key: FrontKey,
        desired: Option<&FrontState>,
        plan: &mut Plan,
        released: &mut Vec<SocketAddr>,
    ) {
        let current = self.fronts.get(&key).cloned();
        match (current, desired) {
            (None, None) => {}
            (Some(current), Some(desired)) if &current.state == desired => {}
            (Some(current), None) => {
                plan.ops.push(Op::DeleteFront { key });
                if let Some(key) = current.table_key() {
                    plan.ops.push(Op::DeleteTable { key });
                }
                released.extend(current.state.backends.iter().copied());
                self.fronts.remove(&key);
                self.free_fronts.push(current.id);
            }
            (current, Some(desired)) => {
                let (id, generation) = match &current {
                    Some(current) => (current.id, current.generation ^ 1),
                    None => (self.front_id(), 0),
                };
                let programmed = ProgrammedFront {
                    id,
                    generation,
                    state: desired.clone(),
                };
                if let Some(table_key) = programmed.table_key() {
                    let slots = self.table(desired, plan);
                    plan.ops.push(Op::PutTable {
                        key: table_key,
                        slots,
                    });
                }
                let count = u16::try_from(desired.backends.len()).unwrap_or(u16::MAX);
                let mut flags = if desired.affinity { FRONT_AFFINITY } else { 0 };
                if programmed.small() {
                    flags |= FRONT_SMALL;
                }
                plan.ops.push(Op::PutFront {
                    key,
                    front: Front {
                        id,
                        count,
                        generation,
                        flags,
                    },
                });
                if let Some(current) = current {
                    if let Some(key) = current.table_key() {
                        plan.ops.push(Op::DeleteTable { key });
                    }
                    released.extend(current.state.backends.iter().copied());
                }
                self.fronts.insert(key, programmed);
            }
        }
    }

    /// Releases `released` backends (one reference each), after every
    /// table change: those no table names any more drain; draining ones
    /// whose address `context` shows held by another instance go.
    pub fn finish(&mut self, released: Vec<SocketAddr>, plan: &mut Plan, context: &DrainContext) {
        for address in released {
            let Some(live) = self.backends.get_mut(&address) else {
                continue;
            };
            live.refs -= 1;
            if live.refs == 0 {
                let (id, instance) = (live.id, live.instance.take());
                self.backends.remove(&address);
                self.start_draining(address, id, instance, context);
            }
        }
        let reused: Vec<SocketAddr> = self
            .draining
            .iter()
            .filter(|(address, draining)| {
                context
                    .members
                    .get(&address.ip())
                    .is_some_and(|instance| draining.instance.as_ref() != Some(instance))
            })
            .map(|(address, _)| *address)
            .collect();
        for address in reused {
            self.end_drain(address, plan);
        }
        if self.drain.is_zero() {
            self.expire(context.now, plan);
        }
    }

    /// Ends the drains due by `now`.
    pub fn expire(&mut self, now: Instant, plan: &mut Plan) {
        let due: Vec<SocketAddr> = self
            .draining
            .iter()
            .filter(|(_, draining)| draining.until <= now)
            .map(|(address, _)| *address)
            .collect();
        for address in due {
            self.end_drain(address, plan);
        }
    }

    /// Backends a previous agent wrote that no new table named: they drain
    /// like any backend that leaves.
    pub fn drain_unadopted(&mut self, context: &DrainContext) {
        for (address, id) in std::mem::take(&mut self.adoptable) {
            let instance = context.members.get(&address.ip()).cloned();
            self.start_draining(address, id, instance, context);
        }
    }

    fn start_draining(
        &mut self,
        address: SocketAddr,
        id: u32,
        instance: Option<String>,
        context: &DrainContext,
    ) {
        let draining = Draining {
            id,
            until: context.now + self.drain,
            instance,
        };
        self.draining.insert(address, draining);
    }

    fn end_drain(&mut self, address: SocketAddr, plan: &mut Plan) {
        let Some(draining) = self.draining.remove(&address) else {
            return;
        };
        self.release_id(draining.id);
        plan.ops.push(Op::DeleteBackend { id: draining.id });
        plan.removed_backends.insert(address);
    }

    /// A deleted backend's id may be handed out again.
    fn release_id(&mut self, id: u32) {
        if !self.foreign_backends.remove(&id) {
            self.free_backends.push(id);
        }
    }

    /// The table for `desired` (which has backends), taking a reference
    /// on each backend (and writing the new ones).
    fn table(&mut self, desired: &FrontState, plan: &mut Plan) -> Vec<u32> {
        let ids: Vec<u32> = desired
            .backends
            .iter()
            .map(|address| {
                let instance = desired.instances.get(&address.ip()).cloned();
                self.reference(*address, instance, plan)
            })
            .collect();
        let names: Vec<String> = desired.backends.iter().map(SocketAddr::to_string).collect();
        maglev::table(self.seed, &names)
            .into_iter()
            .map(|index| ids[index as usize])
            .collect()
    }

    fn reference(&mut self, address: SocketAddr, instance: Option<String>, plan: &mut Plan) -> u32 {
        if let Some(live) = self.backends.get_mut(&address) {
            live.refs += 1;
            live.instance = instance;
            return live.id;
        }
        // Ready again, or a previous agent's: the same id, already in the
        // map, so flows pinned to it stay valid.
        let kept = self
            .draining
            .remove(&address)
            .map(|draining| draining.id)
            .or_else(|| self.adoptable.remove(&address));
        let live = |id| Live {
            id,
            refs: 1,
            instance,
        };
        if let Some(id) = kept {
            self.backends.insert(address, live(id));
            return id;
        }
        let id = self.backend_id();
        plan.ops.push(Op::PutBackend { id, address });
        self.backends.insert(address, live(id));
        id
    }

    fn front_id(&mut self) -> u32 {
        allocate(
            &mut self.free_fronts,
            &mut self.next_front,
            &self.foreign_fronts,
        )
    }

    fn backend_id(&mut self) -> u32 {
        allocate(
            &mut self.free_backends,
            &mut self.next_backend,
            &self.foreign_backends,
        )
    }

    /// Forgets previous agents' front ids once the caller deleted their
    /// entries (their backends' ids stay reserved while in use).
    pub fn forget_foreign(&mut self) {
        self.foreign_fronts.clear();
    }
}

/// A free id: a released one, else the next never used, never one of
/// `foreign`.
fn allocate(free: &mut Vec<u32>, next: &mut u32, foreign: &BTreeSet<u32>) -> u32 {
    if let Some(id) = free.pop() {
        return id;
    }
    while foreign.contains(next) {
        *next += 1;
    }
    let id = *next;
    *next += 1;
    id
}
