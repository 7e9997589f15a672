//! Vertical autoscaling as a fact: the per-instance CPU and memory a
//! service with `autoscale { vertical { ... } }` should be sized to
//! (`derived/vertical/{service}`), and the usage window behind it.
//!
//! The window is a set of histograms, not a series: once every
//! [`SAMPLES_PER_WINDOW`]th of the window the lifecycle controller takes
//! one sample of each ready instance's last fresh usage report (its mean
//! CPU and its memory peak) and counts it in the bucket of the current
//! slice; slices older than the window are dropped. Buckets grow by
//! [`BUCKET_GROWTH_PERMILLE`], so a percentile is within 5% of the exact
//! one, and a busy service's fact stays a few hundred bytes however many
//! instances it has. One write per sample, not per report.
//!
//! The recommendation is the window's 95th percentile with a margin
//! ([`CPU_MARGIN_PERCENT`], [`MEMORY_MARGIN_PERCENT`]: memory more, since
//! running out of it kills where running out of CPU only slows), within
//! the block's bounds and never below [`MIN_CPU`]/[`MIN_MEMORY`]; none
//! until [`MIN_SAMPLES`] samples count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// The usage window a recommendation looks at, unless the control plane
/// is told otherwise (`cca server --vertical-window`).
pub const VERTICAL_WINDOW: Millis = 3_600_000;
/// Samples per window: one a minute for the default window.
pub const SAMPLES_PER_WINDOW: i64 = 60;
/// Slices the window is kept in: the oldest goes as a whole.
pub const SLICES: i64 = 6;
/// No recommendation from fewer samples than this.
pub const MIN_SAMPLES: u64 = 12;
/// The percentile a recommendation follows.
pub const PERCENTILE: u64 = 95;
/// Headroom over the CPU percentile.
pub const CPU_MARGIN_PERCENT: u64 = 15;
/// Headroom over the memory percentile.
pub const MEMORY_MARGIN_PERCENT: u64 = 20;
/// The least CPU a recommendation gives, in millicores.
pub const MIN_CPU: u64 = 10;
/// The least memory a recommendation gives, in bytes.
pub const MIN_MEMORY: u64 = 16 << 20;
/// Each bucket's upper bound over the one before, in thousandths.
pub const BUCKET_GROWTH_PERMILLE: u64 = 1050;
/// Within this many percent of what instances have, a resize is not
/// worth it.
pub const TOLERANCE_PERCENT: u64 = 10;

/// `derived/vertical/{service}`: the usage window of a service with
/// vertical autoscaling and the sizes it recommends.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerticalScaled {
    /// The window it was decided with, in milliseconds.
    pub window_ms: Millis,
    /// When the last sample was taken.
    pub sampled_at: Millis,
    /// The window's slices, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<Slice>,
    /// What the window recommends, once it holds enough samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended: Option<Sizes>,
    /// The window's percentiles the recommendation came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Sizes>,
    /// Samples the window holds.
    pub samples: u64,
    /// `mode = "auto"`: the resources the scheduler sizes the instances
    /// to (in place where the node has room, else as they are replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<crate::spec::Resources>,
    /// Why the applied sizes do not follow the recommendation now, or
    /// which of them another owner keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding: Option<String>,
}

/// Per-instance CPU and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    /// Millicores.
    pub cpu: u64,
    /// Bytes.
    pub memory: u64,
}

/// The samples of one stretch of the window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// When the slice began.
    pub from: Millis,
    /// Instances' mean CPU, in millicores.
    pub cpu: Histogram,
    /// Instances' memory peaks, in bytes.
    pub memory: Histogram,
}

/// Counts by bucket: bucket `i` holds values up to
/// [`upper_bound`]`(i)`, above the bucket before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Histogram(pub BTreeMap<u16, u32>);

impl Histogram {
    pub fn add(&mut self, value: u64) {
        let count = self.0.entry(bucket(value)).or_default();
        *count = count.saturating_add(1);
    }

    pub fn total(&self) -> u64 {
        self.0.values().map(|count| u64::from(*count)).sum()
    }
}

/// The bucket `value` falls in: the first whose upper bound reaches it.
pub fn bucket(value: u64) -> u16 {
    let (mut index, mut bound) = (0u16, 1u64);
    while bound < value && index < u16::MAX {
        index += 1;
        bound = next_bound(bound);
    }
    index
}

/// The largest value bucket `index` holds: 1, then growing by
/// [`BUCKET_GROWTH_PERMILLE`] and at least 1 each step.
pub fn upper_bound(index: u16) -> u64 {
    (0..index).fold(1, |bound, _| next_bound(bound))
}

fn next_bound(bound: u64) -> u64 {
    let grown = bound.saturating_mul(BUCKET_GROWTH_PERMILLE) / 1000;
    grown.max(bound.saturating_add(1))
}

/// The `percentile`th value of the slices' histograms of `pick`, as its
/// bucket's upper bound; `None` when they are empty.
pub fn percentile(
    slices: &[Slice],
    pick: fn(&Slice) -> &Histogram,
    percentile: u64,
) -> Option<u64> {
    let mut merged: BTreeMap<u16, u64> = BTreeMap::new();
    for slice in slices {
        for (bucket, count) in &pick(slice).0 {
            *merged.entry(*bucket).or_default() += u64::from(*count);
        }
    }
    let total: u64 = merged.values().sum();
    if total == 0 {
        return None;
    }
    // The smallest bucket below or at which `percentile`% of the samples lie.
    let rank = (total * percentile).div_ceil(100).max(1);
    let mut seen = 0;
    for (bucket, count) in merged {
        seen += count;
        if seen >= rank {
            return Some(upper_bound(bucket));
        }
    }
    None
}

/// `value` and a margin of `percent` on top.
pub fn with_margin(value: u64, percent: u64) -> u64 {
    value.saturating_mul(100 + percent).div_ceil(100)
}

/// Whether `wanted` is far enough from `have` to resize: more than
/// [`TOLERANCE_PERCENT`] either way.
pub fn worth_resizing(have: u64, wanted: u64) -> bool {
    u128::from(have.abs_diff(wanted)) * 100 > u128::from(have) * u128::from(TOLERANCE_PERCENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_five_percent_and_cover_every_value() {
        assert_eq!(upper_bound(0), 1);
        assert_eq!(upper_bound(1), 2);
        for value in [0, 1, 2, 7, 99, 100, 101, 1_000, 123_456, 8 << 30] {
            let index = bucket(value);
            assert!(upper_bound(index) >= value, "{value}");
            if index > 0 {
                assert!(upper_bound(index - 1) < value, "{value}");
            }
        }
        // Past the first steps, a bound is within 5% (and one) of the value.
        let value = 1_000_000;
        let bound = upper_bound(bucket(value));
        assert!(bound <= value * 1050 / 1000 + 1, "{bound}");
        assert!(
            bucket(1 << 40) < 1000,
            "a TiB stays within a few hundred buckets"
        );
    }

    #[test]
    fn the_percentile_spans_the_slices() {
        let mut old = Slice::default();
        let mut new = Slice::default();
        // 90 samples at 100m, 10 at 1000m: the 95th percentile is 1000m.
        for _ in 0..60 {
            old.cpu.add(100);
        }
        for _ in 0..30 {
            new.cpu.add(100);
        }
        for _ in 0..10 {
            new.cpu.add(1000);
        }
        let slices = [old, new];
        let p95 = percentile(&slices, |slice| &slice.cpu, 95).expect("samples");
        assert!((1000..=1050).contains(&p95), "{p95}");
        let p50 = percentile(&slices, |slice| &slice.cpu, 50).expect("samples");
        assert!((100..=105).contains(&p50), "{p50}");
        assert_eq!(percentile(&slices, |slice| &slice.memory, 95), None);
    }

    #[test]
    fn margins_and_tolerance() {
        assert_eq!(with_margin(200, 15), 230);
        assert_eq!(with_margin(1, 20), 2, "rounded up");
        assert!(!worth_resizing(1000, 1100));
        assert!(worth_resizing(1000, 1101));
        assert!(worth_resizing(1000, 899));
        assert!(worth_resizing(0, 1));
    }

    #[test]
    fn the_fact_round_trips_compactly() {
        let mut slice = Slice {
            from: 5,
            ..Slice::default()
        };
        for value in [100, 100, 250] {
            slice.cpu.add(value);
        }
        let fact = VerticalScaled {
            window_ms: VERTICAL_WINDOW,
            sampled_at: 7,
            slices: vec![slice],
            recommended: None,
            observed: None,
            samples: 3,
            applied: None,
            holding: None,
        };
        let text = serde_json::to_string(&fact).expect("encodes");
        // Bucket by count: 100m twice, 250m once.
        assert!(text.contains(r#""cpu":{"61":2,"81":1}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<VerticalScaled>(&text).expect("decodes"),
            fact
        );
    }
}
