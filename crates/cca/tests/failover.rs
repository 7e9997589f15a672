//! HA failover with real processes: two `cca server`s on one real etcd.
//! Exactly one leads (runs the controllers); `kill -9` it and the other
//! takes over within the leader lease TTL and places new work. Both serve
//! the API throughout. Every process is killed when the test ends.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use cca_store::testing::etcd::EtcdServer;
use support::{CCA, Server};

const LEADER_TTL: Duration = Duration::from_secs(2);

/// Starts `cca server` on `etcd`; every server of a cluster shares the
/// secret key file `key` (the first one creates it).
fn start_server(etcd: &EtcdServer, id: &str, key: &std::path::Path) -> Server {
    let store = format!("etcd://{}", etcd.endpoint().trim_start_matches("http://"));
    let key = key.display().to_string();
    Server::start_with([
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
        "--server-id",
        id,
        "--leader-ttl",
        "2s",
        "--startup-grace",
        "0s",
        "--secret-key-file",
        &key,
        "--log-format",
        "json",
    ])
}

/// The JSON log line of `server` whose message is `message`, once logged.
async fn logged(server: &Server, message: &str) -> serde_json::Value {
    let mut found = None;
    wait_for(message, Duration::from_secs(10), async || {
        let log = server.log.lock().expect("log lock").clone();
        found = log
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["fields"]["message"] == message);
        found.is_some()
    })
    .await;
    found.unwrap_or_default()
}

/// 1 when the server leads, 0 when it stands by (from its `/metrics`).
async fn leads(server: &Server) -> Option<bool> {
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = text.lines().find(|line| line.starts_with("leader "))?;
    Some(line.ends_with(" 1"))
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_server_takes_over_within_the_lease_ttl() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("secret.key");
    let a = start_server(&etcd, "server-a", &key);
    let b = start_server(&etcd, "server-b", &key);
    wait_for("a leader", Duration::from_secs(10), async || {
        leads(&a).await == Some(true) || leads(&b).await == Some(true)
    })
    .await;
    let (leader, standby) = if leads(&a).await == Some(true) {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(
        leads(&standby).await,
        Some(false),
        "exactly one server leads"
    );

    // Who leads shows in the logs at the default level, as JSON lines.
    let led = logged(&leader, "became leader").await;
    let leader_id = led["fields"]["server"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(leader_id.starts_with("server-"), "{led}");
    let stood_by = logged(&standby, "standing by: another server leads").await;
    assert_eq!(
        stood_by["fields"]["leader"],
        leader_id.as_str(),
        "{stood_by}"
    );
    assert_eq!(stood_by["level"], "INFO", "{stood_by}");

    let mut leader = leader;
    leader.child.kill().expect("kill -9 the leader");
    let _ = leader.child.wait();
    let took = wait_for("the standby to lead", LEADER_TTL * 4, async || {
        leads(&standby).await == Some(true)
    })
    .await;
    assert!(
        took <= LEADER_TTL + Duration::from_millis(1500),
        "takeover took {took:?} with a {LEADER_TTL:?} TTL"
    );
    let took_over = logged(&standby, "became leader").await;
    assert_ne!(
        took_over["fields"]["server"],
        leader_id.as_str(),
        "{took_over}"
    );

    // The new leader runs the controllers: an applied service gets placed
    // (an unplaced-demand fact appears, as no node has registered).
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("app.cca");
    std::fs::write(
        &file,
        "service web {\n  run = \"sleep 100\"\n  replicas = 2\n}\n",
    )
    .expect("write");
    let applied = Command::new(CCA)
        .args(["apply", file.to_str().expect("utf-8")])
        .env("CCA_SERVER", &standby.url)
        .output()
        .expect("cca apply");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    wait_for(
        "the new leader's scheduler to act",
        Duration::from_secs(10),
        async || {
            let output = Command::new(CCA)
                .args(["describe", "service", "web"])
                .env("CCA_SERVER", &standby.url)
                .output()
                .expect("cca describe");
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.contains("insufficient_capacity") || text.contains("unsatisfiable_constraint")
        },
    )
    .await;
}
