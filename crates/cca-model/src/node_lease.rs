//! How long a node's heartbeat lease lasts, and how often its agent
//! renews it. A small fleet gets the shortest TTL the operator set (a dead
//! node is noticed soonest); as the fleet grows, every node's renewals
//! together would grow with it, so the TTL lengthens in steps of
//! [`STEP`] until the fleet's heartbeats fit in a budget per second — the
//! API's and the store's cost of liveness then stays flat, whatever the
//! fleet's size, and a dead node is noticed a little later instead of
//! every live one risking its lease behind the others' renewals.
//! Steps rather than an exact fit keep the leases moved few: a lease
//! moves to the fleet's TTL when it is shorter, or when the fleet would
//! have to double to need it.

use std::num::NonZeroU32;
use std::time::Duration;

/// How much longer each step of the TTL is than the one before.
pub const STEP: f64 = 1.5;

/// The longest a lease gets, however large the fleet: past it the budget
/// is exceeded rather than dead nodes going unnoticed for longer.
pub const LONGEST: Duration = Duration::from_secs(600);

/// Heartbeats go out every this share of the TTL, at the longest (the
/// draw in [`heartbeat_period`] shortens it by up to a fifth): a third,
/// so that two missed in a row still leave the lease alive.
const PERIOD_SHARE: f64 = 1.0 / 3.0;

/// The leases' policy: the shortest TTL and the fleet's heartbeat budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLeases {
    /// The TTL of every lease while the fleet's heartbeats fit the budget.
    pub shortest: Duration,
    /// Heartbeats per second the whole fleet may send, on average.
    pub heartbeats_per_s: NonZeroU32,
}

impl NodeLeases {
    /// The default budget: what the control plane and etcd on this
    /// project's 2-core test machine serve beside a 100,000-instance
    /// deploy (docs/benchmarks.md); up to 2,700 nodes keep 6 s leases.
    pub const DEFAULT_HEARTBEATS_PER_S: NonZeroU32 = match NonZeroU32::new(1_500) {
        Some(rate) => rate,
        None => NonZeroU32::MIN,
    };

    /// The TTL a lease granted to one node of `fleet` gets: the shortest
    /// step, from [`Self::shortest`] up by [`STEP`], whose heartbeats
    /// keep the fleet's within the budget; in whole seconds up, as stores
    /// grant leases. Steps stop at [`LONGEST`]; a shortest TTL the
    /// operator set longer than that is kept as it is.
    pub fn ttl_for(&self, fleet: usize) -> Duration {
        let needed = seconds_needed(fleet, self.heartbeats_per_s);
        let shortest = self.shortest.as_secs_f64();
        let mut ttl = shortest;
        if ttl < needed {
            let longest = LONGEST.as_secs_f64();
            ttl = ttl.max(1.0);
            while ttl < needed && ttl < longest {
                ttl *= STEP;
            }
            ttl = ttl.min(longest.max(shortest));
        }
        Duration::from_secs((ttl.ceil() as u64).max(1))
    }

    /// The TTL a live lease of `held` should move to, the fleet now being
    /// `fleet` nodes: the fleet's when `held` is shorter (its heartbeats
    /// come more often than the budget has room for) or when the fleet
    /// would have to double to need `held`; `None` otherwise.
    pub fn move_to(&self, held: Duration, fleet: usize) -> Option<Duration> {
        let fitting = self.ttl_for(fleet);
        let too_long = held > self.ttl_for(fleet.saturating_mul(2));
        (held < fitting || too_long).then_some(fitting)
    }
}

impl Default for NodeLeases {
    fn default() -> Self {
        Self {
            shortest: Duration::from_secs(6),
            heartbeats_per_s: Self::DEFAULT_HEARTBEATS_PER_S,
        }
    }
}

/// The wait before a node's next heartbeat: [`PERIOD_SHARE`] of its
/// lease's TTL times 0.8 + 0.2 × `draw` (uniform in [0, 1)). Drawing each
/// period afresh spreads the renewals of nodes that registered in the
/// same instant over a fifth of a period.
pub fn heartbeat_period(ttl: Duration, draw: f64) -> Duration {
    ttl.mul_f64(PERIOD_SHARE * (0.8 + 0.2 * draw.clamp(0.0, 1.0)))
}

/// The TTL at which `fleet` nodes send `heartbeats_per_s` together: each
/// sends one every 0.9 × [`PERIOD_SHARE`] of the TTL on average, so
/// fleet / (0.3 × TTL) a second (written so that round numbers stay
/// exact).
fn seconds_needed(fleet: usize, heartbeats_per_s: NonZeroU32) -> f64 {
    fleet as f64 * 10.0 / (3.0 * f64::from(heartbeats_per_s.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(shortest_secs: u64, heartbeats_per_s: u32) -> NodeLeases {
        NodeLeases {
            shortest: Duration::from_secs(shortest_secs),
            heartbeats_per_s: NonZeroU32::new(heartbeats_per_s).expect("non-zero"),
        }
    }

    #[test]
    fn heartbeats_come_every_0_8_to_1_0_of_a_third_of_the_ttl() {
        let ttl = Duration::from_secs(15);
        assert_eq!(heartbeat_period(ttl, 0.0), Duration::from_secs(4));
        assert_eq!(heartbeat_period(ttl, 0.5), Duration::from_millis(4500));
        assert_eq!(heartbeat_period(ttl, 1.0), Duration::from_secs(5));
        assert_eq!(heartbeat_period(ttl, 7.0), Duration::from_secs(5));
    }

    #[test]
    fn a_fleet_within_the_budget_keeps_the_shortest_ttl() {
        let leases = leases(6, 1_500);
        assert_eq!(leases.ttl_for(0), Duration::from_secs(6));
        assert_eq!(leases.ttl_for(1), Duration::from_secs(6));
        // 2,700 nodes renewing every 1.8 s on average: 1,500 a second.
        assert_eq!(leases.ttl_for(2_700), Duration::from_secs(6));
    }

    #[test]
    fn a_larger_fleet_gets_the_first_step_that_fits_the_budget() {
        let leases = leases(6, 1_500);
        assert_eq!(leases.ttl_for(2_701), Duration::from_secs(9));
        assert_eq!(leases.ttl_for(4_050), Duration::from_secs(9));
        // 6 × 1.5² = 13.5, whole seconds up.
        assert_eq!(leases.ttl_for(5_000), Duration::from_secs(14));
        for fleet in [1, 10, 2_701, 5_000, 50_000, 150_000] {
            let ttl = leases.ttl_for(fleet);
            let rate = fleet as f64 / (ttl.as_secs_f64() * 0.3);
            assert!(rate <= 1_500.0 + 1e-9, "{fleet} nodes at {ttl:?}: {rate}/s");
        }
    }

    #[test]
    fn no_fleet_gets_a_lease_longer_than_the_longest() {
        let leases = leases(6, 1);
        assert_eq!(leases.ttl_for(1_000_000), LONGEST);
        assert_eq!(leases.ttl_for(usize::MAX), LONGEST);
    }

    #[test]
    fn a_shortest_ttl_set_longer_than_the_longest_is_kept() {
        let leases = leases(3_600, 1);
        assert_eq!(leases.ttl_for(1), Duration::from_secs(3_600));
        assert_eq!(leases.ttl_for(1_000_000), Duration::from_secs(3_600));
    }

    #[test]
    fn ttls_are_whole_seconds_as_stores_grant_them() {
        let leases = NodeLeases {
            shortest: Duration::from_millis(1_500),
            heartbeats_per_s: NonZeroU32::new(1_000).expect("non-zero"),
        };
        assert_eq!(leases.ttl_for(3), Duration::from_secs(2));
        let granted = Duration::from_secs(2);
        assert_eq!(
            leases.move_to(granted, 3),
            None,
            "no move to the lease held"
        );
        let tiny = NodeLeases {
            shortest: Duration::from_millis(100),
            heartbeats_per_s: NonZeroU32::new(1_000).expect("non-zero"),
        };
        assert_eq!(tiny.ttl_for(1), Duration::from_secs(1));
    }

    #[test]
    fn leases_move_when_too_short_or_when_the_fleet_shrank_by_half() {
        let leases = leases(6, 1_500);
        let six = Duration::from_secs(6);
        let fourteen = Duration::from_secs(14);
        assert_eq!(leases.move_to(six, 5_000), Some(fourteen));
        assert_eq!(leases.move_to(fourteen, 5_000), None);
        // 3,000 nodes fit 9 s leases, but 6,000 would need 14 s: stays.
        assert_eq!(leases.move_to(fourteen, 3_000), None);
        // 1,000 nodes: 2,000 would fit in 6 s; back to the shortest.
        assert_eq!(leases.move_to(fourteen, 1_000), Some(six));
        assert_eq!(leases.move_to(six, 1_000), None);
    }
}
