//! `cca benchmark --tls` at a tiny size, so the TLS path cannot rot: a
//! deploy converges with every agent on HTTPS with its own node
//! certificate, and the cluster it runs on really demands certificates:
//! plain HTTP is not served, a node's certificate opens only its own
//! agent routes, the harness's (the local admin's) the user routes.

use std::sync::Arc;
use std::time::Duration;

use cca_bench::{BenchConfig, Cluster, ClusterConfig, Progress, Scenario, StoreTarget};
use cca_model::spec::{Cpu, Memory};
use cca_runtime::sim::SimConfig;
use cca_store::Store;
use cca_store::embedded::{Config, EmbeddedStore};
use cca_wire::{Client, ClientError};

struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _what: &str, _total: u64) {}
    fn advance(&self, _done: u64) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_with_tls_converges_and_reports_its_certificates() {
    // Heartbeats to the liveness listener, then over the API connection.
    for liveness_over_api in [false, true] {
        let mut config = BenchConfig::new(4, 20, StoreTarget::Embedded(None));
        config.node_leases.shortest = Duration::from_secs(2);
        config.timeout = Duration::from_secs(30);
        config.probe_window = Duration::from_millis(200);
        config.tls = true;
        config.liveness_over_api = liveness_over_api;
        let report = cca_bench::run_scenario(Scenario::Deploy, &config, &Quiet)
            .await
            .unwrap_or_else(|error| panic!("deploy with TLS: {error}"));
        assert!(report.passed(), "{report:#?}");
        assert_eq!(report.instances, 20, "{report:#?}");
        assert_eq!(report.success_rate, 1.0, "{report:#?}");
        assert!(report.tls, "{report:#?}");
        assert_eq!(report.liveness_over_api, liveness_over_api);
        assert!(
            report
                .certificates_seconds
                .is_some_and(|seconds| seconds > 0.0),
            "{report:#?}"
        );
        assert!(report.connection_per_node, "{report:#?}");
        let json = serde_json::to_value(&report).expect("a report serialises");
        assert_eq!(json["tls"], true);
        assert!(json["certificates_seconds"].is_number(), "{json}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_deploy_with_a_connection_per_node_converges_and_reports_its_cpu() {
    // With a liveness listener of their own, every agent's second client
    // is opened there too (where `/v1/identity` is not found).
    let mut config = BenchConfig::new(4, 20, StoreTarget::Embedded(None));
    config.node_leases.shortest = Duration::from_secs(2);
    config.timeout = Duration::from_secs(30);
    config.probe_window = Duration::from_millis(200);
    config.connection_per_node = true;
    let report = cca_bench::run_scenario(Scenario::Deploy, &config, &Quiet)
        .await
        .unwrap_or_else(|error| panic!("deploy with a connection per node: {error}"));
    assert!(report.passed(), "{report:#?}");
    assert_eq!(report.success_rate, 1.0, "{report:#?}");
    assert!(!report.tls && report.connection_per_node, "{report:#?}");
    let cpu = report.cpu_seconds.expect("a deploy reports its CPU time");
    // No more than every core for the whole span (and a clock tick).
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    assert!(
        cpu > 0.0 && cpu <= cores as f64 * report.seconds + 0.05,
        "{report:#?}"
    );
    // Part of it (counted in 10 ms ticks per thread, so it may be 0 for
    // a deploy this small: `measure`'s own tests see it grow).
    let plane = report.plane_cpu_seconds.expect("and the control plane's");
    assert!(plane <= cpu + 0.01, "{report:#?}");
    let json = serde_json::to_value(&report).expect("a report serialises");
    assert_eq!(json["connection_per_node"], true, "{json}");
    assert!(json["cpu_seconds"].is_number(), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_admits_only_certificates_and_nodes_only_as_themselves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect("store opens"),
    );
    let config = ClusterConfig {
        nodes: 2,
        node_cpu: Cpu(4000),
        node_memory: Memory(4 << 30),
        sim: SimConfig::default(),
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
        tls: true,
        liveness_over_api: false,
        connection_per_node: false,
    };
    let cluster = Cluster::start(store, config).await.expect("cluster starts");
    // Nodes become ready only if their registrations and heartbeats, over
    // HTTPS with their own certificates, were admitted.
    cluster
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("both nodes ready");
    let base = cluster.client().base_url().to_owned();
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    assert!(cluster.certificates_seconds().is_some());
    let status = cluster
        .client()
        .status()
        .await
        .expect("the harness is the local admin");
    assert_eq!(status.nodes.ready, 2);

    let names = cluster.node_names();
    let own = cluster.node_tls_client(&names[0]).expect("a node's client");
    assert_eq!(
        status_of(own.status().await),
        403,
        "a node may not use user routes"
    );
    // A made-up lease: the authentication layer answers before the route.
    assert_eq!(
        status_of(own.heartbeat(&names[1], 1).await),
        403,
        "a node may not act as another"
    );
    let as_itself = status_of(own.heartbeat(&names[0], 1).await);
    assert!(
        ![401, 403].contains(&as_itself),
        "a node may act as itself (its stale lease aside): HTTP {as_itself}"
    );

    // Plain HTTP is not served at all.
    let plain = Client::new(&base.replacen("https://", "http://", 1));
    assert!(
        plain.status().await.is_err(),
        "plain HTTP was answered on the TLS listener"
    );
    cluster.stop().await;
}

/// The HTTP status of an API call's answer.
fn status_of<T>(result: Result<T, ClientError>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(ClientError::Api { status, .. }) => status,
        Err(other) => panic!("expected an HTTP answer, got {other}"),
    }
}
