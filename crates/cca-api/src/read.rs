//! Read models built from one cache [`View`]: the rows of `get`, the
//! details of `describe`, the cluster `status`. Pure functions of a
//! snapshot, so every answer is consistent with itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cca_control::View;
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{Cpu, Memory, ServiceSpec, Workload, spec_hash};
use cca_model::usage::{NodeUsage, UsageSummary};

use crate::types::{
    ClusterStatus, InstanceSummary, InstanceTop, NodeCounts, NodeInstanceCounts, NodeSummary,
    NodeTop, ReportedUsage, RolloutProgress, RolloutStatus, ScaleStatus, ServiceHistory,
    ServiceSummary, VersionSummary, VerticalStatus,
};

/// Instances a rollout status names as waiting, at most.
const WAITING_SHOWN: usize = 20;

/// Filters of `get instances`.
#[derive(Clone, Debug, Default)]
pub(crate) struct InstanceFilter {
    pub(crate) service: Option<String>,
    pub(crate) node: Option<String>,
    /// Tags every instance's service must carry.
    pub(crate) tags: Vec<(String, String)>,
    /// Include stopped instances and reports without a placement.
    pub(crate) all: bool,
    /// Only running instances.
    pub(crate) running: bool,
    /// Add one `pending` row per instance of unplaced demand.
    pub(crate) pending: bool,
}

/// One row per service carrying every tag in `tags`.
pub(crate) fn services(view: &View, tags: &[(String, String)]) -> Vec<ServiceSummary> {
    view.services
        .iter()
        .filter(|(name, _)| has_tags(view, name, tags))
        .map(|(name, spec)| service_summary(view, name, spec))
        .collect()
}

/// The kept versions of `service`, newest first (by the revision of the
/// apply that last wrote each, then the current one first); `None` when the service has neither a spec
/// nor a kept version.
pub(crate) fn history(view: &View, service: &str) -> Option<ServiceHistory> {
    let versions = view.versions.get(service);
    let current = view
        .services
        .get(service)
        .map(|spec| spec_hash(&spec.value));
    if versions.is_none() && current.is_none() {
        return None;
    }
    let mut running: BTreeMap<&str, usize> = BTreeMap::new();
    for instance in view.instances_of(service) {
        *running.entry(instance.spec_hash.as_str()).or_default() += 1;
    }
    let mut versions: Vec<VersionSummary> = versions
        .into_iter()
        .flat_map(|versions| versions.iter())
        .map(|(hash, version)| VersionSummary {
            version: hash.clone(),
            created_at: version.created_at,
            applied_at: version.applied_at,
            revision: version.mod_revision,
            instances: running.get(hash.as_str()).copied().unwrap_or(0),
            current: current.as_deref() == Some(hash.as_str()),
            spec: version.spec.clone(),
        })
        .collect();
    // An apply that records the version it replaces (one written before
    // versions existed) writes two at one revision: the current one is newer.
    versions.sort_by(|a, b| {
        (b.revision, b.current, b.applied_at)
            .cmp(&(a.revision, a.current, a.applied_at))
            .then_with(|| a.version.cmp(&b.version))
    });
    Some(ServiceHistory {
        service: service.to_owned(),
        versions,
    })
}

/// `service`'s replica count and what sets it; `None` when it has no
/// spec.
pub(crate) fn scale(view: &View, service: &str, now: i64) -> Option<ScaleStatus> {
    let spec = &view.services.get(service)?.value;
    let replicas = view.wanted_replicas(service)?;
    let horizontal = spec
        .autoscale
        .as_ref()
        .and_then(|autoscale| autoscale.horizontal.clone());
    let signals = horizontal.as_ref().map_or_else(Vec::new, |horizontal| {
        cca_control::controllers::lifecycle::horizontal::signals(
            view, service, horizontal, replicas, now,
        )
    });
    Some(ScaleStatus {
        service: service.to_owned(),
        replicas,
        spec_replicas: spec.replicas,
        autoscale: horizontal,
        signals,
        autoscaled: view
            .autoscaled
            .get(service)
            .map(|held| (*held.value).clone()),
        scale_to_zero: view
            .scale
            .get(service)
            .filter(|_| spec.scale_to_zero.is_some())
            .map(|held| (*held.value).clone()),
        vertical: vertical(view, service),
    })
}

/// What vertical autoscaling recommends for `service`; `None` when it has
/// no spec or no `vertical` block.
pub(crate) fn vertical(view: &View, service: &str) -> Option<VerticalStatus> {
    let spec = &view.services.get(service)?.value;
    let bounds = spec.autoscale.as_ref()?.vertical.clone()?;
    let held = view.vertical.get(service).map(|held| &*held.value);
    Some(VerticalStatus {
        bounds,
        resources: spec.resources.clone(),
        window_ms: held.map_or(0, |held| held.window_ms),
        samples: held.map_or(0, |held| held.samples),
        sampled_at: held.map_or(0, |held| held.sampled_at),
        observed: held.and_then(|held| held.observed),
        recommended: held.and_then(|held| held.recommended),
        min_samples: cca_model::vertical::MIN_SAMPLES,
        applied: held.and_then(|held| held.applied.clone()),
        holding: held.and_then(|held| held.holding.clone()),
    })
}

/// Where `service`'s rollout stands; `None` when it has no spec.
pub(crate) fn rollout(view: &View, service: &str) -> Option<RolloutStatus> {
    let spec = &view.services.get(service)?.value;
    let spec_version = spec_hash(spec);
    let placing = view.placed_version_at(service, spec_version.clone());
    let wanted = if view.is_asleep(service) {
        0
    } else {
        view.wanted_replicas(service).unwrap_or(spec.replicas)
    };
    let mut progress = RolloutProgress {
        wanted,
        ..RolloutProgress::default()
    };
    let mut waiting = Vec::new();
    for instance in view.instances_of(service) {
        if instance.stopping {
            progress.stopping += 1;
        } else if instance.spec_hash != placing {
            progress.old += 1;
        } else {
            progress.updated += 1;
            if view.is_ready(instance) {
                progress.ready += 1;
            } else if waiting.len() < WAITING_SHOWN {
                waiting.push(waiting_line(view, instance));
            }
        }
    }
    Some(RolloutStatus {
        service: service.to_owned(),
        spec_version,
        placing,
        rollout: view.rollouts.get(service).map(|held| (*held.value).clone()),
        paused: view
            .rollout_controls
            .get(service)
            .is_some_and(|control| control.paused),
        progress,
        max_surge: spec.update.max_surge,
        max_unavailable: spec.rollout_unavailable(),
        rollback_after: spec.update.rollback_after,
        waiting,
    })
}

/// `web-3 on n1: starting (health check: connection refused)`.
fn waiting_line(view: &View, instance: &Instance) -> String {
    let Some(status) = view.fresh_status(instance) else {
        return format!(
            "{} on {}: no report from its agent yet",
            instance.id, instance.node
        );
    };
    let message = status
        .message
        .as_deref()
        .map(|message| format!(" ({message})"))
        .unwrap_or_default();
    let restarts = match status.restarts {
        0 => String::new(),
        n => format!(", {n} restarts"),
    };
    format!(
        "{} on {}: {}{restarts}{message}",
        instance.id,
        instance.node,
        status.state.as_str()
    )
}

pub(crate) fn service_summary(view: &View, name: &str, spec: &ServiceSpec) -> ServiceSummary {
    let mine = || view.instances_of(name).map(|i| &*i.value);
    let running = mine()
        .filter(|i| state_of(view, &i.id) == Some(InstanceState::Running))
        .count();
    ServiceSummary {
        name: name.to_owned(),
        workload: workload_kind(&spec.workload).to_owned(),
        // The autoscaler's count for an autoscaled service.
        replicas: view.wanted_replicas(name).unwrap_or(spec.replicas),
        instances: mine().filter(|i| !i.stopping).count(),
        running,
        unplaced: view.unplaced.get(name).map_or(0, |u| u.count),
        tags: view
            .tags
            .get(name)
            .map(|tags| {
                tags.iter()
                    .map(|(k, v)| (k.clone(), (*v.value).clone()))
                    .collect()
            })
            .unwrap_or_default(),
        created_at: view.service_meta.get(name).map(|meta| meta.created_at),
        vip: view.vips.get(name).map(|vip| (*vip.value).clone()),
        dns: view
            .vips
            .get(name)
            .and_then(|vip| vip.value.held().map(|_| cca_model::net::service_name(name))),
        scale: view
            .scale
            .get(name)
            .filter(|_| spec.scale_to_zero.is_some())
            .map(|state| (*state.value).clone()),
    }
}

/// `process` or `image`, as lists show a workload.
pub(crate) fn workload_kind(workload: &Workload) -> &'static str {
    match workload {
        Workload::Image { .. } => "image",
        Workload::Process { .. } => "process",
    }
}

fn has_tags(view: &View, service: &str, tags: &[(String, String)]) -> bool {
    let held = view.tags.get(service);
    tags.iter().all(|(key, value)| {
        held.and_then(|held| held.get(key))
            .is_some_and(|held| *held.value == *value)
    })
}

fn state_of(view: &View, id: &str) -> Option<InstanceState> {
    view.statuses.get(id).map(|status| status.state)
}

/// Instances placed or reported, filtered, then the pending rows: placed
/// rows come first so that a client taking the first row gets an instance.
/// Reports whose placement is gone (what an unreachable or partitioned
/// agent still runs or ran) count as ended: listed with `all` only, like
/// stopped instances.
pub(crate) fn instances(view: &View, filter: &InstanceFilter) -> Vec<InstanceSummary> {
    let placed = view.instances.keys();
    let orphans = view
        .statuses
        .keys()
        .filter(|id| !view.instances.contains_key(*id));
    let mut rows: Vec<InstanceSummary> = placed
        .chain(orphans)
        .filter_map(|id| instance_summary(view, id))
        .filter(|row| keep(view, row, filter))
        .collect();
    rows.sort_by(|a, b| (&a.service, &a.id).cmp(&(&b.service, &b.id)));
    if filter.pending && !filter.running && filter.node.is_none() {
        rows.extend(pending_rows(view, filter));
    }
    rows
}

/// By default a placed instance shows in every state but stopped (failed
/// ones included: they are what an operator looks for); `all` adds
/// stopped ones and reports without a placement, `running` keeps only
/// running ones.
fn keep(view: &View, row: &InstanceSummary, filter: &InstanceFilter) -> bool {
    let shown = if filter.running {
        row.placed && row.state == InstanceState::Running.as_str()
    } else {
        filter.all || (row.placed && row.state != InstanceState::Stopped.as_str())
    };
    shown
        && filter.service.as_ref().is_none_or(|s| *s == row.service)
        && filter.node.as_ref().is_none_or(|n| *n == row.node)
        && has_tags(view, &row.service, &filter.tags)
}

/// One `pending` row per instance the scheduler could not place (on no
/// node yet), numbered within its service.
fn pending_rows<'v>(
    view: &'v View,
    filter: &'v InstanceFilter,
) -> impl Iterator<Item = InstanceSummary> + 'v {
    view.unplaced
        .iter()
        .filter(|(service, _)| {
            filter.service.as_ref().is_none_or(|s| s == *service)
                && has_tags(view, service, &filter.tags)
        })
        .flat_map(|(service, unplaced)| {
            (1..=unplaced.value.count).map(move |n| InstanceSummary {
                id: format!("({service} pending {n})"),
                service: service.clone(),
                node: "-".into(),
                state: "pending".into(),
                healthy: None,
                restarts: 0,
                address: None,
                ordinal: None,
                stopping: false,
                placed: false,
                created_at: Some(unplaced.value.since),
            })
        })
}

/// The row of one instance, from its placement and its latest report.
pub(crate) fn instance_summary(view: &View, id: &str) -> Option<InstanceSummary> {
    let placement = view.instances.get(id);
    let status = view.statuses.get(id);
    let (service, node) = match (placement, status) {
        (Some(p), _) => (p.service.clone(), p.node.clone()),
        (None, Some(s)) => (s.service.clone(), s.node.clone()),
        (None, None) => return None,
    };
    Some(InstanceSummary {
        id: id.to_owned(),
        service,
        node,
        state: status.map_or("assigned", |s| s.state.as_str()).to_owned(),
        healthy: status.and_then(|s| s.healthy),
        restarts: status.map_or(0, |s| s.restarts),
        address: status.and_then(|s| s.address.clone()),
        ordinal: placement.and_then(|p| p.ordinal),
        stopping: placement.is_some_and(|p| p.stopping),
        placed: placement.is_some(),
        created_at: placement.map(|p| p.created_at),
    })
}

/// One row per registered node.
pub(crate) fn nodes(view: &View) -> Vec<NodeSummary> {
    let placed = placed_by_node(view);
    view.nodes
        .keys()
        .filter_map(|name| {
            let on_node = placed.get(name.as_str()).copied().unwrap_or_default();
            summary_of_node(view, name, on_node)
        })
        .collect()
}

pub(crate) fn node_summary(view: &View, name: &str) -> Option<NodeSummary> {
    node_summaries(view, &[name]).pop()
}

/// The rows of the nodes named (those registered, in the order given),
/// summing only their instances.
pub(crate) fn node_summaries(view: &View, names: &[&str]) -> Vec<NodeSummary> {
    let mut placed: HashMap<&str, Placed> = names
        .iter()
        .map(|name| (*name, Placed::default()))
        .collect();
    for instance in view.instances.values() {
        if let Some(sums) = placed.get_mut(instance.node.as_str()) {
            sums.add(instance);
        }
    }
    names
        .iter()
        .filter_map(|name| {
            summary_of_node(view, name, placed.get(name).copied().unwrap_or_default())
        })
        .collect()
}

/// What the instances placed on a node reserve, and how many they are.
#[derive(Clone, Copy, Debug, Default)]
struct Placed {
    cpu: u64,
    memory: u64,
    count: usize,
}

impl Placed {
    fn add(&mut self, instance: &Instance) {
        self.cpu += instance.cpu.0;
        self.memory += instance.memory.0;
        self.count += 1;
    }
}

/// Every node's placed instances summed, in one pass over them.
fn placed_by_node(view: &View) -> HashMap<&str, Placed> {
    let mut placed: HashMap<&str, Placed> = HashMap::new();
    for instance in view.instances.values() {
        placed
            .entry(instance.node.as_str())
            .or_default()
            .add(instance);
    }
    placed
}

fn summary_of_node(view: &View, name: &str, placed: Placed) -> Option<NodeSummary> {
    let info = view.nodes.get(name)?;
    let control = view.node_controls.get(name);
    Some(NodeSummary {
        name: name.to_owned(),
        status: node_condition(view, name).to_owned(),
        draining: control.is_some_and(|c| c.drain),
        disabled: control.is_some_and(|c| c.disabled),
        cpu: info.cpu,
        memory: info.memory,
        cpu_allocated: Cpu(placed.cpu),
        memory_allocated: Memory(placed.memory),
        instances: placed.count,
        arch: info.arch.clone(),
        zone: info.zone.clone(),
        labels: info.labels.clone(),
        addresses: info.addresses.clone(),
        registered_at: info.registered_at,
        subnet: view.subnets.get(name).map(|subnet| (*subnet.value).clone()),
    })
}

/// The services a drain of `node` waits for: their budget allows no move
/// (the scheduler's rule, `ServiceSpec::voluntary_moves`), and they still
/// have instances on it. Empty when the node is not draining.
pub(crate) fn drain_held_by(view: &View, node: &str) -> Vec<String> {
    if !view.node_controls.get(node).is_some_and(|c| c.drain) {
        return Vec::new();
    }
    let held: BTreeSet<&str> = view
        .instances
        .values()
        .filter(|instance| instance.node == node && !instance.stopping)
        .filter(|instance| {
            view.services
                .get(&instance.service)
                .is_some_and(|spec| spec.voluntary_moves() == 0)
        })
        .map(|instance| instance.service.as_str())
        .collect();
    held.into_iter().map(str::to_owned).collect()
}

/// The node controller's verdict when it has one; until then a live
/// heartbeat lease means ready.
pub(crate) fn node_condition(view: &View, name: &str) -> &'static str {
    use cca_model::cluster::NodeCondition;
    match view.node_statuses.get(name).map(|s| s.condition) {
        Some(NodeCondition::Ready) => "ready",
        Some(NodeCondition::Unreachable) => "unreachable",
        None if view.heartbeats.contains_key(name) => "ready",
        None => "unreachable",
    }
}

/// The cluster summary.
pub(crate) fn status(view: &View) -> ClusterStatus {
    let nodes = nodes(view);
    let counts = NodeCounts {
        total: nodes.len(),
        ready: nodes.iter().filter(|n| n.status == "ready").count(),
        unreachable: nodes.iter().filter(|n| n.status == "unreachable").count(),
        draining: nodes.iter().filter(|n| n.draining).count(),
        disabled: nodes.iter().filter(|n| n.disabled).count(),
    };
    let all = InstanceFilter {
        all: true,
        ..InstanceFilter::default()
    };
    let rows = instances(view, &all);
    let mut by_state = BTreeMap::new();
    for row in &rows {
        *by_state.entry(row.state.clone()).or_insert(0) += 1;
    }
    ClusterStatus {
        per_node: per_node(view, &rows),
        revision: view.revision,
        nodes: counts,
        services: view.services.len(),
        instances: by_state,
        unplaced: view.unplaced.values().map(|u| (*u.value).clone()).collect(),
        invalid_facts: view
            .invalid
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        disruption: view.disruption.as_ref().map(|held| (*held.value).clone()),
        store: view
            .store_identity
            .as_ref()
            .map(|held| (*held.value).clone()),
        unclaimed: view
            .unclaimed
            .values()
            .map(|reported| reported.value.instances.len())
            .sum(),
    }
}

/// Every registered node (and any node an instance row names) with its
/// placed instances counted by state, and what it runs unclaimed.
fn per_node(view: &View, rows: &[InstanceSummary]) -> Vec<NodeInstanceCounts> {
    let mut counts: BTreeMap<&str, NodeInstanceCounts> = view
        .nodes
        .keys()
        .map(|name| (name.as_str(), NodeInstanceCounts::default()))
        .collect();
    for row in rows.iter().filter(|row| row.placed) {
        let node = counts.entry(row.node.as_str()).or_default();
        match row.state.as_str() {
            "running" => node.running += 1,
            "failed" => node.failed += 1,
            "stopped" => {}
            _ => node.other += 1,
        }
    }
    counts
        .into_iter()
        .map(|(name, counted)| NodeInstanceCounts {
            node: name.to_owned(),
            status: node_condition(view, name).to_owned(),
            unclaimed: view
                .unclaimed
                .get(name)
                .map_or(0, |reported| reported.value.instances.len()),
            ..counted
        })
        .collect()
}

/// Parses `k=v` tag filters.
pub(crate) fn parse_tags(raw: &[String]) -> Result<Vec<(String, String)>, String> {
    raw.iter()
        .map(|tag| match tag.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!("tag filter `{tag}` is not of the form key=value")),
        })
        .collect()
}

/// `cca top nodes`: every node's last usage report against its capacity
/// and what its instances requested.
pub(crate) fn top_nodes(view: &View) -> Vec<NodeTop> {
    let placed = placed_by_node(view);
    view.nodes
        .iter()
        .map(|(name, info)| {
            let on_node = placed.get(name.as_str()).copied().unwrap_or_default();
            NodeTop {
                node: name.clone(),
                status: node_condition(view, name).to_owned(),
                cpu: info.cpu,
                memory: info.memory,
                cpu_requested: Cpu(on_node.cpu),
                memory_requested: Memory(on_node.memory),
                usage: node_usage(view, name),
            }
        })
        .collect()
}

/// `cca top workloads`: every placed instance of the services carrying
/// `tags`, with its request and its node's last report of it.
pub(crate) fn top_instances(view: &View, tags: &[(String, String)]) -> Vec<InstanceTop> {
    view.instances
        .values()
        .filter(|instance| has_tags(view, &instance.service, tags))
        .map(|instance| instance_top(view, &instance.value))
        .collect()
}

/// The `top` rows of one service's placed instances.
pub(crate) fn service_usage(view: &View, service: &str) -> Vec<InstanceTop> {
    view.service_instances
        .get(service)
        .into_iter()
        .flat_map(|instances| instances.values())
        .map(|instance| instance_top(view, &instance.value))
        .collect()
}

fn instance_top(view: &View, instance: &Instance) -> InstanceTop {
    InstanceTop {
        instance: instance.id.clone(),
        service: instance.service.clone(),
        node: instance.node.clone(),
        cpu_request: instance.cpu,
        memory_request: instance.memory,
        usage: instance_usage(view, &instance.node, &instance.id),
    }
}

/// What `node`'s last report says instance `id` used.
pub(crate) fn instance_usage(view: &View, node: &str, id: &str) -> Option<ReportedUsage> {
    let report = view.usage.get(node)?;
    let summary = report.value.instances.get(id)?;
    Some(reported(&report.value, *summary))
}

/// What `node`'s last report says the whole node used.
pub(crate) fn node_usage(view: &View, node: &str) -> Option<ReportedUsage> {
    let report = view.usage.get(node)?;
    Some(reported(&report.value, report.value.node))
}

fn reported(report: &NodeUsage, summary: UsageSummary) -> ReportedUsage {
    ReportedUsage {
        at: report.at,
        period_ms: report.period_ms,
        summary,
    }
}
