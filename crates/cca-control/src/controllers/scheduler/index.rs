//! The capacity index: schedulable nodes ordered by how many instances of
//! the service being placed they already run (their *level*), then by free
//! resources, so a best-fit lookup is one `BTreeSet` range seek per level
//! (O(log nodes)) plus the entries a filter rejects. Two orders are kept.
//! `soft` orders by headroom below the pressure line (free minus the
//! reserve that keeps a node at or under ~80% allocated), `hard` by plain
//! free resources. Bin-packing asks `soft` first — the lowest level with a
//! node that stays under the line, the most allocated such node — and only
//! then `hard`, so packing never pushes a node over the line while another
//! node could take the instance; that keeps placement and rebalancing from
//! fighting each other. Searching the lowest level first is what spreads a
//! service fairly: a node gets its `k+1`-th instance only when every node
//! that can take one under the line already has `k`.

use std::collections::BTreeSet;

/// CPU millicores and memory bytes, signed: headroom can be negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Room {
    pub(crate) cpu: i64,
    pub(crate) memory: i64,
}

/// Field order is the sort order: level, then room, then node number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    level: u32,
    room: Room,
    node: u32,
}

/// Which order a lookup may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Only nodes that stay at or under the pressure line.
    UnderPressureLine,
    /// Under the line if possible, else any node with room.
    Anywhere,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct CapacityIndex {
    soft: BTreeSet<Entry>,
    hard: BTreeSet<Entry>,
    /// Each indexed node's entries, to remove them on update.
    held: Vec<Option<(Entry, Entry)>>,
}

impl CapacityIndex {
    pub(crate) fn with_nodes(nodes: usize) -> Self {
        Self {
            held: vec![None; nodes],
            ..Self::default()
        }
    }

    /// Indexes `node` at `level` with its free room and headroom under
    /// the line, replacing what was held for it.
    pub(crate) fn set(&mut self, node: u32, level: u32, free: Room, headroom: Room) {
        let soft = Entry {
            level,
            room: headroom,
            node,
        };
        let hard = Entry {
            level,
            room: free,
            node,
        };
        if self.held.get(node as usize) == Some(&Some((soft, hard))) {
            return;
        }
        self.remove(node);
        self.soft.insert(soft);
        self.hard.insert(hard);
        if let Some(slot) = self.held.get_mut(node as usize) {
            *slot = Some((soft, hard));
        }
    }

    /// Takes `node` out (it is not schedulable).
    pub(crate) fn remove(&mut self, node: u32) {
        if let Some((soft, hard)) = self.held.get_mut(node as usize).and_then(Option::take) {
            self.soft.remove(&soft);
            self.hard.remove(&hard);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.hard.len()
    }

    /// The node at the lowest level with the least room that still has
    /// `need` and that `accept` takes; ties go to the lower node number
    /// (name order). Under the line at any level beats over it at a lower
    /// one (see the module documentation).
    pub(crate) fn best_fit(
        &self,
        need: Room,
        fit: Fit,
        mut accept: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        let under_line = seek(&self.soft, need, &mut accept);
        match fit {
            Fit::UnderPressureLine => under_line,
            Fit::Anywhere => under_line.or_else(|| seek(&self.hard, need, &mut accept)),
        }
    }
}

/// One range seek per level present, lowest level first: levels are few
/// (a service's instances per node), so this stays O(levels · log nodes).
fn seek(set: &BTreeSet<Entry>, need: Room, accept: &mut impl FnMut(u32) -> bool) -> Option<u32> {
    let start = |level: u32, cpu: i64| Entry {
        level,
        room: Room {
            cpu,
            memory: i64::MIN,
        },
        node: 0,
    };
    let mut level = set.first()?.level;
    loop {
        let from = start(level, need.cpu);
        let found = match level.checked_add(1) {
            Some(next) => set
                .range(from..start(next, i64::MIN))
                .find(|entry| entry.room.memory >= need.memory && accept(entry.node)),
            None => set
                .range(from..)
                .find(|entry| entry.room.memory >= need.memory && accept(entry.node)),
        };
        if let Some(entry) = found {
            return Some(entry.node);
        }
        level = set
            .range(start(level.checked_add(1)?, i64::MIN)..)
            .next()?
            .level;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(cpu: i64, memory: i64) -> Room {
        Room { cpu, memory }
    }

    #[test]
    fn best_fit_prefers_the_fullest_node_under_the_line() {
        let mut index = CapacityIndex::with_nodes(3);
        index.set(0, 0, room(900, 900), room(700, 700));
        index.set(1, 0, room(300, 300), room(100, 100));
        index.set(2, 0, room(500, 500), room(300, 300));
        assert_eq!(
            index.best_fit(room(100, 100), Fit::Anywhere, |_| true),
            Some(1)
        );
        assert_eq!(
            index.best_fit(room(200, 100), Fit::Anywhere, |_| true),
            Some(2)
        );
        assert_eq!(
            index.best_fit(room(200, 100), Fit::Anywhere, |n| n != 2),
            Some(0)
        );
        // Memory is checked too: node 2 has cpu headroom but not memory.
        assert_eq!(
            index.best_fit(room(200, 400), Fit::Anywhere, |_| true),
            Some(0)
        );
    }

    #[test]
    fn over_the_line_only_when_asked_and_nothing_else_fits() {
        let mut index = CapacityIndex::with_nodes(2);
        index.set(0, 0, room(300, 300), room(100, 100));
        index.set(1, 0, room(250, 250), room(50, 50));
        assert_eq!(
            index.best_fit(room(200, 1), Fit::UnderPressureLine, |_| true),
            None
        );
        assert_eq!(
            index.best_fit(room(200, 1), Fit::Anywhere, |_| true),
            Some(1)
        );
    }

    #[test]
    fn the_lowest_level_wins_then_the_fullest_node() {
        let mut index = CapacityIndex::with_nodes(4);
        index.set(0, 1, room(100, 100), room(100, 100));
        index.set(1, 0, room(900, 900), room(700, 700));
        index.set(2, 0, room(500, 500), room(300, 300));
        index.set(3, 2, room(200, 200), room(200, 200));
        let any = |_| true;
        assert_eq!(index.best_fit(room(100, 100), Fit::Anywhere, any), Some(2));
        // Nothing has the memory under the line: over it, lowest level first.
        assert_eq!(index.best_fit(room(100, 800), Fit::Anywhere, any), Some(1));
        assert_eq!(
            index.best_fit(room(100, 100), Fit::Anywhere, |n| n > 1),
            Some(2)
        );
        assert_eq!(
            index.best_fit(room(100, 100), Fit::Anywhere, |n| n != 1 && n != 2),
            Some(0)
        );
        assert_eq!(
            index.best_fit(room(150, 150), Fit::Anywhere, |n| n == 0 || n == 3),
            Some(3)
        );
        // Under the line at a higher level beats over it at a lower one.
        index.set(2, 0, room(500, 500), room(-10, -10));
        index.set(1, 1, room(900, 900), room(700, 700));
        assert_eq!(index.best_fit(room(100, 100), Fit::Anywhere, any), Some(0));
        assert_eq!(
            index.best_fit(room(200, 200), Fit::Anywhere, |n| n != 1 && n != 3),
            Some(2)
        );
    }

    #[test]
    fn updates_replace_and_remove_entries() {
        let mut index = CapacityIndex::with_nodes(2);
        index.set(0, 0, room(300, 300), room(300, 300));
        index.set(0, 0, room(50, 50), room(50, 50));
        assert_eq!(index.len(), 1);
        assert_eq!(index.best_fit(room(100, 1), Fit::Anywhere, |_| true), None);
        index.remove(0);
        index.remove(1);
        assert_eq!(index.len(), 0);
    }
}
