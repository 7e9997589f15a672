//! Seeded flow hashing and each front's consistent-hash table (Maglev:
//! Eisenbud et al., NSDI 2016). The table is a pure function of the
//! cluster-wide seed and the set of backends, never of their order or of
//! the node computing it, so every node sends a flow to the same backend;
//! a backend that joins or leaves takes or gives up about its own share of
//! the slots, so the other flows keep theirs.
//!
//! [`mix`], [`slot`] and [`flow_hash`] are the programs' hashes too
//! (`bpf/maps.h`, `bpf/tc_lb.bpf.c`): both sides must compute the same
//! slot for a flow.

use std::net::SocketAddr;

use super::layout::address_bytes;

/// Slots of a large table (`LB_TABLE_SIZE`): prime, so every skip visits
/// every slot.
pub const TABLE_SIZE: usize = 1021;
/// Slots of a small table (`LB_SMALL_TABLE_SIZE`), for fronts with up to
/// [`SMALL_MAX`] backends: a quarter of the memory, shares still within
/// a few percent.
pub const SMALL_TABLE_SIZE: usize = 251;
pub const SMALL_MAX: usize = 8;

/// The table size for a front with `backends` backends.
pub fn size_for(backends: usize) -> usize {
    if backends <= SMALL_MAX {
        SMALL_TABLE_SIZE
    } else {
        TABLE_SIZE
    }
}

/// A 64-bit finaliser (MurmurHash3's): every input bit moves every output
/// bit.
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The slot of `flow` under `seed` in a table of `size` slots, as the
/// programs compute it.
pub fn slot(seed: u64, flow: u64, size: usize) -> usize {
    (mix(seed ^ mix(flow)) % size as u64) as usize
}

/// A packet's flow as the tc programs hash it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub client: SocketAddr,
    pub front: SocketAddr,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub protocol: u8,
}

/// The seeded hash the tc programs pick a flow's slot with (`hash %
/// size`): of the client's address alone with client-IP `affinity`, else
/// of the whole 5-tuple. The programs read addresses and ports as the
/// packet holds them (network order) into host-order words.
pub fn flow_hash(seed: u64, flow: &Flow, affinity: bool) -> u64 {
    let words = |address: SocketAddr| {
        let bytes = address_bytes(address.ip());
        let word = |at: usize| {
            u64::from(u32::from_ne_bytes([
                bytes[at],
                bytes[at + 1],
                bytes[at + 2],
                bytes[at + 3],
            ]))
        };
        [word(0) << 32 | word(4), word(8) << 32 | word(12)]
    };
    let port = |address: SocketAddr| u64::from(u16::from_ne_bytes(address.port().to_be_bytes()));
    let mut h = seed;
    for word in words(flow.client) {
        h = mix(h ^ word);
    }
    if affinity {
        return h;
    }
    for word in words(flow.front) {
        h = mix(h ^ word);
    }
    mix(h ^ (port(flow.client) << 24 | port(flow.front) << 8 | u64::from(flow.protocol)))
}

/// FNV-1a over a backend's name, then seeded.
fn name_hash(seed: u64, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(seed ^ h)
}

/// The table for `backends` (each named by bytes unique among them, such
/// as its address and port), [`size_for`] their number of slots: slot →
/// index into `backends`. Empty for no backends.
pub fn table<N: AsRef<[u8]>>(seed: u64, backends: &[N]) -> Vec<u32> {
    if backends.is_empty() {
        return Vec::new();
    }
    // Visit backends in name order: the table must not depend on the
    // order they were given in.
    let mut order: Vec<usize> = (0..backends.len()).collect();
    order.sort_by(|a, b| backends[*a].as_ref().cmp(backends[*b].as_ref()));
    let slots = size_for(backends.len());
    let size = slots as u64;
    let walks: Vec<(u64, u64)> = order
        .iter()
        .map(|index| {
            let name = backends[*index].as_ref();
            let offset = name_hash(seed, name) % size;
            let skip =
                name_hash(seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15, name) % (size - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; order.len()];
    let mut entries = vec![u32::MAX; slots];
    let mut filled = 0;
    loop {
        for (turn, index) in order.iter().enumerate() {
            let (offset, skip) = walks[turn];
            let mut candidate = ((offset + next[turn] * skip) % size) as usize;
            while entries[candidate] != u32::MAX {
                next[turn] += 1;
                candidate = ((offset + next[turn] * skip) % size) as usize;
            }
            entries[candidate] = *index as u32;
            next[turn] += 1;
            filled += 1;
            if filled == slots {
                return entries;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("10.42.0.{i}:8080")).collect()
    }

    fn shares(table: &[u32], backends: usize) -> Vec<usize> {
        let mut shares = vec![0; backends];
        for entry in table {
            shares[*entry as usize] += 1;
        }
        shares
    }

    #[test]
    fn every_slot_goes_to_a_backend_in_even_shares() {
        for count in [1, 2, 3, 7, 8, 9, 10, 40] {
            let table = table(42, &names(count));
            assert_eq!(table.len(), size_for(count));
            let shares = shares(&table, count);
            let even = table.len() / count;
            for share in shares {
                // Maglev's population gives each backend floor or ceil.
                assert!(share == even || share == even + 1, "{count}: {share}");
            }
        }
    }

    #[test]
    fn the_table_depends_on_the_set_not_its_order() {
        let forward = names(5);
        let mut backward = forward.clone();
        backward.reverse();
        let a = table(7, &forward);
        let b = table(7, &backward);
        for (slot, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(forward[*x as usize], backward[*y as usize], "slot {slot}");
        }
    }

    #[test]
    fn the_seed_changes_the_table() {
        assert_ne!(table(1, &names(4)), table(2, &names(4)));
    }

    #[test]
    fn a_backend_leaving_moves_little_more_than_its_own_share() {
        let before_names = names(10);
        let before = table(9, &before_names);
        let after_names: Vec<String> = before_names
            .iter()
            .filter(|name| name.as_str() != "10.42.0.3:8080")
            .cloned()
            .collect();
        let after = table(9, &after_names);
        let mut moved = 0;
        for (slot, old) in before.iter().enumerate() {
            let old = &before_names[*old as usize];
            let new = &after_names[after[slot] as usize];
            if old != "10.42.0.3:8080" && old != new {
                moved += 1;
            }
        }
        // Of the 918 slots the other nine held, Maglev moves a few percent.
        assert_eq!(before.len(), TABLE_SIZE);
        assert!(
            moved < TABLE_SIZE / 20,
            "{moved} slots of staying backends moved"
        );
    }

    #[test]
    fn no_backends_no_table() {
        assert!(table::<&str>(1, &[]).is_empty());
    }

    #[test]
    fn slots_are_spread() {
        for size in [SMALL_TABLE_SIZE, TABLE_SIZE] {
            let mut hits = vec![0u32; size];
            for flow in 0..(size as u64 * 50) {
                hits[slot(3, flow, size)] += 1;
            }
            assert!(hits.iter().all(|hits| (20..=90).contains(hits)), "{hits:?}");
        }
    }

    #[test]
    fn the_flow_hash_reads_every_field_and_affinity_only_the_client() {
        let flow = Flow {
            client: "10.42.0.5:40000".parse().expect("address"),
            front: "10.43.0.7:80".parse().expect("address"),
            protocol: 6,
        };
        let base = flow_hash(1, &flow, false);
        let other_port = Flow {
            client: "10.42.0.5:40001".parse().expect("address"),
            ..flow
        };
        let udp = Flow {
            protocol: 17,
            ..flow
        };
        assert_ne!(base, flow_hash(1, &other_port, false));
        assert_ne!(base, flow_hash(1, &udp, false));
        assert_ne!(base, flow_hash(2, &flow, false));
        assert_eq!(
            flow_hash(1, &flow, true),
            flow_hash(1, &other_port, true),
            "affinity hashes the client address alone"
        );
    }

    #[test]
    fn a_small_table_moves_little_too() {
        let before = table(5, &names(6));
        let after = table(5, &names(5));
        let moved = before
            .iter()
            .zip(&after)
            .filter(|(old, new)| **old != 5 && old != new)
            .count();
        assert!(moved < SMALL_TABLE_SIZE / 10, "{moved}");
    }
}
