//! The runner: campaigns for leadership, then drives every controller —
//! wake on a relevant change (coalesced), on a requested requeue, or on the
//! periodic resync; reconcile on a fresh snapshot; refuse writes outside
//! the controller's domain; commit the plan in compare-and-swap
//! transactions guarded by the view's revisions and the fencing token;
//! retry conflicts with jittered backoff; answer no-op plans without a
//! write. Losing the lease stops every controller until leadership returns.

use std::sync::Arc;
use std::time::Duration;

use cca_model::clock::now_millis;

use cca_model::cluster::{Event, Millis};
use cca_model::keys::EventIds;
use cca_model::{Key, Kind, ownership};
use cca_store::{Compare, CompareOp, Op, Revision, Store, StoreError, Txn, TxnOutcome};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::cache::{Cache, Change};
use crate::controller::{Context, Controller, Plan, Write};
use crate::leader::{self, LeaderConfig, Leadership};
use crate::metrics::Metrics;
use crate::pacing::{Cycle, Decision, Pacing};
use crate::view::View;

/// How the runner behaves.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    pub leader: LeaderConfig,
    /// Every controller reconciles at least this often, changes or not.
    pub resync: Duration,
}

impl RunnerConfig {
    pub fn new(server_id: impl Into<String>) -> Self {
        Self {
            leader: LeaderConfig::new(server_id),
            resync: Duration::from_secs(30),
        }
    }
}

/// Runs controllers while this server leads.
#[derive(Clone)]
pub struct Runner {
    store: Arc<dyn Store>,
    cache: Arc<Cache>,
    controllers: Vec<Arc<dyn Controller>>,
    metrics: Arc<Metrics>,
    config: RunnerConfig,
    /// Keys of the events the controllers' plans log.
    events: Arc<EventIds>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.controllers.iter().map(|c| c.name()).collect();
        f.debug_struct("Runner")
            .field("controllers", &names)
            .finish_non_exhaustive()
    }
}

impl Runner {
    pub fn new(
        store: Arc<dyn Store>,
        cache: Arc<Cache>,
        controllers: Vec<Arc<dyn Controller>>,
        metrics: Arc<Metrics>,
        config: RunnerConfig,
    ) -> Self {
        Self {
            store,
            cache,
            controllers,
            metrics,
            config,
            events: Arc::new(EventIds::new(fastrand::u32(..))),
        }
    }

    /// Leads whenever it can until `shutdown` turns true; resigns on the way
    /// out so another server takes over at once.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let leadership = tokio::select! {
                leadership = leader::acquire(&self.store, &self.config.leader, now_millis) => leadership,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            self.metrics.leader.set(1);
            let stopping = self.lead(&leadership, &mut shutdown).await;
            self.metrics.leader.set(0);
            if stopping {
                leadership.resign(self.store.as_ref()).await;
                return;
            }
            tracing::warn!("no longer leader; campaigning again");
        }
    }

    /// Drives every controller until leadership ends (false) or shutdown
    /// (true).
    async fn lead(&self, leadership: &Leadership, shutdown: &mut watch::Receiver<bool>) -> bool {
        let (deposed, deposed_signal) = watch::channel(false);
        let mut drivers = tokio::task::JoinSet::new();
        for controller in &self.controllers {
            let driver = Driver {
                runner: self.clone(),
                controller: Arc::clone(controller),
                fence: leadership.fence(),
                leader_since: leadership.since,
                deposed: deposed.clone(),
            };
            drivers.spawn(driver.drive(deposed_signal.clone()));
        }
        let stopping = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => true,
            _ = leadership.lost() => false,
            _ = async { let mut signal = deposed_signal.clone(); let _ = signal.wait_for(|d| *d).await; } => false,
        };
        let _ = deposed.send(true);
        drivers.shutdown().await;
        stopping
    }
}

/// One controller's loop while this server leads.
struct Driver {
    runner: Runner,
    controller: Arc<dyn Controller>,
    fence: Compare,
    leader_since: Millis,
    deposed: watch::Sender<bool>,
}

impl Driver {
    async fn drive(self, mut stop: watch::Receiver<bool>) {
        let mut changes = self.runner.cache.subscribe();
        let mut pacing = Pacing::new();
        let mut next_resync = Instant::now() + self.runner.config.resync;
        loop {
            let started = Instant::now();
            let cycle = self.cycle(pacing.min_revision).await;
            let (wake_at, rest_until) =
                match pacing.after(&cycle, started, Instant::now(), fastrand::f64()) {
                    Decision::Wait {
                        wake_at,
                        rest_until,
                    } => (wake_at, rest_until),
                    Decision::Stop => {
                        let _ = self.deposed.send(true);
                        return;
                    }
                };
            let (woken, by_change) = tokio::select! {
                woken = wait_for_interest(&mut changes, self.controller.interests()) => (woken, true),
                _ = sleep_until_opt(wake_at) => (true, false),
                _ = tokio::time::sleep_until(next_resync) => {
                    next_resync = Instant::now() + self.runner.config.resync;
                    (true, false)
                }
                _ = stop.wait_for(|stop| *stop) => (false, false),
            };
            if !woken || (by_change && !rest(rest_until, &mut stop).await) {
                return;
            }
        }
    }

    /// Runs a reconcile on the blocking pool: a scheduler pass over 100,000
    /// instances is hundreds of milliseconds of CPU, and on an async worker
    /// it held every task queued behind it — heartbeats among them — for that
    /// long; on its own thread the OS shares the cores with them instead.
    /// `None` if the reconcile panicked (a bug: the cycle fails and is
    /// retried like any failed cycle).
    async fn reconcile_apart(
        controller: &Arc<dyn Controller>,
        view: &Arc<View>,
        context: Context,
    ) -> Option<Plan> {
        let (controller, view) = (Arc::clone(controller), Arc::clone(view));
        match tokio::task::spawn_blocking(move || controller.reconcile(&view, &context)).await {
            Ok(plan) => Some(plan),
            Err(error) => {
                tracing::error!(%error, "a reconcile failed unexpectedly");
                None
            }
        }
    }

    /// Gauges that read the view its owner reconciled.
    fn record_gauges(&self, name: &str, view: &View) {
        let metrics = &self.runner.metrics;
        match name {
            "scheduler" => {
                metrics.unplaced_services.set(view.unplaced.len() as i64);
            }
            "node" => {
                let paused = view.disruption.as_ref().is_some_and(|d| d.value.paused);
                metrics.replacement_paused.set(i64::from(paused));
                let unreachable = view
                    .nodes
                    .iter()
                    .filter(|(name, _)| !view.heartbeats.contains_key(name.as_str()))
                    .count();
                metrics.nodes_unreachable.set(unreachable as i64);
            }
            _ => {}
        }
    }

    /// Takes a view, reconciles, and commits the plan.
    async fn cycle(&self, min_revision: Revision) -> Cycle {
        let name = self.controller.name();
        let label = Metrics::label(name);
        let started = std::time::Instant::now();
        let view = match self.runner.cache.view_at_least(min_revision).await {
            Ok(view) => view,
            Err(_) => return Cycle::Failed,
        };
        let context = Context {
            now: now_millis(),
            leader_since: self.leader_since,
        };
        let plan = match Self::reconcile_apart(&self.controller, &view, context).await {
            Some(plan) => plan,
            None => return Cycle::Failed,
        };
        self.record_gauges(name, &view);
        let cycle = if plan.is_noop() {
            Cycle::Idle {
                requeue: plan.requeue_after,
            }
        } else {
            self.commit(&view, plan).await
        };
        self.runner.metrics.cycles.get_or_create(&label).inc();
        self.runner
            .metrics
            .cycle_seconds
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        match &cycle {
            Cycle::Conflict { .. } => {
                self.runner.metrics.conflicts.get_or_create(&label).inc();
            }
            Cycle::Failed => {
                self.runner.metrics.errors.get_or_create(&label).inc();
            }
            _ => {}
        }
        cycle
    }

    async fn commit(&self, view: &View, plan: Plan) -> Cycle {
        let owner = self.controller.owner();
        if let Some(refused) = plan
            .writes
            .iter()
            .find_map(|write| ownership::check_write(&owner, write.key()).err())
        {
            tracing::error!(controller = self.controller.name(), %refused, "plan refused: write outside the controller's domain");
            return Cycle::Failed;
        }
        let placements = count_placements(view, &plan);
        let max_ops = self.runner.store.max_txn_ops();
        let txns = match transactions(view, &plan, &self.fence, max_ops) {
            Ok(txns) => txns,
            Err(reason) => {
                tracing::error!(controller = self.controller.name(), %reason, "plan cannot be committed");
                return Cycle::Failed;
            }
        };
        let mut revision = view.revision;
        for txn in txns {
            match self.commit_one(txn).await {
                Ok(TxnOutcome::Committed {
                    revision: committed,
                }) => revision = committed,
                Ok(TxnOutcome::CompareFailed { index: 0, .. }) => return Cycle::Deposed,
                Ok(TxnOutcome::CompareFailed { revision, .. }) => {
                    return Cycle::Conflict { revision };
                }
                Err(error) => {
                    tracing::warn!(controller = self.controller.name(), %error, "commit failed");
                    return Cycle::Failed;
                }
            }
        }
        let label = Metrics::label(self.controller.name());
        self.runner
            .metrics
            .writes
            .get_or_create(&label)
            .inc_by(plan.writes.len() as u64);
        self.runner.metrics.placements.inc_by(placements);
        self.log_events(&plan).await;
        Cycle::Committed {
            revision,
            requeue: plan.requeue_after,
        }
    }

    async fn commit_one(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let started = std::time::Instant::now();
        let outcome = self.runner.store.txn(txn).await;
        self.runner
            .metrics
            .store_txn_seconds
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    /// Events are best effort: a lost event must not undo a committed plan.
    async fn log_events(&self, plan: &Plan) {
        if plan.events.is_empty() {
            return;
        }
        let at = now_millis();
        let txn = plan.events.iter().fold(Txn::new(), |txn, draft| {
            let event = Event {
                at,
                level: draft.level,
                source: self.controller.name().to_owned(),
                subject: draft.subject.clone(),
                message: draft.message.clone(),
            };
            let value = serde_json::to_vec(&event).unwrap_or_default();
            txn.then(Op::put(self.runner.events.key(at), value))
        });
        for draft in &plan.events {
            match draft.level {
                cca_model::cluster::EventLevel::Warning => {
                    tracing::warn!(subject = %draft.subject, "{}", draft.message);
                }
                cca_model::cluster::EventLevel::Info => {
                    tracing::info!(subject = %draft.subject, "{}", draft.message);
                }
            }
        }
        for chunk in split_ops(txn.ops, self.runner.store.max_txn_ops()) {
            if let Err(error) = self
                .runner
                .store
                .txn(Txn {
                    compares: Vec::new(),
                    ops: chunk,
                })
                .await
            {
                tracing::warn!(%error, "writing events failed");
            }
        }
    }
}

/// New instance records in a plan (for the placements counter).
fn count_placements(view: &View, plan: &Plan) -> u64 {
    plan.writes
        .iter()
        .filter(|write| {
            matches!(write, Write::Put { key, .. } if Key::parse(key).is_some_and(|key| key.kind() == Kind::Instance) && view.mod_revision(key) == 0)
        })
        .count() as u64
}

/// The plan as transactions of at most `max_ops` ops and compares each:
/// the fencing compare first (index 0 means "deposed"), then the plan's
/// guards, then one compare per written key against the view's revision.
fn transactions(
    view: &View,
    plan: &Plan,
    fence: &Compare,
    max_ops: usize,
) -> Result<Vec<Txn>, String> {
    let guards: Vec<Compare> = plan
        .guards
        .iter()
        .map(|key| Compare::mod_revision(key, CompareOp::Equal, view.mod_revision(key)))
        .collect();
    let fixed = 1 + guards.len();
    if fixed >= max_ops {
        return Err(format!(
            "the plan has {} guards; a transaction holds at most {max_ops} compares",
            guards.len()
        ));
    }
    let per_txn = max_ops - fixed;
    let txns = plan
        .writes
        .chunks(per_txn)
        .map(|writes| {
            let mut txn = Txn::new().when(fence.clone());
            txn.compares.extend(guards.iter().cloned());
            for write in writes {
                if View::tracks(write.key()) {
                    txn = txn.when(Compare::mod_revision(
                        write.key(),
                        CompareOp::Equal,
                        view.mod_revision(write.key()),
                    ));
                }
                txn = txn.then(match write {
                    Write::Put { key, value } => Op::put(key, value.clone()),
                    Write::Delete { key } => Op::delete(key),
                });
            }
            txn
        })
        .collect();
    Ok(txns)
}

fn split_ops(ops: Vec<Op>, max_ops: usize) -> Vec<Vec<Op>> {
    ops.chunks(max_ops.max(1)).map(<[Op]>::to_vec).collect()
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a change under one of `interests`, then drains every other
/// pending notification (coalescing a burst into one reconcile). A lagged
/// receiver counts as a change: anything may have happened.
/// Sleeps until `until`; false when told to stop meanwhile.
async fn rest(until: Option<Instant>, stop: &mut watch::Receiver<bool>) -> bool {
    let Some(until) = until else { return true };
    tokio::select! {
        () = tokio::time::sleep_until(until) => true,
        _ = stop.wait_for(|stop| *stop) => false,
    }
}

async fn wait_for_interest(
    changes: &mut broadcast::Receiver<Arc<Change>>,
    interests: &[Kind],
) -> bool {
    loop {
        let relevant = match changes.recv().await {
            Ok(change) => touches(&change, interests),
            Err(broadcast::error::RecvError::Lagged(_)) => true,
            Err(broadcast::error::RecvError::Closed) => return false,
        };
        if relevant {
            while changes.try_recv().is_ok() {}
            return true;
        }
    }
}

fn touches(change: &Change, interests: &[Kind]) -> bool {
    change.relisted
        || change
            .facts
            .iter()
            .any(|fact| interests.contains(&fact.kind()))
}
