//! The etcd backend on a 3-member cluster: losing a member — the one the
//! client talks to, or the leader — must not interrupt reads, transactions
//! or watches.

use std::time::Duration;

use cca_store::etcd::{Config, EtcdStore};
use cca_store::testing::etcd::EtcdCluster;
use cca_store::{Compare, CompareOp, Op, Revision, Store, Txn, WatchMessage, WatchStream};

/// A store whose first (current) endpoint is member `first`.
async fn connect_via(cluster: &EtcdCluster, first: usize) -> EtcdStore {
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(first);
    EtcdStore::connect(Config::new(endpoints))
        .await
        .expect("connect")
}

async fn put(store: &EtcdStore, key: &str, value: &str) -> Revision {
    let outcome = store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("put");
    assert!(outcome.is_committed());
    outcome.revision()
}

async fn next_revision(watch: &mut WatchStream) -> Revision {
    let message = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
        .await
        .expect("a watch message within 10 s")
        .expect("a watch message");
    match message {
        WatchMessage::Events { revision, .. } => revision,
        other => panic!("expected events, got {other:?}"),
    }
}

/// Reads, a CAS transaction and the watch all work after `victim` died.
async fn keeps_serving_after_losing(cluster: &mut EtcdCluster, victim: usize, store: &EtcdStore) {
    let mut watch = store.watch("k/", 0).await.expect("watch");
    let before = put(store, "k/before", "1").await;
    assert_eq!(next_revision(&mut watch).await, before);

    cluster.kill(victim);

    let kv = store
        .get("k/before")
        .await
        .expect("read after the kill")
        .expect("k/before");
    let txn = Txn::new()
        .when(Compare::mod_revision(
            "k/before",
            CompareOp::Equal,
            kv.mod_revision,
        ))
        .then(Op::put("k/after", "2"));
    let after = store.txn(txn).await.expect("txn after the kill");
    assert!(after.is_committed(), "{after:?}");
    assert_eq!(
        next_revision(&mut watch).await,
        after.revision(),
        "the watch moved on, gap-free"
    );
    let again = put(store, "k/again", "3").await;
    assert_eq!(next_revision(&mut watch).await, again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_survives_the_death_of_the_leader_it_talks_to() {
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.leader();
    let store = connect_via(&cluster, leader).await;
    keeps_serving_after_losing(&mut cluster, leader, &store).await;
    assert_ne!(cluster.leader(), leader, "a new leader took over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_survives_the_death_of_the_follower_it_talks_to() {
    let mut cluster = EtcdCluster::start(3);
    let follower = (cluster.leader() + 1) % 3;
    let store = connect_via(&cluster, follower).await;
    keeps_serving_after_losing(&mut cluster, follower, &store).await;
}
