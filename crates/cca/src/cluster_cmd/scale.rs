//! `cca scale SERVICE N` sets a service's replicas in its spec; `cca scale
//! why SERVICE` prints what sets its count: the spec, or the autoscaler
//! with the signals, the scale-down window, the bounds and why it holds
//! (`GET /v1/services/{name}/scale`).

use anyhow::{Result, bail};
use cca_control::controllers::lifecycle::horizontal::per_second;
use cca_control::controllers::lifecycle::vertical::resources_text;
use cca_model::spec::{Memory, VerticalMode};
use cca_wire::types::{ScaleStatus, VerticalStatus};
use clap::{Args, Subcommand};

use super::commands::client;
use super::output::{self, age, now_millis};
use super::{OutputArgs, ScaleArgs, ServerAddr};

#[derive(Debug, Subcommand)]
pub(crate) enum ScaleCommand {
    /// Print what sets a service's replica count: its spec, or the
    /// autoscaler's signals, window and bounds.
    Why(WhyArgs),
}

/// `cca scale why SERVICE`
#[derive(Debug, Args)]
pub(crate) struct WhyArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
    service: String,
}

pub(crate) async fn run(args: ScaleArgs) -> Result<()> {
    if let Some(ScaleCommand::Why(why)) = args.why {
        let status = client(&why.addr)?.scale_status(&why.service).await?;
        if !output::structured(why.out.output, &status)? {
            for line in explain(&status, now_millis()) {
                output::line(&line);
            }
        }
        return Ok(());
    }
    let (Some(service), Some(replicas)) = (args.service, args.replicas) else {
        bail!("usage: cca scale SERVICE N, or cca scale why SERVICE");
    };
    let report = client(&args.addr)?.scale(&service, replicas).await?;
    output::line(&format!(
        "service/{} scaled from {} to {} replicas",
        report.service, report.previous, report.replicas
    ));
    Ok(())
}

/// `scale why`, line by line.
fn explain(status: &ScaleStatus, now: i64) -> Vec<String> {
    let service = &status.service;
    let mut lines = Vec::new();
    let Some(bounds) = &status.autoscale else {
        lines.push(format!(
            "service/{service}: {} replicas, from its spec (set by `cca apply` or `cca scale`); \
             it is not autoscaled horizontally.",
            status.replicas
        ));
        lines.extend(sleeping(status, now));
        lines.extend(status.vertical.iter().flat_map(|v| vertical_lines(v, now)));
        return lines;
    };
    lines.push(format!(
        "service/{service}: {} replicas, set by the autoscaler within min {} .. max {} (the \
         spec's {} was the start); `cca scale` is refused while `autoscale` is on.",
        status.replicas, bounds.min, bounds.max, status.spec_replicas
    ));
    lines.push("Signals now (each ready instance's last usage report):".into());
    for signal in &status.signals {
        let (used, request) = match signal.metric {
            cca_model::autoscale::Metric::Cpu => {
                (format!("{}m", signal.used), format!("{}m", signal.request))
            }
            cca_model::autoscale::Metric::Memory => {
                (Memory(signal.used).human(), Memory(signal.request).human())
            }
            cca_model::autoscale::Metric::RequestsPerSecond => {
                lines.push(format!(
                    "  requests_per_second: {}/s through the gates against {}/s per instance \
                     ({} instances) → {} replicas",
                    per_second(signal.used),
                    per_second(signal.request),
                    signal.reporting,
                    signal.recommended
                ));
                continue;
            }
        };
        lines.push(format!(
            "  {}: {}% of requests against a {}% target ({used} used by {} instances reporting, \
             {request} requested each) → {} replicas",
            signal.metric.as_str(),
            signal.utilization,
            signal.target,
            signal.reporting,
            signal.recommended
        ));
    }
    if let Some(decided) = &status.autoscaled {
        lines.push(format!(
            "Recommendation: {} (the highest metric's, within the bounds); up follows it at once, \
             at most doubling (or +4) per step; down goes to the highest of the last {}s.",
            decided.recommended,
            decided.window_ms / 1000
        ));
        for old in &decided.superseded {
            lines.push(format!(
                "  {} was recommended until {} ago",
                old.replicas,
                age(Some(old.until), now)
            ));
        }
        if let Some(holding) = &decided.holding {
            lines.push(format!("Holding: {holding}."));
        }
        if let Some(change) = &decided.last_change {
            lines.push(format!(
                "Last change: {} → {}, {} ago: {}.",
                change.from,
                change.to,
                age(Some(change.at), now),
                change.why
            ));
        }
    } else {
        lines.push("No decision yet: the lifecycle controller has not seen it.".into());
    }
    lines.extend(sleeping(status, now));
    lines.extend(status.vertical.iter().flat_map(|v| vertical_lines(v, now)));
    lines
}

/// Vertical autoscaling: the recommendation in one line, as `describe`
/// shows it, or what it still waits for.
pub(crate) fn vertical_summary(vertical: &VerticalStatus) -> String {
    let have = format!("the spec gives {}", resources_text(&vertical.resources));
    let Some(sizes) = vertical.recommended else {
        return format!(
            "no recommendation yet: {} of {} samples ({have})",
            vertical.samples, vertical.min_samples
        );
    };
    let applied = match (vertical.bounds.mode, &vertical.applied) {
        (VerticalMode::Recommend, _) => "mode recommend: nothing is resized".to_owned(),
        (VerticalMode::Auto, Some(applied)) => {
            format!("mode auto: sized to {}", resources_text(applied))
        }
        (VerticalMode::Auto, None) => "mode auto: nothing applied yet".to_owned(),
    };
    format!(
        "recommends {}m CPU, {} memory per instance ({have}; {applied})",
        sizes.cpu,
        Memory(sizes.memory).human()
    )
}

/// `scale why`'s lines on vertical autoscaling.
fn vertical_lines(vertical: &VerticalStatus, now: i64) -> Vec<String> {
    let mut lines = vec![format!("Vertical: {}.", vertical_summary(vertical))];
    if let Some(holding) = &vertical.holding {
        lines.push(format!("  Holding: {holding}."));
    }
    if vertical.sampled_at > 0 {
        lines.push(format!(
            "  Window: the last {}s, {} samples (each ready instance's last usage report, once \
             every {}s; the last {} ago).",
            vertical.window_ms / 1000,
            vertical.samples,
            vertical.window_ms / 60_000,
            age(Some(vertical.sampled_at), now)
        ));
    }
    if let Some(observed) = vertical.observed {
        lines.push(format!(
            "  95th percentiles: {}m CPU (mean per report), {} memory (peak per report); \
             recommended with {}% and {}% on top, within the block's bounds.",
            observed.cpu,
            Memory(observed.memory).human(),
            cca_model::vertical::CPU_MARGIN_PERCENT,
            cca_model::vertical::MEMORY_MARGIN_PERCENT
        ));
    }
    lines
}

fn sleeping(status: &ScaleStatus, now: i64) -> Option<String> {
    let state = status.scale_to_zero.as_ref()?;
    let since = age(Some(state.since), now);
    Some(if state.asleep {
        format!(
            "Scale to zero: asleep for {since} ({}): it runs none until a request wakes it.",
            state.cause
        )
    } else {
        format!("Scale to zero: awake for {since} ({}).", state.cause)
    })
}

#[cfg(test)]
mod tests {
    use cca_model::autoscale::{Autoscaled, Metric, Recommendation, ScaleChange, Signal};
    use cca_model::spec::{HorizontalScale, Percent};
    use cca_model::vertical::Sizes;
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        scale: ScaleArgs,
    }

    #[test]
    fn scale_takes_a_count_or_why() {
        let set = Cli::try_parse_from(["scale", "web", "3"]).expect("parses");
        assert_eq!(set.scale.service.as_deref(), Some("web"));
        assert_eq!(set.scale.replicas, Some(3));
        let why = Cli::try_parse_from(["scale", "why", "web"]).expect("parses");
        assert!(matches!(why.scale.why, Some(ScaleCommand::Why(ref w)) if w.service == "web"));
        assert!(
            Cli::try_parse_from(["scale", "web"]).is_err(),
            "a count is needed"
        );
    }

    #[test]
    fn why_names_the_owner_the_signals_the_window_and_the_last_change() {
        let signal = Signal {
            metric: Metric::Cpu,
            reporting: 2,
            used: 280,
            request: 100,
            utilization: 140,
            target: 70,
            recommended: 4,
        };
        let status = ScaleStatus {
            service: "web".into(),
            replicas: 4,
            spec_replicas: 2,
            autoscale: Some(HorizontalScale {
                min: 2,
                max: 10,
                cpu: Some(Percent(70)),
                memory: None,
                requests_per_second: None,
            }),
            signals: vec![signal.clone()],
            autoscaled: Some(Autoscaled {
                replicas: 4,
                recommended: 4,
                window_ms: 300_000,
                superseded: vec![Recommendation {
                    replicas: 6,
                    until: 40_000,
                }],
                last_change: Some(ScaleChange {
                    from: 2,
                    to: 4,
                    at: 30_000,
                    signals: vec![signal],
                    why: "cpu at 140%".into(),
                }),
                holding: None,
            }),
            scale_to_zero: None,
            vertical: None,
        };
        let text = explain(&status, 60_000).join("\n");
        assert!(
            text.contains("set by the autoscaler within min 2 .. max 10"),
            "{text}"
        );
        assert!(
            text.contains("cpu: 140% of requests against a 70% target (280m used by 2"),
            "{text}"
        );
        assert!(text.contains("6 was recommended until 20s ago"), "{text}");
        assert!(
            text.contains("Last change: 2 → 4, 30s ago: cpu at 140%."),
            "{text}"
        );
        let plain = ScaleStatus {
            autoscale: None,
            signals: vec![],
            autoscaled: None,
            ..status
        };
        assert!(explain(&plain, 0)[0].contains("from its spec"));
    }

    #[test]
    fn why_shows_the_vertical_window_and_recommendation() {
        let mut vertical = VerticalStatus {
            bounds: cca_model::spec::VerticalScale::default(),
            resources: cca_model::spec::Resources {
                cpu: Some(cca_model::spec::Cpu(500)),
                memory: None,
            },
            window_ms: 3_600_000,
            samples: 4,
            sampled_at: 50_000,
            observed: None,
            recommended: None,
            min_samples: 12,
            applied: None,
            holding: None,
        };
        assert_eq!(
            vertical_summary(&vertical),
            "no recommendation yet: 4 of 12 samples (the spec gives 500m CPU, unlimited memory)"
        );
        vertical.samples = 40;
        vertical.observed = Some(Sizes {
            cpu: 200,
            memory: 80 << 20,
        });
        vertical.recommended = Some(Sizes {
            cpu: 230,
            memory: 96 << 20,
        });
        let text = vertical_lines(&vertical, 60_000).join("\n");
        assert!(
            text.starts_with("Vertical: recommends 230m CPU, 96Mi memory per instance"),
            "{text}"
        );
        assert!(
            text.contains("mode recommend: nothing is resized"),
            "{text}"
        );
        assert!(
            text.contains(
                "the last 3600s, 40 samples (each ready instance's last usage report, \
                           once every 60s; the last 10s ago)"
            ),
            "{text}"
        );
        assert!(text.contains("95th percentiles: 200m CPU"), "{text}");
        vertical.bounds.mode = VerticalMode::Auto;
        vertical.applied = Some(cca_model::spec::Resources {
            cpu: Some(cca_model::spec::Cpu(230)),
            memory: Some(Memory(96 << 20)),
        });
        vertical.holding = Some("a rollout of version ab12 is in progress".into());
        let text = vertical_lines(&vertical, 60_000).join("\n");
        assert!(
            text.contains("mode auto: sized to 230m CPU, 96Mi memory"),
            "{text}"
        );
        assert!(
            text.contains("Holding: a rollout of version ab12"),
            "{text}"
        );
    }
}
