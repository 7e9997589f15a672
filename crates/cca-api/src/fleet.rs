//! What the API knows of the fleet's size beyond its cache, for sizing
//! node leases (`cca_model::node_lease`): the registrations it is serving
//! now (in a cluster's first minute thousands of nodes register at once,
//! and the cache counts each only once its registration is committed), and
//! a bound on lease moves served at once (a move costs a read, a grant, a
//! commit and a revocation on the liveness lane; never urgent, it must not
//! slow the heartbeats beside it, so one that finds no room waits for the
//! node's next heartbeat).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, SemaphorePermit};

use cca_control::View;

/// Lease moves served at once, at most.
const MOVES_AT_ONCE: usize = 4;

#[derive(Debug)]
pub(crate) struct Fleet {
    registering: AtomicUsize,
    moves: Semaphore,
}

impl Default for Fleet {
    fn default() -> Self {
        Self {
            registering: AtomicUsize::new(0),
            moves: Semaphore::new(MOVES_AT_ONCE),
        }
    }
}

/// One registration being served; counted until dropped.
#[derive(Debug)]
pub(crate) struct Registering<'a> {
    fleet: &'a Fleet,
}

impl Drop for Registering<'_> {
    fn drop(&mut self) {
        self.fleet.registering.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Fleet {
    /// Counts a registration until the guard is dropped.
    pub(crate) fn registering(&self) -> Registering<'_> {
        self.registering.fetch_add(1, Ordering::Relaxed);
        Registering { fleet: self }
    }

    /// The fleet `node` registers into: the nodes with a live lease in
    /// `view` and those registering now (`node` among them), counting a
    /// node once when it is both.
    pub(crate) fn joined_by(&self, view: &View, node: &str) -> usize {
        let registering = self.registering.load(Ordering::Relaxed).max(1);
        let live = view.heartbeats.len();
        live + registering - usize::from(view.heartbeats.contains_key(node))
    }

    /// Room for one lease move, if no more than [`MOVES_AT_ONCE`] are
    /// under way.
    pub(crate) fn room_to_move(&self) -> Option<SemaphorePermit<'_>> {
        self.moves.try_acquire().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_under_way_count_towards_the_fleet_once_each() {
        let fleet = Fleet::default();
        let mut view = View::default();
        assert_eq!(fleet.joined_by(&view, "n1"), 1, "a node alone");
        let heartbeat = br#"{"lease_ttl_secs":6,"started_at":0,"lease":7}"#;
        view.put("observed/heartbeat/n1", heartbeat, 2);
        view.put("observed/heartbeat/n2", heartbeat, 3);
        let first = fleet.registering();
        let second = fleet.registering();
        // n3 and another new node registering beside two live ones.
        assert_eq!(fleet.joined_by(&view, "n3"), 4);
        // n1 registering again is counted once.
        assert_eq!(fleet.joined_by(&view, "n1"), 3);
        drop((first, second));
        assert_eq!(fleet.joined_by(&view, "n3"), 3);
    }

    #[test]
    fn lease_moves_are_bounded() {
        let fleet = Fleet::default();
        let held: Vec<_> = (0..MOVES_AT_ONCE)
            .map(|_| fleet.room_to_move().expect("room"))
            .collect();
        assert!(fleet.room_to_move().is_none(), "no room beyond the bound");
        drop(held);
        assert!(fleet.room_to_move().is_some());
    }
}
