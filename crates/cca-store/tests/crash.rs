//! Crash test of the embedded store: a child process commits transactions
//! and reports each acknowledged one; the parent kills it with SIGKILL at a
//! random moment, reopens the store, and checks that every acknowledged
//! write is there and no transaction is half-applied. 100 kill points, on
//! one data directory that accumulates the history of every round.
//!
//! The child is this same test binary, re-run on the ignored test
//! `crash_child` with the data directory in `CCA_CRASH_CHILD_DIR`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::{Op, RangeRequest, Store, Txn};

const CHILD_DIR_VAR: &str = "CCA_CRASH_CHILD_DIR";
const CHILD_FIRST_VAR: &str = "CCA_CRASH_CHILD_FIRST";
const KILL_POINTS: usize = 100;
const CHILD_WRITERS: u64 = 8;

/// Each transaction writes the same sequence number to three keys; seeing
/// some but not all of them after a crash means a torn transaction.
fn txn_for(sequence: u64) -> Txn {
    let value = sequence.to_string();
    Txn::new()
        .then(Op::put(format!("seq/{sequence:08}/a"), value.clone()))
        .then(Op::put(format!("seq/{sequence:08}/b"), value.clone()))
        .then(Op::put("last", value))
}

#[test]
#[ignore = "runs only as the child of `sigkill_at_100_points_loses_no_acknowledged_write`"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_VAR) else {
        return;
    };
    let first: u64 = std::env::var(CHILD_FIRST_VAR)
        .ok()
        .and_then(|n| n.parse().ok())
        .expect("first sequence number");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let store = Arc::new(
            EmbeddedStore::open(Config::new(dir))
                .await
                .expect("child open"),
        );
        println!("ready");
        let next = Arc::new(AtomicU64::new(first));
        let writers: Vec<_> = (0..CHILD_WRITERS)
            .map(|_| {
                let store = Arc::clone(&store);
                let next = Arc::clone(&next);
                tokio::spawn(async move {
                    loop {
                        let sequence = next.fetch_add(1, Ordering::SeqCst);
                        let outcome = store.txn(txn_for(sequence)).await.expect("child txn");
                        // One line per acknowledgement, written whole.
                        println!("ack {sequence} {}", outcome.revision());
                    }
                })
            })
            .collect();
        for writer in writers {
            let _ = writer.await;
        }
    });
}

/// Runs one child until a random kill point; returns the acknowledged
/// sequence numbers with their revisions.
fn run_and_kill(dir: &std::path::Path, first: u64, lifetime: Duration) -> BTreeMap<u64, i64> {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_VAR, dir)
        .env(CHILD_FIRST_VAR, first.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        let mut acked = BTreeMap::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if words.next() == Some("ack") {
                let sequence = words.next().and_then(|n| n.parse().ok());
                let revision = words.next().and_then(|n| n.parse().ok());
                if let (Some(sequence), Some(revision)) = (sequence, revision) {
                    acked.insert(sequence, revision);
                }
            }
        }
        acked
    });
    std::thread::sleep(lifetime);
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    reader.join().expect("reader thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_100_points_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut next_sequence = 0;
    let mut total_acked = 0;
    let mut last_revision = 1;
    for round in 0..KILL_POINTS {
        // Kill points spread from "while opening" to well into the writes.
        let lifetime = Duration::from_millis(fastrand::u64(5..120));
        let child_dir = dir.path().to_owned();
        let first = next_sequence;
        let acked = tokio::task::spawn_blocking(move || run_and_kill(&child_dir, first, lifetime))
            .await
            .expect("child round");
        total_acked += acked.len();

        let store = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .unwrap_or_else(|err| panic!("round {round}: reopen after SIGKILL failed: {err}"));
        for (sequence, revision) in &acked {
            for part in ["a", "b"] {
                let key = format!("seq/{sequence:08}/{part}");
                let kv = store.get(&key).await.expect("get");
                let kv =
                    kv.unwrap_or_else(|| panic!("round {round}: acknowledged {key} is missing"));
                assert_eq!(kv.mod_revision, *revision, "round {round}: {key}");
            }
        }
        let page = store
            .range(RangeRequest::prefix("seq/"))
            .await
            .expect("range");
        assert_eq!(
            page.kvs.len() % 2,
            0,
            "round {round}: a transaction was torn"
        );
        for pair in page.kvs.chunks(2) {
            assert_eq!(
                (pair[0].key.trim_end_matches('a'), pair[0].mod_revision),
                (pair[1].key.trim_end_matches('b'), pair[1].mod_revision),
                "round {round}: a transaction was torn"
            );
        }
        let revision = store.current_revision().await.expect("revision");
        assert!(
            revision >= last_revision,
            "round {round}: the revision went back"
        );
        last_revision = revision;
        // Unacknowledged but durable transactions may exist; number past them.
        next_sequence = page
            .kvs
            .last()
            .and_then(|kv| String::from_utf8_lossy(&kv.value).parse::<u64>().ok())
            .map_or(next_sequence, |n| n.max(next_sequence) + 1)
            .max(acked.keys().last().map_or(0, |n| n + 1))
            + CHILD_WRITERS;
        store.close().await;
    }
    assert!(total_acked > 0, "no child ever acknowledged a write");
    eprintln!(
        "{KILL_POINTS} kill points, {total_acked} acknowledged txns, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
