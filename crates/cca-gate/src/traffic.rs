//! What scale to zero needs from a gate node: when each service last got
//! a request through it ([`Traffic`], read by the agent every few seconds
//! and reported to the control plane, so a busy service is never put to
//! sleep and no request costs a store write), and a way to wake a service
//! that sleeps ([`Wake`], the agent's call to the control plane, made at
//! most once a second per service however many requests wait). It also
//! counts each service's requests ([`Traffic::requests`]), which the
//! agent's usage reports carry for autoscaling on `requests_per_second`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::sharded::Counter;

/// Wake calls for one service are at least this far apart.
const WAKE_EVERY: Duration = Duration::from_secs(1);

/// Asks the control plane to wake a service; must not block (the agent's
/// implementation sends the request from a task of its own).
pub trait Wake: Send + Sync + std::fmt::Debug {
    fn wake(&self, service: &str);
}

/// The last request per service, and what was last reported.
#[derive(Debug, Default)]
pub struct Traffic {
    services: Mutex<HashMap<String, Arc<AtomicI64>>>,
    reported: Mutex<HashMap<String, i64>>,
    woken: Mutex<HashMap<String, Instant>>,
    counters: Mutex<HashMap<String, Counter>>,
}

impl Traffic {
    /// The clock a service's requests stamp (ms since the epoch); the same
    /// for every pool of the service, across route-table rebuilds.
    pub fn clock(&self, service: &str) -> Arc<AtomicI64> {
        let mut services = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(services.entry(service.to_owned()).or_default())
    }

    /// The request counter of `service`: sharded, so counting costs a
    /// request no shared cache line; the same for every pool of the
    /// service, across route-table rebuilds.
    pub fn counter(&self, service: &str) -> Counter {
        let mut counters = self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counters.entry(service.to_owned()).or_default().clone()
    }

    /// Every service's requests so far (monotonic).
    pub fn requests(&self) -> BTreeMap<String, u64> {
        let counters = self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counters
            .iter()
            .map(|(service, counter)| (service.clone(), counter.get()))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// Services with a request since the last call, with its time.
    pub fn take_new(&self) -> BTreeMap<String, i64> {
        let services = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut reported = self
            .reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut fresh = BTreeMap::new();
        for (service, clock) in services.iter() {
            let last = clock.load(Ordering::Relaxed);
            if last > 0 && reported.get(service) != Some(&last) {
                reported.insert(service.clone(), last);
                fresh.insert(service.clone(), last);
            }
        }
        fresh
    }

    /// Forgets that `services` were reported (the report failed), so the
    /// next call returns them again.
    pub fn unreport(&self, services: &BTreeMap<String, i64>) {
        let mut reported = self
            .reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for service in services.keys() {
            reported.remove(service);
        }
    }

    /// Whether a wake call for `service` is due now (none in the last
    /// second); notes it when it is.
    pub fn wake_due(&self, service: &str, now: Instant) -> bool {
        let mut woken = self
            .woken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match woken.get(service) {
            Some(at) if now.duration_since(*at) < WAKE_EVERY => false,
            _ => {
                woken.insert(service.to_owned(), now);
                true
            }
        }
    }
}

/// A service's clock is set at most this often: every request reading it
/// is cheap, every request writing it would bounce its cache line between
/// the worker threads, and idle windows are minutes long.
const STAMP_GRAIN_MS: i64 = 250;

/// Marks a request to a service on its clock (to [`STAMP_GRAIN_MS`]).
pub fn stamp(clock: &AtomicI64) {
    let now = now_millis();
    if now - clock.load(Ordering::Relaxed) >= STAMP_GRAIN_MS {
        clock.store(now, Ordering::Relaxed);
    }
}

/// Milliseconds since the epoch, for a service's clock.
pub fn now_millis() -> i64 {
    cca_model::clock::system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_requests_are_reported_and_a_failed_report_comes_again() {
        let traffic = Traffic::default();
        let web = traffic.clock("web");
        let _quiet = traffic.clock("quiet");
        assert!(traffic.take_new().is_empty());
        web.store(1_000, Ordering::Relaxed);
        let first = traffic.take_new();
        assert_eq!(first, BTreeMap::from([("web".to_owned(), 1_000)]));
        assert!(traffic.take_new().is_empty(), "nothing new");
        traffic.unreport(&first);
        assert_eq!(traffic.take_new(), first, "reported again after a failure");
        assert!(
            Arc::ptr_eq(&web, &traffic.clock("web")),
            "one clock per service"
        );
    }

    #[test]
    fn requests_are_counted_per_service_across_pools() {
        let traffic = Traffic::default();
        let one_pool = traffic.counter("web");
        let another = traffic.counter("web");
        let _quiet = traffic.counter("quiet");
        one_pool.inc();
        another.inc();
        another.inc();
        assert_eq!(
            traffic.requests(),
            BTreeMap::from([("web".to_owned(), 3)]),
            "one count per service; none for a quiet one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_is_woken_at_most_once_a_second() {
        let traffic = Traffic::default();
        assert!(traffic.wake_due("web", Instant::now()));
        assert!(!traffic.wake_due("web", Instant::now()));
        assert!(traffic.wake_due("api", Instant::now()));
        tokio::time::advance(WAKE_EVERY).await;
        assert!(traffic.wake_due("web", Instant::now()));
    }
}
