//! Health checks of running instances: an HTTP GET (2xx/3xx is healthy), a
//! TCP connect, or a command run in the instance's context (exit 0 is
//! healthy), each with a timeout. [`HealthTracker`] turns probe results
//! into a verdict with the service's `retries` tolerance.
//!
//! The first probe after a start runs at once, and until the first success
//! probes follow every [`STARTUP_PROBE_EVERY`] instead of every `interval`
//! (failures then do not count against `retries`: the process is still
//! binding), for at most one `interval` (at least a second) after the
//! start; then the normal interval and counting. So an instance is ready,
//! and in its service's endpoints, a few milliseconds after it listens —
//! what a request held for a cold start waits on — not an interval later.

use std::sync::Arc;
use std::time::Duration;

use cca_model::spec::{HealthCheck, Probe};
use cca_runtime::{ExecRequest, Runtime};
use tokio::time::Instant;

/// The verdict on one instance, updated by each probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTracker {
    /// `None` until the first probe has answered.
    pub healthy: Option<bool>,
    pub consecutive_failures: u32,
    pub next_probe_at: Instant,
    /// The last failure, for `cca describe`.
    pub last_failure: Option<String>,
    /// When the instance (re)started: the quick startup probes last at
    /// most one interval from here.
    pub started: Instant,
}

/// How often an instance is probed between its start and its first
/// success (within the startup window).
pub const STARTUP_PROBE_EVERY: Duration = Duration::from_millis(15);

/// The shortest startup window, whatever the interval.
const MIN_STARTUP_WINDOW: Duration = Duration::from_secs(1);

impl HealthTracker {
    pub fn new(now: Instant) -> Self {
        Self {
            healthy: None,
            consecutive_failures: 0,
            next_probe_at: now,
            last_failure: None,
            started: now,
        }
    }

    /// True while the instance has not passed a probe since its start and
    /// its startup window lasts: probes come every [`STARTUP_PROBE_EVERY`].
    pub fn in_startup(&self, check: &HealthCheck, now: Instant) -> bool {
        let window = Duration::from_millis(check.interval.0).max(MIN_STARTUP_WINDOW);
        self.healthy != Some(true) && self.consecutive_failures == 0 && now < self.started + window
    }

    /// Records a probe result: healthy at once on success; unhealthy after
    /// more than `retries` consecutive failures.
    pub fn record(&mut self, check: &HealthCheck, result: Result<(), String>, now: Instant) {
        self.next_probe_at = now + Duration::from_millis(check.interval.0.max(100));
        if let Err(reason) = &result
            && self.in_startup(check, now)
        {
            self.next_probe_at = now + STARTUP_PROBE_EVERY;
            self.last_failure = Some(reason.clone());
            return;
        }
        match result {
            Ok(()) => {
                self.healthy = Some(true);
                self.consecutive_failures = 0;
            }
            Err(reason) => {
                self.consecutive_failures += 1;
                self.last_failure = Some(reason);
                if self.consecutive_failures > check.retries {
                    self.healthy = Some(false);
                }
            }
        }
    }
}

/// Where a probe connects: the host port the instance's probe port maps to.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    pub address: String,
    pub port: u16,
}

/// Runs one probe. `target` is `None` for exec probes.
pub async fn probe(
    check: &HealthCheck,
    target: Option<ProbeTarget>,
    runtime: &Arc<dyn Runtime>,
    instance: &str,
) -> Result<(), String> {
    let timeout = Duration::from_millis(check.timeout.0.max(50));
    let outcome = tokio::time::timeout(
        timeout,
        run_probe(&check.probe, target, runtime, instance, timeout),
    )
    .await;
    outcome.unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}

async fn run_probe(
    probe: &Probe,
    target: Option<ProbeTarget>,
    runtime: &Arc<dyn Runtime>,
    instance: &str,
    timeout: Duration,
) -> Result<(), String> {
    match (probe, target) {
        (Probe::Http { path, .. }, Some(target)) => http_get(&target, path, timeout).await,
        (Probe::Tcp { .. }, Some(target)) => {
            tokio::net::TcpStream::connect((target.address.as_str(), target.port))
                .await
                .map(drop)
                .map_err(|err| format!("tcp {}:{}: {err}", target.address, target.port))
        }
        (Probe::Exec { command }, _) => {
            let request = ExecRequest::new(["sh", "-c", command.as_str()], timeout);
            let output = runtime
                .exec(instance, request)
                .await
                .map_err(|err| err.to_string())?;
            match output.code {
                Some(0) => Ok(()),
                code => Err(format!("`{command}` exited with {code:?}")),
            }
        }
        (_, None) => Err("the probe's port is not bound on this node".to_owned()),
    }
}

async fn http_get(target: &ProbeTarget, path: &str, timeout: Duration) -> Result<(), String> {
    let url = format!("http://{}:{}{}", target.address, target.port, path);
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|err| err.to_string())?;
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|err| format!("GET {url}: {err}"))?;
    let status = response.status();
    if status.is_success() || status.is_redirection() {
        Ok(())
    } else {
        Err(format!("GET {url}: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cca_model::spec::Duration as SpecDuration;

    fn check(retries: u32) -> HealthCheck {
        HealthCheck {
            probe: Probe::Tcp { port: 80 },
            interval: SpecDuration(1000),
            timeout: SpecDuration(500),
            retries,
        }
    }

    #[test]
    fn failures_beyond_the_retries_make_an_instance_unhealthy() {
        let start = Instant::now();
        // Past the startup window, where every failure counts.
        let now = start + Duration::from_secs(2);
        let mut tracker = HealthTracker::new(start);
        let check = check(2);
        tracker.record(&check, Err("refused".into()), now);
        tracker.record(&check, Err("refused".into()), now);
        assert_eq!(
            tracker.healthy, None,
            "two failures are within the tolerance"
        );
        tracker.record(&check, Err("refused".into()), now);
        assert_eq!(tracker.healthy, Some(false));
        assert_eq!(tracker.last_failure.as_deref(), Some("refused"));
        tracker.record(&check, Ok(()), now);
        assert_eq!(
            (tracker.healthy, tracker.consecutive_failures),
            (Some(true), 0)
        );
        assert_eq!(tracker.next_probe_at, now + Duration::from_secs(1));
    }

    #[test]
    fn until_the_first_success_probes_come_quickly_and_failures_wait() {
        let start = Instant::now();
        let mut tracker = HealthTracker::new(start);
        let check = check(0);
        assert_eq!(tracker.next_probe_at, start, "the first probe runs at once");
        let soon = start + Duration::from_millis(5);
        tracker.record(&check, Err("refused".into()), soon);
        assert_eq!(tracker.next_probe_at, soon + STARTUP_PROBE_EVERY);
        assert_eq!(
            (tracker.healthy, tracker.consecutive_failures),
            (None, 0),
            "a process still binding is not unhealthy"
        );
        let up = start + Duration::from_millis(40);
        tracker.record(&check, Ok(()), up);
        assert_eq!(tracker.healthy, Some(true));
        assert_eq!(tracker.next_probe_at, up + Duration::from_secs(1));
        // Once it has passed, failures count at the normal interval.
        let later = up + Duration::from_millis(10);
        tracker.record(&check, Err("refused".into()), later);
        assert_eq!(tracker.healthy, Some(false));
        assert_eq!(tracker.next_probe_at, later + Duration::from_secs(1));
    }

    #[test]
    fn the_startup_window_ends_after_one_interval() {
        let start = Instant::now();
        let mut tracker = HealthTracker::new(start);
        let check = check(0);
        let late = start + Duration::from_millis(1_000);
        tracker.record(&check, Err("refused".into()), late);
        assert_eq!(tracker.healthy, Some(false), "counted after the window");
        assert_eq!(tracker.next_probe_at, late + Duration::from_secs(1));
    }
}
