//! What one gate keeps between requests on a gate node: how it talks to
//! its backends (the gate's connect and idle timeouts; the connections
//! themselves are each backend's [`crate::upstream`]), its response cache, its metric handles, its rate limiters (per client
//! address and for the whole gate, GCRA token buckets from `governor`) and
//! its retry budget. It outlives route-table rebuilds while the settings
//! it was made from stay the same.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use cca_model::spec::{GateSpec, GateTimeouts, Rate, RateLimit, ResponseCache, Retries};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::time::Instant;

use crate::cache::Cache;
use crate::metrics::{GateMetrics, Metrics};
use crate::sharded;
use crate::upstream::UpstreamSettings;

/// Idle keep-alive connections kept per backend.
const IDLE_PER_BACKEND: usize = 64;

/// Retries within this window count against the budget.
const BUDGET_WINDOW: Duration = Duration::from_secs(10);
/// Retries a window always allows, so a quiet gate can still retry.
const BUDGET_FLOOR: u64 = 10;

/// One gate's state; see the module documentation.
#[derive(Debug)]
pub struct GateState {
    name: String,
    rate_limit: Option<RateLimit>,
    retries: Retries,
    timeouts: GateTimeouts,
    cache_settings: Option<ResponseCache>,
    pub(crate) cache: Option<Cache>,
    pub(crate) upstream: UpstreamSettings,
    pub(crate) metrics: GateMetrics,
    per_client: Option<DefaultKeyedRateLimiter<IpAddr>>,
    per_gate: Option<DefaultDirectRateLimiter>,
    /// First tries, ever; the budget's window reads how many were its own.
    requests: sharded::Counter,
    budget: Mutex<Budget>,
    /// Requests held while a service wakes.
    holding: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

/// A request's place in a gate's wake queue.
#[derive(Debug)]
pub struct Held(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Budget {
    since: Instant,
    /// The request count when the window began.
    requests_before: u64,
    retries: u64,
}

/// Why a request may not go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    /// When the client may try again.
    pub retry_after: Duration,
}

fn quota(rate: Rate) -> Quota {
    let per_second = NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(rate.burst).unwrap_or(per_second);
    Quota::per_second(per_second).allow_burst(burst)
}

impl GateState {
    pub fn new(spec: &GateSpec, metrics: &Metrics) -> Self {
        let limits = spec.rate_limit.unwrap_or_default();
        Self {
            name: spec.name.clone(),
            rate_limit: spec.rate_limit,
            retries: spec.retries,
            timeouts: spec.timeouts,
            cache_settings: spec.cache,
            cache: spec.cache.map(Cache::new),
            upstream: UpstreamSettings {
                connect: Duration::from_millis(spec.timeouts.connect.0),
                idle: Duration::from_millis(spec.timeouts.idle.0),
                max_idle: IDLE_PER_BACKEND,
            },
            metrics: metrics.gate(&spec.name),
            per_client: limits
                .per_client
                .map(|rate| RateLimiter::keyed(quota(rate))),
            per_gate: limits.per_gate.map(|rate| RateLimiter::direct(quota(rate))),
            requests: sharded::Counter::default(),
            budget: Mutex::new(Budget {
                since: Instant::now(),
                requests_before: 0,
                retries: 0,
            }),
            holding: std::sync::Arc::default(),
        }
    }

    /// Whether this state was made for `spec`'s settings.
    pub fn serves(&self, spec: &GateSpec) -> bool {
        self.name == spec.name
            && self.rate_limit == spec.rate_limit
            && self.retries == spec.retries
            && self.timeouts == spec.timeouts
            && self.cache_settings == spec.cache
    }

    /// Takes a token for a request from `client`; `Err` when a limit is
    /// spent (the client's own first, then the gate's).
    pub fn admit(&self, client: IpAddr) -> Result<(), Limited> {
        let clock = DefaultClock::default();
        let limited = |not_until: governor::NotUntil<_>| Limited {
            retry_after: not_until.wait_time_from(clock.now()),
        };
        if let Some(limiter) = &self.per_client {
            limiter.check_key(&client).map_err(limited)?;
        }
        if let Some(limiter) = &self.per_gate {
            limiter.check().map_err(limited)?;
        }
        Ok(())
    }

    /// A place in the wake queue, unless `queue` requests already wait.
    pub fn hold(&self, queue: u32) -> Option<Held> {
        let held = self
            .holding
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let place = Held(std::sync::Arc::clone(&self.holding));
        (held < queue).then_some(place)
    }

    /// Forgets clients whose buckets are full again, so the per-client
    /// map holds only recent clients.
    pub fn forget_idle_clients(&self) {
        if let Some(limiter) = &self.per_client {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// Counts a first try against the retry budget's window.
    pub fn count_request(&self) {
        self.requests.inc();
    }

    /// Whether a failed request that was retried `retries_made` times may
    /// be tried again: it has attempts left and the window's retries stay
    /// within the budget's share of its requests.
    pub fn may_retry(&self, retries_made: u32) -> bool {
        if retries_made >= self.retries.attempts {
            return false;
        }
        let requests = self.requests.get();
        let mut budget = self.lock_budget();
        budget.roll(Instant::now(), requests);
        let in_window = requests.saturating_sub(budget.requests_before);
        let allowed = (in_window * u64::from(self.retries.budget.0) / 100).max(BUDGET_FLOOR);
        if budget.retries >= allowed {
            return false;
        }
        budget.retries += 1;
        self.metrics.retries.inc();
        true
    }

    fn lock_budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Budget {
    fn roll(&mut self, now: Instant, requests: u64) {
        if now.duration_since(self.since) >= BUDGET_WINDOW {
            self.since = now;
            self.requests_before = requests;
            self.retries = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use cca_model::spec::Percent;

    use super::*;

    fn gate(rate_limit: Option<RateLimit>, retries: Retries) -> GateState {
        let spec = GateSpec {
            name: "shop".into(),
            rate_limit,
            retries,
            ..GateSpec::default()
        };
        GateState::new(&spec, &Metrics::default())
    }

    #[test]
    fn a_client_over_its_rate_is_limited_and_others_are_not() {
        let state = gate(
            Some(RateLimit {
                per_client: Some(Rate {
                    per_second: 1,
                    burst: 3,
                }),
                per_gate: None,
            }),
            Retries::default(),
        );
        let noisy = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let quiet = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        for _ in 0..3 {
            assert_eq!(state.admit(noisy), Ok(()));
        }
        let limited = state.admit(noisy).expect_err("over the burst");
        assert!(
            limited.retry_after > Duration::ZERO && limited.retry_after <= Duration::from_secs(1)
        );
        assert_eq!(state.admit(quiet), Ok(()));
    }

    #[test]
    fn the_gate_wide_rate_covers_every_client() {
        let state = gate(
            Some(RateLimit {
                per_client: None,
                per_gate: Some(Rate {
                    per_second: 1,
                    burst: 2,
                }),
            }),
            Retries::default(),
        );
        let clients = (1..=3).map(|k| IpAddr::V4(Ipv4Addr::new(192, 0, 2, k)));
        let admitted: Vec<bool> = clients.map(|c| state.admit(c).is_ok()).collect();
        assert_eq!(admitted, vec![true, true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stay_within_the_budget() {
        let state = gate(
            None,
            Retries {
                attempts: 5,
                budget: Percent(20),
            },
        );
        for _ in 0..100 {
            state.count_request();
        }
        // 20% of 100 requests: 20 retries in this window.
        let granted = (0..50).filter(|_| state.may_retry(0)).count();
        assert_eq!(granted, 20);
        tokio::time::advance(BUDGET_WINDOW).await;
        assert!(!state.may_retry(5), "beyond the attempts");
        tokio::time::advance(BUDGET_WINDOW).await;
        // A new, quiet window still allows the floor.
        let granted = (0..50).filter(|_| state.may_retry(0)).count();
        assert_eq!(granted as u64, BUDGET_FLOOR);
    }
}
