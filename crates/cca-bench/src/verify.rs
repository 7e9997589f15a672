//! Placement verification through the API, as an operator would check
//! it: no node holds more than its capacity (by the server's accounting
//! and recomputed from the instance list), every instance of the
//! restricted service sits on a node with the required label, nothing is
//! left unplaced, and the expected number of instances runs.

use std::collections::HashMap;

use cca_wire::types::NodeSummary;
use cca_wire::{Client, InstanceQuery};

use crate::BenchError;
use crate::workload::{GOLD_LABEL, INSTANCE_CPU_MILLIS, INSTANCE_MEMORY_MIB, Workload};

/// Every violation found; empty when the placement is valid.
pub(crate) async fn placement(
    client: &Client,
    workload: &Workload,
) -> Result<Vec<String>, BenchError> {
    let nodes: HashMap<String, NodeSummary> = client
        .nodes()
        .await?
        .into_iter()
        .map(|node| (node.name.clone(), node))
        .collect();
    let instances = client.instances(&InstanceQuery::default()).await?;
    let mut violations = Vec::new();
    let mut per_node: HashMap<&str, u64> = HashMap::new();
    for instance in instances.iter().filter(|instance| !instance.stopping) {
        *per_node.entry(instance.node.as_str()).or_default() += 1;
        if Some(instance.service.as_str()) == workload.restricted_service() {
            let (key, value) = GOLD_LABEL;
            let labelled = nodes
                .get(&instance.node)
                .is_some_and(|node| node.labels.get(key).map(String::as_str) == Some(value));
            if !labelled {
                violations.push(format!(
                    "{} runs on {}, which lacks the label {key}={value}",
                    instance.id, instance.node
                ));
            }
        }
    }
    for node in nodes.values() {
        violations.extend(over_capacity(
            node,
            per_node.get(node.name.as_str()).copied(),
        ));
    }
    let running = instances
        .iter()
        .filter(|instance| !instance.stopping && instance.state == "running")
        .count();
    if running != workload.instances() {
        violations.push(format!(
            "{running} instances run, {} were asked for",
            workload.instances()
        ));
    }
    for unplaced in client.status().await?.unplaced {
        violations.push(format!(
            "{} instances of {} unplaced: {}",
            unplaced.count, unplaced.service, unplaced.constraint
        ));
    }
    Ok(violations)
}

/// A node's capacity checked against the server's accounting and against
/// what its instance count reserves.
fn over_capacity(node: &NodeSummary, instances: Option<u64>) -> Vec<String> {
    let mut violations = Vec::new();
    if node.cpu_allocated.0 > node.cpu.0 || node.memory_allocated.0 > node.memory.0 {
        violations.push(format!(
            "{} is over capacity by the server's accounting: cpu {}m of {}m, memory {} of {} bytes",
            node.name, node.cpu_allocated.0, node.cpu.0, node.memory_allocated.0, node.memory.0
        ));
    }
    let count = instances.unwrap_or(0);
    let cpu = count * INSTANCE_CPU_MILLIS;
    let memory = count * INSTANCE_MEMORY_MIB * 1024 * 1024;
    if cpu > node.cpu.0 || memory > node.memory.0 {
        violations.push(format!(
            "{} holds {count} instances reserving {cpu}m and {memory} bytes, more than its {}m and {} bytes",
            node.name, node.cpu.0, node.memory.0
        ));
    }
    violations
}
