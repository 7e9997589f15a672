//! `cca scale SERVICE N` sets a service's replicas in its spec; `cca scale
//! why SERVICE` prints what sets its count: the spec, or the autoscaler
//! with the signals, the scale-down window, the bounds and why it holds
//! (`GET /v1/services/{name}/scale`).

use anyhow::{Result, bail};
use cca_model::spec::Memory;
use cca_wire::types::ScaleStatus;
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
             it is not autoscaled.",
            status.replicas
        ));
        lines.extend(sleeping(status, now));
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
}
