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
use crate::controller::{Changes, Context, Controller, Plan, Write};
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
        let names: Vec<&str> = controllers.iter().map(|c| c.name()).collect();
        metrics.know_controllers(&names);
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
            self.metrics.leadership_lost.inc();
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
        let interests = self.controller.interests();
        let mut notifications = self.runner.cache.subscribe();
        let mut pending = Pending::new();
        let mut pacing = Pacing::new();
        let mut next_resync = Instant::now() + self.runner.config.resync;
        loop {
            pending.drain(&mut notifications, interests);
            let started = Instant::now();
            let cycle = self.cycle(pacing.min_revision, pending.take()).await;
            // A timer wake after anything but a commit is a retry or a
            // requeue: neither is about particular facts.
            let timer_is_everything = !matches!(cycle, Cycle::Committed { .. });
            if matches!(cycle, Cycle::Conflict { .. } | Cycle::Failed) {
                pending.everything();
            }
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
                woken = pending.wait(&mut notifications, interests) => (woken, true),
                _ = sleep_until_opt(wake_at) => {
                    if timer_is_everything {
                        pending.everything();
                    }
                    (true, false)
                }
                _ = tokio::time::sleep_until(next_resync) => {
                    next_resync = Instant::now() + self.runner.config.resync;
                    pending.everything();
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
        changes: Changes,
    ) -> Option<Plan> {
        let (controller, view) = (Arc::clone(controller), Arc::clone(view));
        let reconcile = move || controller.reconcile_changes(&view, &context, &changes);
        match tokio::task::spawn_blocking(reconcile).await {
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
    async fn cycle(&self, min_revision: Revision, changes: Changes) -> Cycle {
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
        let plan = match Self::reconcile_apart(&self.controller, &view, context, changes).await {
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

/// Sleeps until `until`; false when told to stop meanwhile.
async fn rest(until: Option<Instant>, stop: &mut watch::Receiver<bool>) -> bool {
    let Some(until) = until else { return true };
    tokio::select! {
        () = tokio::time::sleep_until(until) => true,
        _ = stop.wait_for(|stop| *stop) => false,
    }
}

/// Facts one controller has not looked at yet, gathered from the cache's
/// notifications between its passes.
#[derive(Debug)]
struct Pending {
    /// Anything may have changed (the state a driver starts in).
    everything: bool,
    facts: Vec<crate::view::FactChange>,
}

impl Pending {
    /// Beyond this many facts a pass looks at everything: following them
    /// one by one would cost about as much and hold them all meanwhile.
    const MAX_FACTS: usize = 4_096;

    /// A driver's first pass looks at everything.
    fn new() -> Self {
        Self {
            everything: true,
            facts: Vec::new(),
        }
    }

    fn everything(&mut self) {
        self.everything = true;
        self.facts = Vec::new();
    }

    /// What the next pass is told, leaving nothing pending.
    fn take(&mut self) -> Changes {
        let everything = std::mem::replace(&mut self.everything, false);
        let facts = std::mem::take(&mut self.facts);
        if everything {
            Changes::Everything
        } else {
            Changes::Facts(facts)
        }
    }

    /// Adds one notification; true when it concerns `interests`. A lagged
    /// receiver counts as a change to everything.
    fn add(
        &mut self,
        notification: Result<Arc<Change>, broadcast::error::RecvError>,
        interests: &[Kind],
    ) -> bool {
        let change = match notification {
            Ok(change) => change,
            Err(_) => {
                self.everything();
                return true;
            }
        };
        if change.relisted {
            self.everything();
            return true;
        }
        let mut relevant = false;
        for fact in change
            .facts
            .iter()
            .filter(|fact| interests.contains(&fact.kind()))
        {
            relevant = true;
            if !self.everything {
                self.facts.push(fact.clone());
            }
        }
        if self.facts.len() > Self::MAX_FACTS {
            self.everything();
        }
        relevant
    }

    /// Takes every notification already waiting.
    fn drain(&mut self, notifications: &mut broadcast::Receiver<Arc<Change>>, interests: &[Kind]) {
        loop {
            match notifications.try_recv() {
                Err(
                    broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed,
                ) => return,
                Err(broadcast::error::TryRecvError::Lagged(skipped)) => {
                    self.add(Err(broadcast::error::RecvError::Lagged(skipped)), interests);
                }
                Ok(change) => {
                    self.add(Ok(change), interests);
                }
            }
        }
    }

    /// Waits for a change under one of `interests`, then takes every other
    /// waiting notification too (a burst folds into one pass). False once
    /// the cache is gone.
    async fn wait(
        &mut self,
        notifications: &mut broadcast::Receiver<Arc<Change>>,
        interests: &[Kind],
    ) -> bool {
        loop {
            let notification = notifications.recv().await;
            if matches!(notification, Err(broadcast::error::RecvError::Closed)) {
                return false;
            }
            if self.add(notification, interests) {
                self.drain(notifications, interests);
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cca_model::cluster::{NodeCondition, NodeStatus};

    use super::*;
    use crate::view::FactChange;

    fn change(revision: Revision, keys: &[&str]) -> Arc<Change> {
        let mut view = View::default();
        let status = NodeStatus {
            condition: NodeCondition::Ready,
            since: 0,
        };
        let bytes = serde_json::to_vec(&status).expect("encodes");
        let facts: Vec<FactChange> = keys
            .iter()
            .flat_map(|key| view.put(key, &bytes, revision))
            .collect();
        Arc::new(Change {
            revision,
            facts,
            relisted: false,
        })
    }

    fn keys_of(changes: &Changes) -> Option<Vec<String>> {
        match changes {
            Changes::Everything => None,
            Changes::Facts(facts) => Some(facts.iter().map(|f| f.key.to_string()).collect()),
        }
    }

    #[tokio::test]
    async fn pending_gathers_the_facts_of_interest_between_passes() {
        let (sender, mut receiver) = broadcast::channel(16);
        let mut pending = Pending::new();
        assert!(
            keys_of(&pending.take()).is_none(),
            "the first pass sees all"
        );
        assert_eq!(keys_of(&pending.take()), Some(vec![]));

        sender.send(change(2, &["derived/node/n1"])).expect("sent");
        sender
            .send(change(3, &["derived/node/n2", "derived/node/n3"]))
            .expect("sent");
        assert!(pending.wait(&mut receiver, &[Kind::NodeStatus]).await);
        assert_eq!(
            keys_of(&pending.take()),
            Some(vec![
                "derived/node/n1".into(),
                "derived/node/n2".into(),
                "derived/node/n3".into()
            ])
        );

        sender.send(change(4, &["derived/node/n1"])).expect("sent");
        pending.drain(&mut receiver, &[Kind::Heartbeat]);
        assert_eq!(
            keys_of(&pending.take()),
            Some(vec![]),
            "other kinds are left out"
        );
    }

    #[tokio::test]
    async fn lost_notifications_a_relist_or_a_flood_mean_everything() {
        let (sender, mut receiver) = broadcast::channel(2);
        let mut pending = Pending::new();
        let _ = pending.take();
        for revision in 2..6 {
            sender
                .send(change(revision, &["derived/node/n1"]))
                .expect("sent");
        }
        pending.drain(&mut receiver, &[Kind::NodeStatus]);
        assert!(keys_of(&pending.take()).is_none(), "lagged");

        sender
            .send(Arc::new(Change {
                revision: 7,
                facts: Vec::new(),
                relisted: true,
            }))
            .expect("sent");
        pending.drain(&mut receiver, &[Kind::NodeStatus]);
        assert!(keys_of(&pending.take()).is_none(), "relisted");

        let nodes: Vec<String> = (0..=Pending::MAX_FACTS)
            .map(|n| format!("derived/node/n{n}"))
            .collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        sender.send(change(8, &nodes)).expect("sent");
        pending.drain(&mut receiver, &[Kind::NodeStatus]);
        assert!(
            keys_of(&pending.take()).is_none(),
            "more than are worth following"
        );

        drop(sender);
        assert!(
            !pending.wait(&mut receiver, &[Kind::NodeStatus]).await,
            "the cache is gone"
        );
    }
}
