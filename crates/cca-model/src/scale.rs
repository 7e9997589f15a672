//! Scale to zero as facts: what gate nodes saw of each service's traffic
//! (`observed/gate-activity/{node}`) and whether a service with
//! `scale_to_zero` sleeps (`derived/scale/{service}`).
//!
//! Only requests through a gate count as activity: a gate node forwards
//! them, so it can count them for free and report the last one per service
//! every few seconds. Traffic between services over their VIPs goes
//! through the nodes' packet filters, which count nothing, so a service
//! only other services call must not scale to zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// `observed/gate-activity/{node}`: per service, when the gate node last
/// forwarded a request to it (the node's clock). Written by the API when
/// the gate node reports (at most every 10 s, only when something
/// changed), merged with what was there: the later time per service wins,
/// services that no longer exist go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateActivity {
    pub services: BTreeMap<String, Millis>,
}

impl GateActivity {
    /// Folds `report` in: the later time per service. True when it
    /// changed anything.
    pub fn merge(&mut self, report: &BTreeMap<String, Millis>) -> bool {
        let mut changed = false;
        for (service, &at) in report {
            let held = self.services.entry(service.clone()).or_insert(Millis::MIN);
            if at > *held {
                *held = at;
                changed = true;
            }
        }
        changed
    }
}

/// `derived/scale/{service}`: whether a service with `scale_to_zero`
/// sleeps. Written by the scale controller (to sleep, and to start the
/// first idle window) and by the API's wake route (to wake at once,
/// without waiting for a controller pass): both compare-and-swap on it.
/// Absent: awake (a service without `scale_to_zero` has none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleState {
    /// The scheduler runs no instance of an asleep service.
    pub asleep: bool,
    /// When it fell asleep or woke.
    pub since: Millis,
    pub cause: ScaleCause,
}

/// Why a service is asleep or awake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ScaleCause {
    /// Awake since `scale_to_zero` was set (or the service created): its
    /// first idle window counts from then.
    Enabled,
    /// Asleep: no gate forwarded a request to it for `window` ms since
    /// `last_activity`.
    Idle {
        window: Millis,
        last_activity: Millis,
    },
    /// Awake: a request reached it through gate node `node`, which asked
    /// to wake it (`POST …/wake`), or reported activity after it fell
    /// asleep.
    Woken { node: String },
}

impl std::fmt::Display for ScaleCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScaleCause::Enabled => f.write_str("scale_to_zero set"),
            ScaleCause::Idle { window, .. } => {
                write!(f, "idle: no request through a gate for {}s", window / 1000)
            }
            ScaleCause::Woken { node } => write!(f, "woken by a request via gate node {node}"),
        }
    }
}

/// The latest request any gate node forwarded to `service`, over every
/// gate node's report.
pub fn last_activity<'a>(
    reports: impl IntoIterator<Item = &'a GateActivity>,
    service: &str,
) -> Option<Millis> {
    reports
        .into_iter()
        .filter_map(|report| report.services.get(service).copied())
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_keeps_the_later_time_per_service() {
        let mut held = GateActivity {
            services: BTreeMap::from([("web".into(), 50), ("api".into(), 10)]),
        };
        let report = BTreeMap::from([("web".into(), 40), ("api".into(), 20), ("new".into(), 5)]);
        assert!(held.merge(&report));
        assert_eq!(
            held.services,
            BTreeMap::from([("web".into(), 50), ("api".into(), 20), ("new".into(), 5)])
        );
        assert!(
            !held.merge(&report),
            "the same report again changes nothing"
        );
    }

    #[test]
    fn the_last_activity_is_the_max_over_gate_nodes() {
        let a = GateActivity {
            services: BTreeMap::from([("web".into(), 50)]),
        };
        let b = GateActivity {
            services: BTreeMap::from([("web".into(), 70), ("api".into(), 1)]),
        };
        assert_eq!(last_activity([&a, &b], "web"), Some(70));
        assert_eq!(last_activity([&a], "api"), None);
    }

    #[test]
    fn causes_encode_with_their_reason_and_say_why() {
        let state = ScaleState {
            asleep: true,
            since: 9,
            cause: ScaleCause::Idle {
                window: 300_000,
                last_activity: 5,
            },
        };
        let json = serde_json::to_value(&state).expect("encodes");
        assert_eq!(json["cause"]["reason"], "idle");
        assert_eq!(
            serde_json::from_value::<ScaleState>(json).expect("decodes"),
            state
        );
        assert_eq!(
            ScaleCause::Woken { node: "g1".into() }.to_string(),
            "woken by a request via gate node g1"
        );
    }
}
