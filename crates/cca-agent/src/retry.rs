//! The agent's one retry policy: how long to wait before asking the API
//! again after a failure. Without word from the server it backs off
//! exponentially, jittered to between half and all of the step, so nodes
//! that failed together (an outage, a restart of the server) come back
//! spread out. A server that shed the request (429) or is unavailable
//! (503) says how long to stay away (`Retry-After`); the wait is then at
//! least that, jittered up to twice it — never below — so thousands of
//! agents told the same thing at once do not all return in the same
//! second. The computation is pure (a random draw in, a delay out); the
//! loops sleep it.

use std::time::Duration;

/// Backoff state between attempts of one loop (registration, the
/// assignment stream, reports, a failing heartbeat).
#[derive(Debug)]
pub(crate) struct Retry {
    first: Duration,
    max: Duration,
    step: Duration,
}

impl Retry {
    /// The default: 100 ms doubling to 5 s.
    pub(crate) fn new() -> Self {
        Self::between(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// `first` doubling to `max`.
    pub(crate) fn between(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
            step: first,
        }
    }

    /// After a success: the next failure waits the first step again.
    pub(crate) fn reset(&mut self) {
        self.step = self.first;
    }

    /// The wait before the next attempt, given the server's `Retry-After`
    /// (if any) and a uniform `draw` in [0, 1); advances the backoff.
    pub(crate) fn next_delay(&mut self, retry_after: Option<Duration>, draw: f64) -> Duration {
        let draw = draw.clamp(0.0, 1.0);
        let step = self.step;
        self.step = (step * 2).min(self.max);
        let backoff = step / 2 + (step / 2).mul_f64(draw);
        match retry_after {
            Some(floor) => backoff.max(floor + floor.mul_f64(draw)),
            None => backoff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_backoff_doubles_to_its_cap_jittered_between_half_and_all() {
        let mut retry = Retry::new();
        let lowest: Vec<Duration> = (0..8).map(|_| retry.next_delay(None, 0.0)).collect();
        assert_eq!(
            lowest,
            [50, 100, 200, 400, 800, 1600, 2500, 2500].map(|ms| ms * MS)
        );
        retry.reset();
        assert_eq!(retry.next_delay(None, 1.0), 100 * MS);
        assert_eq!(retry.next_delay(None, 0.5), 150 * MS);
    }

    #[test]
    fn a_retry_after_is_a_floor_jittered_up_to_twice_it() {
        let after = Some(Duration::from_secs(2));
        let mut retry = Retry::new();
        assert_eq!(retry.next_delay(after, 0.0), Duration::from_secs(2));
        let mut retry = Retry::new();
        assert_eq!(retry.next_delay(after, 0.5), Duration::from_secs(3));
        let mut retry = Retry::new();
        let highest = retry.next_delay(after, 0.999_999);
        assert!(highest < Duration::from_secs(4), "{highest:?}");
        assert!(highest > Duration::from_millis(3999), "{highest:?}");
    }

    #[test]
    fn a_retry_after_never_shortens_a_longer_backoff() {
        let mut retry = Retry::new();
        for _ in 0..10 {
            retry.next_delay(None, 0.0);
        }
        // At the 5 s cap the backoff (2.5–5 s) outweighs a 1 s Retry-After.
        let one_second = Some(Duration::from_secs(1));
        assert_eq!(retry.next_delay(one_second, 0.0), 2500 * MS);
        assert_eq!(retry.next_delay(one_second, 0.5), 3750 * MS);
    }

    #[test]
    fn every_delay_honours_the_retry_after_whatever_the_draw() {
        for floor in [1, 2, 7, 60].map(Duration::from_secs) {
            let mut retry = Retry::between(10 * MS, 20 * MS);
            for draw in [0.0, 0.1, 0.5, 0.9, 0.999, -1.0, 2.0] {
                let delay = retry.next_delay(Some(floor), draw);
                assert!(delay >= floor, "{delay:?} < {floor:?} (draw {draw})");
                assert!(
                    delay <= floor * 2,
                    "{delay:?} > 2 × {floor:?} (draw {draw})"
                );
            }
        }
    }

    #[test]
    fn a_short_retry_starts_short() {
        let mut retry = Retry::between(500 * MS, Duration::from_secs(5));
        assert_eq!(retry.next_delay(None, 0.0), 250 * MS);
        assert_eq!(retry.next_delay(None, 0.0), 500 * MS);
        let mut capped = Retry::between(500 * MS, 100 * MS);
        capped.next_delay(None, 0.0);
        assert_eq!(
            capped.next_delay(None, 0.0),
            250 * MS,
            "the cap is at least the first step"
        );
    }
}
