//! End to end with real processes: one `cca server` (embedded store) and
//! three `cca agent`s, each a separate process with its own data directory
//! and its own loopback address (127.0.0.2–4), running `cca whoami`
//! instances as host processes. It checks what the disaster-recovery
//! runbook promises: instances answer HTTP; a killed instance is
//! restarted; a command that fails fast is reported failed with its exit
//! code and last log lines; a restarted agent adopts its instances (same
//! pids); instances keep serving while the server is down and the cluster
//! converges without duplicates when it returns; `cca logs` and `cca exec`
//! reach the agent; a `kill -9`ed agent's
//! node goes unreachable and its instances are replaced elsewhere; scale
//! up and down; drain. Registrations and heartbeats travel the server's
//! liveness listener (`--liveness-listen`, `--liveness-server`), kept at
//! its address across the server's restart. Every process this test
//! starts is killed when it ends, pass or fail — workloads included.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use cca_wire::client::InstanceQuery;
use cca_wire::types::InstanceSummary;
use support::CCA;
use support::cluster::{
    Cluster, all_running, answers, assert_all_answer, eventually, instances, pid_and_url,
    running_at, url_port,
};
use support::signal;

const PROGRAM: &str = r#"
service web {
  run = "cca whoami --port $PORT"
  replicas = 6
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 1s
  }
}

service broken {
  run = "echo boom; echo 'cannot reach the database' >&2; exit 3"
  replicas = 1
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_processes_survives_crashes_restarts_and_node_loss() {
    let mut cluster = Cluster::new();
    cluster.start_server();
    for (node, address) in [
        ("n1", "127.0.0.2"),
        ("n2", "127.0.0.3"),
        ("n3", "127.0.0.4"),
    ] {
        cluster.start_agent(node, address);
    }
    let client = cluster.client();
    eventually("three ready nodes", Duration::from_secs(20), async || {
        let nodes = client.nodes().await.ok()?;
        (nodes.iter().filter(|n| n.status == "ready").count() == 3).then_some(())
    })
    .await;
    let file = cluster.dir.path().join("app.cca");
    std::fs::write(&file, PROGRAM).expect("write program");
    cluster.cca(&["apply", file.to_str().expect("utf-8 path")]);

    // Apply: every instance runs, on every node, and answers HTTP.
    let web = eventually(
        "6 healthy web instances",
        Duration::from_secs(30),
        async || all_running(&client, 6).await,
    )
    .await;
    let nodes: std::collections::BTreeSet<&str> = web.iter().map(|i| i.node.as_str()).collect();
    assert_eq!(nodes.len(), 3, "replicas spread over the nodes: {web:?}");
    assert_all_answer(&client, &web).await;
    let (_, url) = pid_and_url(&client, &web[0].id).await;
    let described = cluster.cca(&["describe", "instance", &web[0].id]);
    assert!(
        described.contains(&format!("8080/tcp, host port {}", url_port(&url)))
            && described.contains(url.trim_end_matches('/')),
        "describe instance shows the port, host port and URL {url}:\n{described}"
    );

    // A command that fails fast is reported failed with its exit code and
    // output. The scheduler replaces failed instances (within the restart
    // budget) and the agent then removes them, so each failed instance is
    // looked at while it still exists; the last one stays once the budget
    // is spent.
    let (exit, described) = eventually(
        "broken to be reported failed, with describe showing why",
        Duration::from_secs(60),
        async || {
            let query = InstanceQuery {
                service: Some("broken".to_owned()),
                all: true,
                ..InstanceQuery::default()
            };
            let listed = client.instances(&query).await.ok()?;
            let failed = listed.into_iter().find(|found| found.state == "failed")?;
            let exit = client.instance(&failed.id).await.ok()?.status?.last_exit?;
            let output = Command::new(CCA)
                .args(["describe", "instance", &failed.id])
                .env("CCA_SERVER", &cluster.url)
                .output()
                .ok()?;
            output
                .status
                .success()
                .then(|| (exit, String::from_utf8_lossy(&output.stdout).into_owned()))
        },
    )
    .await;
    assert_eq!(exit.code, Some(3));
    assert!(
        exit.log_tail.iter().any(|line| line.contains("boom")),
        "{:?}",
        exit.log_tail
    );
    assert!(
        described.contains("cannot reach the database"),
        "describe shows the log tail:\n{described}"
    );

    // Logs and exec reach the agent running the instance, through the API.
    eventually(
        "cca logs to show broken's output",
        Duration::from_secs(20),
        async || {
            let output = Command::new(CCA)
                .args(["logs", "broken", "--tail", "5"])
                .env("CCA_SERVER", &cluster.url)
                .output()
                .ok()?;
            String::from_utf8_lossy(&output.stdout)
                .contains("boom")
                .then_some(())
        },
    )
    .await;
    let output = Command::new(CCA)
        .args([
            "exec",
            &web[0].id,
            "--",
            "sh",
            "-c",
            "echo $CCA_INSTANCE; exit 7",
        ])
        .env("CCA_SERVER", &cluster.url)
        .output()
        .expect("cca exec runs");
    assert_eq!(
        output.status.code(),
        Some(7),
        "cca exec passes the remote exit code on"
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), web[0].id);

    // A killed instance process is restarted.
    let victim = web[0].id.clone();
    let (old_pid, _) = pid_and_url(&client, &victim).await;
    signal(i32::try_from(old_pid).expect("pid"), "KILL");
    eventually(
        "the killed instance to run again",
        Duration::from_secs(20),
        async || {
            let (pid, url) = running_at(&client, &victim).await?;
            let detail = client.instance(&victim).await.ok()?;
            let restarted =
                detail.summary.restarts >= 1 && pid != old_pid && detail.summary.state == "running";
            (restarted && answers(&url, &victim).await).then_some(())
        },
    )
    .await;

    // A restarted agent adopts its instances: same pids.
    let on_n2: Vec<String> = instances(&client, "web")
        .await
        .into_iter()
        .filter(|i| i.node == "n2")
        .map(|i| i.id)
        .collect();
    let mut pids_before = BTreeMap::new();
    for id in &on_n2 {
        pids_before.insert(id.clone(), pid_and_url(&client, id).await.0);
    }
    cluster.agents.remove("n2").expect("n2 agent").terminate();
    cluster.start_agent("n2", "127.0.0.3");
    tokio::time::sleep(Duration::from_secs(2)).await;
    eventually(
        "n2's instances adopted",
        Duration::from_secs(20),
        async || all_running(&client, 6).await,
    )
    .await;
    for (id, pid) in &pids_before {
        assert_eq!(
            pid_and_url(&client, id).await.0,
            *pid,
            "{id} was restarted instead of adopted"
        );
    }

    // The server goes away: instances keep serving. It returns: no duplicates.
    let web = all_running(&client, 6).await.expect("converged");
    let mut urls = Vec::new();
    for instance in &web {
        urls.push((
            instance.id.clone(),
            pid_and_url(&client, &instance.id).await.1,
        ));
    }
    cluster.server.take().expect("server").terminate();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (id, url) in &urls {
        if !answers(url, id).await {
            for node in ["n1", "n2", "n3"] {
                let log = std::fs::read_to_string(cluster.dir.path().join(format!("{node}.log")))
                    .unwrap_or_default();
                eprintln!("--- {node}\n{log}");
            }
            panic!("{id} at {url} stopped serving while the server was down ({web:?})");
        }
    }
    cluster.start_server();
    let client = cluster.client();
    let after = eventually(
        "convergence after the server returns",
        Duration::from_secs(30),
        async || all_running(&client, 6).await,
    )
    .await;
    let ids = |list: &[InstanceSummary]| {
        list.iter()
            .map(|i| i.id.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(ids(&after), ids(&web), "the same instances, no duplicates");

    // kill -9 an agent: its node goes unreachable, its instances are replaced.
    let n3 = cluster.agents.remove("n3").expect("n3 agent");
    signal(n3.pid(), "KILL");
    drop(n3);
    eventually("n3 unreachable", Duration::from_secs(20), async || {
        let nodes = client.nodes().await.ok()?;
        nodes
            .iter()
            .any(|n| n.name == "n3" && n.status == "unreachable")
            .then_some(())
    })
    .await;
    let replaced = eventually(
        "n3's instances replaced elsewhere",
        Duration::from_secs(40),
        async || {
            let web = all_running(&client, 6).await?;
            web.iter().all(|i| i.node != "n3").then_some(web)
        },
    )
    .await;
    assert_all_answer(&client, &replaced).await;

    // Scale up and down.
    cluster.cca(&["scale", "web", "8"]);
    eventually("8 instances", Duration::from_secs(30), async || {
        all_running(&client, 8).await
    })
    .await;
    cluster.cca(&["scale", "web", "3"]);
    eventually("3 instances", Duration::from_secs(30), async || {
        all_running(&client, 3).await
    })
    .await;

    // Drain n1: its instances move to n2.
    cluster.cca(&["drain", "n1"]);
    let drained = eventually("n1 drained", Duration::from_secs(40), async || {
        let web = all_running(&client, 3).await?;
        web.iter().all(|i| i.node == "n2").then_some(web)
    })
    .await;
    assert_all_answer(&client, &drained).await;
}
