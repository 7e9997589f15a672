//! Instances run the spec they were placed with, on the real control plane
//! (store, cache, scheduler, API) and a real agent: in the middle of a
//! rolling update, an agent that restarts is sent each instance's own
//! version, and once its node reboots it re-creates the old version's
//! instances with the old spec and the new version's with the new one.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cca_bench::{Cluster, ClusterConfig};
use cca_model::spec::{
    Cpu, Memory, Program, Resources, ServiceSpec, UpdateStrategy, Workload, spec_hash,
};
use cca_runtime::Runtime;
use cca_runtime::sim::{SimConfig, StartLatency};
use cca_store::Store;
use cca_store::embedded::{Config, EmbeddedStore};
use cca_wire::Client;
use cca_wire::InstanceQuery;
use cca_wire::types::ServiceHistory;

const WAIT: Duration = Duration::from_secs(30);

/// Two replicas with `VERSION` in their environment; the update adds one
/// new instance at a time and stops an old one only once a new one runs.
fn web(version: &str) -> ServiceSpec {
    ServiceSpec {
        replicas: 2,
        env: BTreeMap::from([("VERSION".to_owned(), version.to_owned())]),
        resources: Resources {
            cpu: Some(Cpu(100)),
            memory: Some(Memory(64 << 20)),
        },
        update: UpdateStrategy {
            max_unavailable: 0,
            max_surge: 1,
            rollback_after: 3,
        },
        ..ServiceSpec::new("web", Workload::process("web --serve"))
    }
}

fn program(spec: ServiceSpec) -> Program {
    let mut program = Program::default();
    program.services.insert(spec.name.clone(), spec);
    program
}

async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many placed instances run each version.
async fn running_versions(client: &Client) -> BTreeMap<String, usize> {
    let history: ServiceHistory = client.service_history("web").await.expect("history");
    history
        .versions
        .into_iter()
        .map(|version| (version.version, version.instances))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rebooted_during_a_rolling_update_restarts_old_instances_as_old() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("store opens"),
    );
    let config = ClusterConfig {
        nodes: 1,
        node_cpu: Cpu(4000),
        node_memory: Memory(4 << 30),
        // Slow starts keep the new version's first instance starting (so
        // not ready) for a while: the rollout is caught half way.
        sim: SimConfig {
            start_latency: StartLatency::Fixed(Duration::from_secs(3)),
            ..SimConfig::default()
        },
        node_leases: cca_model::node_lease::NodeLeases {
            shortest: Duration::from_secs(5),
            ..Default::default()
        },
        lost_grace: Duration::from_secs(30),
        startup_grace: Duration::ZERO,
        agent_tick: Duration::from_millis(100),
        resume_replacement_after: None,
        usage_every: Duration::from_secs(30),
        scale_down_window: Duration::from_secs(300),
        tls: false,
        liveness_over_api: false,
        connection_per_node: false,
    };
    let mut cluster = Cluster::start(store, config).await.expect("cluster starts");
    cluster.wait_ready(WAIT).await.expect("the node is ready");
    let client = cluster.client().clone();
    let node = cluster.node_names().remove(0);
    let (v1, v2) = (spec_hash(&web("1")), spec_hash(&web("2")));

    client
        .apply(&program(web("1")), false)
        .await
        .expect("v1 applies");
    let query = InstanceQuery {
        service: Some("web".to_owned()),
        ..InstanceQuery::default()
    };
    eventually("two v1 instances running", || async {
        let rows = client.instances(&query).await.ok()?;
        (rows.iter().filter(|row| row.state == "running").count() == 2).then_some(())
    })
    .await;

    client
        .apply(&program(web("2")), false)
        .await
        .expect("v2 applies");
    eventually("a v2 instance placed next to both v1s", || async {
        let running = running_versions(&client).await;
        (running.get(&v2) == Some(&1) && running.get(&v1) == Some(&2)).then_some(())
    })
    .await;
    // Freeze the rollout half way: both versions placed at once.
    cluster.stop_controllers().await;
    assert_eq!(
        running_versions(&client).await,
        BTreeMap::from([(v1.clone(), 2), (v2.clone(), 1)]),
        "the rollout stopped half way"
    );

    // The agent restarts: it is sent a snapshot of its assignments and
    // keeps it. A write first makes that snapshot newer than anything the
    // agent had, so the wait below knows when it arrived.
    let mut other = web("x");
    other.name = "other".to_owned();
    other.replicas = 0;
    client.apply(&program(other), false).await.expect("applies");
    let written = client.status().await.expect("status").revision;
    assert!(
        cluster.restart_agent(&node, false).await,
        "node {node} exists"
    );
    let dir = cluster.agent_dir(&node);
    let known = eventually("the restarted agent's snapshot", || async {
        let desired = cca_agent::Desired::load(&dir).ok()?;
        (desired.revision >= written).then_some(desired)
    })
    .await;
    for (id, assignment) in &known.assignments {
        let spec = assignment.spec.as_ref().expect("a spec");
        assert_eq!(spec_hash(spec), assignment.instance.spec_hash, "{id}");
    }
    // The machine reboots: the agent re-creates every instance from what
    // it was sent.
    assert!(
        cluster.restart_agent(&node, true).await,
        "node {node} exists"
    );
    let runtime = cluster.runtime(&node).expect("the node's runtime");
    let placed = client.instances(&query).await.expect("instances");
    assert_eq!(placed.len(), 3, "{placed:?}");
    for row in placed {
        let detail = client.instance(&row.id).await.expect("instance");
        let hash = detail.placement.expect("placed").spec_hash;
        let expected = if hash == v1 { "1" } else { "2" };
        let created = eventually(&format!("{} re-created", row.id), || async {
            runtime.inspect(&row.id).await.ok()
        })
        .await;
        assert_eq!(
            created.spec.env.get("VERSION").map(String::as_str),
            Some(expected),
            "{} was placed with {hash} (v1 is {v1})",
            row.id
        );
    }
    cluster.stop().await;
}
