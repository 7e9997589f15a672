//! Backups end to end on the store: a snapshot of one backend written as a
//! payload and restored into the other. Into the embedded store: a new
//! data file at the backup's revision plus the bump, its history marked
//! compacted (a watch from an old revision is told so), the replaced key
//! in place, the keys a lease held left out, and a directory that holds a
//! store refused. Into etcd: the keys written through its API, and a
//! store that is not empty refused.

use std::any::Any;
use std::sync::Arc;

use cca_store::backup::payload::{self, PAYLOAD_FORMAT, PayloadHeader, Record};
use cca_store::backup::{RestoreTarget, restore};
use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::etcd::EtcdStore;
use cca_store::testing::etcd::EtcdServer;
use cca_store::{Op, Store, Txn, WatchMessage};

/// The payload `store`'s snapshot makes.
async fn payload_of(store: &dyn Store) -> payload::Payload {
    let mut snapshot = store.snapshot(64).await.expect("snapshot");
    let mut bytes = PayloadHeader {
        format: PAYLOAD_FORMAT,
        revision: snapshot.revision,
        keys: snapshot.count,
        store: None,
    }
    .encode();
    let mut keys = 0;
    while let Some(page) = snapshot.pages.recv().await {
        for kv in page.expect("page") {
            Record::Key { kv }.encode(&mut bytes);
            keys += 1;
        }
    }
    Record::End { keys, files: 0 }.encode(&mut bytes);
    payload::parse(&bytes).expect("parses")
}

async fn filled_embedded(dir: &std::path::Path) -> Arc<dyn Store> {
    let store: Arc<dyn Store> =
        Arc::new(EmbeddedStore::open(Config::new(dir)).await.expect("opens"));
    for i in 0..300 {
        let txn = Txn::new().then(Op::put(format!("desired/service/s{i:03}"), "spec"));
        store.txn(txn).await.expect("puts");
    }
    let lease = store
        .grant_lease(std::time::Duration::from_secs(60))
        .await
        .expect("lease");
    let txn = Txn::new().then(Op::put_with_lease("observed/heartbeat/n1", "beat", lease));
    store.txn(txn).await.expect("puts");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_into_a_new_embedded_store_past_its_revision() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = filled_embedded(&dir.path().join("old")).await;
    let payload = payload_of(source.as_ref()).await;
    assert_eq!(payload.keys.len(), 301);
    let target = dir.path().join("new");
    let replaced = vec![("meta/store".to_owned(), b"new identity".to_vec())];
    let restored = restore(
        &payload,
        replaced,
        RestoreTarget::Embedded(target.clone()),
        1000,
        |_| {},
    )
    .await
    .expect("restores");
    assert_eq!(restored.revision, payload.revision + 1000);
    assert_eq!((restored.keys, restored.leased), (301, 1));
    let store = EmbeddedStore::open(Config::new(&target))
        .await
        .expect("the restored store opens");
    assert_eq!(
        store.current_revision().await.expect("revision"),
        restored.revision
    );
    let service = store.get("desired/service/s007").await.expect("get");
    assert_eq!(service.expect("restored").value, b"spec");
    assert!(
        store
            .get("observed/heartbeat/n1")
            .await
            .expect("get")
            .is_none()
    );
    let identity = store.get("meta/store").await.expect("get").expect("put");
    assert_eq!(identity.value, b"new identity");
    let mut watch = store.watch("", 5).await.expect("watch");
    assert!(matches!(
        watch.next_message().await,
        Ok(WatchMessage::Compacted { .. })
    ));
    drop(store);
    let again = restore(
        &payload,
        Vec::new(),
        RestoreTarget::Embedded(target),
        1000,
        |_| {},
    )
    .await
    .expect_err("a store is there");
    assert!(again.to_string().contains("already here"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_the_embedded_store_restores_into_an_empty_etcd() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = filled_embedded(dir.path()).await;
    let payload = payload_of(source.as_ref()).await;
    let server = EtcdServer::start();
    let etcd: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(cca_store::etcd::Config::new(vec![server.endpoint()]))
            .await
            .expect("connects"),
    );
    let restored = restore(
        &payload,
        Vec::new(),
        RestoreTarget::Store(Arc::clone(&etcd)),
        1000,
        |_| {},
    )
    .await
    .expect("restores");
    assert_eq!(restored.keys, 300);
    let back = payload_of(etcd.as_ref()).await;
    let keys = |p: &payload::Payload| -> Vec<(String, Vec<u8>)> {
        p.keys
            .iter()
            .filter(|kv| kv.lease.is_none())
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect()
    };
    assert_eq!(keys(&back), keys(&payload));
    let refused = restore(
        &payload,
        Vec::new(),
        RestoreTarget::Store(etcd),
        1000,
        |_| {},
    )
    .await
    .expect_err("not empty");
    assert!(refused.to_string().contains("not empty"), "{refused}");
    let _keep: Box<dyn Any> = Box::new(server);
}
