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
//! last, and only then are the sockets' reverse entries to them swept.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

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
            (key, FrontState { backends, affinity })
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

/// What the maps hold, as far as this planner wrote them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Programmed {
    seed: u64,
    fronts: BTreeMap<FrontKey, ProgrammedFront>,
    /// Each service's fronts, as last planned.
    services: BTreeMap<String, BTreeSet<FrontKey>>,
    /// Each backend's id and how many fronts' tables name it.
    backends: BTreeMap<SocketAddr, (u32, usize)>,
    /// Ids the maps use that this planner did not write (a previous
    /// agent's): never handed out until they are gone.
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
    /// entries with these ids (a restart): new entries take other ids, so
    /// the old ones keep serving until they are replaced.
    pub fn new(seed: u64, foreign_fronts: BTreeSet<u32>, foreign_backends: BTreeSet<u32>) -> Self {
        Self {
            seed,
            foreign_fronts,
            foreign_backends,
            ..Self::default()
        }
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

    /// Releases `released` backends (one reference each): those no table
    /// names any more are deleted, after every table change.
    pub fn finish(&mut self, released: Vec<SocketAddr>, plan: &mut Plan) {
        for address in released {
            let Some((id, refs)) = self.backends.get_mut(&address) else {
                continue;
            };
            *refs -= 1;
            if *refs == 0 {
                let id = *id;
                self.backends.remove(&address);
                self.free_backends.push(id);
                plan.ops.push(Op::DeleteBackend { id });
                plan.removed_backends.insert(address);
            }
        }
        // A backend that left one front and joined another in the same
        // change is not removed.
        plan.removed_backends
            .retain(|address| !self.backends.contains_key(address));
    }

    /// The table for `desired` (which has backends), taking a reference
    /// on each backend (and writing the new ones).
    fn table(&mut self, desired: &FrontState, plan: &mut Plan) -> Vec<u32> {
        let ids: Vec<u32> = desired
            .backends
            .iter()
            .map(|address| self.reference(*address, plan))
            .collect();
        let names: Vec<String> = desired.backends.iter().map(SocketAddr::to_string).collect();
        maglev::table(self.seed, &names)
            .into_iter()
            .map(|index| ids[index as usize])
            .collect()
    }

    fn reference(&mut self, address: SocketAddr, plan: &mut Plan) -> u32 {
        if let Some((id, refs)) = self.backends.get_mut(&address) {
            *refs += 1;
            return *id;
        }
        let id = self.backend_id();
        plan.ops.push(Op::PutBackend { id, address });
        self.backends.insert(address, (id, 1));
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

    /// Forgets previous agents' ids once the caller deleted their entries.
    pub fn forget_foreign(&mut self) {
        self.foreign_fronts.clear();
        self.foreign_backends.clear();
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
