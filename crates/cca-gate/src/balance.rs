//! Backends and how a request picks one: a [`Pool`] is a target's ready
//! backends (a service port), a [`Backend`] one instance with its requests
//! in flight and its health. [`Pool::choose`] honours a sticky cookie while
//! its backend is usable, else hashes an affinity key (the cookie, or the
//! client's address with `source_ip`) onto the backends by rendezvous
//! hashing — so a backend joining or leaving moves only its own share of
//! keys — else balances in turn or by fewest requests in flight.
//!
//! Outlier ejection is a per-backend circuit breaker: consecutive failures
//! eject a backend for a while (doubling with each ejection, up to ten
//! times the base); when that ends one probe request is let through, and
//! its outcome restores or ejects the backend again. No more than the
//! configured share of a pool is ejected at once, and a pool whose every
//! backend is ejected is used anyway (a guess at a working backend beats a
//! certain 503).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cca_model::net::Target;
use cca_model::spec::{Balance, CircuitBreaker};
use tokio::time::{Duration, Instant};

use crate::metrics::{BackendMetrics, Metrics};
use crate::sharded::{Gauge, Shards};
use crate::upstream::Upstream;

/// The longest ejection, as a multiple of the base.
const MAX_EJECTION_FACTOR: u32 = 10;

/// One instance's port behind a pool.
#[derive(Debug)]
pub struct Backend {
    pub target: Target,
    /// What a sticky cookie holds: a hash of the instance, never its name.
    pub token: String,
    hash: u64,
    in_flight: Gauge,
    health: Mutex<Health>,
    /// `health` is not the healthy default (a failure counted, an
    /// ejection, a probe): requests to a healthy backend read this and
    /// never take the lock.
    troubled: AtomicBool,
    pub(crate) metrics: BackendMetrics,
    /// The gate's kept-alive connections to it.
    pub(crate) upstream: Arc<Upstream>,
}

#[derive(Debug, Default)]
struct Health {
    failures: u32,
    ejected_until: Option<Instant>,
    ejections: u32,
    /// The one request let through after an ejection is in flight.
    probing: bool,
}

/// What a finished request says about its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Refused or reset connection, timeout, or a 502/503/504.
    Failure,
}

/// A backend's health as `describe gate` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthView {
    Healthy,
    /// Ejected for this much longer.
    Ejected(Duration),
    /// Its ejection ended; the next request probes it.
    Probing,
}

impl Backend {
    pub fn new(target: Target, service: &str, metrics: &Metrics) -> Self {
        let hash = hash64(target.instance.as_bytes());
        Self {
            token: format!("{hash:016x}"),
            hash,
            metrics: metrics.backend(service, &target),
            upstream: Arc::new(Upstream::new(SocketAddr::from((
                target.address,
                target.port,
            )))),
            target,
            in_flight: Gauge::default(),
            health: Mutex::default(),
            troubled: AtomicBool::new(false),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.get()
    }

    pub fn health(&self, now: Instant) -> HealthView {
        let health = self.lock();
        match health.ejected_until {
            Some(until) if until > now => HealthView::Ejected(until - now),
            Some(_) => HealthView::Probing,
            None => HealthView::Healthy,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_troubled(&self) -> bool {
        self.troubled.load(Ordering::Acquire)
    }

    /// Changes the health under its lock and keeps `troubled` in step.
    fn update_health<R>(&self, change: impl FnOnce(&mut Health) -> R) -> R {
        let mut health = self.lock();
        let result = change(&mut health);
        let troubled = health.failures > 0 || health.ejected_until.is_some() || health.probing;
        self.troubled.store(troubled, Ordering::Release);
        result
    }

    fn is_ejected(&self, now: Instant) -> bool {
        self.is_troubled() && self.lock().ejected_until.is_some_and(|until| until > now)
    }

    /// Whether a new request may go here now: not ejected, or its
    /// ejection over and no probe in flight.
    fn available(&self, now: Instant) -> bool {
        if !self.is_troubled() {
            return true;
        }
        let health = self.lock();
        match health.ejected_until {
            None => true,
            Some(until) => until <= now && !health.probing,
        }
    }

    /// Takes the probe slot of a backend whose ejection is over.
    fn claim(&self, now: Instant) {
        if !self.is_troubled() {
            return;
        }
        self.update_health(|health| {
            if health.ejected_until.is_some_and(|until| until <= now) {
                health.probing = true;
            }
        });
    }
}

/// A target's backends.
#[derive(Debug)]
pub struct Pool {
    pub service: String,
    pub port: u16,
    pub backends: Vec<Arc<Backend>>,
    /// The service exists in the map (it may have no ready backend).
    pub service_known: bool,
    /// The service scales to zero: with no backend, a request wakes it and
    /// waits instead of getting a 503 at once.
    pub wakeable: bool,
    /// When the service last got a request through this gate node.
    pub last_request: Arc<std::sync::atomic::AtomicI64>,
    /// Requests to the service through this node (autoscaling's
    /// `requests_per_second`), shared by its pools.
    pub requests: crate::sharded::Counter,
    /// Where round-robin starts, and each thread's turn from there.
    start: usize,
    turns: Shards<AtomicUsize>,
}

/// A request's claim on a backend: counts as in flight until dropped.
#[derive(Debug)]
pub struct Lease {
    pub backend: Arc<Backend>,
    /// The shard of `in_flight` it was counted on.
    shard: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.in_flight.dec(self.shard);
    }
}

/// What a request brings to the choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct Preference<'a> {
    /// The token of the backend its sticky cookie names.
    pub sticky: Option<&'a str>,
    /// Hashed onto the backends when set (source IP, or a sticky cookie
    /// whose backend is gone).
    pub affinity: Option<u64>,
}

impl Pool {
    pub fn new(service: &str, port: u16, backends: Vec<Arc<Backend>>, service_known: bool) -> Self {
        let start = if backends.is_empty() {
            0
        } else {
            fastrand_index(backends.len())
        };
        Self {
            service: service.to_owned(),
            port,
            backends,
            service_known,
            wakeable: false,
            last_request: Arc::default(),
            requests: crate::sharded::Counter::default(),
            start,
            turns: Shards::default(),
        }
    }

    /// A backend for a request, other than those in `tried`; `None` when
    /// there is none left.
    pub fn choose(
        &self,
        balance: Balance,
        preference: Preference<'_>,
        tried: &[Arc<Backend>],
        now: Instant,
    ) -> Option<Lease> {
        let untried = |b: &Arc<Backend>| !tried.iter().any(|t| Arc::ptr_eq(t, b));
        if !self.backends.iter().any(untried) {
            return None;
        }
        if let Some(token) = preference.sticky
            && let Some(pinned) = self
                .backends
                .iter()
                .find(|b| b.token == token && untried(b))
            && pinned.available(now)
        {
            pinned.claim(now);
            return Some(lease(pinned));
        }
        let affinity = preference.affinity;
        let chosen = self
            .pick(balance, affinity, |b| untried(b) && b.available(now))
            // Every candidate ejected: use one anyway.
            .or_else(|| self.pick(balance, affinity, untried))?;
        chosen.claim(now);
        Some(lease(chosen))
    }

    fn pick(
        &self,
        balance: Balance,
        affinity: Option<u64>,
        usable: impl Fn(&Arc<Backend>) -> bool,
    ) -> Option<&Arc<Backend>> {
        let candidates = &self.backends;
        if let Some(key) = affinity {
            // Rendezvous: the highest weight among the usable wins.
            return candidates
                .iter()
                .filter(|b| usable(b))
                .max_by_key(|b| mix(key ^ b.hash));
        }
        let n = candidates.len();
        let start = self.start + self.turns.local().fetch_add(1, Ordering::Relaxed);
        let mut in_turn = (0..n)
            .map(|k| &candidates[(start + k) % n])
            .filter(|b| usable(b));
        match balance {
            // Fewest in flight; a tie goes to the first in turn.
            Balance::LeastConnections => {
                in_turn.fold(None, |best: Option<&Arc<Backend>>, b| match best {
                    Some(best) if best.in_flight() <= b.in_flight() => Some(best),
                    _ => Some(b),
                })
            }
            Balance::RoundRobin | Balance::SourceIp => in_turn.next(),
        }
    }

    /// Records how a request to `backend` went.
    pub fn record(
        &self,
        backend: &Backend,
        outcome: Outcome,
        breaker: &CircuitBreaker,
        now: Instant,
    ) {
        if outcome == Outcome::Success && !backend.is_troubled() {
            // Healthy and still healthy: nothing to change.
            return;
        }
        let ejected_now = match outcome {
            Outcome::Success => 0,
            Outcome::Failure => self
                .backends
                .iter()
                .filter(|b| !std::ptr::eq(&***b, backend) && b.is_ejected(now))
                .count(),
        };
        let allowed = (self.backends.len() * breaker.max_ejected.0 as usize / 100).max(1);
        backend.update_health(|health| {
            let probing = std::mem::take(&mut health.probing);
            match outcome {
                Outcome::Success => {
                    health.failures = 0;
                    if probing || health.ejected_until.is_some_and(|until| until <= now) {
                        health.ejected_until = None;
                        health.ejections = 0;
                    }
                }
                Outcome::Failure => {
                    health.failures += 1;
                    let due = probing || health.failures >= breaker.failures.max(1);
                    if due && ejected_now < allowed {
                        self.eject(backend, health, breaker, now);
                    }
                }
            }
        });
    }

    fn eject(
        &self,
        backend: &Backend,
        health: &mut Health,
        breaker: &CircuitBreaker,
        now: Instant,
    ) {
        health.ejections += 1;
        let factor = 1u32
            .checked_shl(health.ejections - 1)
            .unwrap_or(u32::MAX)
            .min(MAX_EJECTION_FACTOR);
        let ejection = Duration::from_millis(breaker.ejection.0) * factor;
        health.ejected_until = Some(now + ejection);
        health.failures = 0;
        backend.metrics.ejections.inc();
        tracing::warn!(
            service = %self.service,
            instance = %backend.target.instance,
            seconds = ejection.as_secs_f64(),
            "ejecting a failing gate backend"
        );
    }
}

fn lease(backend: &Arc<Backend>) -> Lease {
    Lease {
        shard: backend.in_flight.inc(),
        backend: Arc::clone(backend),
    }
}

fn fastrand_index(n: usize) -> usize {
    // Pools start their turn at different backends, so many gate nodes
    // do not all send their first request to the same one.
    (hash64(&Instant::now().elapsed().as_nanos().to_le_bytes()) as usize) % n
}

/// FNV-1a, stable across builds and machines: every gate node hashes a
/// key to the same backend.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

/// splitmix64's finalizer: spreads nearby keys apart.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::Ipv4Addr;

    use cca_model::spec::{Duration as SpecDuration, Percent};

    use super::*;

    fn pool(instances: &[&str]) -> Pool {
        let metrics = Metrics::default();
        let backends = instances
            .iter()
            .enumerate()
            .map(|(k, instance)| {
                Arc::new(Backend::new(
                    Target {
                        instance: (*instance).to_owned(),
                        node: "n1".into(),
                        address: Ipv4Addr::new(10, 0, 0, k as u8 + 1),
                        port: 80,
                    },
                    "web",
                    &metrics,
                ))
            })
            .collect();
        Pool::new("web", 80, backends, true)
    }

    fn choose(pool: &Pool, balance: Balance, preference: Preference<'_>) -> String {
        let lease = pool
            .choose(balance, preference, &[], Instant::now())
            .expect("a backend");
        lease.backend.target.instance.clone()
    }

    #[test]
    fn round_robin_takes_turns() {
        let pool = pool(&["a", "b", "c"]);
        let mut seen: HashMap<String, u32> = HashMap::new();
        for _ in 0..30 {
            *seen
                .entry(choose(&pool, Balance::RoundRobin, Preference::default()))
                .or_default() += 1;
        }
        assert_eq!(seen.values().copied().collect::<Vec<_>>(), vec![10, 10, 10]);
    }

    #[test]
    fn least_connections_avoids_the_busy_backend() {
        let pool = pool(&["a", "b"]);
        let now = Instant::now();
        let held = pool
            .choose(Balance::LeastConnections, Preference::default(), &[], now)
            .expect("first");
        let busy = held.backend.target.instance.clone();
        for _ in 0..5 {
            assert_ne!(
                choose(&pool, Balance::LeastConnections, Preference::default()),
                busy
            );
        }
        drop(held);
        assert_eq!(pool.backends.iter().map(|b| b.in_flight()).sum::<u32>(), 0);
    }

    #[test]
    fn hashing_moves_only_the_keys_of_a_new_backend() {
        let before = pool(&["a", "b", "c", "d"]);
        let after = pool(&["a", "b", "c", "d", "e"]);
        let mut moved = 0;
        let keys = 10_000u64;
        for key in 0..keys {
            let preference = Preference {
                sticky: None,
                affinity: Some(hash64(&key.to_le_bytes())),
            };
            let old = choose(&before, Balance::SourceIp, preference);
            let new = choose(&after, Balance::SourceIp, preference);
            if old != new {
                assert_eq!(new, "e", "a key moves only to the new backend");
                moved += 1;
            }
        }
        // About a fifth move: the new backend's share.
        assert!((1_500..2_500).contains(&moved), "{moved} of {keys} moved");
    }

    #[test]
    fn a_sticky_token_wins_while_its_backend_is_usable() {
        let pool = pool(&["a", "b", "c"]);
        let token = pool.backends[2].token.clone();
        let preference = Preference {
            sticky: Some(&token),
            affinity: Some(1),
        };
        for _ in 0..5 {
            assert_eq!(choose(&pool, Balance::RoundRobin, preference), "c");
        }
        // Ejected, its sessions fail over at once.
        let breaker = CircuitBreaker {
            failures: 1,
            ..CircuitBreaker::default()
        };
        pool.record(
            &pool.backends[2],
            Outcome::Failure,
            &breaker,
            Instant::now(),
        );
        assert_ne!(choose(&pool, Balance::RoundRobin, preference), "c");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_eject_a_backend_until_a_probe_succeeds() {
        let pool = pool(&["a", "b"]);
        let breaker = CircuitBreaker {
            failures: 3,
            ejection: SpecDuration(10_000),
            max_ejected: Percent(50),
        };
        let a = Arc::clone(&pool.backends[0]);
        for _ in 0..3 {
            pool.record(&a, Outcome::Failure, &breaker, Instant::now());
        }
        assert!(matches!(a.health(Instant::now()), HealthView::Ejected(_)));
        for _ in 0..4 {
            assert_eq!(
                choose(&pool, Balance::RoundRobin, Preference::default()),
                "b"
            );
        }
        // The second backend cannot be ejected too: 50% of two is one.
        let b = Arc::clone(&pool.backends[1]);
        for _ in 0..5 {
            pool.record(&b, Outcome::Failure, &breaker, Instant::now());
        }
        assert_eq!(b.health(Instant::now()), HealthView::Healthy);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(a.health(Instant::now()), HealthView::Probing);
        // One probe only: the next request while it is in flight skips a.
        let probe = pool
            .choose(
                Balance::RoundRobin,
                Preference {
                    sticky: Some(&a.token),
                    affinity: None,
                },
                &[],
                Instant::now(),
            )
            .expect("probe");
        assert_eq!(probe.backend.target.instance, "a");
        let other = pool
            .choose(
                Balance::RoundRobin,
                Preference {
                    sticky: Some(&a.token),
                    affinity: None,
                },
                &[],
                Instant::now(),
            )
            .expect("other");
        assert_eq!(other.backend.target.instance, "b");
        // A failed probe ejects it again, for twice as long.
        pool.record(&a, Outcome::Failure, &breaker, Instant::now());
        assert_eq!(
            a.health(Instant::now()),
            HealthView::Ejected(Duration::from_secs(20))
        );
        tokio::time::advance(Duration::from_secs(21)).await;
        let probe = pool
            .choose(
                Balance::RoundRobin,
                Preference {
                    sticky: Some(&a.token),
                    affinity: None,
                },
                &[],
                Instant::now(),
            )
            .expect("probe");
        assert_eq!(probe.backend.target.instance, "a");
        pool.record(&a, Outcome::Success, &breaker, Instant::now());
        assert_eq!(a.health(Instant::now()), HealthView::Healthy);
    }

    #[test]
    fn a_pool_of_ejected_backends_is_still_used() {
        let pool = pool(&["a"]);
        let breaker = CircuitBreaker {
            failures: 1,
            ..CircuitBreaker::default()
        };
        pool.record(
            &pool.backends[0],
            Outcome::Failure,
            &breaker,
            Instant::now(),
        );
        assert!(matches!(
            pool.backends[0].health(Instant::now()),
            HealthView::Ejected(_)
        ));
        assert_eq!(
            choose(&pool, Balance::RoundRobin, Preference::default()),
            "a"
        );
    }

    #[test]
    fn tried_backends_are_skipped() {
        let pool = pool(&["a", "b"]);
        let first = pool
            .choose(
                Balance::RoundRobin,
                Preference::default(),
                &[],
                Instant::now(),
            )
            .expect("first");
        let tried = [Arc::clone(&first.backend)];
        let second = pool
            .choose(
                Balance::RoundRobin,
                Preference::default(),
                &tried,
                Instant::now(),
            )
            .expect("second");
        assert!(!Arc::ptr_eq(&first.backend, &second.backend));
        let both = [Arc::clone(&first.backend), Arc::clone(&second.backend)];
        assert!(
            pool.choose(
                Balance::RoundRobin,
                Preference::default(),
                &both,
                Instant::now()
            )
            .is_none()
        );
    }
}
