//! Vertical autoscaling of one service with `autoscale { vertical { ... } }`:
//! the usage window and the per-instance sizes it recommends
//! (`derived/vertical/{service}`).
//!
//! - **Sampling.** Once every [`SAMPLES_PER_WINDOW`]th of the window, each
//!   ready instance whose node's last usage report is fresh adds its mean
//!   CPU and its memory peak to the window's newest slice; slices older
//!   than the window go. Between samples nothing is written: a usage
//!   report alone never costs a write.
//! - **Recommendation.** The window's 95th percentiles with a margin,
//!   within the block's bounds, once [`MIN_SAMPLES`] samples count
//!   (`cca_model::vertical`). A new one replaces the one before only when
//!   it differs by more than [`TOLERANCE_PERCENT`], so what `describe`
//!   shows does not wander with every sample.
//! - **Applying it** (`mode = "auto"`): the recommendation becomes the
//!   fact's `applied` resources, which the scheduler sizes the instances
//!   to — except a metric horizontal autoscaling follows, and never while
//!   a rollout progresses.
//!
//! [`SAMPLES_PER_WINDOW`]: cca_model::vertical::SAMPLES_PER_WINDOW
//! [`MIN_SAMPLES`]: cca_model::vertical::MIN_SAMPLES
//! [`TOLERANCE_PERCENT`]: cca_model::vertical::TOLERANCE_PERCENT

use cca_model::cluster::Millis;
use cca_model::rollout::{Rollout, RolloutPhase};
use cca_model::spec::{Cpu, Memory, Resources, ServiceSpec, VerticalMode, VerticalScale};
use cca_model::vertical::{
    CPU_MARGIN_PERCENT, MEMORY_MARGIN_PERCENT, MIN_CPU, MIN_MEMORY, MIN_SAMPLES, PERCENTILE,
    SAMPLES_PER_WINDOW, SLICES, Sizes, Slice, VerticalScaled, percentile, with_margin,
    worth_resizing,
};

use super::horizontal::fresh_usage;
use crate::controller::EventDraft;
use crate::view::View;

/// The window and recommendation `service` should have now (`None`: it
/// has no vertical autoscaling), and when its next sample is due.
pub(super) fn decide(
    view: &View,
    service: &str,
    spec: &ServiceSpec,
    rollout: &Rollout,
    (now, window): (Millis, Millis),
    events: &mut Vec<EventDraft>,
) -> Option<(VerticalScaled, Option<Millis>)> {
    let vertical = spec.autoscale.as_ref()?.vertical.as_ref()?;
    let held = view.vertical.get(service).map(|held| &*held.value);
    let window = window.max(1);
    let step = (window / SAMPLES_PER_WINDOW).max(1);
    let slice_span = (window / SLICES).max(1);
    let mut decided = held.cloned().unwrap_or_default();
    decided.window_ms = window;
    decided
        .slices
        .retain(|slice| slice.from + slice_span > now - window);
    // Never sampled (`sampled_at` 0): due as soon as an instance reports.
    let due = held.is_none_or(|held| held.sampled_at == 0 || now >= held.sampled_at + step);
    if due && sample(view, service, now, slice_span, &mut decided.slices) {
        decided.sampled_at = now;
    }
    decided.samples = decided.slices.iter().map(|slice| slice.cpu.total()).sum();
    recommend(&mut decided, vertical);
    if decided.recommended != held.and_then(|held| held.recommended)
        && let Some(sizes) = decided.recommended
    {
        events.push(EventDraft::info(
            format!("service/{service}"),
            format!("vertical recommendation: {}", describe(&decided, sizes)),
        ));
    }
    apply(&mut decided, spec, vertical, rollout);
    let applied = decided.applied.as_ref();
    if applied != held.and_then(|held| held.applied.as_ref())
        && let Some(resources) = applied
    {
        events.push(EventDraft::info(
            format!("service/{service}"),
            format!(
                "vertical autoscaling sizes instances to {} (in place where their node has room)",
                resources_text(resources)
            ),
        ));
    }
    let wake = (decided.sampled_at > 0).then_some(decided.sampled_at + step);
    Some((decided, wake))
}

/// `mode = "auto"`: the resources the instances are sized to — the
/// recommendation for what horizontal autoscaling does not follow (it
/// scales on a share of the request, so resizing that request would make
/// the two fight), held while a rollout progresses.
fn apply(
    decided: &mut VerticalScaled,
    spec: &ServiceSpec,
    bounds: &VerticalScale,
    rollout: &Rollout,
) {
    decided.holding = None;
    if bounds.mode != VerticalMode::Auto {
        decided.applied = None;
        return;
    }
    let Some(sizes) = decided.recommended else {
        decided.holding = Some(format!(
            "waiting for {MIN_SAMPLES} samples before the first size"
        ));
        return;
    };
    if rollout.phase == RolloutPhase::Progressing {
        decided.holding = Some(format!(
            "a rollout of version {} is in progress",
            rollout.target
        ));
        return;
    }
    let horizontal = spec
        .autoscale
        .as_ref()
        .and_then(|autoscale| autoscale.horizontal.as_ref());
    let (cpu_kept, memory_kept) =
        horizontal.map_or((false, false), |h| (h.cpu.is_some(), h.memory.is_some()));
    let kept: Vec<&str> = [("cpu", cpu_kept), ("memory", memory_kept)]
        .into_iter()
        .filter_map(|(name, kept)| kept.then_some(name))
        .collect();
    if !kept.is_empty() {
        decided.holding = Some(format!(
            "{} stays at the spec's `resources`: horizontal autoscaling follows it",
            kept.join(" and ")
        ));
    }
    decided.applied = Some(Resources {
        cpu: if cpu_kept {
            spec.resources.cpu
        } else {
            Some(Cpu(sizes.cpu))
        },
        memory: if memory_kept {
            spec.resources.memory
        } else {
            Some(Memory(sizes.memory))
        },
    });
}

/// `250m CPU, 96Mi memory`, or `unlimited` for a missing one.
pub fn resources_text(resources: &Resources) -> String {
    let cpu = resources
        .cpu
        .map_or_else(|| "unlimited".to_owned(), |cpu| format!("{}m", cpu.0));
    let memory = resources
        .memory
        .map_or_else(|| "unlimited".to_owned(), Memory::human);
    format!("{cpu} CPU, {memory} memory")
}

/// Adds one sample of each fresh, ready instance to the newest slice (a
/// new one when it has ended). Whether any instance counted.
fn sample(
    view: &View,
    service: &str,
    now: Millis,
    slice_span: Millis,
    slices: &mut Vec<Slice>,
) -> bool {
    let mut usages = fresh_usage(view, service, now).peekable();
    if usages.peek().is_none() {
        return false;
    }
    if slices
        .last()
        .is_none_or(|slice| slice.from + slice_span <= now)
    {
        slices.push(Slice {
            from: now,
            ..Slice::default()
        });
    }
    let Some(slice) = slices.last_mut() else {
        return false;
    };
    for (_, usage) in usages {
        slice.cpu.add(usage.cpu_millis);
        slice.memory.add(usage.memory_peak_bytes);
    }
    true
}

/// Sets the window's percentiles and, once enough samples count and the
/// new sizes differ enough from the last, the recommendation.
fn recommend(decided: &mut VerticalScaled, bounds: &VerticalScale) {
    if decided.samples < MIN_SAMPLES {
        decided.observed = None;
        decided.recommended = None;
        return;
    }
    let cpu = percentile(&decided.slices, |slice| &slice.cpu, PERCENTILE);
    let memory = percentile(&decided.slices, |slice| &slice.memory, PERCENTILE);
    let (Some(cpu), Some(memory)) = (cpu, memory) else {
        return;
    };
    decided.observed = Some(Sizes { cpu, memory });
    let clamp = |value: u64, least: u64, min: Option<u64>, max: Option<u64>| {
        let value = value.max(least).max(min.unwrap_or(0));
        max.map_or(value, |max| value.min(max.max(min.unwrap_or(0))))
    };
    let (min_cpu, max_cpu) = (bounds.min_cpu.map(|c| c.0), bounds.max_cpu.map(|c| c.0));
    let (min_memory, max_memory) = (
        bounds.min_memory.map(|m| m.0),
        bounds.max_memory.map(|m| m.0),
    );
    let wanted = Sizes {
        cpu: clamp(
            with_margin(cpu, CPU_MARGIN_PERCENT),
            MIN_CPU,
            min_cpu,
            max_cpu,
        ),
        memory: clamp(
            with_margin(memory, MEMORY_MARGIN_PERCENT),
            MIN_MEMORY,
            min_memory,
            max_memory,
        ),
    };
    // One the bounds have moved away from is replaced at once.
    let changed = decided.recommended.is_none_or(|held| {
        worth_resizing(held.cpu, wanted.cpu)
            || worth_resizing(held.memory, wanted.memory)
            || clamp(held.cpu, MIN_CPU, min_cpu, max_cpu) != held.cpu
            || clamp(held.memory, MIN_MEMORY, min_memory, max_memory) != held.memory
    });
    if changed {
        decided.recommended = Some(wanted);
    }
}

/// In words: the sizes and the window behind them.
pub fn describe(decided: &VerticalScaled, sizes: Sizes) -> String {
    let observed = decided.observed.unwrap_or(sizes);
    format!(
        "{}m CPU, {} MiB memory (p{PERCENTILE} {}m CPU, {} MiB memory + {CPU_MARGIN_PERCENT}%/\
         {MEMORY_MARGIN_PERCENT}%, over {} samples in the last {}s)",
        sizes.cpu,
        sizes.memory.div_ceil(1 << 20),
        observed.cpu,
        observed.memory.div_ceil(1 << 20),
        decided.samples,
        decided.window_ms / 1000
    )
}
