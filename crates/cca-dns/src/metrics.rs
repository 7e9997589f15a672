//! The server's counters: plain atomics its owner reads and exports under
//! its own metric names (the agent and `cca server` each have a registry).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts since the server started; every field only grows.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Query packets received (over UDP and TCP), answered or not.
    pub queries: AtomicU64,
    /// Answers that said the name does not exist in the zone.
    pub nxdomain: AtomicU64,
    /// Queries sent to an upstream resolver (answered or not).
    pub forwarded: AtomicU64,
    /// Queries answered with an error: malformed (FORMERR), unsupported
    /// (NOTIMP, REFUSED, BADVERS), no upstream answer or too many forwards
    /// in flight (SERVFAIL); and replies the socket refused to send.
    pub errors: AtomicU64,
}

/// The counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub queries: u64,
    pub nxdomain: u64,
    pub forwarded: u64,
    pub errors: u64,
}

impl Metrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            queries: self.queries.load(Ordering::Relaxed),
            nxdomain: self.nxdomain.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
