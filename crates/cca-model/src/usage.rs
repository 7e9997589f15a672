//! Resource usage as facts: what each node and each of its running
//! instances used of CPU and memory (`observed/usage/{node}`).
//!
//! An agent samples every few seconds and reports a summary of each period
//! (about 30 s), one fact per node overwritten each time: the store takes
//! one write per node per period, not one per sample, and every API
//! server's cache sees each report, so any server can answer `cca top` and
//! keep the recent series autoscaling decides on. A period's summary keeps
//! the mean and the peak, so a burst between two reports is not lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// `observed/usage/{node}`, written by the node's agent once a period.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUsage {
    /// When the period ended (the node's clock).
    pub at: Millis,
    /// How long the period lasted, in milliseconds.
    pub period_ms: u64,
    /// The whole node: every process on it, the cluster's or not.
    pub node: UsageSummary,
    /// Each instance that ran through the period's last sample, by id.
    pub instances: BTreeMap<String, UsageSummary>,
    /// A gate node: the requests its gate forwarded to each service over
    /// the period (none: no gate, or no request).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, u64>,
}

/// What something used over one period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSummary {
    /// Mean CPU over the period, in millicores (1000 = one core busy).
    pub cpu_millis: u64,
    /// The busiest stretch between two samples, in millicores.
    pub cpu_peak_millis: u64,
    /// Memory in use at the period's end, in bytes.
    pub memory_bytes: u64,
    /// The most memory any sample of the period saw, in bytes.
    pub memory_peak_bytes: u64,
}
