//! `cca rollout status|history|why|undo|pause|resume SERVICE`: a service's
//! rollout as the lifecycle controller decided it (`GET
//! /v1/services/{name}/rollout`) and an operator's word on it.
//!
//! `status` follows the rollout until it completes (exit 0), fails or is
//! rolled back (exit 1, saying why), or `--timeout` passes: a progress bar
//! on a terminal, a line per change otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cca_model::rollout::{FailedInstance, Rollout, RolloutCause, RolloutPhase};
use cca_wire::Client;
use cca_wire::types::RolloutStatus;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use super::commands::client;
use super::output::{self, age, now_millis};
use super::{OutputArgs, ServerAddr};

/// How often `status` asks.
const POLL: Duration = Duration::from_secs(1);

/// `cca rollout …`
#[derive(Debug, Args)]
pub(crate) struct RolloutArgs {
    #[command(subcommand)]
    pub(crate) command: RolloutCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RolloutCommand {
    /// Follow a service's rollout until it completes, fails or is rolled back.
    Status(StatusArgs),
    /// List a service's rollouts, newest first: versions, causes, outcomes.
    History(ServiceArgs),
    /// Print the signals and limits behind the rollout's automatic decisions.
    Why(ServiceArgs),
    /// Roll a service back to its previous version, or to --to VERSION.
    Undo(UndoArgs),
    /// Hold a service's rollout where it is (new applies wait too).
    Pause(ServiceArgs),
    /// Let a paused rollout go on.
    Resume(ServiceArgs),
}

/// `cca rollout history|why|pause|resume SERVICE`
#[derive(Debug, Args)]
pub(crate) struct ServiceArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
    service: String,
}

/// `cca rollout status SERVICE [--no-wait] [--timeout 10m]`
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
    service: String,
    /// Print where it stands once, without following it.
    #[arg(long)]
    no_wait: bool,
    /// Give up following after this long (exit 1).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    timeout: Duration,
}

/// `cca rollout undo SERVICE [--to VERSION]`
#[derive(Debug, Args)]
pub(crate) struct UndoArgs {
    #[command(flatten)]
    addr: ServerAddr,
    service: String,
    /// A kept version (its hash, or a unique prefix of one; `cca rollout
    /// history` lists them) [default: the rollout's previous version].
    #[arg(long, value_name = "VERSION")]
    to: Option<String>,
}

pub(crate) async fn run(args: RolloutArgs) -> Result<()> {
    match args.command {
        RolloutCommand::Status(args) => status(&args).await,
        RolloutCommand::History(args) => {
            let status = client(&args.addr)?.rollout(&args.service).await?;
            let rows = history_rows(&status);
            if !output::structured(args.out.output, &rows)? {
                history_table(&rows);
            }
            Ok(())
        }
        RolloutCommand::Why(args) => {
            let status = client(&args.addr)?.rollout(&args.service).await?;
            if !output::structured(args.out.output, &status)? {
                for line in why(&status, now_millis()) {
                    output::line(&line);
                }
            }
            Ok(())
        }
        RolloutCommand::Undo(args) => {
            let report = client(&args.addr)?
                .undo_rollout(&args.service, args.to.as_deref())
                .await?;
            let to = report.control.undo.as_ref().map_or("?", |undo| &undo.to);
            output::line(&if report.changed {
                format!("service/{}: rolling back to version {to}", report.service)
            } else {
                format!(
                    "service/{}: already at or rolling to version {}",
                    report.service,
                    args.to.as_deref().unwrap_or(to)
                )
            });
            Ok(())
        }
        RolloutCommand::Pause(args) => pause(&args, true).await,
        RolloutCommand::Resume(args) => pause(&args, false).await,
    }
}

async fn pause(args: &ServiceArgs, paused: bool) -> Result<()> {
    let report = client(&args.addr)?
        .pause_rollout(&args.service, paused)
        .await?;
    let word = if paused { "paused" } else { "resumed" };
    let already = if report.changed { "" } else { " (already)" };
    output::line(&format!(
        "service/{}: rollout {word}{already}",
        report.service
    ));
    Ok(())
}

/// Where a followed rollout stands.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Not there yet: what to show.
    Going(String),
    Complete(String),
    /// Failed or rolled back: why.
    Failed(String),
}

async fn status(args: &StatusArgs) -> Result<()> {
    let client = client(&args.addr)?;
    if args.no_wait || args.out.output != output::Format::Table {
        let status = client.rollout(&args.service).await?;
        if !output::structured(args.out.output, &status)? {
            output::line(&describe(&outcome(&status)));
        }
        return Ok(());
    }
    follow(&client, args).await
}

async fn follow(client: &Client, args: &StatusArgs) -> Result<()> {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    let style = ProgressStyle::with_template("{spinner} [{elapsed}] {bar:30} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    let deadline = Instant::now() + args.timeout;
    let mut last = String::new();
    loop {
        let status = client.rollout(&args.service).await?;
        bar.set_length(u64::from(status.progress.wanted));
        bar.set_position(u64::from(status.progress.ready));
        let outcome = outcome(&status);
        let text = describe(&outcome);
        if bar.is_hidden() && text != last {
            output::line(&text);
        }
        bar.set_message(text.clone());
        last = text;
        match outcome {
            Outcome::Going(_) => {}
            Outcome::Complete(text) => {
                bar.finish_and_clear();
                if !bar.is_hidden() {
                    output::line(&text);
                }
                return Ok(());
            }
            Outcome::Failed(text) => {
                bar.finish_and_clear();
                bail!("{text}");
            }
        }
        if Instant::now() >= deadline {
            bar.finish_and_clear();
            bail!(
                "service/{}: the rollout did not finish within {}: {last}",
                args.service,
                humantime::format_duration(args.timeout)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One line for `describe service`: where the rollout stands.
pub(super) fn summary(status: &RolloutStatus) -> String {
    let text = describe(&outcome(status));
    let prefix = format!("service/{}: ", status.service);
    text.strip_prefix(&prefix).unwrap_or(&text).to_owned()
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Going(text) | Outcome::Complete(text) | Outcome::Failed(text) => text.clone(),
    }
}

/// What `status` says of `status`.
fn outcome(status: &RolloutStatus) -> Outcome {
    let service = &status.service;
    let progress = status.progress;
    let counts = format!(
        "{} of {} updated, {} ready, {} old",
        progress.updated, progress.wanted, progress.ready, progress.old
    );
    let Some(rollout) = status
        .rollout
        .as_ref()
        .filter(|rollout| rollout.requested == status.spec_version)
    else {
        return Outcome::Going(format!(
            "service/{service}: rolling out version {} ({counts})",
            status.spec_version
        ));
    };
    if let RolloutCause::Rollback { from, failed, .. } = &rollout.cause {
        return Outcome::Failed(format!(
            "service/{service}: version {from} was rolled back to {}: {failed} new instances \
             failed (`cca rollout why {service}`)",
            rollout.target
        ));
    }
    match rollout.phase {
        RolloutPhase::Failed => Outcome::Failed(format!(
            "service/{service}: the rollout of version {} failed: {} new instances failed and \
             there is nothing to roll back to (`cca rollout why {service}`)",
            rollout.target,
            rollout.failures.len()
        )),
        RolloutPhase::Complete => Outcome::Complete(format!(
            "service/{service}: rollout of version {} complete ({counts})",
            rollout.target
        )),
        _ if status.paused => Outcome::Going(format!(
            "service/{service}: paused at {counts} (`cca rollout resume {service}`)"
        )),
        _ => Outcome::Going(format!(
            "service/{service}: rolling out version {} ({counts})",
            rollout.target
        )),
    }
}

/// One row of `rollout history`.
#[derive(Debug, serde::Serialize)]
struct HistoryRow {
    target: String,
    previous: Option<String>,
    cause: RolloutCause,
    phase: RolloutPhase,
    started_at: i64,
    ended_at: Option<i64>,
    failed: u32,
}

/// The current rollout, then the earlier ones, newest first.
fn history_rows(status: &RolloutStatus) -> Vec<HistoryRow> {
    let Some(rollout) = &status.rollout else {
        return Vec::new();
    };
    let current = HistoryRow {
        target: rollout.target.clone(),
        previous: rollout.previous.clone(),
        cause: rollout.cause.clone(),
        phase: rollout.phase,
        started_at: rollout.started_at,
        ended_at: rollout.ended_at,
        failed: u32::try_from(rollout.failures.len()).unwrap_or(u32::MAX),
    };
    let earlier = rollout.history.iter().map(|record| HistoryRow {
        target: record.target.clone(),
        previous: record.previous.clone(),
        cause: record.cause.clone(),
        phase: record.phase,
        started_at: record.started_at,
        ended_at: Some(record.ended_at),
        failed: record.failed,
    });
    std::iter::once(current).chain(earlier).collect()
}

fn history_table(rows: &[HistoryRow]) {
    let now = now_millis();
    let rows = rows
        .iter()
        .map(|row| {
            vec![
                row.target.clone(),
                row.previous.clone().unwrap_or_else(|| "-".into()),
                cause_name(&row.cause),
                row.phase.as_str().into(),
                row.failed.to_string(),
                age(Some(row.started_at), now),
                row.ended_at
                    .map_or_else(|| "-".into(), |at| age(Some(at), now)),
            ]
        })
        .collect();
    output::table(
        &[
            "version", "from", "cause", "outcome", "failed", "started", "ended",
        ],
        rows,
    );
}

fn cause_name(cause: &RolloutCause) -> String {
    match cause {
        RolloutCause::Apply => "apply".into(),
        RolloutCause::Undo => "undo".into(),
        RolloutCause::Rollback { from, .. } => format!("rollback from {from}"),
    }
}

/// `rollout why`: the decision, the signals it counted, the limits.
fn why(status: &RolloutStatus, now: i64) -> Vec<String> {
    let service = &status.service;
    let mut lines = vec![format!(
        "service/{service}: spec at version {}, placing version {}{}",
        status.spec_version,
        status.placing,
        if status.paused { " (paused)" } else { "" }
    )];
    let Some(rollout) = &status.rollout else {
        lines.push("No rollout decided yet: the lifecycle controller has not seen it.".into());
        return lines;
    };
    lines.push(decision(rollout, now));
    if let RolloutCause::Rollback { from, .. } = &rollout.cause
        && let Some(bad) = rollout
            .history
            .first()
            .filter(|record| record.target == *from)
    {
        lines.push(format!(
            "  The rollout of {from} had started {} ago ({}).",
            age(Some(bad.started_at), now),
            cause_name(&bad.cause)
        ));
    }
    let p = status.progress;
    lines.push(format!(
        "Progress: {} of {} instances run version {}, {} ready; {} of other versions, {} \
         stopping.",
        p.updated, p.wanted, status.placing, p.ready, p.old, p.stopping
    ));
    lines.push(format!(
        "Limits: max_surge {}, max_unavailable {} (within the disruption budget), \
         rollback_after {} ({}).",
        status.max_surge,
        status.max_unavailable,
        status.rollback_after,
        if status.rollback_after == 0 {
            "never rolls back".to_owned()
        } else {
            format!(
                "a new instance counts as failed once its agent gives up on it or it restarted \
                 {} times",
                cca_model::rollout::CRASH_LOOP_RESTARTS
            )
        }
    ));
    if let RolloutCause::Rollback { from, .. } = &rollout.cause
        && !rollout.decided_by.is_empty()
    {
        lines.push(format!(
            "Failed new instances of {from}, which decided the rollback:"
        ));
        lines.extend(failure_lines(&rollout.decided_by, now));
    }
    if !rollout.failures.is_empty() {
        lines.push(format!(
            "Failed new instances of {} ({}):",
            rollout.target,
            rollout.failures.len()
        ));
        lines.extend(failure_lines(&rollout.failures, now));
    }
    if !status.waiting.is_empty() {
        lines.push("Waiting for:".into());
        lines.extend(status.waiting.iter().map(|line| format!("  {line}")));
    }
    lines
}

fn failure_lines(failures: &[FailedInstance], now: i64) -> impl Iterator<Item = String> + '_ {
    failures.iter().map(move |failure| {
        format!(
            "  {} on {}, {} ago: {}",
            failure.id,
            failure.node,
            age(Some(failure.at), now),
            failure.why
        )
    })
}

/// The rollout's own line: what it is, why it began, how it ended.
fn decision(rollout: &Rollout, now: i64) -> String {
    let from = rollout
        .previous
        .as_deref()
        .map(|previous| format!(" from {previous}"))
        .unwrap_or_default();
    let began = match &rollout.cause {
        RolloutCause::Apply => "an apply made it the spec".to_owned(),
        RolloutCause::Undo => "`cca rollout undo` asked for it".to_owned(),
        RolloutCause::Rollback {
            from: bad,
            failed,
            rollback_after,
        } => format!(
            "automatic rollback: {failed} new instances of {bad} failed, rollback_after = \
             {rollback_after}"
        ),
    };
    let ended = rollout
        .ended_at
        .map(|at| format!(", {} {} ago", rollout.phase.as_str(), age(Some(at), now)))
        .unwrap_or_else(|| format!(", {}", rollout.phase.as_str()));
    format!(
        "Rollout: to version {}{from}, started {} ago ({began}){ended}.",
        rollout.target,
        age(Some(rollout.started_at), now)
    )
}

#[cfg(test)]
mod tests {
    use cca_wire::types::RolloutProgress;

    use super::*;

    fn status(rollout: Option<Rollout>) -> RolloutStatus {
        RolloutStatus {
            service: "web".into(),
            spec_version: "bbbb".into(),
            placing: "bbbb".into(),
            rollout,
            paused: false,
            progress: RolloutProgress {
                wanted: 3,
                updated: 2,
                ready: 1,
                old: 1,
                stopping: 0,
            },
            max_surge: 1,
            max_unavailable: 1,
            rollback_after: 3,
            waiting: vec!["web-9 on n1: starting".into()],
        }
    }

    #[test]
    fn status_follows_until_complete_and_fails_on_a_rollback() {
        let going = status(None);
        assert!(matches!(outcome(&going), Outcome::Going(_)));
        let mut rollout = Rollout::start("bbbb", "bbbb", RolloutCause::Apply, 0);
        rollout.phase = RolloutPhase::Complete;
        let done = status(Some(rollout.clone()));
        assert!(matches!(outcome(&done), Outcome::Complete(_)));
        let mut stale = rollout.clone();
        stale.requested = "aaaa".into();
        assert!(
            matches!(outcome(&status(Some(stale))), Outcome::Going(_)),
            "a rollout answering an older spec is not this one's end"
        );
        let back = Rollout::start(
            "aaaa",
            "bbbb",
            RolloutCause::Rollback {
                from: "bbbb".into(),
                failed: 3,
                rollback_after: 3,
            },
            5,
        );
        let Outcome::Failed(text) = outcome(&status(Some(back))) else {
            panic!("a rollback fails the status");
        };
        assert!(text.contains("bbbb was rolled back to aaaa"), "{text}");
    }

    #[test]
    fn why_names_the_decision_the_failures_and_the_limits() {
        let mut back = Rollout::start(
            "aaaa",
            "bbbb",
            RolloutCause::Rollback {
                from: "bbbb".into(),
                failed: 1,
                rollback_after: 1,
            },
            10_000,
        );
        back.decided_by.push(FailedInstance {
            id: "web-7".into(),
            node: "n1".into(),
            at: 9_000,
            why: "crash looping: restarted 2 times".into(),
        });
        let lines = why(&status(Some(back)), 20_000);
        let text = lines.join("\n");
        assert!(
            text.contains("automatic rollback: 1 new instances of bbbb failed"),
            "{text}"
        );
        assert!(
            text.contains("web-7 on n1, 11s ago: crash looping"),
            "{text}"
        );
        assert!(text.contains("rollback_after 3"), "{text}");
        assert!(text.contains("web-9 on n1: starting"), "{text}");
    }
}
