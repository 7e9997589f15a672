//! Admission: which requests the API serves now, which wait, and which it
//! sheds. Every route belongs to one [`Lane`] ([`ROUTE_LANES`] is the one
//! table; a route it does not name is `user`), in priority order:
//! `liveness` (register, heartbeat), `reports` (what agents send and fetch
//! to run their node: report batches, single reports, instance files, the
//! assignment stream), `user` (what people and the CLI send), `bulk` (the
//! big list reads, events, watches, logs, `/metrics`). Each lane has its
//! own [`LaneLimits`]: requests served at once, a bounded wait queue and
//! how long a request may wait in it. No lane takes another's permits, so
//! a flood of list reads or reports never puts a heartbeat behind it; the
//! priority is that isolation plus the sizes below, not preemption. A
//! request whose lane queue is full is shed at once, one that waited its
//! lane's queue timeout is shed then: both answered **429** with
//! `Retry-After` (the lane's queue timeout in whole seconds, at least 1:
//! a lane that could not admit a request within its timeout holds at
//! least that much work) and the usual JSON error. A stream (watch, logs,
//! assignments) holds its lane's permit only until its headers are sent;
//! open streams have their own bound (`ApiConfig::max_streams`).
//!
//! The defaults ([`LaneSettings::default`]), and why:
//! - `liveness`: 1,024 at once, 8,192 queued, 2 s. A heartbeat is one
//!   lease keep-alive and the store answers many at once, so a wide lane
//!   costs little, and a whole large cluster registering again after an
//!   outage fits its queue. Never the bottleneck by design. A heartbeat
//!   sent every third of the 15 s TTL that waits 2 s and is shed still
//!   leaves its agent two retries before the lease lapses.
//! - `reports`: 256 at once, 2,048 queued, 2 s. Reports are re-sent by
//!   their agent (next tick, and all of them every 30 s), so shedding one
//!   loses nothing; the bound keeps a cluster-wide burst of reports (every
//!   node after a deploy) from filling the store's writer queue ahead of
//!   the keep-alives.
//! - `user`: 64 at once, 256 queued, 5 s. People and scripts: the old
//!   single limit's wait, and room for every CLI a team runs at once.
//! - `bulk`: 8 at once, 64 queued, 5 s. A list of 100,000 instances costs
//!   tens of milliseconds of CPU and megabytes of JSON; on a small server
//!   more than a few at once only trade memory for thrashing.
//!
//! A cluster of thousands of nodes raises `liveness` and `reports` to at
//! least its node count (`cca server --api-lane`; `cca benchmark` sizes them
//! so).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::{ApiError, retry_after_seconds};

/// A class of requests with its own permits and queue, highest priority
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// Node liveness: registration and heartbeats.
    Liveness,
    /// What agents send and fetch to run their node.
    Reports,
    /// Everything a user or the CLI sends that is not bulk.
    User,
    /// Large reads and long-lived streams.
    Bulk,
}

impl Lane {
    /// Every lane, highest priority first.
    pub const ALL: [Lane; 4] = [Lane::Liveness, Lane::Reports, Lane::User, Lane::Bulk];

    /// The lane's name in metrics, errors and flags.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Liveness => "liveness",
            Lane::Reports => "reports",
            Lane::User => "user",
            Lane::Bulk => "bulk",
        }
    }

    /// The lane named `name`, if any.
    pub fn from_name(name: &str) -> Option<Lane> {
        Lane::ALL.into_iter().find(|lane| lane.name() == name)
    }

    /// The lane of a matched route pattern (`/v1/nodes/{name}`): its row
    /// in [`ROUTE_LANES`], else `user`.
    pub(crate) fn of(route: &str) -> Lane {
        explicit_lane(route).unwrap_or(Lane::User)
    }

    fn index(self) -> usize {
        match self {
            Lane::Liveness => 0,
            Lane::Reports => 1,
            Lane::User => 2,
            Lane::Bulk => 3,
        }
    }
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The lane of every route, by the pattern the router matched (all its
/// methods share it). A route added to the router must be added here: a
/// unit test of the router checks that each of its routes has a row.
pub(crate) const ROUTE_LANES: &[(&str, Lane)] = &[
    ("/v1/agent/register", Lane::Liveness),
    ("/v1/agent/nodes/{node}/heartbeat", Lane::Liveness),
    ("/v1/agent/nodes/{node}/reports", Lane::Reports),
    ("/v1/agent/nodes/{node}/instances/{id}", Lane::Reports),
    ("/v1/agent/nodes/{node}/instances/{id}/files", Lane::Reports),
    // A node runs nothing new without it; it holds the permit only until
    // its snapshot starts.
    ("/v1/agent/nodes/{node}/assignments", Lane::Reports),
    ("/v1/agent/nodes/{node}/network", Lane::Reports),
    // Rare (a third of a day per node), and a node whose certificate
    // lapses stops working: beside the reports, not behind users.
    ("/v1/agent/nodes/{node}/certificate", Lane::Reports),
    // Every node's poll (each few seconds at most), small and from the
    // cache: beside the reports; shed, the agent keeps its last list.
    ("/v1/agent/nodes/{node}/revocations", Lane::Reports),
    // A gate node's: a certificate per gate every 60 days, and a poll of
    // a gate's secrets every 10 s answered from the cache (304 unless set
    // again); a gate whose certificate lapses stops serving HTTPS.
    (
        "/v1/agent/nodes/{node}/gates/{gate}/certificate",
        Lane::Reports,
    ),
    ("/v1/agent/nodes/{node}/gates/{gate}/tls", Lane::Reports),
    // A gate node's: a report at most every 10 s, and a wake per cold
    // start, which a request waits on at the gate: not behind users.
    // Every node's, rarely: when it finds a host port held by something
    // outside the cluster or freed again; its failed instance's report
    // waits on it.
    ("/v1/agent/nodes/{node}/held-ports", Lane::Reports),
    // Every node's, after a resync with another store: what it runs that
    // the store does not place, while it waits for adoption.
    ("/v1/agent/nodes/{node}/unclaimed", Lane::Reports),
    // Every node's usage summary, once a period (30 s).
    ("/v1/agent/nodes/{node}/usage", Lane::Reports),
    ("/v1/agent/nodes/{node}/gate-activity", Lane::Reports),
    (
        "/v1/agent/nodes/{node}/services/{service}/wake",
        Lane::Reports,
    ),
    ("/v1/apply", Lane::User),
    ("/v1/diff", Lane::User),
    ("/v1/services/{name}", Lane::User),
    ("/v1/services/{name}/scale", Lane::User),
    ("/v1/services/{name}/history", Lane::User),
    ("/v1/services/{name}/rollout", Lane::User),
    ("/v1/services/{name}/rollout/pause", Lane::User),
    ("/v1/services/{name}/rollout/resume", Lane::User),
    ("/v1/services/{name}/rollout/undo", Lane::User),
    ("/v1/instances/{id}", Lane::User),
    ("/v1/instances/{id}/exec", Lane::User),
    ("/v1/nodes/{name}", Lane::User),
    ("/v1/nodes/{name}/inspect", Lane::User),
    ("/v1/gates/{name}", Lane::User),
    ("/v1/nodes/{name}/drain", Lane::User),
    ("/v1/nodes/{name}/disable", Lane::User),
    ("/v1/nodes/{name}/enable", Lane::User),
    ("/v1/secrets", Lane::User),
    ("/v1/secrets/{name}", Lane::User),
    ("/v1/status", Lane::User),
    ("/v1/identity", Lane::User),
    ("/v1/audit", Lane::User),
    ("/v1/cluster/resume-replacement", Lane::User),
    ("/v1/tokens", Lane::User),
    ("/v1/tokens/{id}", Lane::User),
    ("/v1/join", Lane::User),
    ("/v1/revocations", Lane::User),
    ("/v1/users", Lane::User),
    ("/v1/users/{name}", Lane::User),
    ("/v1/users/{name}/tokens", Lane::User),
    ("/v1/roles", Lane::User),
    ("/v1/roles/{name}", Lane::User),
    ("/v1/logout", Lane::User),
    // The console: a page's view is one page of rows whatever the
    // cluster's size (built off the async threads); a live view holds
    // the permit only until its headers.
    ("/ui", Lane::User),
    ("/ui/{file}", Lane::User),
    ("/v1/console/overview", Lane::User),
    ("/v1/console/services", Lane::User),
    ("/v1/console/services/{name}", Lane::User),
    ("/v1/console/nodes", Lane::User),
    ("/v1/console/nodes/{name}", Lane::User),
    ("/v1/console/instances/{id}", Lane::User),
    ("/v1/console/events", Lane::User),
    ("/v1/console/diff", Lane::User),
    ("/v1/console/apply", Lane::User),
    ("/v1/services", Lane::Bulk),
    // A whole-store read, now and then.
    ("/v1/backup", Lane::Bulk),
    ("/v1/instances", Lane::Bulk),
    ("/v1/nodes", Lane::Bulk),
    ("/v1/top/nodes", Lane::Bulk),
    ("/v1/top/workloads", Lane::Bulk),
    ("/v1/events", Lane::Bulk),
    ("/v1/watch", Lane::Bulk),
    ("/v1/services/{name}/logs", Lane::Bulk),
    ("/v1/instances/{id}/logs", Lane::Bulk),
    ("/metrics", Lane::Bulk),
    ("/v1/secret-key/rotate", Lane::Bulk),
];

/// The row of `route` in [`ROUTE_LANES`].
pub(crate) fn explicit_lane(route: &str) -> Option<Lane> {
    ROUTE_LANES
        .iter()
        .find(|(pattern, _)| *pattern == route)
        .map(|(_, lane)| *lane)
}

/// How much one lane takes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneLimits {
    /// Requests served at once (at least 1).
    pub in_flight: usize,
    /// Requests waiting for a permit at once; one more is shed (429) at
    /// once. 0: no waiting.
    pub queued: usize,
    /// How long a request waits for a permit before it is shed (429).
    pub queue_timeout: Duration,
}

impl LaneLimits {
    /// The `Retry-After` a shed request of this lane is given: the queue
    /// timeout in whole seconds, rounded up, at least 1.
    pub fn retry_after(&self) -> Duration {
        Duration::from_secs(retry_after_seconds(self.queue_timeout))
    }
}

/// The limits of every lane (the module doc argues the defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneSettings {
    pub liveness: LaneLimits,
    pub reports: LaneLimits,
    pub user: LaneLimits,
    pub bulk: LaneLimits,
}

impl LaneSettings {
    /// The limits of `lane`.
    pub fn get(&self, lane: Lane) -> &LaneLimits {
        match lane {
            Lane::Liveness => &self.liveness,
            Lane::Reports => &self.reports,
            Lane::User => &self.user,
            Lane::Bulk => &self.bulk,
        }
    }

    /// The limits of `lane`, to change.
    pub fn get_mut(&mut self, lane: Lane) -> &mut LaneLimits {
        match lane {
            Lane::Liveness => &mut self.liveness,
            Lane::Reports => &mut self.reports,
            Lane::User => &mut self.user,
            Lane::Bulk => &mut self.bulk,
        }
    }
}

impl Default for LaneSettings {
    fn default() -> Self {
        let limits = |in_flight, queued, seconds| LaneLimits {
            in_flight,
            queued,
            queue_timeout: Duration::from_secs(seconds),
        };
        Self {
            liveness: limits(1024, 8192, 2),
            reports: limits(256, 2048, 2),
            user: limits(64, 256, 5),
            bulk: limits(8, 64, 5),
        }
    }
}

/// The admission state of every lane; one per server.
#[derive(Debug)]
pub(crate) struct Admission {
    gates: [Gate; 4],
}

/// Why a request was shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShedReason {
    /// Its lane's queue was full when it arrived.
    QueueFull,
    /// It waited its lane's whole queue timeout.
    TimedOut,
}

impl ShedReason {
    const ALL: [ShedReason; 2] = [ShedReason::QueueFull, ShedReason::TimedOut];

    fn name(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::TimedOut => "timed_out",
        }
    }

    fn index(self) -> usize {
        match self {
            ShedReason::QueueFull => 0,
            ShedReason::TimedOut => 1,
        }
    }
}

/// A request refused by admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shed {
    pub(crate) lane: Lane,
    pub(crate) reason: ShedReason,
    pub(crate) limits: LaneLimits,
}

impl From<Shed> for ApiError {
    fn from(shed: Shed) -> Self {
        let Shed {
            lane,
            reason,
            limits,
        } = shed;
        let retry_after = limits.retry_after();
        let why = match reason {
            ShedReason::QueueFull => format!(
                "{} in flight and {} waiting, its limits",
                limits.in_flight, limits.queued
            ),
            ShedReason::TimedOut => format!(
                "no request finished within {} ms to make room",
                limits.queue_timeout.as_millis()
            ),
        };
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "server busy: the `{lane}` lane is full ({why}); retry in {} s",
                retry_after.as_secs()
            ),
        )
        .with_retry_after(retry_after)
    }
}

/// One lane's permits, queue and tallies.
#[derive(Debug)]
struct Gate {
    lane: Lane,
    limits: LaneLimits,
    permits: Semaphore,
    queued: AtomicUsize,
    shed: [AtomicU64; 2],
}

/// A request's place in its lane: served while this lives.
#[derive(Debug)]
pub(crate) struct Admitted<'a> {
    _permit: SemaphorePermit<'a>,
}

/// A place in a lane's queue, given back on drop (served, shed or
/// cancelled by a client that went away).
struct QueueSlot<'a>(&'a AtomicUsize);

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub(crate) fn new(settings: &LaneSettings) -> Self {
        Self {
            gates: Lane::ALL.map(|lane| Gate::new(lane, *settings.get(lane))),
        }
    }

    /// Admits a request of `lane` now, after waiting in its queue, or
    /// sheds it.
    pub(crate) async fn admit(&self, lane: Lane) -> Result<Admitted<'_>, Shed> {
        self.gate(lane).admit().await
    }

    fn gate(&self, lane: Lane) -> &Gate {
        &self.gates[lane.index()]
    }

    /// Per lane: requests in flight and queued (gauges), requests shed
    /// (a counter, by reason), in Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP cca_api_lane_in_flight API requests being served, by admission lane.\n",
        );
        out.push_str("# TYPE cca_api_lane_in_flight gauge\n");
        for gate in &self.gates {
            let _ = writeln!(
                out,
                "cca_api_lane_in_flight{{lane=\"{}\"}} {}",
                gate.lane,
                gate.in_flight()
            );
        }
        out.push_str(
            "# HELP cca_api_lane_queued API requests waiting for a permit, by admission lane.\n",
        );
        out.push_str("# TYPE cca_api_lane_queued gauge\n");
        for gate in &self.gates {
            let _ = writeln!(
                out,
                "cca_api_lane_queued{{lane=\"{}\"}} {}",
                gate.lane,
                gate.queued.load(Ordering::Acquire)
            );
        }
        out.push_str(
            "# HELP cca_api_requests_shed_total API requests answered 429 without being served, by admission lane and reason.\n",
        );
        out.push_str("# TYPE cca_api_requests_shed_total counter\n");
        for gate in &self.gates {
            for reason in ShedReason::ALL {
                let _ = writeln!(
                    out,
                    "cca_api_requests_shed_total{{lane=\"{}\",reason=\"{}\"}} {}",
                    gate.lane,
                    reason.name(),
                    gate.shed[reason.index()].load(Ordering::Relaxed)
                );
            }
        }
    }
}

impl Gate {
    fn new(lane: Lane, limits: LaneLimits) -> Self {
        let limits = LaneLimits {
            in_flight: limits.in_flight.clamp(1, Semaphore::MAX_PERMITS),
            ..limits
        };
        Self {
            lane,
            limits,
            permits: Semaphore::new(limits.in_flight),
            queued: AtomicUsize::new(0),
            shed: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    async fn admit(&self) -> Result<Admitted<'_>, Shed> {
        // The semaphore is fair: a free permit goes to the queue's head
        // before `try_acquire` can see it, so this never jumps the queue.
        if let Ok(permit) = self.permits.try_acquire() {
            return Ok(Admitted { _permit: permit });
        }
        let Some(_slot) = self.join_queue() else {
            return Err(self.shed(ShedReason::QueueFull));
        };
        match tokio::time::timeout(self.limits.queue_timeout, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(Admitted { _permit: permit }),
            // The semaphore is never closed; a closed one sheds as a timeout.
            Ok(Err(_)) | Err(_) => Err(self.shed(ShedReason::TimedOut)),
        }
    }

    fn join_queue(&self) -> Option<QueueSlot<'_>> {
        let room = |queued: usize| (queued < self.limits.queued).then_some(queued + 1);
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, room)
            .ok()
            .map(|_| QueueSlot(&self.queued))
    }

    fn shed(&self, reason: ShedReason) -> Shed {
        self.shed[reason.index()].fetch_add(1, Ordering::Relaxed);
        Shed {
            lane: self.lane,
            reason,
            limits: self.limits,
        }
    }

    fn in_flight(&self) -> usize {
        self.limits
            .in_flight
            .saturating_sub(self.permits.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt as _;

    use super::*;

    #[test]
    fn agents_liveness_comes_first_and_big_reads_last() {
        for (route, lane) in [
            ("/v1/agent/register", Lane::Liveness),
            ("/v1/agent/nodes/{node}/heartbeat", Lane::Liveness),
            ("/v1/agent/nodes/{node}/reports", Lane::Reports),
            ("/v1/agent/nodes/{node}/instances/{id}", Lane::Reports),
            ("/v1/agent/nodes/{node}/instances/{id}/files", Lane::Reports),
            ("/v1/apply", Lane::User),
            ("/v1/nodes/{name}", Lane::User),
            ("/v1/instances", Lane::Bulk),
            ("/v1/services", Lane::Bulk),
            ("/v1/nodes", Lane::Bulk),
            ("/v1/watch", Lane::Bulk),
            ("/v1/events", Lane::Bulk),
            ("/v1/instances/{id}/logs", Lane::Bulk),
            ("/metrics", Lane::Bulk),
            ("/v1/secret-key/rotate", Lane::Bulk),
        ] {
            assert_eq!(Lane::of(route), lane, "{route}");
        }
    }

    #[test]
    fn an_unknown_route_is_a_user_request() {
        assert_eq!(Lane::of("unmatched"), Lane::User);
        assert_eq!(Lane::of("/v1/agent/nodes/{node}/heartbeat/"), Lane::User);
        assert_eq!(explicit_lane("unmatched"), None);
    }

    #[test]
    fn each_route_has_one_row() {
        for (index, (route, _)) in ROUTE_LANES.iter().enumerate() {
            let rows = ROUTE_LANES.iter().filter(|(other, _)| other == route);
            assert_eq!(rows.count(), 1, "{route} (row {index})");
        }
    }

    #[test]
    fn lanes_are_named_both_ways() {
        for lane in Lane::ALL {
            assert_eq!(Lane::from_name(lane.name()), Some(lane));
        }
        assert_eq!(Lane::from_name("heartbeat"), None);
    }

    #[test]
    fn retry_after_is_the_queue_timeout_in_whole_seconds_at_least_one() {
        let after = |millis| {
            LaneLimits {
                in_flight: 1,
                queued: 0,
                queue_timeout: Duration::from_millis(millis),
            }
            .retry_after()
        };
        assert_eq!(after(0), Duration::from_secs(1));
        assert_eq!(after(200), Duration::from_secs(1));
        assert_eq!(after(2000), Duration::from_secs(2));
        assert_eq!(after(2001), Duration::from_secs(3));
    }

    fn one_at_a_time(queued: usize) -> LaneSettings {
        LaneSettings {
            user: LaneLimits {
                in_flight: 1,
                queued,
                queue_timeout: Duration::from_secs(3600),
            },
            ..LaneSettings::default()
        }
    }

    #[tokio::test]
    async fn a_full_queue_sheds_at_once_and_other_lanes_go_on() {
        let admission = Admission::new(&one_at_a_time(0));
        let _held = admission.admit(Lane::User).await.expect("first admitted");
        let shed = admission.admit(Lane::User).await.expect_err("no room");
        assert_eq!(shed.reason, ShedReason::QueueFull);
        assert_eq!(shed.lane, Lane::User);
        admission
            .admit(Lane::Liveness)
            .await
            .expect("liveness has its own permits");
        let error = ApiError::from(shed);
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.retry_after, Some(Duration::from_secs(3600)));
        assert_eq!(
            error.message,
            "server busy: the `user` lane is full (1 in flight and 0 waiting, its limits); retry in 3600 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_request_is_served_when_a_permit_frees_or_shed_at_its_timeout() {
        let admission = Admission::new(&one_at_a_time(1));
        let held = admission.admit(Lane::User).await.expect("first admitted");
        let mut text = String::new();
        {
            let waiting = admission.admit(Lane::User);
            tokio::pin!(waiting);
            assert!((&mut waiting).now_or_never().is_none(), "no permit yet");
            admission.render(&mut text);
            assert!(
                text.contains("cca_api_lane_queued{lane=\"user\"} 1"),
                "{text}"
            );
            assert!(
                text.contains("cca_api_lane_in_flight{lane=\"user\"} 1"),
                "{text}"
            );
            drop(held);
            let _served = waiting.await.expect("the freed permit goes to the queue");
        }
        let _held = admission.admit(Lane::User).await.expect("admitted again");
        let shed = admission
            .admit(Lane::User)
            .await
            .expect_err("waited an hour");
        assert_eq!(shed.reason, ShedReason::TimedOut);
        text.clear();
        admission.render(&mut text);
        assert!(
            text.contains("cca_api_lane_queued{lane=\"user\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("cca_api_requests_shed_total{lane=\"user\",reason=\"timed_out\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cca_api_requests_shed_total{lane=\"bulk\",reason=\"queue_full\"} 0"),
            "{text}"
        );
    }
}
