//! `cca node-inspect NODE`: the node's agent's own view, through the API
//! server. One table lines up each instance as the agent's cache, its
//! runtime and its last report have it; the drift lists say where they
//! differ from each other and from the store, and what comes of it.

use std::collections::BTreeSet;

use anyhow::Result;
use cca_wire::types::{Drift, NodeInspection};
use clap::Args;

use super::commands::client;
use super::output::{self, age, field, now_millis, or_dash};
use super::{OutputArgs, ServerAddr};

/// `cca node-inspect NODE [-o json]`
#[derive(Debug, Args)]
pub(crate) struct NodeInspectArgs {
    #[command(flatten)]
    pub(crate) addr: ServerAddr,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
    pub(crate) node: String,
}

pub(super) async fn run(args: &NodeInspectArgs) -> Result<()> {
    let inspection = client(&args.addr)?.inspect_node(&args.node).await?;
    if !output::structured(args.out.output, &inspection)? {
        print(&inspection);
    }
    Ok(())
}

fn print(inspection: &NodeInspection) {
    let agent = &inspection.agent;
    let now = now_millis();
    let link = if agent.connected {
        "connected"
    } else {
        "NOT connected: its registration or heartbeats do not get through"
    };
    field("Node", &format!("{} ({link})", agent.node));
    let snapshot = if agent.cache.known {
        "a full snapshot held"
    } else {
        "no snapshot yet: orphans are kept"
    };
    field(
        "Cache",
        &format!(
            "revision {} of store {} (epoch {}), {snapshot}",
            agent.cache.revision,
            or_dash(Some(agent.cache.origin.store.clone()).filter(|s| !s.is_empty())),
            or_dash(Some(agent.cache.origin.epoch.clone()).filter(|s| !s.is_empty())),
        ),
    );
    field("Store", &format!("revision {}", inspection.store_revision));
    field("Reports", &reports_line(inspection, now));
    output::line("");
    output::table(
        &[
            "instance", "service", "cached", "runtime", "pid", "reported",
        ],
        instance_rows(inspection),
    );
    if !agent.unclaimed.is_empty() {
        output::line("");
        output::line("Unclaimed (awaiting adoption):");
        for run in &agent.unclaimed {
            output::line(&format!(
                "  {} ({}), since {} ago",
                run.id,
                run.service,
                age(Some(run.since), now)
            ));
        }
    }
    output::line("");
    print_drift(
        "Drift between the agent's cache and its runtime",
        &agent.drift,
    );
    print_drift(
        "Drift between the store and the agent's cache",
        &inspection.store_drift,
    );
}

fn reports_line(inspection: &NodeInspection, now: i64) -> String {
    let reports = &inspection.agent.reports;
    let sent = match reports.last_sent_at {
        Some(at) => format!("last sent {} ago", age(Some(at), now)),
        None => "none sent yet".to_owned(),
    };
    let failed = match (&reports.last_error, reports.last_error_at) {
        (Some(error), Some(at)) => format!("; failing since {} ago: {error}", age(Some(at), now)),
        _ => String::new(),
    };
    format!("{sent}, {} statuses sent{failed}", reports.statuses_sent)
}

/// One row per instance any of the three views names.
fn instance_rows(inspection: &NodeInspection) -> Vec<Vec<String>> {
    let agent = &inspection.agent;
    let ids: BTreeSet<&str> = agent
        .desired
        .iter()
        .map(|d| d.id.as_str())
        .chain(agent.runtime.iter().map(|r| r.id.as_str()))
        .chain(agent.reports.last_tick.iter().map(|s| s.id.as_str()))
        .collect();
    ids.into_iter()
        .map(|id| {
            let cached = agent.desired.iter().find(|d| d.id == id);
            let running = agent.runtime.iter().find(|r| r.id == id);
            let reported = agent.reports.last_tick.iter().find(|s| s.id == id);
            let service = cached
                .map(|d| d.service.clone())
                .or_else(|| reported.map(|s| s.service.clone()));
            vec![
                id.to_owned(),
                or_dash(service),
                if cached.is_some() { "yes" } else { "no" }.to_owned(),
                or_dash(running.map(|r| r.state.clone())),
                or_dash(running.and_then(|r| r.pid).map(|pid| pid.to_string())),
                or_dash(reported.and_then(|s| {
                    serde_json::to_value(s.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                })),
            ]
        })
        .collect()
}

fn print_drift(title: &str, drift: &[Drift]) {
    if drift.is_empty() {
        output::line(&format!("{title}: none"));
        return;
    }
    output::line(&format!("{title}:"));
    for entry in drift {
        output::line(&format!("  {}: {}", entry.id, entry.problem));
    }
}

#[cfg(test)]
mod tests {
    use cca_wire::types::{AgentInspection, CacheInspection, DesiredInstance, RuntimeInstance};

    use super::*;

    #[test]
    fn every_instance_any_view_names_gets_one_row() {
        let inspection = NodeInspection {
            agent: AgentInspection {
                node: "n1".into(),
                at: 0,
                connected: true,
                cache: CacheInspection::default(),
                desired: vec![DesiredInstance {
                    id: "web-1".into(),
                    service: "web".into(),
                    spec_hash: "h".into(),
                    host_ports: Default::default(),
                }],
                runtime: vec![
                    RuntimeInstance {
                        id: "web-1".into(),
                        state: "running".into(),
                        pid: Some(42),
                        started_at: None,
                        exit: None,
                        adopted: false,
                    },
                    RuntimeInstance {
                        id: "stray".into(),
                        state: "exited".into(),
                        pid: None,
                        started_at: None,
                        exit: None,
                        adopted: true,
                    },
                ],
                unclaimed: Vec::new(),
                drift: Vec::new(),
                reports: Default::default(),
            },
            store_revision: 3,
            store_drift: Vec::new(),
        };
        assert_eq!(
            instance_rows(&inspection),
            [
                ["stray", "-", "no", "exited", "-", "-"],
                ["web-1", "web", "yes", "running", "42", "-"],
            ]
        );
    }
}
