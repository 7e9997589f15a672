//! Horizontal autoscaling as a fact: the replica count the lifecycle
//! controller runs a service with `autoscale` at
//! (`derived/autoscale/{service}`), and the signals behind each change.
//!
//! The recommendation comes from the instances' usage reports
//! (`observed/usage/{node}`): the replicas that would bring the mean use
//! of each metric to its target share of the request. Up follows the
//! newest recommendation at once (at most doubling, or +4, per step); down
//! follows the highest recommendation of the last [`SCALE_DOWN_WINDOW`],
//! so a load that comes and goes keeps the count of its peaks instead of
//! flapping. The window lives in the fact itself: only recommendations
//! that changed are recorded, so a steady load writes nothing.

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// How long a higher recommendation holds a scale-down back, unless the
/// control plane is told otherwise (`cca server --scale-down-window`).
pub const SCALE_DOWN_WINDOW: Millis = 300_000;

/// Within this many percent of the target, nothing changes.
pub const TOLERANCE_PERCENT: u64 = 10;

/// A usage report older than this many of its periods counts for nothing.
pub const STALE_PERIODS: u64 = 3;

/// `derived/autoscale/{service}`: the replica count the scheduler runs a
/// service with horizontal `autoscale` at, within its `min..max`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscaled {
    /// What the scheduler runs.
    pub replicas: u32,
    /// The newest recommendation (what the signals ask for now).
    pub recommended: u32,
    /// The scale-down window it was decided with, in milliseconds.
    #[serde(default = "default_window")]
    pub window_ms: Millis,
    /// Earlier recommendations still inside the scale-down window, each
    /// with when it was superseded, oldest first: a scale-down goes no
    /// lower than the highest of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<Recommendation>,
    /// The last change of `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change: Option<ScaleChange>,
    /// Why it does not follow the recommendation now, if it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding: Option<String>,
}

fn default_window() -> Millis {
    SCALE_DOWN_WINDOW
}

/// A recommendation and when a different one replaced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommendation {
    pub replicas: u32,
    pub until: Millis,
}

/// One change of an autoscaled service's replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleChange {
    pub from: u32,
    pub to: u32,
    pub at: Millis,
    /// The signals it was decided on.
    pub signals: Vec<Signal>,
    /// In words: which signal, which window, which bound.
    pub why: String,
}

/// What one metric says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    pub metric: Metric,
    /// Instances whose last report counts.
    pub reporting: u32,
    /// Their summed use: millicores, or bytes.
    pub used: u64,
    /// Each one's request: millicores, or bytes.
    pub request: u64,
    /// The reporting instances' mean use, in percent of the request.
    pub utilization: u64,
    /// The target, in percent of the request.
    pub target: u64,
    /// The replicas that bring the utilization to the target.
    pub recommended: u32,
}

/// A metric autoscaling follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Cpu,
    Memory,
    /// Requests per second through the gates; `used` and `request` in
    /// thousandths of a request per second, `target` 100 (percent of the
    /// per-instance rate).
    RequestsPerSecond,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Cpu => "cpu",
            Metric::Memory => "memory",
            Metric::RequestsPerSecond => "requests_per_second",
        }
    }
}

/// The replicas that bring `used` (summed over `reporting` instances of
/// `current`) to `target` percent of `request` each. Instances without a
/// report count as using nothing when that asks for more, and as on
/// target when it asks for fewer: a new instance that has not reported
/// yet neither speeds a scale-up nor starts a scale-down. Within
/// [`TOLERANCE_PERCENT`] of the target, `current`.
pub fn recommend(current: u32, reporting: u32, used: u64, request: u64, target: u64) -> u32 {
    if request == 0 || target == 0 || reporting == 0 {
        return current;
    }
    let per_instance = u128::from(request) * u128::from(target);
    let used = u128::from(used) * 100;
    let missing = u128::from(current.saturating_sub(reporting));
    let wanted = used.div_ceil(per_instance);
    let wanted = if wanted < u128::from(current) {
        (used + missing * per_instance).div_ceil(per_instance)
    } else {
        wanted
    };
    // Mean use over the instances that count, against the target.
    let counted = u128::from(current.max(reporting));
    let mean = used / counted.max(1);
    let off = mean.abs_diff(per_instance) * 100;
    if off <= per_instance * u128::from(TOLERANCE_PERCENT) {
        return current;
    }
    u32::try_from(wanted).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recommendation_brings_the_mean_to_the_target() {
        // 4 instances of 100m at 140m each, target 70%: 560m / 70m = 8.
        assert_eq!(recommend(4, 4, 560, 100, 70), 8);
        // At 35m each: 140m / 70m = 2.
        assert_eq!(recommend(4, 4, 140, 100, 70), 2);
        // Within 10% of the target: unchanged.
        assert_eq!(recommend(4, 4, 4 * 74, 100, 70), 4);
        assert_eq!(recommend(4, 4, 4 * 66, 100, 70), 4);
    }

    #[test]
    fn instances_without_a_report_neither_speed_up_nor_start_a_scale_down() {
        // 2 of 4 report 140m: up from what they use alone, 280 / 70 = 4.
        assert_eq!(recommend(4, 2, 280, 100, 70), 4);
        // 2 of 4 report 10m: the other two count as on target.
        assert_eq!(recommend(4, 2, 20, 100, 70), 3);
        assert_eq!(recommend(4, 0, 0, 100, 70), 4, "no report: hold");
        assert_eq!(recommend(4, 4, 50, 0, 70), 4, "no request: hold");
    }
}
