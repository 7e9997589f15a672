//! What each page of the web console shows, built from one cache snapshot
//! (pure: no IO, no clock). A view is a summary
//! whose size does not grow with the cluster: counts, the problems first
//! (at most [`MAX_PROBLEMS`]) and one page of rows ([`PAGE_SIZE`]). Every
//! view opens with its [`Verdict`]: is it healthy, and if not, why.

use std::collections::{BTreeMap, HashMap};

use cca_control::View;
use cca_model::cluster::{Instance, InstanceState, InstanceStatus, Unplaced};
use cca_model::rollout::RolloutPhase;
use cca_model::spec::ServiceSpec;
use serde::{Deserialize, Serialize};

use crate::read;
use crate::types::{
    InstanceSummary, NodeCounts, NodeSummary, ReportedUsage, RolloutStatus, ServiceSummary,
};

/// Rows on one page of a list.
pub const PAGE_SIZE: usize = 50;
/// Problems an overview lists (the rest are counted).
pub const MAX_PROBLEMS: usize = 50;
/// Unplaced services an overview lists (the rest are counted).
pub const MAX_UNPLACED: usize = 20;

/// How an object is doing, worst first (lists sort by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Serves nothing: no instance running, a node unreachable, an
    /// instance that gave up.
    Down,
    /// Serves, but less than asked, or something in it fails.
    Degraded,
    /// On its way: instances starting, a rollout or a drain under way.
    Progressing,
    /// A scale-to-zero service asleep until its next request.
    Asleep,
    Healthy,
}

/// The answer every view opens with: the health and, unless healthy,
/// why (notes such as "disabled" may come with a healthy verdict).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub health: Health,
    pub reasons: Vec<String>,
}

impl Verdict {
    fn healthy() -> Self {
        Verdict {
            health: Health::Healthy,
            reasons: Vec::new(),
        }
    }

    /// Adds `reason`, lowering the health to `health` if that is worse.
    fn flag(&mut self, health: Health, reason: String) {
        self.health = self.health.min(health);
        self.reasons.push(reason);
    }
}

/// One object that is not healthy, for the overview.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub health: Health,
    /// `service/web`, `node/n1`: what the console links to.
    pub subject: String,
    pub reasons: Vec<String>,
}

/// One page of a list, and where it stands in the whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T> {
    pub rows: Vec<T>,
    /// Rows in the whole list (after the filter).
    pub total: usize,
    /// Zero-based.
    pub page: usize,
    pub pages: usize,
}

impl<T> Page<T> {
    /// Page `page` of `rows` (the last one if `page` is past the end).
    pub fn of(rows: Vec<T>, page: usize) -> Self {
        let total = rows.len();
        let pages = total.div_ceil(PAGE_SIZE).max(1);
        let page = page.min(pages - 1);
        let rows = rows
            .into_iter()
            .skip(page * PAGE_SIZE)
            .take(PAGE_SIZE)
            .collect();
        Page {
            rows,
            total,
            page,
            pages,
        }
    }
}

/// The cluster at a glance (`/ui`'s first page).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overview {
    pub verdict: Verdict,
    pub nodes: NodeCounts,
    /// Services by health.
    pub services: BTreeMap<Health, usize>,
    /// Placed instances by state (`assigned` before their first report).
    pub instances: BTreeMap<String, usize>,
    /// Demand waiting for a node, most instances first.
    pub unplaced: Vec<Unplaced>,
    pub unplaced_services: usize,
    /// Services and nodes that are not healthy, worst first.
    pub problems: Vec<Problem>,
    pub problems_total: usize,
}

/// One row of the services list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRow {
    pub name: String,
    pub workload: String,
    pub verdict: Verdict,
    pub replicas: u32,
    pub running: usize,
    pub unplaced: u32,
}

/// One row of the nodes list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    pub verdict: Verdict,
    #[serde(flatten)]
    pub summary: NodeSummary,
}

/// One row of an instance list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRow {
    pub verdict: Verdict,
    #[serde(flatten)]
    pub summary: InstanceSummary,
}

/// A service's page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServicePage {
    pub row: ServiceRow,
    pub summary: ServiceSummary,
    pub spec: ServiceSpec,
    pub instances: Page<InstanceRow>,
    pub unplaced: Option<Unplaced>,
    /// Ready backends, by port name.
    pub endpoints: BTreeMap<String, usize>,
    pub rollout: Option<RolloutStatus>,
}

/// A node's page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodePage {
    pub row: NodeRow,
    pub instances: Page<InstanceRow>,
    pub usage: Option<ReportedUsage>,
    /// While it drains: the services whose budget holds instances on it.
    pub drain_held_by: Vec<String>,
}

/// An instance's page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstancePage {
    pub row: InstanceRow,
    pub placement: Option<Instance>,
    pub status: Option<InstanceStatus>,
    pub usage: Option<ReportedUsage>,
}

/// What a list keeps: names containing `query` (every name when empty).
fn matches(name: &str, query: &str) -> bool {
    query.is_empty() || name.contains(query)
}

/// The overview of `view`, counting only the services `visible` keeps.
pub fn overview(view: &View, visible: impl Fn(&str) -> bool) -> Overview {
    let census = census(view);
    let service_rows = service_rows(view, &census, &visible);
    let node_states = node_states(view);
    let mut services = BTreeMap::new();
    let mut instances = BTreeMap::new();
    for row in &service_rows {
        *services.entry(row.verdict.health).or_insert(0) += 1;
        if let Some(tally) = census.get(row.name.as_str()) {
            for (state, count) in &tally.by_state {
                *instances.entry((*state).to_owned()).or_insert(0) += count;
            }
        }
    }
    let mut problems: Vec<Problem> = service_rows
        .iter()
        .filter(|row| row.verdict.health < Health::Asleep)
        .map(|row| problem("service", &row.name, &row.verdict))
        .chain(
            node_states
                .iter()
                .filter(|node| node.verdict.health < Health::Asleep)
                .map(|node| problem("node", node.name, &node.verdict)),
        )
        .collect();
    problems.sort_by(|a, b| (a.health, &a.subject).cmp(&(b.health, &b.subject)));
    let problems_total = problems.len();
    problems.truncate(MAX_PROBLEMS);
    let mut unplaced: Vec<Unplaced> = view
        .unplaced
        .iter()
        .filter(|(service, _)| visible(service))
        .map(|(_, held)| (*held.value).clone())
        .collect();
    unplaced.sort_by(|a, b| b.count.cmp(&a.count).then(a.service.cmp(&b.service)));
    let unplaced_services = unplaced.len();
    unplaced.truncate(MAX_UNPLACED);
    let nodes = node_counts(&node_states);
    Overview {
        verdict: cluster_verdict(view, &nodes, &services, unplaced_services),
        nodes,
        services,
        instances,
        unplaced,
        unplaced_services,
        problems,
        problems_total,
    }
}

fn problem(kind: &str, name: &str, verdict: &Verdict) -> Problem {
    Problem {
        health: verdict.health,
        subject: format!("{kind}/{name}"),
        reasons: verdict.reasons.clone(),
    }
}

fn node_counts(nodes: &[NodeState]) -> NodeCounts {
    let count = |keep: fn(&NodeState) -> bool| nodes.iter().filter(|node| keep(node)).count();
    NodeCounts {
        total: nodes.len(),
        ready: count(|node| node.status == "ready"),
        unreachable: count(|node| node.status == "unreachable"),
        draining: count(|node| node.draining),
        disabled: count(|node| node.disabled),
    }
}

/// The cluster's verdict: down when no node is ready, degraded when
/// anything else is wrong.
fn cluster_verdict(
    view: &View,
    nodes: &NodeCounts,
    services: &BTreeMap<Health, usize>,
    unplaced_services: usize,
) -> Verdict {
    let mut verdict = Verdict::healthy();
    let count = |health| services.get(&health).copied().unwrap_or(0);
    if nodes.total > 0 && nodes.ready == 0 {
        verdict.flag(Health::Down, "no node is ready".into());
    } else if nodes.total == 0 {
        verdict.flag(Health::Down, "no node has registered".into());
    }
    if nodes.unreachable > 0 {
        verdict.flag(
            Health::Degraded,
            format!("{} of {} nodes unreachable", nodes.unreachable, nodes.total),
        );
    }
    // A service down leaves the cluster degraded, not down: the cluster
    // is down only when it can run nothing.
    for (health, words, cluster) in [
        (Health::Down, "down", Health::Degraded),
        (Health::Degraded, "degraded", Health::Degraded),
        (Health::Progressing, "progressing", Health::Progressing),
    ] {
        let n = count(health);
        if n > 0 {
            verdict.flag(cluster, format!("{n} {} {words}", plural(n, "service")));
        }
    }
    if unplaced_services > 0 {
        verdict.flag(
            Health::Degraded,
            format!(
                "{unplaced_services} {} with demand no node can take",
                plural(unplaced_services, "service")
            ),
        );
    }
    if !view.invalid.is_empty() {
        verdict.flag(
            Health::Degraded,
            format!("{} facts in the store do not decode", view.invalid.len()),
        );
    }
    if let Some(held) = view.disruption.as_ref().filter(|held| held.value.paused) {
        verdict.flag(
            Health::Degraded,
            format!(
                "lost-node replacement paused: {} of {} nodes went missing at once \
                 (cca cluster resume-replacement)",
                held.value.missing, held.value.nodes
            ),
        );
    }
    verdict
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

/// What a service's placed instances are doing.
#[derive(Default)]
struct Tally {
    /// Reported running (ready or not), as `get services` counts them.
    running: usize,
    ready: usize,
    starting: usize,
    unhealthy: usize,
    restarting: usize,
    failed: usize,
    /// Placed instances by state (`assigned` before their first report).
    by_state: BTreeMap<&'static str, usize>,
    /// The message of one failed or restarting instance: what to look at.
    example: Option<String>,
}

impl Tally {
    fn count(&mut self, instance: &Instance, status: Option<&InstanceStatus>) {
        let state = status.map_or("assigned", |status| status.state.as_str());
        *self.by_state.entry(state).or_insert(0) += 1;
        if instance.stopping {
            return;
        }
        match status.map(|status| (status.state, status.healthy)) {
            Some((InstanceState::Running, healthy)) => {
                self.running += 1;
                if healthy == Some(false) {
                    self.unhealthy += 1;
                } else {
                    self.ready += 1;
                }
            }
            Some((InstanceState::Restarting, _)) => self.restarting += 1,
            Some((InstanceState::Failed, _)) => self.failed += 1,
            Some((InstanceState::Stopping | InstanceState::Stopped, _)) => {}
            Some((InstanceState::Pending | InstanceState::Starting, _)) | None => {
                self.starting += 1;
            }
        }
        if let Some(status) =
            status.filter(|s| matches!(s.state, InstanceState::Failed | InstanceState::Restarting))
            && self.example.is_none()
        {
            self.example = Some(format!("{}: {}", instance.id, status_words(status)));
        }
    }
}

/// Every service's [`Tally`], in one pass that walks the placements and
/// the reports side by side: both tables are ordered by instance id, so
/// no report is looked up (at 100,000 instances the lookups were most of
/// an overview's cost).
fn census(view: &View) -> HashMap<&str, Tally> {
    let mut tallies: HashMap<&str, Tally> = HashMap::new();
    let mut reports = view.statuses.iter().peekable();
    for (id, held) in &view.instances {
        while reports
            .next_if(|(report, _)| report.as_str() < id.as_str())
            .is_some()
        {}
        let status = reports
            .peek()
            .filter(|(report, _)| *report == id)
            .map(|(_, held)| &*held.value);
        let instance = &*held.value;
        tallies
            .entry(instance.service.as_str())
            .or_default()
            .count(instance, status);
    }
    tallies
}

/// The tally of one service's instances, alone.
fn tally_of(view: &View, service: &str) -> Tally {
    let mut tally = Tally::default();
    for held in view.instances_of(service) {
        let status = view.statuses.get(&held.value.id).map(|held| &*held.value);
        tally.count(&held.value, status);
    }
    tally
}

/// What an instance's report says went wrong, in a few words.
fn status_words(status: &InstanceStatus) -> String {
    let exit = status
        .last_exit
        .as_ref()
        .map(cca_model::cluster::ExitInfo::summary);
    match (&status.message, exit) {
        (Some(message), Some(exit)) => format!("{message} ({exit})"),
        (Some(message), None) => message.clone(),
        (None, Some(exit)) => exit,
        (None, None) => status.state.as_str().to_owned(),
    }
}

/// The rows of the services `visible` keeps, by name.
fn service_rows(
    view: &View,
    census: &HashMap<&str, Tally>,
    visible: impl Fn(&str) -> bool,
) -> Vec<ServiceRow> {
    view.services
        .iter()
        .filter(|(name, _)| visible(name))
        .map(|(name, spec)| {
            let tally = census.get(name.as_str());
            service_row(view, name, &spec.value, tally.unwrap_or(&Tally::default()))
        })
        .collect()
}

fn service_row(view: &View, name: &str, spec: &ServiceSpec, tally: &Tally) -> ServiceRow {
    let replicas = view.wanted_replicas(name).unwrap_or(spec.replicas);
    ServiceRow {
        name: name.to_owned(),
        workload: read::workload_kind(&spec.workload).to_owned(),
        verdict: service_verdict(view, name, spec, replicas, tally),
        replicas,
        running: tally.running,
        unplaced: view.unplaced.get(name).map_or(0, |u| u.count),
    }
}

fn service_verdict(
    view: &View,
    name: &str,
    spec: &ServiceSpec,
    replicas: u32,
    tally: &Tally,
) -> Verdict {
    let mut verdict = Verdict::healthy();
    let asleep = view
        .scale
        .get(name)
        .filter(|held| spec.scale_to_zero.is_some() && held.value.asleep);
    if asleep.is_some() {
        verdict.flag(
            Health::Asleep,
            "asleep (scale to zero): the next request wakes it".into(),
        );
        return verdict;
    }
    let wanted = replicas as usize;
    if wanted > 0 && tally.ready == 0 {
        verdict.flag(
            Health::Down,
            format!("none of {wanted} {} ready", plural(wanted, "instance")),
        );
    } else if tally.ready < wanted {
        let health = if tally.starting > 0 && tally.failed + tally.restarting == 0 {
            Health::Progressing
        } else {
            Health::Degraded
        };
        verdict.flag(
            health,
            format!("{} of {wanted} instances ready", tally.ready),
        );
    }
    if tally.starting > 0 {
        verdict.flag(Health::Progressing, format!("{} starting", tally.starting));
    }
    for (n, words) in [
        (tally.unhealthy, "failing their health check"),
        (tally.restarting, "restarting after a crash"),
        (tally.failed, "failed (gave up restarting)"),
    ] {
        if n > 0 {
            verdict.flag(Health::Degraded, format!("{n} {words}"));
        }
    }
    if let Some(example) = &tally.example {
        verdict.reasons.push(example.clone());
    }
    if let Some(unplaced) = view.unplaced.get(name) {
        verdict.flag(Health::Degraded, unplaced_words(&unplaced.value));
    }
    if let Some(rollout) = view.rollouts.get(name) {
        rollout_reason(&mut verdict, &rollout.value);
    }
    verdict
}

fn unplaced_words(unplaced: &Unplaced) -> String {
    let nearest = unplaced
        .nearest_node
        .as_ref()
        .map(|node| format!("; nearest node {node}"))
        .unwrap_or_default();
    format!(
        "{} unplaced: {}{nearest}",
        unplaced.count, unplaced.constraint
    )
}

fn rollout_reason(verdict: &mut Verdict, rollout: &cca_model::rollout::Rollout) {
    let version = short(&rollout.target);
    match rollout.phase {
        RolloutPhase::Progressing if rollout.paused => verdict.flag(
            Health::Degraded,
            format!("rollout to {version} paused (cca rollout resume)"),
        ),
        RolloutPhase::Progressing => {
            verdict.flag(Health::Progressing, format!("rolling out {version}"));
        }
        RolloutPhase::Failed => verdict.flag(
            Health::Degraded,
            format!("rollout to {version} failed: its new instances kept failing"),
        ),
        RolloutPhase::Complete | RolloutPhase::RolledBack | RolloutPhase::Superseded => {}
    }
    if let Some(previous) = rollout
        .previous
        .as_ref()
        .filter(|_| rollout.undo_at.is_none() && !rollout.failures.is_empty())
    {
        verdict.reasons.push(format!(
            "rolled back from a failing version to {}",
            short(previous)
        ));
    }
}

fn short(version: &str) -> &str {
    version.get(..12).unwrap_or(version)
}

/// What a node's verdict needs, without what is placed on it (which
/// costs a pass over every instance): the overview counts these, the
/// nodes list sorts them and sums the instances of one page only.
struct NodeState<'v> {
    name: &'v str,
    status: &'static str,
    draining: bool,
    disabled: bool,
    verdict: Verdict,
}

fn node_states(view: &View) -> Vec<NodeState<'_>> {
    view.nodes
        .keys()
        .map(|name| {
            let status = read::node_condition(view, name);
            let control = view.node_controls.get(name);
            let draining = control.is_some_and(|c| c.drain);
            let disabled = control.is_some_and(|c| c.disabled);
            NodeState {
                name,
                status,
                draining,
                disabled,
                verdict: node_verdict(status, draining, disabled),
            }
        })
        .collect()
}

fn node_verdict(status: &str, draining: bool, disabled: bool) -> Verdict {
    let mut verdict = Verdict::healthy();
    if status != "ready" {
        verdict.flag(
            Health::Down,
            "unreachable: its heartbeats stopped; its instances are replaced elsewhere".into(),
        );
    }
    if draining {
        verdict.flag(Health::Progressing, "draining".into());
    }
    if disabled {
        verdict
            .reasons
            .push("disabled: takes no new instances (cca node enable)".into());
    }
    verdict
}

/// Page `page` of the services whose names contain `query` and that
/// `visible` keeps, worst first.
pub fn services(
    view: &View,
    query: &str,
    page: usize,
    visible: impl Fn(&str) -> bool,
) -> Page<ServiceRow> {
    let census = census(view);
    let mut rows = service_rows(view, &census, |name| matches(name, query) && visible(name));
    rows.sort_by(|a, b| (a.verdict.health, &a.name).cmp(&(b.verdict.health, &b.name)));
    Page::of(rows, page)
}

/// Page `page` of the nodes whose names contain `query`, worst first.
pub fn nodes(view: &View, query: &str, page: usize) -> Page<NodeRow> {
    let mut states: Vec<NodeState> = node_states(view)
        .into_iter()
        .filter(|node| matches(node.name, query))
        .collect();
    states.sort_by(|a, b| (a.verdict.health, a.name).cmp(&(b.verdict.health, b.name)));
    let page = Page::of(states, page);
    let names: Vec<&str> = page.rows.iter().map(|node| node.name).collect();
    // Every listed node is registered: one summary each, in order.
    let summaries = read::node_summaries(view, &names);
    Page {
        rows: page
            .rows
            .into_iter()
            .zip(summaries)
            .map(|(node, summary)| NodeRow {
                verdict: node.verdict,
                summary,
            })
            .collect(),
        total: page.total,
        page: page.page,
        pages: page.pages,
    }
}

/// A service's page, with page `page` of its instances; `None` when
/// there is no such service.
pub fn service(view: &View, name: &str, page: usize) -> Option<ServicePage> {
    let spec = view.services.get(name)?;
    let summary = read::service_summary(view, name, &spec.value);
    let tally = tally_of(view, name);
    let ids: Vec<&str> = view
        .instances_of(name)
        .map(|held| held.value.id.as_str())
        .collect();
    Some(ServicePage {
        row: service_row(view, name, &spec.value, &tally),
        summary,
        spec: (*spec.value).clone(),
        instances: instance_page(view, ids, page),
        unplaced: view.unplaced.get(name).map(|held| (*held.value).clone()),
        endpoints: view
            .endpoints
            .get(name)
            .map(|ports| {
                ports
                    .iter()
                    .map(|(port, held)| (port.clone(), held.value.backends.len()))
                    .collect()
            })
            .unwrap_or_default(),
        rollout: read::rollout(view, name),
    })
}

/// A node's page, with page `page` of the instances placed on it.
pub fn node(view: &View, name: &str, page: usize) -> Option<NodePage> {
    let summary = read::node_summary(view, name)?;
    let ids: Vec<&str> = view
        .instances
        .values()
        .filter(|held| held.value.node == name)
        .map(|held| held.value.id.as_str())
        .collect();
    Some(NodePage {
        row: NodeRow {
            verdict: node_verdict(&summary.status, summary.draining, summary.disabled),
            summary,
        },
        instances: instance_page(view, ids, page),
        usage: read::node_usage(view, name),
        drain_held_by: read::drain_held_by(view, name),
    })
}

/// An instance's page: its placement and its latest report.
pub fn instance(view: &View, id: &str) -> Option<InstancePage> {
    let row = instance_row(view, id)?;
    let placement = view.instances.get(id).map(|held| (*held.value).clone());
    let status = view.statuses.get(id).map(|held| (*held.value).clone());
    let usage = read::instance_usage(view, &row.summary.node, id);
    Some(InstancePage {
        row,
        placement,
        status,
        usage,
    })
}

fn instance_page(view: &View, ids: Vec<&str>, page: usize) -> Page<InstanceRow> {
    let mut rows: Vec<InstanceRow> = ids
        .into_iter()
        .filter_map(|id| instance_row(view, id))
        .collect();
    rows.sort_by(|a, b| (a.verdict.health, &a.summary.id).cmp(&(b.verdict.health, &b.summary.id)));
    Page::of(rows, page)
}

fn instance_row(view: &View, id: &str) -> Option<InstanceRow> {
    let summary = read::instance_summary(view, id)?;
    let status = view.statuses.get(id).map(|held| &*held.value);
    Some(InstanceRow {
        verdict: instance_verdict(&summary, status),
        summary,
    })
}

fn instance_verdict(summary: &InstanceSummary, status: Option<&InstanceStatus>) -> Verdict {
    let mut verdict = Verdict::healthy();
    let words = || status.map(status_words).unwrap_or_default();
    match status.map(|status| status.state) {
        Some(InstanceState::Running) if summary.healthy == Some(false) => {
            verdict.flag(
                Health::Degraded,
                format!("failing its health check: {}", words()),
            );
        }
        Some(InstanceState::Running) => {}
        Some(InstanceState::Restarting) => verdict.flag(
            Health::Degraded,
            format!(
                "restarting after a crash ({} restarts): {}",
                summary.restarts,
                words()
            ),
        ),
        Some(InstanceState::Failed) => {
            verdict.flag(Health::Down, format!("failed: {}", words()));
        }
        Some(InstanceState::Pending | InstanceState::Starting) => {
            verdict.flag(Health::Progressing, format!("starting: {}", words()));
        }
        Some(InstanceState::Stopping | InstanceState::Stopped) => {
            verdict.flag(Health::Progressing, "stopping".into());
        }
        None => verdict.flag(
            Health::Progressing,
            format!("placed on {}; its agent has not reported yet", summary.node),
        ),
    }
    if summary.stopping && !verdict.reasons.iter().any(|r| r == "stopping") {
        verdict.reasons.push("the scheduler is stopping it".into());
    }
    if !summary.placed {
        verdict
            .reasons
            .push("no longer placed: what its node last reported".into());
    }
    verdict
}
