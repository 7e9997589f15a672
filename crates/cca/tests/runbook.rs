//! The operations runbook (docs/operations.md) walked on real processes:
//! one `cca server` and four `cca agent`s, each its own process with its
//! own data directory and loopback address, running `cca whoami`
//! instances. In order: each node's pre-flight (`cca readiness agent`);
//! the post-incident commands on a healthy cluster and on unplaceable
//! demand (`cca status`, `cca get instances | grep -c "failed\|pending"`,
//! `cca node-inspect`, `/metrics`); a partition (an agent frozen with
//! SIGSTOP past its lease while its instances are replaced elsewhere, then
//! thawed: its duplicates stop and no longer answer); a mass node failure
//! (two of four agents killed at once: replacement pauses until `cca
//! resume-replacement`, and the returning agents stop what they ran); the
//! control plane down (workloads keep serving, the cluster converges when
//! it returns); a rolling restart of every agent, as an upgrade does it
//! (no workload restarts); and `cca events --follow` having seen it all. Store loss
//! with and without a backup and a store gone back in time are walked by
//! `store_recovery.rs`, leader failover by `failover.rs`. Every process
//! this test starts is killed when it ends, pass or fail.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use cca_wire::types::InstanceSummary;
use support::cluster::{Cluster, all_running, answers, eventually, instances, pid_and_url};
use support::{CCA, Proc, signal};

const PROGRAM: &str = r#"
service web {
  run = "cca whoami --port $PORT"
  replicas = 4
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 1s
  }
}
"#;

/// Asks more memory than any node has: its demand stays pending.
const UNPLACEABLE: &str = r#"
service huge {
  run = "sleep 1000"
  resources { memory = 100Gi }
}
"#;

const NODES: [(&str, &str); 4] = [
    ("n1", "127.0.0.21"),
    ("n2", "127.0.0.22"),
    ("n3", "127.0.0.23"),
    ("n4", "127.0.0.24"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbook_works_as_written_on_a_cluster_of_processes() {
    let mut cluster = Cluster::new();
    cluster.start_server();
    for (node, address) in NODES {
        preflight(&cluster, node);
        cluster.start_agent(node, address);
    }
    let client = cluster.client();
    let followed = cluster.dir.path().join("events.ndjson");
    let _follower = follow_events(&cluster, &followed);
    cluster.apply("web.cca", PROGRAM);
    eventually(
        "4 web instances running",
        Duration::from_secs(60),
        async || all_running(&client, 4).await,
    )
    .await;

    post_incident_checks_see_a_healthy_cluster(&cluster).await;
    pending_demand_is_counted_by_grep(&cluster).await;
    a_frozen_node_s_duplicates_stop_when_it_thaws(&mut cluster).await;
    a_mass_node_failure_pauses_replacement_until_resumed(&mut cluster).await;
    workloads_outlive_the_control_plane(&mut cluster).await;
    a_rolling_restart_restarts_no_workload(&mut cluster).await;

    // The event stream saw the partition, the pause and its end.
    let seen = std::fs::read_to_string(&followed).unwrap_or_default();
    for expected in [
        "node is unreachable: its heartbeat lease expired",
        "lost-node replacement paused: 2 of 4 nodes",
        "lost-node replacement resumed: an operator said",
    ] {
        assert!(
            seen.contains(expected),
            "events --follow missed {expected:?}:\n{seen}"
        );
    }
    post_incident_checks_see_a_healthy_cluster(&cluster).await;
}

/// `cca readiness agent` with the flags the node starts with passes.
fn preflight(cluster: &Cluster, node: &str) {
    let data_dir = cluster.agent_dir(node);
    let output = Command::new(CCA)
        .args([
            "readiness",
            "agent",
            "--server",
            &cluster.url,
            "--node",
            node,
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--no-cluster-network")
        .output()
        .expect("cca readiness runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{node} is not ready:\n{text}");
    assert!(text.contains("ready ("), "{text}");
}

/// `cca events --follow -o json` into `file` until the test ends.
fn follow_events(cluster: &Cluster, file: &std::path::Path) -> Proc {
    let out = std::fs::File::create(file).expect("events file");
    let child = Command::new(CCA)
        .args(["events", "--follow", "-o", "json"])
        .env("CCA_SERVER", &cluster.url)
        .current_dir(cluster.dir.path())
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .expect("cca events --follow starts");
    Proc(child)
}

/// The runbook's post-incident commands on a cluster that converged:
/// nothing failed or pending, every node ready and without drift, the
/// reconciliation error counters present.
async fn post_incident_checks_see_a_healthy_cluster(cluster: &Cluster) {
    assert_eq!(
        failed_or_pending(cluster),
        0,
        "{}",
        cluster.cca(&["get", "instances"])
    );
    let status = cluster.cca(&["status"]);
    for (node, _) in NODES {
        assert!(
            status
                .lines()
                .any(|line| line.starts_with(node) && line.contains("ready")),
            "{status}"
        );
    }
    for (node, _) in NODES {
        let inspected = eventually_no_drift(cluster, node).await;
        assert!(
            inspected.contains(&format!("Node:         {node} (connected)")),
            "{inspected}"
        );
    }
    let metrics = reqwest::get(format!("{}/metrics", cluster.url))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("reconciliation_errors_total{controller=\"scheduler\"}"),
        "no reconciliation error counter"
    );
}

/// `cca node-inspect NODE` once it shows no drift either way.
async fn eventually_no_drift(cluster: &Cluster, node: &str) -> String {
    eventually(
        &format!("node {node} without drift"),
        Duration::from_secs(30),
        async || {
            // Fails while a restarted agent has not registered its new
            // address yet.
            let output = Command::new(CCA)
                .args(["node-inspect", node])
                .env("CCA_SERVER", &cluster.url)
                .output()
                .ok()
                .filter(|output| output.status.success())?;
            let inspected = String::from_utf8_lossy(&output.stdout).into_owned();
            let clean = inspected.contains("cache and its runtime: none")
                && inspected.contains("store and the agent's cache: none");
            clean.then_some(inspected)
        },
    )
    .await
}

/// `cca get instances | grep -c "failed\|pending"`.
fn failed_or_pending(cluster: &Cluster) -> usize {
    cluster
        .cca(&["get", "instances"])
        .lines()
        .filter(|line| line.contains("failed") || line.contains("pending"))
        .count()
}

/// Demand nothing can place shows as a pending row and in the status.
async fn pending_demand_is_counted_by_grep(cluster: &Cluster) {
    cluster.apply("huge.cca", UNPLACEABLE);
    eventually("a pending row", Duration::from_secs(20), async || {
        (failed_or_pending(cluster) == 1).then_some(())
    })
    .await;
    let status = cluster.cca(&["status"]);
    assert!(status.contains("Unplaced demand"), "{status}");
    assert!(status.contains("huge"), "{status}");
    cluster.cca(&["delete", "service", "huge"]);
    eventually("no pending row", Duration::from_secs(20), async || {
        (failed_or_pending(cluster) == 0).then_some(())
    })
    .await;
}

/// The web instances on `node`, with their pid and URL.
async fn on_node(cluster: &Cluster, node: &str) -> Vec<(InstanceSummary, u32, String)> {
    let client = cluster.client();
    let mut found = Vec::new();
    for instance in instances(&client, "web").await {
        if instance.node == node {
            let (pid, url) = pid_and_url(&client, &instance.id).await;
            found.push((instance, pid, url));
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.split_whitespace().nth(2) == Some("Z"))
}

/// An agent frozen past its lease: its node goes unreachable and its
/// instances are replaced elsewhere while they still run (duplicates, as
/// the cluster sees it); thawed, the agent stops them, and exactly the
/// desired instances run and answer.
async fn a_frozen_node_s_duplicates_stop_when_it_thaws(cluster: &mut Cluster) {
    let client = cluster.client();
    let mut frozen = "";
    let mut before = Vec::new();
    for (node, _) in NODES {
        before = on_node(cluster, node).await;
        if !before.is_empty() {
            frozen = node;
            break;
        }
    }
    assert!(!before.is_empty(), "some node runs web");
    let agent = cluster.agents[frozen].pid();
    signal(agent, "STOP");
    eventually(
        "the frozen node's instances replaced elsewhere",
        Duration::from_secs(60),
        async || {
            let web = all_running(&client, 4).await?;
            web.iter().all(|i| i.node != frozen).then_some(())
        },
    )
    .await;
    for (instance, pid, _) in &before {
        assert!(
            alive(*pid),
            "{} stopped while its agent was frozen",
            instance.id
        );
    }
    signal(agent, "CONT");
    eventually(
        "the thawed node's duplicates stopped",
        Duration::from_secs(60),
        async || before.iter().all(|(_, pid, _)| !alive(*pid)).then_some(()),
    )
    .await;
    for (instance, _, url) in &before {
        assert!(
            !answers(url, &instance.id).await,
            "{} still answers at {url}",
            instance.id
        );
    }
    let web = all_running(&client, 4).await;
    assert!(web.is_some(), "exactly 4 web instances run after the thaw");
}

/// The two agents running the most killed at once: replacement pauses (their instances
/// stay placed), `cca resume-replacement` ends the pause and they are
/// replaced; the agents return and stop what they ran.
async fn a_mass_node_failure_pauses_replacement_until_resumed(cluster: &mut Cluster) {
    let client = cluster.client();
    // The two nodes that run the most: their loss is the one that hurts.
    let mut by_count: Vec<(usize, &str)> = Vec::new();
    for (node, _) in NODES {
        by_count.push((on_node(cluster, node).await.len(), node));
    }
    by_count.sort_by(|a, b| b.cmp(a));
    let lost = [by_count[0].1, by_count[1].1];
    let mut orphaned = Vec::new();
    for node in lost {
        orphaned.extend(on_node(cluster, node).await);
        cluster.agents.remove(node);
    }
    assert!(!orphaned.is_empty(), "the lost nodes ran web instances");
    eventually("replacement paused", Duration::from_secs(30), async || {
        let status = client.status().await.ok()?;
        status.disruption.filter(|pause| pause.paused).map(drop)
    })
    .await;
    let placed_on_lost = || async {
        instances(&client, "web")
            .await
            .iter()
            .filter(|i| lost.contains(&i.node.as_str()))
            .count()
    };
    let held = placed_on_lost().await;
    // Twice the lost grace: a node's instances would be replaced by then.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        placed_on_lost().await,
        held,
        "nothing is replaced while paused"
    );
    let status = cluster.cca(&["status"]);
    assert!(status.contains("PAUSED"), "{status}");

    let resumed = cluster.cca(&["resume-replacement"]);
    assert!(resumed.contains("resumed"), "{resumed}");
    eventually(
        "the lost nodes' instances replaced",
        Duration::from_secs(60),
        async || {
            let web = all_running(&client, 4).await?;
            web.iter()
                .all(|i| !lost.contains(&i.node.as_str()))
                .then_some(())
        },
    )
    .await;
    for (node, address) in NODES.iter().filter(|(node, _)| lost.contains(node)) {
        cluster.start_agent(node, address);
    }
    eventually(
        "the returning agents stop what they ran",
        Duration::from_secs(60),
        async || {
            orphaned
                .iter()
                .all(|(_, pid, _)| !alive(*pid))
                .then_some(())
        },
    )
    .await;
}

/// The server killed: every instance keeps answering; back, the cluster
/// converges on the same instances.
async fn workloads_outlive_the_control_plane(cluster: &mut Cluster) {
    let client = cluster.client();
    let before: BTreeMap<String, (u32, String)> = {
        let mut running = BTreeMap::new();
        for instance in instances(&client, "web").await {
            running.insert(
                instance.id.clone(),
                pid_and_url(&client, &instance.id).await,
            );
        }
        running
    };
    cluster.stop_server();
    for (id, (_, url)) in &before {
        assert!(
            answers(url, id).await,
            "{id} stopped answering with the server down"
        );
    }
    cluster.start_server();
    let client = cluster.client();
    let web = eventually(
        "the cluster converged again",
        Duration::from_secs(60),
        async || all_running(&client, 4).await,
    )
    .await;
    let after: Vec<&str> = web.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        after,
        before.keys().map(String::as_str).collect::<Vec<_>>(),
        "the same instances, none replaced"
    );
}

/// Each agent stopped (SIGTERM, as `systemctl restart` with the unit's
/// `KillMode=process`) and started again in turn, as an upgrade does:
/// every instance keeps its process.
async fn a_rolling_restart_restarts_no_workload(cluster: &mut Cluster) {
    let client = cluster.client();
    let mut before = BTreeMap::new();
    for instance in instances(&client, "web").await {
        before.insert(
            instance.id.clone(),
            pid_and_url(&client, &instance.id).await.0,
        );
    }
    for (node, address) in NODES {
        if let Some(agent) = cluster.agents.remove(node) {
            agent.terminate();
        }
        cluster.start_agent(node, address);
        eventually_no_drift(cluster, node).await;
    }
    let mut after = BTreeMap::new();
    for instance in all_running(&client, 4).await.unwrap_or_default() {
        after.insert(
            instance.id.clone(),
            pid_and_url(&client, &instance.id).await.0,
        );
    }
    assert_eq!(after, before, "every instance kept its process");
}
