//! A recording fake of the eBPF maps for tests: it keeps the maps as the
//! kernel would, checks after every operation that no front names a
//! missing table and no table a missing backend (what a program could read
//! at that moment), and answers lookups the way the programs choose.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use super::error::{Error, Result};
use super::kernel::{Existing, LbMaps, Stats};
use super::layout::{FRONT_SMALL, Front, FrontKey, TableKey};
use super::maglev;
use super::plan::Op;
use super::tc::VethPrograms;

/// What the programs do with a connect to a front.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Not a front: the connect goes where it was aimed.
    Pass,
    Sent(SocketAddr),
    Refused,
}

#[derive(Clone, Debug, Default)]
pub struct FakeMaps {
    pub fronts: BTreeMap<FrontKey, Front>,
    pub tables: BTreeMap<TableKey, Vec<u32>>,
    pub backends: BTreeMap<u32, SocketAddr>,
    /// Reverse entries: (socket cookie, backend) → front.
    pub sock_rev: BTreeMap<(u64, SocketAddr), SocketAddr>,
    /// Containers' flows: (client, front) → backend.
    pub flows: BTreeMap<(SocketAddr, SocketAddr), SocketAddr>,
    /// The service range last set (`Some(None)`: every address).
    pub service_range: Option<Option<(Ipv4Addr, u8)>>,
    pub veths: Arc<FakeVeths>,
    /// The programs' seed, once set after opening.
    pub seed: Option<u64>,
    /// Every batch applied, in order.
    pub applied: Vec<Vec<Op>>,
    /// The next `apply` fails after this many operations.
    pub fail_after: Option<usize>,
    pub removed: bool,
}

impl FakeMaps {
    /// What a connect to `key` with flow hash input `flow` gets.
    pub fn lookup(&self, key: &FrontKey, seed: u64, flow: u64) -> Verdict {
        let Some(front) = self.fronts.get(key) else {
            return Verdict::Pass;
        };
        if front.count == 0 {
            return Verdict::Refused;
        }
        let Some(table) = self.tables.get(&table_of(front)) else {
            return Verdict::Refused;
        };
        let id = table[maglev::slot(seed, flow, table.len())];
        self.backends
            .get(&id)
            .map_or(Verdict::Refused, |backend| Verdict::Sent(*backend))
    }

    /// Panics when a program could read a front without its table or a
    /// table slot without its backend.
    fn check_readable(&self, after: &Op) {
        for (key, front) in &self.fronts {
            if front.count == 0 {
                continue;
            }
            let table = self
                .tables
                .get(&table_of(front))
                .unwrap_or_else(|| panic!("after {after:?}: front {key:?} has no table"));
            for id in table.iter() {
                assert!(
                    self.backends.contains_key(id),
                    "after {after:?}: front {key:?} names missing backend {id}"
                );
            }
        }
    }
}

/// A [`FakeMaps`] a test keeps reading after the plane took it.
#[derive(Clone, Debug, Default)]
pub struct SharedFakeMaps(pub std::sync::Arc<std::sync::Mutex<FakeMaps>>);

impl SharedFakeMaps {
    pub fn get(&self) -> std::sync::MutexGuard<'_, FakeMaps> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LbMaps for SharedFakeMaps {
    fn existing(&self) -> Result<Existing> {
        self.get().existing()
    }

    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        self.get().apply(ops)
    }

    fn sweep(&mut self, backends: &BTreeSet<SocketAddr>) -> Result<usize> {
        self.get().sweep(backends)
    }

    fn set_service_range(&mut self, range: Option<(Ipv4Addr, u8)>) -> Result<()> {
        self.get().set_service_range(range)
    }

    fn veth_programs(&self) -> Arc<dyn VethPrograms> {
        self.get().veth_programs()
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        self.get().set_seed(seed)
    }

    fn stats(&self) -> Result<Stats> {
        self.get().stats()
    }

    fn remove(&mut self) -> Result<()> {
        self.get().remove()
    }
}

/// The table a front reads.
pub fn table_of(front: &Front) -> TableKey {
    TableKey {
        front: front.id,
        generation: front.generation,
        small: front.flags & FRONT_SMALL != 0,
    }
}

impl LbMaps for FakeMaps {
    fn existing(&self) -> Result<Existing> {
        Ok(Existing {
            fronts: self.fronts.clone(),
            tables: self.tables.keys().copied().collect(),
            backends: self.backends.clone(),
        })
    }

    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        self.applied.push(ops.to_vec());
        for (done, op) in ops.iter().enumerate() {
            if self.fail_after.is_some_and(|limit| done >= limit) {
                self.fail_after = None;
                return Err(Error::Map {
                    map: "fake",
                    error: "injected failure".to_owned(),
                });
            }
            match op {
                Op::PutBackend { id, address } => {
                    self.backends.insert(*id, *address);
                }
                Op::PutTable { key, slots } => {
                    self.tables.insert(*key, slots.clone());
                }
                Op::PutFront { key, front } => {
                    self.fronts.insert(*key, *front);
                }
                Op::DeleteFront { key } => {
                    self.fronts.remove(key);
                }
                Op::DeleteTable { key } => {
                    self.tables.remove(key);
                }
                Op::DeleteBackend { id } => {
                    self.backends.remove(id);
                }
            }
            self.check_readable(op);
        }
        Ok(())
    }

    fn sweep(&mut self, backends: &BTreeSet<SocketAddr>) -> Result<usize> {
        let before = self.sock_rev.len() + self.flows.len();
        self.sock_rev
            .retain(|(_, backend), _| !backends.contains(backend));
        self.flows.retain(|_, backend| !backends.contains(backend));
        Ok(before - self.sock_rev.len() - self.flows.len())
    }

    fn set_service_range(&mut self, range: Option<(Ipv4Addr, u8)>) -> Result<()> {
        self.service_range = Some(range);
        Ok(())
    }

    fn veth_programs(&self) -> Arc<dyn VethPrograms> {
        self.veths.clone()
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        self.seed = Some(seed);
        Ok(())
    }

    fn stats(&self) -> Result<Stats> {
        Ok(Stats::new())
    }

    fn remove(&mut self) -> Result<()> {
        self.veths.retain(&BTreeSet::new())?;
        *self = Self {
            removed: true,
            veths: self.veths.clone(),
            ..Self::default()
        };
        Ok(())
    }
}

/// Records which veths have the tc programs; `fail` makes the next
/// attach fail.
#[derive(Debug, Default)]
pub struct FakeVeths {
    pub attached: Mutex<BTreeSet<String>>,
    /// Every call, in order: `attach vethX`, `detach vethX`, `retain N`.
    pub calls: Mutex<Vec<String>>,
    pub fail: std::sync::atomic::AtomicBool,
}

impl FakeVeths {
    pub fn attached(&self) -> BTreeSet<String> {
        self.attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, call: String) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }
}

impl VethPrograms for FakeVeths {
    fn attach(&self, veth: &str) -> Result<()> {
        self.record(format!("attach {veth}"));
        if self.fail.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Program {
                program: "fake",
                error: format!("injected failure attaching to {veth}"),
            });
        }
        self.attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(veth.to_owned());
        Ok(())
    }

    fn detach(&self, veth: &str) -> Result<()> {
        self.record(format!("detach {veth}"));
        self.attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(veth);
        Ok(())
    }

    fn retain(&self, keep: &BTreeSet<String>) -> Result<()> {
        self.record(format!("retain {}", keep.len()));
        self.attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|veth| keep.contains(veth));
        Ok(())
    }
}
