//! Horizontal autoscaling of one service with `autoscale { min max cpu
//! memory }`: the replica count (`derived/autoscale/{service}`) from its
//! instances' usage reports.
//!
//! - **Signals.** Per metric, the ready instances whose node's last report
//!   is fresh (at most [`STALE_PERIODS`] periods old) and names them: their
//!   summed mean use against their requests gives the utilization, and the
//!   replicas that bring it to the target ([`recommend`]). The highest
//!   metric's wins, within `min..max`.
//! - **Up fast.** A higher recommendation is followed at once, at most
//!   doubling (or +4) per step.
//! - **Down slowly.** A scale-down goes to the highest recommendation of
//!   the last `scale_down_window` (5 minutes, [`SCALE_DOWN_WINDOW`], unless
//!   configured; the fact keeps the recommendations it
//!   superseded in that window), so a periodic load holds the count of its
//!   peaks rather than following each trough.
//! - **Never fighting.** While a rollout progresses, or the service sleeps
//!   (`scale_to_zero`), the count holds and says why. `cca scale` is
//!   refused for an autoscaled service: the autoscaler owns its replicas,
//!   within the bounds its file sets.
//!
//! [`STALE_PERIODS`]: cca_model::autoscale::STALE_PERIODS
//! [`SCALE_DOWN_WINDOW`]: cca_model::autoscale::SCALE_DOWN_WINDOW

use cca_model::autoscale::{
    Autoscaled, Metric, Recommendation, STALE_PERIODS, ScaleChange, Signal, recommend,
};
use cca_model::cluster::{Instance, Millis};
use cca_model::rollout::{Rollout, RolloutPhase};
use cca_model::spec::{HorizontalScale, ServiceSpec};
use cca_model::usage::UsageSummary;

use crate::controller::EventDraft;
use crate::view::View;

/// The autoscaled count `service` should have now (`None`: it does not
/// autoscale horizontally), and when to look again if nothing reports.
pub(super) fn decide(
    view: &View,
    service: &str,
    spec: &ServiceSpec,
    rollout: &Rollout,
    context: &Decision,
    events: &mut Vec<EventDraft>,
) -> Option<(Autoscaled, Option<Millis>)> {
    let (now, window) = (context.now, context.window);
    let horizontal = spec.autoscale.as_ref()?.horizontal.as_ref()?;
    let (min, max) = (horizontal.min, horizontal.max.max(horizontal.min));
    let held = view.autoscaled.get(service).map(|held| &*held.value);
    let before = held.map_or(spec.replicas, |held| held.replicas);
    let current = before.clamp(min, max);
    let signals = signals(view, service, horizontal, current, now);
    let recommended = signals
        .iter()
        .map(|signal| signal.recommended)
        .max()
        .unwrap_or(current)
        .clamp(min, max);
    let mut superseded: Vec<Recommendation> =
        held.map(|held| held.superseded.clone()).unwrap_or_default();
    if let Some(held) = held.filter(|held| held.recommended != recommended) {
        superseded.push(Recommendation {
            replicas: held.recommended,
            until: now,
        });
    }
    // One no higher than the newest recommendation never bounds a
    // scale-down again: that one outlives it in the window.
    superseded.retain(|old| old.until > now - window && old.replicas > recommended);
    let window_max = superseded
        .iter()
        .map(|old| old.replicas)
        .fold(recommended, u32::max);
    let choice = Choice {
        current,
        recommended,
        window_max,
        window,
    };
    let (target, holding) = choose(view, service, rollout, &choice);
    let last_change = if target == before {
        held.and_then(|held| held.last_change.clone())
    } else {
        let why = reason(&signals, before, target, &choice, (min, max));
        events.push(EventDraft::info(
            format!("service/{service}"),
            format!("autoscaled from {before} to {target} replicas: {why}"),
        ));
        Some(ScaleChange {
            from: before,
            to: target,
            at: now,
            signals,
            why,
        })
    };
    let wake = superseded.iter().map(|old| old.until + window).min();
    let decided = Autoscaled {
        replicas: target,
        recommended,
        window_ms: window,
        superseded,
        last_change,
        holding,
    };
    Some((decided, wake))
}

/// When a decision is taken, and the scale-down window it uses.
#[derive(Clone, Copy, Debug)]
pub(super) struct Decision {
    pub(super) now: Millis,
    pub(super) window: Millis,
    /// The vertical usage window.
    pub(super) vertical_window: Millis,
}

/// What a choice weighs: the count now, the newest recommendation, the
/// highest of the window.
struct Choice {
    current: u32,
    recommended: u32,
    window_max: u32,
    window: Millis,
}

/// The count to run and, when it is not the recommendation, why.
fn choose(view: &View, service: &str, rollout: &Rollout, choice: &Choice) -> (u32, Option<String>) {
    let Choice {
        current,
        recommended,
        window_max,
        window,
    } = *choice;
    if rollout.phase == RolloutPhase::Progressing && recommended != current {
        let why = format!(
            "holding at {current}: a rollout of version {} is in progress",
            rollout.target
        );
        return (current, Some(why));
    }
    if view.is_asleep(service) && recommended != current {
        return (
            current,
            Some(format!("holding at {current}: asleep (scale_to_zero)")),
        );
    }
    if recommended > current {
        let step = current.saturating_mul(2).max(current.saturating_add(4));
        let target = recommended.min(step);
        let holding = (target < recommended)
            .then(|| format!("stepping up: at most {step} this step, {recommended} recommended"));
        return (target, holding);
    }
    if window_max < current {
        return (window_max, None);
    }
    let holding = (recommended < current).then(|| {
        format!(
            "scale-down to {recommended} waits: {window_max} was recommended within the last {}s",
            window / 1000
        )
    });
    (current, holding)
}

/// What each metric with a target says of `service`'s ready instances.
pub fn signals(
    view: &View,
    service: &str,
    horizontal: &HorizontalScale,
    current: u32,
    now: Millis,
) -> Vec<Signal> {
    let cpu: Resource = (Metric::Cpu, |usage| usage.cpu_millis, |i| i.cpu.0);
    let memory: Resource = (Metric::Memory, |usage| usage.memory_bytes, |i| i.memory.0);
    let targets = [(cpu, horizontal.cpu), (memory, horizontal.memory)];
    let mut signals: Vec<Signal> = targets
        .into_iter()
        .filter_map(|(resource, target)| Some((resource, u64::from(target?.0))))
        .map(|(resource, target)| signal(view, service, resource, target, current, now))
        .collect();
    if let Some(per_instance) = horizontal.requests_per_second {
        signals.push(request_signal(view, service, per_instance, current, now));
    }
    signals
}

/// Requests per second: what every gate node's fresh usage report says
/// it forwarded to `service` over its period, summed, against
/// `per_instance` for each of the `current` instances (in thousandths of
/// a request per second, so low rates keep their precision).
fn request_signal(
    view: &View,
    service: &str,
    per_instance: u32,
    current: u32,
    now: Millis,
) -> Signal {
    let mut used = 0u64;
    for (_, report) in view.usage.iter() {
        if is_stale(report, now) {
            continue;
        }
        let Some(requests) = report.requests.get(service) else {
            continue;
        };
        used += requests.saturating_mul(1_000_000) / report.period_ms.max(1);
    }
    let request = u64::from(per_instance) * 1000;
    let capacity = request.saturating_mul(u64::from(current));
    Signal {
        metric: Metric::RequestsPerSecond,
        reporting: current,
        used,
        request,
        utilization: used.saturating_mul(100).checked_div(capacity).unwrap_or(0),
        target: 100,
        recommended: recommend(current, current, used, request, 100),
    }
}

/// A usage report older than [`STALE_PERIODS`] of its periods.
fn is_stale(report: &cca_model::usage::NodeUsage, now: Millis) -> bool {
    now.saturating_sub(report.at)
        > i64::try_from(report.period_ms.saturating_mul(STALE_PERIODS)).unwrap_or(i64::MAX)
}

/// A resource metric: what an instance used of it, and what it requests.
type Resource = (Metric, fn(&UsageSummary) -> u64, fn(&Instance) -> u64);

fn signal(
    view: &View,
    service: &str,
    (metric, use_of, request_of): Resource,
    target: u64,
    current: u32,
    now: Millis,
) -> Signal {
    let (mut reporting, mut used, mut requested) = (0u32, 0u64, 0u64);
    for (instance, usage) in fresh_usage(view, service, now) {
        reporting += 1;
        used += use_of(usage);
        requested += request_of(instance);
    }
    let request = requested.checked_div(u64::from(reporting)).unwrap_or(0);
    let utilization = (used.saturating_mul(100))
        .checked_div(requested)
        .unwrap_or(0);
    Signal {
        metric,
        reporting,
        used,
        request,
        utilization,
        target,
        recommended: recommend(current, reporting, used, request, target),
    }
}

/// The ready instances of `service` whose node's last usage report is
/// fresh (at most [`STALE_PERIODS`] periods old) and names them, each with
/// what it used.
pub(super) fn fresh_usage<'v>(
    view: &'v View,
    service: &str,
    now: Millis,
) -> impl Iterator<Item = (&'v Instance, &'v UsageSummary)> {
    view.instances_of(service)
        .filter(|instance| !instance.stopping && view.is_ready(instance))
        .filter_map(move |instance| {
            let report = view.usage.get(&instance.node)?;
            let stale = is_stale(report, now);
            let usage = report.instances.get(&instance.id).filter(|_| !stale)?;
            Some((&**instance, usage))
        })
}

/// Thousandths of a request per second, in words: `2.5`, `40`.
pub fn per_second(thousandths: u64) -> String {
    let whole = thousandths / 1000;
    match (thousandths % 1000) / 100 {
        0 => whole.to_string(),
        tenths => format!("{whole}.{tenths}"),
    }
}

/// In words: the signal that decided, or the window, or the bounds.
fn reason(
    signals: &[Signal],
    before: u32,
    target: u32,
    choice: &Choice,
    (min, max): (u32, u32),
) -> String {
    let strongest = signals
        .iter()
        .max_by_key(|signal| signal.recommended)
        .map(|signal| match signal.metric {
            Metric::RequestsPerSecond => format!(
                "requests_per_second at {}/s through the gates against {}/s per instance across {} \
                 instances recommends {}",
                per_second(signal.used),
                per_second(signal.request),
                signal.reporting,
                signal.recommended
            ),
            _ => format!(
                "{} at {}% of requests against a {}% target across {} instances recommends {}",
                signal.metric.as_str(),
                signal.utilization,
                signal.target,
                signal.reporting,
                signal.recommended
            ),
        })
        .unwrap_or_else(|| "no usage reported".to_owned());
    if !(min..=max).contains(&before) && (target == min || target == max) {
        return format!("brought within min {min} .. max {max}");
    }
    if target > before {
        return strongest;
    }
    let window = choice.window / 1000;
    if choice.window_max > choice.recommended {
        return format!(
            "{strongest}; the highest recommendation of the last {window}s is {}",
            choice.window_max
        );
    }
    format!("{strongest}, and nothing higher within the last {window}s")
}
