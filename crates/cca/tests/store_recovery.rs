//! End to end with real processes (one `cca server` on an embedded store,
//! one `cca agent` running `cca whoami` instances as host processes): the
//! store is swapped under a running cluster the ways an operator would,
//! and the node resyncs instead of trusting what it cached.
//!
//! 1. The store goes back in time: the server stops, its data dir is
//!    copied, the cluster goes on (a scale-up starts a third instance),
//!    then the old copy is put back. The instance the old store never
//!    knew stops; the two it knows keep running (same pids); scaling up
//!    again works (no instance left holding a host port).
//! 2. The store is lost and rebuilt without a snapshot: an empty store,
//!    the node registers again and reports what it runs as unclaimed, the
//!    desired state is applied again (2 replicas of 3 running): two are
//!    adopted where they run (same ids and pids, nothing restarted), the
//!    third stops after the claim grace.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::cluster::{Cluster, all_running, answers, eventually, pid_and_url};

const PROGRAM: &str = r#"
service web {
  run = "cca whoami --port $PORT"
  replicas = 2
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 1s
  }
}
"#;

/// Each running `web` instance's pid and URL, by id.
async fn running_web(cluster: &Cluster, count: usize) -> BTreeMap<String, (u32, String)> {
    let client = cluster.client();
    let web = eventually(
        &format!("{count} running web instances"),
        Duration::from_secs(60),
        async || all_running(&client, count).await,
    )
    .await;
    let mut running = BTreeMap::new();
    for instance in web {
        let at = pid_and_url(&client, &instance.id).await;
        running.insert(instance.id, at);
    }
    running
}

/// Waits until exactly the instances of `expected` run, each with the
/// same pid as before, and `gone` no longer answers.
async fn only_these_run(
    cluster: &Cluster,
    expected: &BTreeMap<String, (u32, String)>,
    gone: &(String, (u32, String)),
) {
    let (gone_id, (_, gone_url)) = gone;
    eventually(
        &format!("{gone_id} stopped and the rest kept"),
        Duration::from_secs(60),
        async || {
            let now = running_web_now(cluster, expected.len()).await?;
            let kept = now == *expected;
            (kept && !answers(gone_url, gone_id).await).then_some(())
        },
    )
    .await;
}

async fn running_web_now(
    cluster: &Cluster,
    count: usize,
) -> Option<BTreeMap<String, (u32, String)>> {
    let client = cluster.client();
    let web = all_running(&client, count).await?;
    let mut running = BTreeMap::new();
    for instance in web {
        let at = support::cluster::running_at(&client, &instance.id).await?;
        running.insert(instance.id, at);
    }
    Some(running)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("makes the copy's dir");
    for entry in std::fs::read_dir(from).expect("reads the store dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copies");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_store_and_a_rebuilt_one_are_resynced_adopting_what_runs() {
    let mut cluster = Cluster::new();
    cluster.start_server();
    cluster.start_agent_with("n1", "127.0.0.2", &["--claim-grace", "2s"]);
    let file = cluster.dir.path().join("web.cca");
    std::fs::write(&file, PROGRAM).expect("writes the program");
    let file = file.to_str().expect("utf-8 path").to_owned();
    cluster.cca(&["apply", &file]);
    let two = running_web(&cluster, 2).await;

    // 1. Back in time.
    cluster.stop_server();
    let copy = cluster.dir.path().join("store-copy");
    copy_dir(&cluster.store_dir(), &copy);
    cluster.start_server();
    cluster.cca(&["scale", "web", "3"]);
    let three = running_web(&cluster, 3).await;
    let third = three
        .iter()
        .find(|(id, _)| !two.contains_key(*id))
        .map(|(id, at)| (id.clone(), at.clone()))
        .expect("a third instance");
    assert!(answers(&third.1.1, &third.0).await);
    cluster.stop_server();
    std::fs::remove_dir_all(cluster.store_dir()).expect("removes the store");
    std::fs::rename(&copy, cluster.store_dir()).expect("puts the old copy back");
    cluster.start_server();
    only_these_run(&cluster, &two, &third).await;
    cluster.cca(&["scale", "web", "3"]);
    let three = running_web(&cluster, 3).await;

    // 2. Lost, rebuilt without a snapshot, the program applied again.
    cluster.stop_server();
    std::fs::remove_dir_all(cluster.store_dir()).expect("removes the store");
    cluster.start_server();
    let client = cluster.client();
    eventually(
        "the node's three instances reported unclaimed",
        Duration::from_secs(60),
        async || {
            let status = client.status().await.ok()?;
            (status.unclaimed == 3).then_some(())
        },
    )
    .await;
    let described = cluster.cca(&["describe", "node", "n1"]);
    assert!(described.contains("awaiting adoption"), "{described}");
    cluster.cca(&["apply", &file]);
    let adopted = running_web(&cluster, 2).await;
    for (id, at) in &adopted {
        assert_eq!(
            three.get(id),
            Some(at),
            "{id} was adopted as it ran (same pid and port)"
        );
    }
    let left = three
        .iter()
        .find(|(id, _)| !adopted.contains_key(*id))
        .map(|(id, at)| (id.clone(), at.clone()))
        .expect("one of three was not adopted");
    only_these_run(&cluster, &adopted, &left).await;
    let status = client.status().await.expect("status");
    assert_eq!(status.unclaimed, 0, "nothing left unclaimed");
}

/// `cca` with `args` against the cluster, expected to fail: its stderr.
fn cca_fails(cluster: &Cluster, args: &[&str]) -> String {
    let output = std::process::Command::new(support::CCA)
        .args(args)
        .env("CCA_SERVER", &cluster.url)
        .output()
        .expect("cca runs");
    assert!(!output.status.success(), "cca {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A backup of a running cluster, its store destroyed and restored from
/// it: the agent resyncs with the restored store (a new identity naming
/// the old one) and keeps the instances it places running (same pids);
/// the one started after the backup stops. A corrupt copy and a wrong key
/// are refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_a_backup_keeps_its_instances_running() {
    let mut cluster = Cluster::new();
    cluster.start_server();
    cluster.start_agent_with("n1", "127.0.0.2", &["--claim-grace", "2s"]);
    cluster.apply("web.cca", PROGRAM);
    let two = running_web(&cluster, 2).await;
    let old_store = cluster.client().status().await.expect("status").store;
    let old_store = old_store.expect("the store has an identity").id;

    let backup = cluster.dir.path().join("cluster.ccab");
    let key = cluster.dir.path().join("backup.key");
    let (backup, key) = (
        backup.to_str().expect("utf-8"),
        key.to_str().expect("utf-8"),
    );
    let said = cluster.cca(&["backup", backup, "--key-file", key, "--create-key"]);
    assert!(
        said.contains("backed up") && said.contains(&old_store),
        "{said}"
    );
    let proven = cluster.cca(&["restore", backup, "--key-file", key, "--check"]);
    assert!(proven.contains("proven"), "{proven}");
    cluster.cca(&["scale", "web", "3"]);
    let three = running_web(&cluster, 3).await;
    let third = three
        .iter()
        .find(|(id, _)| !two.contains_key(*id))
        .map(|(id, at)| (id.clone(), at.clone()))
        .expect("a third instance");

    // Refusals: a wrong key, a corrupt copy.
    let other_key = cluster.dir.path().join("other.key");
    std::fs::write(&other_key, "ab".repeat(32)).expect("writes another key");
    let other_key = other_key.to_str().expect("utf-8");
    let wrong = cca_fails(
        &cluster,
        &["restore", backup, "--key-file", other_key, "--check"],
    );
    assert!(wrong.contains("the key does not open"), "{wrong}");
    let mut bytes = std::fs::read(backup).expect("reads the backup");
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff;
    let corrupt = cluster.dir.path().join("corrupt.ccab");
    std::fs::write(&corrupt, bytes).expect("writes");
    let corrupt = corrupt.to_str().expect("utf-8");
    let refused = cca_fails(
        &cluster,
        &["restore", corrupt, "--key-file", key, "--check"],
    );
    assert!(refused.contains("corrupt or truncated"), "{refused}");

    cluster.stop_server();
    std::fs::remove_dir_all(cluster.store_dir()).expect("destroys the store");
    let target = format!("embedded:{}", cluster.store_dir().display());
    let restored = cluster.cca(&["restore", backup, "--key-file", key, "--store", &target]);
    assert!(
        restored.contains(&format!("restored from {old_store}")),
        "{restored}"
    );
    cluster.start_server();
    only_these_run(&cluster, &two, &third).await;
    let status = cluster.client().status().await.expect("status");
    let store = status.store.expect("the restored store has an identity");
    assert_ne!(store.id, old_store);
    assert_eq!(store.restored_from.as_deref(), Some(old_store.as_str()));
}
