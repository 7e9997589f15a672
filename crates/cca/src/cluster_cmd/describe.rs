//! The long views: `describe service` (spec summary, instances, and the
//! unplaced demand that says why instances are pending), `describe
//! instance` (status, last exit, log tail), `describe node`, `describe
//! gate` (hosts, targets, and each gate node's view of their backends),
//! and `status`.

use std::collections::BTreeMap;

use anyhow::Result;
use cca_model::cluster::Disruption;
use cca_model::spec::{Cpu, Memory, PortSpec, Protocol, Workload};
use cca_wire::Client;
use cca_wire::types::{
    ClusterStatus, GateDetail, InstanceDetail, NodeDetail, NodeInstanceCounts, ReportedUsage,
    ServiceDetail,
};

use super::commands::{event_table, instance_table, node_state, top_instance_table};
use super::output::{self, Format, age, field, now_millis, or_dash};
use super::{DescribeArgs, DescribeKind};
use cca_model::net::BackendState;

pub(super) async fn describe(client: &Client, args: &DescribeArgs) -> Result<()> {
    let format = args.out.output;
    match args.kind {
        DescribeKind::Service => {
            let detail = client.service(&args.name).await?;
            if !output::structured(format, &detail)? {
                service(&detail);
            }
        }
        DescribeKind::Instance => {
            let detail = client.instance(&args.name).await?;
            if !output::structured(format, &detail)? {
                // The port numbers are the service's; without it (deleted
                // meanwhile) the ports still show by name.
                let ports = client
                    .service(&detail.summary.service)
                    .await
                    .map(|service| service.spec.ports)
                    .unwrap_or_default();
                instance(&detail, &ports);
            }
        }
        DescribeKind::Gate => {
            let detail = client.gate(&args.name).await?;
            if !output::structured(format, &detail)? {
                gate(&detail);
            }
        }
        DescribeKind::Node => {
            let detail = client.node(&args.name).await?;
            if !output::structured(format, &detail)? {
                node(&detail);
            }
        }
    }
    Ok(())
}

fn service(detail: &ServiceDetail) {
    let spec = &detail.spec;
    let summary = &detail.summary;
    field("Name", &summary.name);
    match &spec.workload {
        Workload::Image { image, command } => {
            field("Image", image);
            if let Some(command) = command {
                field("Command", command);
            }
        }
        Workload::Process { run } => field("Run", run),
    }
    let autoscaled = spec
        .autoscale
        .as_ref()
        .and_then(|autoscale| autoscale.horizontal.as_ref())
        .map(|h| {
            format!(
                " (autoscaled {}..{}: `cca scale why {}`)",
                h.min, h.max, summary.name
            )
        })
        .unwrap_or_default();
    field(
        "Replicas",
        &format!(
            "{} desired{autoscaled}, {} placed, {} running",
            summary.replicas, summary.instances, summary.running
        ),
    );
    if let Some(vertical) = &detail.vertical {
        field(
            "Vertical",
            &format!(
                "{} (`cca scale why {}`)",
                super::scale::vertical_summary(vertical),
                summary.name
            ),
        );
    }
    if let Some(state) = &summary.scale {
        let now = now_millis();
        let ago = age(Some(state.since), now);
        let line = if state.asleep {
            format!("asleep for {ago} ({})", state.cause)
        } else {
            format!("awake for {ago} ({})", state.cause)
        };
        field("Scale to zero", &line);
    }
    if let Some(rollout) = &detail.rollout {
        field("Rollout", &super::rollout::summary(rollout));
    }
    let ports: Vec<String> = spec
        .ports
        .iter()
        .map(|p| match &p.name {
            Some(name) => format!("{name}:{}", p.number),
            None => p.number.to_string(),
        })
        .collect();
    field("Ports", &or_dash(Some(ports.join(", "))));
    if summary.vip.is_some() {
        field("VIP", &output::vip(summary.vip.as_ref()));
        field("DNS", &or_dash(summary.dns.clone()));
    }
    let resources = format!(
        "cpu {}, memory {}",
        spec.resources.cpu.map_or("-".into(), output::cpu),
        spec.resources.memory.map_or("-".into(), Memory::human)
    );
    field("Resources", &resources);
    let tags: Vec<String> = summary
        .tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    field("Tags", &or_dash(Some(tags.join(", "))));
    field("Age", &age(summary.created_at, now_millis()));
    output::line("");
    pending(detail);
    output::line("Instances:");
    if detail.instances.is_empty() {
        output::line("  (none)");
    } else {
        instance_table(&detail.instances);
    }
    if detail.usage.iter().any(|row| row.usage.is_some()) {
        output::line("");
        output::line("Usage (each instance's last report):");
        top_instance_table(&detail.usage);
    }
    if !detail.events.is_empty() {
        output::line("");
        output::line("Events:");
        event_table(&detail.events);
    }
}

/// `cpu 498m (peak 522m) of 500m, memory 96.9Mi (peak 97Mi) of 256Mi,
/// over 30s, 3s ago`, or that there is none yet.
fn usage_line(usage: Option<&ReportedUsage>, cpu: Cpu, memory: Memory) -> String {
    let Some(usage) = usage else {
        return "no report yet".into();
    };
    let summary = &usage.summary;
    let of = |whole: String, zero: bool| {
        if zero {
            String::new()
        } else {
            format!(" of {whole}")
        }
    };
    format!(
        "cpu {} (peak {}){}, memory {} (peak {}){}, over {}s, {} ago",
        output::cpu(Cpu(summary.cpu_millis)),
        output::cpu(Cpu(summary.cpu_peak_millis)),
        of(output::cpu(cpu), cpu.0 == 0),
        Memory(summary.memory_bytes).human(),
        Memory(summary.memory_peak_bytes).human(),
        of(memory.human(), memory.0 == 0),
        usage.period_ms / 1000,
        age(Some(usage.at), now_millis()),
    )
}

/// "Why is it pending": the scheduler's unplaced-demand fact.
fn pending(detail: &ServiceDetail) {
    let Some(unplaced) = &detail.unplaced else {
        return;
    };
    let reason = serde_json::to_value(unplaced.reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    output::line(&format!(
        "Pending:      {} instance(s) cannot be placed",
        unplaced.count
    ));
    field("  Reason", &reason);
    field("  Constraint", &unplaced.constraint);
    field("  Nearest", &or_dash(unplaced.nearest_node.clone()));
    field("  Since", &age(Some(unplaced.since), now_millis()));
    output::line("");
}

fn instance(detail: &InstanceDetail, ports: &[PortSpec]) {
    let summary = &detail.summary;
    field("Id", &summary.id);
    field("Service", &summary.service);
    field("Node", &summary.node);
    field("State", &summary.state);
    if summary.stopping {
        field("Stopping", "yes (asked by the scheduler)");
    }
    field(
        "Healthy",
        &summary.healthy.map_or("-".into(), |h| h.to_string()),
    );
    field("Restarts", &summary.restarts.to_string());
    field("Address", &or_dash(summary.address.clone()));
    field("Age", &age(summary.created_at, now_millis()));
    if let Some(placement) = &detail.placement {
        field(
            "Usage",
            &usage_line(detail.usage.as_ref(), placement.cpu, placement.memory),
        );
    }
    let host_ports = detail
        .status
        .as_ref()
        .map(|status| &status.host_ports)
        .filter(|reported| !reported.is_empty())
        .or(detail
            .placement
            .as_ref()
            .map(|placement| &placement.host_ports));
    let lines = port_lines(ports, host_ports, summary.address.as_deref());
    if !lines.is_empty() {
        output::line("Ports:");
        for (name, text) in lines {
            field(&format!("  {name}"), &text);
        }
    }
    let Some(status) = &detail.status else {
        output::line("");
        output::line("No report from the node's agent yet.");
        return;
    };
    if let Some(message) = &status.message {
        field("Message", message);
    }
    let Some(exit) = &status.last_exit else {
        return;
    };
    output::line("");
    output::line("Last exit:");
    field("  Code", &exit.code.map_or("-".into(), |c| c.to_string()));
    if let Some(signal) = exit.signal {
        field("  Signal", &signal.to_string());
    }
    field("  Reason", &exit.reason);
    field("  Ago", &age(Some(exit.at), now_millis()));
    if !exit.log_tail.is_empty() {
        output::line("  Log tail:");
        for line in &exit.log_tail {
            output::line(&format!("    {line}"));
        }
    }
}

/// One line per port of the service: `8080/tcp, host port 20000:
/// http://10.0.0.5:20000` — the URL where the instance answers, as `cca dev`
/// prints at start (TCP ports with a host port and a reported address).
/// Host ports without a port of the service (renamed since) show too.
fn port_lines(
    ports: &[PortSpec],
    host_ports: Option<&BTreeMap<String, u16>>,
    address: Option<&str>,
) -> Vec<(String, String)> {
    let empty = BTreeMap::new();
    let host_ports = host_ports.unwrap_or(&empty);
    let mut lines: Vec<(String, String)> = ports
        .iter()
        .map(|port| {
            let name = port.name.clone().unwrap_or_else(|| port.number.to_string());
            let protocol = match port.protocol {
                Protocol::Tcp => "tcp",
                Protocol::Udp => "udp",
            };
            let mut text = format!("{}/{protocol}", port.number);
            if let Some(host_port) = host_ports.get(&name) {
                text.push_str(&format!(", host port {host_port}"));
                if let (Some(address), Protocol::Tcp) = (address, port.protocol) {
                    text.push_str(&format!(": http://{address}:{host_port}"));
                }
            }
            (name, text)
        })
        .collect();
    for (name, host_port) in host_ports {
        if !lines.iter().any(|(known, _)| known == name) {
            lines.push((name.clone(), format!("host port {host_port}")));
        }
    }
    lines
}

fn gate(detail: &GateDetail) {
    let spec = &detail.spec;
    field("Name", &spec.name);
    field("Hosts", &spec.hosts.join(", "));
    field("Target", &format!("{} port {}", spec.service, spec.port));
    for path in &spec.paths {
        field(
            "Path",
            &format!("{} -> {} port {}", path.prefix, path.service, path.port),
        );
    }
    let tls = match &spec.tls {
        None => "none".to_owned(),
        Some(cca_model::spec::Tls::SelfSigned) => "self-signed (cluster CA)".to_owned(),
        Some(cca_model::spec::Tls::Secrets { cert, key }) => {
            format!("secrets `{cert}` (chain) and `{key}` (key)")
        }
    };
    let redirect = if spec.redirect_https {
        ", plain HTTP redirected"
    } else {
        ""
    };
    field("TLS", &format!("{tls}{redirect}"));
    let sticky = spec.sticky.as_ref().map_or("no".to_owned(), |sticky| {
        format!("cookie {}", sticky.cookie)
    });
    field("Sticky", &sticky);
    let balance = match spec.balance {
        cca_model::spec::Balance::RoundRobin => "round-robin",
        cca_model::spec::Balance::LeastConnections => "least-connections",
        cca_model::spec::Balance::SourceIp => "source-ip",
    };
    field("Balance", balance);
    if detail.nodes.is_empty() {
        field("Gate nodes", "none: no node runs with --gate-listen");
        return;
    }
    for node in &detail.nodes {
        let listens: Vec<String> = [
            node.listen.http.as_ref().map(|a| format!("http://{a}")),
            node.listen.https.as_ref().map(|a| format!("https://{a}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        output::line(&format!(
            "\nGate node {} ({})",
            node.node,
            listens.join(", ")
        ));
        if let Some(error) = &node.error {
            output::line(&format!("  no report: {error}"));
            continue;
        }
        for target in &node.targets {
            let prefix = target.prefix.as_deref().unwrap_or("/");
            output::line(&format!(
                "  {prefix} -> {} port {}",
                target.service, target.port
            ));
            if target.backends.is_empty() {
                output::line("    no ready backend (requests get 503)");
            }
            for backend in &target.backends {
                let state = match backend.state {
                    BackendState::Healthy => "healthy".to_owned(),
                    BackendState::Ejected { for_ms } => {
                        format!("ejected for {}s more", for_ms.div_ceil(1000))
                    }
                    BackendState::Probing => "probing".to_owned(),
                };
                let t = &backend.target;
                output::line(&format!(
                    "    {:<24} {:<12} {}:{:<6} {:<26} {} in flight",
                    t.instance, t.node, t.address, t.port, state, backend.in_flight
                ));
            }
        }
    }
}

fn node(detail: &NodeDetail) {
    let summary = &detail.summary;
    field("Name", &summary.name);
    field("Status", &node_state(summary));
    field("Arch", &summary.arch);
    field("Zone", &or_dash(summary.zone.clone()));
    let labels: Vec<String> = summary
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    field("Labels", &or_dash(Some(labels.join(", "))));
    field("Addresses", &or_dash(Some(summary.addresses.join(", "))));
    let gate = &detail.info.gate;
    let listens: Vec<String> = [
        gate.http.as_ref().map(|a| format!("http://{a}")),
        gate.https.as_ref().map(|a| format!("https://{a}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    field("Gate", &or_dash(Some(listens.join(", "))));
    field("Subnet", &output::subnet(summary.subnet.as_ref()));
    field(
        "CPU",
        &format!(
            "{} of {} allocated",
            output::cpu(summary.cpu_allocated),
            output::cpu(summary.cpu)
        ),
    );
    field(
        "Memory",
        &format!(
            "{} of {} allocated",
            summary.memory_allocated.human(),
            summary.memory.human()
        ),
    );
    field(
        "Usage",
        &usage_line(detail.usage.as_ref(), summary.cpu, summary.memory),
    );
    field(
        "Heartbeat",
        if detail.heartbeat.is_some() {
            "live lease"
        } else {
            "none (lease expired)"
        },
    );
    field("Age", &age(Some(summary.registered_at), now_millis()));
    if !detail.drain_held_by.is_empty() {
        field(
            "Drain",
            &format!(
                "waiting: the disruption budget (max_unavailable = 0) of {} allows no move",
                detail.drain_held_by.join(", ")
            ),
        );
    }
    if !detail.unclaimed.is_empty() {
        let ids: Vec<&str> = detail.unclaimed.iter().map(|i| i.id.as_str()).collect();
        field(
            "Unclaimed",
            &format!(
                "{} (running here, not placed by this store; awaiting adoption)",
                ids.join(", ")
            ),
        );
    }
    output::line("");
    output::line("Instances:");
    if detail.instances.is_empty() {
        output::line("  (none)");
    } else {
        instance_table(&detail.instances);
    }
}

/// Whether lost-node replacement is paused; nothing when it never was.
fn replacement_line(disruption: Option<&Disruption>) -> Option<String> {
    let disruption = disruption?;
    let ago = age(Some(disruption.since), now_millis());
    Some(if disruption.paused {
        format!(
            "PAUSED for {ago}: {} of {} nodes missed their leases at once; \
             `cca resume-replacement` if they are gone",
            disruption.missing, disruption.nodes
        )
    } else {
        format!("active (a pause ended {ago} ago)")
    })
}

pub(super) async fn status(client: &Client, format: Format) -> Result<()> {
    let status = client.status().await?;
    if !output::structured(format, &status)? {
        print_status(&status);
    }
    Ok(())
}

fn print_status(status: &ClusterStatus) {
    let nodes = &status.nodes;
    field(
        "Nodes",
        &format!(
            "{} total, {} ready, {} unreachable, {} draining, {} disabled",
            nodes.total, nodes.ready, nodes.unreachable, nodes.draining, nodes.disabled
        ),
    );
    if let Some(line) = replacement_line(status.disruption.as_ref()) {
        field("Replacement", &line);
    }
    field("Services", &status.services.to_string());
    let states: Vec<String> = status
        .instances
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    field("Instances", &or_dash(Some(states.join(", "))));
    if status.unclaimed > 0 {
        field(
            "Unclaimed",
            &format!(
                "{} instance(s) run on nodes without a placement in this store, awaiting adoption",
                status.unclaimed
            ),
        );
    }
    field("Revision", &status.revision.to_string());
    if let Some(store) = &status.store {
        let restored = store
            .restored_from
            .as_ref()
            .map(|from| format!(" (restored from {from})"))
            .unwrap_or_default();
        field("Store", &format!("{}{restored}", store.id));
    }
    print_per_node(&status.per_node);
    if !status.unplaced.is_empty() {
        output::line("");
        output::line("Unplaced demand:");
        let rows = status
            .unplaced
            .iter()
            .map(|u| {
                let reason = serde_json::to_value(u.reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                vec![
                    u.service.clone(),
                    u.count.to_string(),
                    reason,
                    u.constraint.clone(),
                    or_dash(u.nearest_node.clone()),
                ]
            })
            .collect();
        output::table(
            &["service", "count", "reason", "constraint", "nearest"],
            rows,
        );
    }
    if !status.invalid_facts.is_empty() {
        output::line("");
        output::line("Facts that do not decode:");
        for (key, reason) in &status.invalid_facts {
            output::line(&format!("  {key}: {reason}"));
        }
    }
}

/// Nodes `cca status` lists one by one; beyond them, healthy nodes are
/// only counted (the JSON output has them all).
const NODES_LISTED: usize = 20;

/// The per-node table, nodes that need a look first: unreachable, with
/// failed or unclaimed instances.
fn print_per_node(per_node: &[NodeInstanceCounts]) {
    if per_node.is_empty() {
        return;
    }
    let mut nodes: Vec<&NodeInstanceCounts> = per_node.iter().collect();
    nodes.sort_by_key(|node| !needs_a_look(node));
    let rows = nodes
        .iter()
        .take(NODES_LISTED)
        .map(|node| {
            vec![
                node.node.clone(),
                node.status.clone(),
                node.running.to_string(),
                node.failed.to_string(),
                node.other.to_string(),
                node.unclaimed.to_string(),
            ]
        })
        .collect();
    output::line("");
    output::table(
        &["node", "status", "running", "failed", "other", "unclaimed"],
        rows,
    );
    let hidden = nodes.len().saturating_sub(NODES_LISTED);
    if hidden > 0 {
        let troubled = nodes
            .iter()
            .skip(NODES_LISTED)
            .filter(|n| needs_a_look(n))
            .count();
        output::line(&format!(
            "… and {hidden} more node(s), {troubled} of them unreachable or with failed or \
             unclaimed instances (`cca status -o json` lists all)"
        ));
    }
}

fn needs_a_look(node: &NodeInstanceCounts) -> bool {
    node.status != "ready" || node.failed > 0 || node.unclaimed > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: Option<&str>, number: u16, protocol: Protocol) -> PortSpec {
        PortSpec {
            name: name.map(str::to_owned),
            number,
            protocol,
        }
    }

    #[test]
    fn ports_show_the_host_port_and_the_url_where_the_instance_answers() {
        let ports = [
            port(Some("http"), 8080, Protocol::Tcp),
            port(None, 53, Protocol::Udp),
            port(Some("admin"), 9000, Protocol::Tcp),
        ];
        let host_ports = BTreeMap::from([
            ("http".to_owned(), 20000),
            ("53".to_owned(), 20001),
            ("old".to_owned(), 20002),
        ]);
        assert_eq!(
            port_lines(&ports, Some(&host_ports), Some("127.0.0.2")),
            vec![
                (
                    "http".to_owned(),
                    "8080/tcp, host port 20000: http://127.0.0.2:20000".to_owned()
                ),
                ("53".to_owned(), "53/udp, host port 20001".to_owned()),
                ("admin".to_owned(), "9000/tcp".to_owned()),
                ("old".to_owned(), "host port 20002".to_owned()),
            ]
        );
        // Not placed or not reported yet: the ports alone, no URL.
        assert_eq!(
            port_lines(&ports[..1], None, None),
            vec![("http".to_owned(), "8080/tcp".to_owned())]
        );
        assert!(port_lines(&[], None, Some("10.0.0.5")).is_empty());
    }
}
