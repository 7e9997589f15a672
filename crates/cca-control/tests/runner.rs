//! The runner against real stores: plans are committed and no-op plans
//! cost no write; writes outside a controller's domain are refused; a plan
//! committed in parts and cut off between any two of them converges under
//! the next leader; and on a real etcd two servers elect exactly one
//! leader, the other takes over within the lease TTL when the leader dies,
//! and the deposed leader's late commit is refused by the fencing token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_control::controllers::{NodeController, SchedulerController};
use cca_control::leader::LeaderRecord;
use cca_control::metrics::Metrics;
use cca_control::runner::{Runner, RunnerConfig};
use cca_control::{Cache, Context, Controller, Plan, View, Write};
use cca_model::{Kind, keys};
use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::etcd::EtcdStore;
use cca_store::testing::CrashAfter;
use cca_store::testing::etcd::EtcdServer;
use cca_store::{Compare, CompareOp, Op, RangeRequest, Store, Txn, TxnOutcome};
use tokio::sync::watch;

/// Writes `key` once (as the controller named `name`), then is converged.
struct WriteOnce {
    name: &'static str,
    key: String,
}

impl Controller for WriteOnce {
    fn name(&self) -> &'static str {
        self.name
    }

    fn interests(&self) -> &'static [Kind] {
        &[Kind::Endpoint]
    }

    fn reconcile(&self, view: &View, _: &Context) -> Plan {
        let mut plan = Plan::default();
        if view.mod_revision(&self.key) == 0 {
            plan.writes.push(Write::put_json(
                self.key.clone(),
                &serde_json::json!({"service": "s", "port": "p", "backends": []}),
            ));
        }
        plan
    }
}

async fn embedded() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(Config::new(dir.path()))
        .await
        .expect("open");
    (Arc::new(store), dir)
}

struct Server {
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(
    store: Arc<dyn Store>,
    id: &str,
    controller: Arc<dyn Controller>,
    ttl: Duration,
) -> Server {
    start_all(store, id, vec![controller], ttl).await
}

async fn start_all(
    store: Arc<dyn Store>,
    id: &str,
    controllers: Vec<Arc<dyn Controller>>,
    ttl: Duration,
) -> Server {
    let cache = Arc::new(Cache::start(Arc::clone(&store)).await.expect("cache"));
    let metrics = Arc::new(Metrics::new());
    let mut config = RunnerConfig::new(id);
    config.leader.ttl = ttl;
    let runner = Runner::new(store, cache, controllers, Arc::clone(&metrics), config);
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(runner.run(stopped));
    Server {
        metrics,
        stop,
        task,
    }
}

async fn eventually(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

fn metric(metrics: &Metrics, line_start: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find(|line| line.starts_with(line_start))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_committed_once_and_a_converged_view_costs_no_write() {
    let (store, _dir) = embedded().await;
    let key = keys::derived_endpoint("web", "http");
    let controller = Arc::new(WriteOnce {
        name: "endpoint",
        key: key.clone(),
    });
    let server = start(Arc::clone(&store), "a", controller, Duration::from_secs(2)).await;
    eventually("the plan's write", Duration::from_secs(5), async || {
        store.get(&key).await.expect("get").is_some()
    })
    .await;
    let settled = store.current_revision().await.expect("revision");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.current_revision().await.expect("revision"),
        settled,
        "a no-op plan wrote"
    );
    assert_eq!(
        metric(
            &server.metrics,
            "reconciliation_writes_total{controller=\"endpoint\"}"
        ),
        1.0
    );
    assert!(
        metric(
            &server.metrics,
            "reconciliation_cycle_total{controller=\"endpoint\"}"
        ) >= 2.0
    );
    assert_eq!(metric(&server.metrics, "leader "), 1.0);
    let _ = server.stop.send(true);
    server.task.await.expect("runner stops");
    assert_eq!(
        store.get(&cca_model::keys::leader()).await.expect("get"),
        None,
        "a stopping leader resigns"
    );
}

/// Leadership that lapses under a running leader (its lease gone) is
/// counted, unlike a resignation, and the server campaigns again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_leadership_is_counted_and_campaigned_for_again() {
    let (store, _dir) = embedded().await;
    let controller = Arc::new(WriteOnce {
        name: "endpoint",
        key: keys::derived_endpoint("lapse", "a"),
    });
    let server = start(
        Arc::clone(&store),
        "server-a",
        controller,
        Duration::from_secs(2),
    )
    .await;
    eventually("leadership", Duration::from_secs(5), async || {
        metric(&server.metrics, "leader ") == 1.0
    })
    .await;
    assert_eq!(metric(&server.metrics, "leadership_lost_total "), 0.0);
    let record = store
        .get(&cca_model::keys::leader())
        .await
        .expect("get")
        .expect("a leader");
    let lease = record.lease.expect("the leader record is leased");
    store.revoke_lease(lease).await.expect("revoke");

    eventually(
        "the loss to be counted",
        Duration::from_secs(10),
        async || metric(&server.metrics, "leadership_lost_total ") == 1.0,
    )
    .await;
    eventually("leadership again", Duration::from_secs(10), async || {
        metric(&server.metrics, "leader ") == 1.0
    })
    .await;
    let _ = server.stop.send(true);
    server.task.await.expect("runner stops");
    assert_eq!(
        metric(&server.metrics, "leadership_lost_total "),
        1.0,
        "resigning on the way out is not a loss"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_outside_the_controllers_domain_is_refused() {
    let (store, _dir) = embedded().await;
    let foreign = keys::derived_instance("web", "web-1");
    let controller = Arc::new(WriteOnce {
        name: "endpoint",
        key: foreign.clone(),
    });
    let server = start(Arc::clone(&store), "a", controller, Duration::from_secs(2)).await;
    eventually("a refused cycle", Duration::from_secs(5), async || {
        metric(
            &server.metrics,
            "reconciliation_errors_total{controller=\"endpoint\"}",
        ) >= 1.0
    })
    .await;
    assert_eq!(store.get(&foreign).await.expect("get"), None);
    let derived = store
        .range(RangeRequest::prefix(keys::DERIVED))
        .await
        .expect("range");
    assert!(
        derived.kvs.is_empty(),
        "nothing under derived/ may be written: {:?}",
        derived.kvs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_etcd_elect_one_leader_and_fail_over_within_the_ttl() {
    const TTL: Duration = Duration::from_secs(2);
    let etcd = EtcdServer::start();
    let connect = || async {
        let store = EtcdStore::connect(cca_store::etcd::Config::new(vec![etcd.endpoint()]))
            .await
            .expect("connect");
        Arc::new(store) as Arc<dyn Store>
    };
    let observer = connect().await;
    let writes = |server: &str| -> Arc<dyn Controller> {
        Arc::new(WriteOnce {
            name: "endpoint",
            key: keys::derived_endpoint("leader", server),
        })
    };
    let a = start(connect().await, "server-a", writes("server-a"), TTL).await;
    let b = start(connect().await, "server-b", writes("server-b"), TTL).await;

    eventually(
        "a leader's controller to run",
        Duration::from_secs(5),
        async || {
            observer
                .range(RangeRequest::prefix("derived/endpoint/leader/"))
                .await
                .expect("range")
                .kvs
                .len()
                == 1
        },
    )
    .await;
    let record = observer
        .get(&cca_model::keys::leader())
        .await
        .expect("get")
        .expect("a leader");
    let leader: LeaderRecord = serde_json::from_slice(&record.value).expect("leader record");
    let (leading, standby, standby_name) = if leader.server == "server-a" {
        (a, b, "server-b")
    } else {
        (b, a, "server-a")
    };
    assert_eq!(metric(&leading.metrics, "leader "), 1.0);
    assert_eq!(
        metric(&standby.metrics, "leader "),
        0.0,
        "exactly one server leads"
    );
    let ran: Vec<String> = observer
        .range(RangeRequest::prefix("derived/endpoint/leader/"))
        .await
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        ran,
        [keys::derived_endpoint("leader", &leader.server)],
        "only the leader's controllers run"
    );

    // The leader dies without resigning: its lease must run out.
    leading.task.abort();
    let killed = Instant::now();
    eventually("the standby to take over", TTL * 3, async || {
        metric(&standby.metrics, "leader ") == 1.0
    })
    .await;
    let takeover = killed.elapsed();
    eprintln!("takeover after {takeover:?} with a {TTL:?} lease TTL");
    assert!(
        takeover <= TTL + Duration::from_millis(2500),
        "takeover took {takeover:?} with a {TTL:?} TTL"
    );
    eventually(
        "the new leader's controller to run",
        Duration::from_secs(5),
        async || {
            observer
                .get(&keys::derived_endpoint("leader", standby_name))
                .await
                .expect("get")
                .is_some()
        },
    )
    .await;

    // A late commit fenced with the old leader's token is refused.
    let stale_fence = Compare::mod_revision(
        cca_model::keys::leader(),
        CompareOp::Equal,
        record.mod_revision,
    );
    let late = Txn::new()
        .when(stale_fence)
        .then(Op::put(keys::derived_endpoint("late", "write"), "{}"));
    let outcome = observer.txn(late).await.expect("txn");
    assert!(
        matches!(outcome, TxnOutcome::CompareFailed { index: 0, .. }),
        "{outcome:?}"
    );
    assert_eq!(
        observer
            .get(&keys::derived_endpoint("late", "write"))
            .await
            .expect("get"),
        None
    );
    let _ = standby.stop.send(true);
    let _ = standby.task.await;
}

/// Writes nothing and takes `pass` of real time; records when each pass
/// started and ended.
struct SlowIdle {
    pass: Duration,
    passes: std::sync::Mutex<Vec<(Instant, Instant)>>,
}

impl Controller for SlowIdle {
    fn name(&self) -> &'static str {
        "endpoint"
    }

    fn interests(&self) -> &'static [Kind] {
        &[Kind::Node, Kind::Heartbeat, Kind::InstanceStatus]
    }

    fn reconcile(&self, _: &View, _: &Context) -> Plan {
        let started = Instant::now();
        std::thread::sleep(self.pass);
        let mut passes = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        passes.push((started, Instant::now()));
        Plan::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_pass_that_wrote_nothing_a_change_waits_as_long_as_the_pass_took() {
    let (store, _dir) = embedded().await;
    let pass = Duration::from_millis(150);
    let controller = Arc::new(SlowIdle {
        pass,
        passes: std::sync::Mutex::new(Vec::new()),
    });
    let server = start(
        Arc::clone(&store),
        "a",
        Arc::clone(&controller) as Arc<dyn Controller>,
        Duration::from_secs(5),
    )
    .await;
    // Changes the controller is interested in, without pause, for 1.5 s.
    let until = Instant::now() + Duration::from_millis(1_500);
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let beat = br#"{"lease_ttl_secs":15,"started_at":0}"#.to_vec();
        store
            .txn(Txn::new().then(Op::put(keys::observed_heartbeat(&format!("n{n}")), beat)))
            .await
            .expect("put");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.stop.send_replace(true);
    server.task.await.expect("runner ends");
    let passes = controller
        .passes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    assert!(passes.len() >= 3, "passes ran: {passes:?}");
    // A slow machine only makes the rests longer; pacing makes none shorter.
    for pair in passes.windows(2) {
        let ((started, ended), (next, _)) = (pair[0], pair[1]);
        let took = ended - started;
        let rested = next.saturating_duration_since(ended);
        assert!(
            rested >= took.mul_f64(0.9),
            "a pass of {took:?} was followed after {rested:?}: {passes:?}"
        );
    }
}

/// The cluster of the crash test: four nodes alive, one service of 30.
async fn seed_cluster(store: &dyn Store) {
    let mut txn = Txn::new();
    for node in ["n1", "n2", "n3", "n4"] {
        let info = serde_json::json!({
            "name": node, "cpu": 4000, "memory": 8_589_934_592_u64, "arch": "amd64",
            "zone": null, "labels": {}, "addresses": ["127.0.0.1"], "agent_url": null,
            "registered_at": 0
        });
        let beat = serde_json::json!({"lease_ttl_secs": 15, "started_at": 0});
        txn = txn
            .then(Op::put(
                keys::observed_node(node),
                info.to_string().into_bytes(),
            ))
            .then(Op::put(
                keys::observed_heartbeat(node),
                beat.to_string().into_bytes(),
            ));
    }
    let service = serde_json::json!({
        "name": "web", "workload": {"kind": "process", "run": "sleep 1000"},
        "replicas": 30, "ports": [], "env": {}, "resources": {"cpu": 100, "memory": 67_108_864},
        "health": null, "placement": {"colocate": [], "separate": [], "restrict": {}, "spread": []},
        "connections": [], "volumes": [], "init": [],
        "update": {"max_unavailable": 1, "max_surge": 1, "rollback_after": 3},
        "budget": null, "autoscale": null, "stateful": false, "scale_to_zero": null
    });
    txn = txn.then(Op::put(
        keys::desired_service("web"),
        service.to_string().into_bytes(),
    ));
    let outcome = store.txn(txn).await.expect("seed");
    assert!(matches!(outcome, TxnOutcome::Committed { .. }));
}

fn control_plane() -> Vec<Arc<dyn Controller>> {
    let mut scheduler = SchedulerController::default();
    scheduler.config.startup_grace = Duration::ZERO;
    vec![Arc::new(NodeController::default()), Arc::new(scheduler)]
}

async fn placements(store: &dyn Store) -> Vec<String> {
    let page = store
        .range(RangeRequest::prefix(Kind::Instance.prefix()))
        .await
        .expect("range");
    page.kvs.into_iter().map(|kv| kv.key).collect()
}

/// The runner's contract (controller.rs): a plan larger than a transaction
/// is committed in parts, so a leader that dies between parts leaves some
/// of its plan committed. The next leader must converge from there, to
/// exactly the replicas asked for: no duplicate, nothing lost. Tried at
/// every crash point, with transactions of 8 operations (the scheduler's
/// 30 placements take several).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_cut_off_between_its_parts_converges_under_the_next_leader() {
    let ttl = Duration::from_secs(1);
    let mut cut_with_some_placed = 0;
    for commits in 1..=12 {
        let (store, _dir) = embedded().await;
        seed_cluster(store.as_ref()).await;
        let crashing = Arc::new(CrashAfter::new(Arc::clone(&store), commits, 8));
        let doomed = start_all(crashing.clone(), "doomed", control_plane(), ttl).await;
        eventually(
            "the crash or convergence",
            Duration::from_secs(10),
            async || crashing.crashed() || placements(store.as_ref()).await.len() == 30,
        )
        .await;
        doomed.task.abort();
        let partial = placements(store.as_ref()).await.len();
        if (1..30).contains(&partial) {
            cut_with_some_placed += 1;
        }

        let next = start_all(Arc::clone(&store), "next", control_plane(), ttl).await;
        eventually("30 placements", Duration::from_secs(10), async || {
            placements(store.as_ref()).await.len() == 30
        })
        .await;
        // Settled: the next passes neither add nor remove any.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let placed = placements(store.as_ref()).await;
        assert_eq!(placed.len(), 30, "after a crash at commit {commits}");
        let _ = next.stop.send(true);
        let _ = next.task.await;
    }
    assert!(
        cut_with_some_placed > 0,
        "no crash point fell between two parts of the scheduler's plan"
    );
}
