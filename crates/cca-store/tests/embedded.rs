//! The conformance suite on the embedded backend, plus what only the
//! embedded backend promises: durability across reopen, leases that outlive
//! a closed store by one TTL, refusal of damaged data files, and agreement with a model under
//! random operation sequences.

mod conformance;

use std::any::Any;
use std::sync::Arc;

use cca_store::Store;
use cca_store::embedded::{Config, EmbeddedStore};

async fn fixture() -> conformance::Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(Config::new(dir.path()))
        .await
        .expect("open");
    (
        Arc::new(store) as Arc<dyn Store>,
        Box::new(dir) as Box<dyn Any + Send>,
    )
}

conformance_tests!(fixture);

mod durability {
    use std::path::Path;
    use std::time::Duration;

    use cca_store::embedded::{Config, EmbeddedStore, FILE_NAME};
    use cca_store::{Op, RangeRequest, Store, StoreError, Txn, WatchEvent, WatchMessage};

    async fn open(dir: &Path) -> EmbeddedStore {
        EmbeddedStore::open(Config::new(dir)).await.expect("open")
    }

    async fn put(store: &EmbeddedStore, key: &str, value: &str) -> i64 {
        store
            .txn(Txn::new().then(Op::put(key, value)))
            .await
            .expect("put")
            .revision()
    }

    #[tokio::test]
    async fn reopen_recovers_keys_revision_and_history() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = open(dir.path()).await;
        let first = put(&store, "a", "1").await;
        put(&store, "b", "2").await;
        let last = store
            .txn(Txn::new().then(Op::delete("a")).then(Op::put("c", "3")))
            .await
            .expect("txn")
            .revision();
        store.close().await;

        let store = open(dir.path()).await;
        assert_eq!(store.current_revision().await.expect("revision"), last);
        let keys: Vec<String> = store
            .range(RangeRequest::prefix(""))
            .await
            .expect("range")
            .kvs
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["b", "c"]);
        // History survives too: a watcher can resume from before the restart.
        let mut watch = store.watch("", first).await.expect("watch");
        let mut revisions = Vec::new();
        while revisions.len() < 3 {
            match watch.next_message().await.expect("message") {
                WatchMessage::Events { revision, .. } => revisions.push(revision),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(revisions, [first, first + 1, last]);
        assert_eq!(
            put(&store, "d", "4").await,
            last + 1,
            "revisions continue after reopen"
        );
    }

    /// Downtime is not silence: no holder could renew while the store was
    /// closed, so a lease whose deadline passed meanwhile gets one full TTL
    /// from the reopen — and expires after it like any lease left alone.
    #[tokio::test]
    async fn a_lease_gets_a_full_ttl_after_a_reopen_then_expires_if_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = open(dir.path()).await;
        let short = store
            .grant_lease(Duration::from_secs(1))
            .await
            .expect("grant");
        let long = store
            .grant_lease(Duration::from_secs(60))
            .await
            .expect("grant");
        let rev = store
            .txn(
                Txn::new()
                    .then(Op::put_with_lease("short", "x", short))
                    .then(Op::put_with_lease("long", "x", long)),
            )
            .await
            .expect("put")
            .revision();
        store.close().await;
        tokio::time::sleep(Duration::from_millis(1500)).await;

        let store = open(dir.path()).await;
        assert!(store.get("short").await.expect("get").is_some());
        assert_eq!(
            store.keep_alive(short).await.expect("renews after reopen"),
            Duration::from_secs(1)
        );
        assert!(store.keep_alive(long).await.is_ok());
        // Left alone, the short lease runs out one TTL later.
        let mut watch = store.watch("", rev + 1).await.expect("watch");
        let message = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
            .await
            .expect("the short lease expires within its TTL")
            .expect("message");
        match message {
            WatchMessage::Events { events, .. } => {
                assert_eq!(
                    events,
                    [WatchEvent::Delete {
                        key: "short".into(),
                        revision: rev + 1
                    }]
                );
            }
            other => panic!("expected the expiry's delete, got {other:?}"),
        }
        assert!(matches!(
            store.keep_alive(short).await,
            Err(StoreError::LeaseNotFound(_))
        ));
        assert!(store.get("long").await.expect("get").is_some());
    }

    #[tokio::test]
    async fn a_slow_watcher_catches_up_without_gaps() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = open(dir.path()).await;
        let start = store.current_revision().await.expect("revision");
        let mut watch = store.watch("", 0).await.expect("watch");
        // More revisions than the watch buffer holds, not consumed meanwhile.
        const REVISIONS: i64 = 3000;
        for chunk in 0..REVISIONS / 100 {
            let puts = (0..100).map(|i| {
                let n = chunk * 100 + i;
                store.txn(Txn::new().then(Op::put(format!("k{n}"), n.to_string())))
            });
            for outcome in futures_join(puts).await {
                outcome.expect("put");
            }
        }
        for expected in start + 1..=start + REVISIONS {
            match watch.next_message().await.expect("message") {
                WatchMessage::Events { revision, .. } => assert_eq!(revision, expected),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Awaits futures concurrently on the current task.
    async fn futures_join<F: std::future::Future>(
        futures: impl Iterator<Item = F>,
    ) -> Vec<F::Output> {
        let handles: Vec<_> = futures.map(Box::pin).collect();
        let mut outputs = Vec::with_capacity(handles.len());
        for handle in handles {
            outputs.push(handle.await);
        }
        outputs
    }

    #[tokio::test]
    async fn history_beyond_the_retention_is_compacted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(Config::new(dir.path()).history_retention(10))
            .await
            .expect("open");
        for i in 0..50 {
            put(&store, "k", &i.to_string()).await;
        }
        let mut watch = store.watch("", 2).await.expect("watch");
        match watch.next_message().await.expect("message") {
            WatchMessage::Compacted { compact_revision } => {
                assert!(
                    compact_revision >= 51 - 11,
                    "kept too much: {compact_revision}"
                );
                assert!(
                    compact_revision <= 51 - 10,
                    "kept too little: {compact_revision}"
                );
            }
            other => panic!("expected Compacted, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_second_open_of_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let _store = open(dir.path()).await;
        let err = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect_err("second open");
        assert!(
            err.to_string().contains("already open in another process"),
            "{err}"
        );
    }

    /// Writes a store with some data, closes it, and returns the file's bytes.
    async fn valid_file(dir: &Path) -> Vec<u8> {
        let store = open(dir).await;
        for i in 0..200 {
            put(&store, &format!("key/{i}"), &"v".repeat(100)).await;
        }
        store.close().await;
        std::fs::read(dir.join(FILE_NAME)).expect("read file")
    }

    async fn open_damaged(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, bytes).expect("write damaged file");
        match EmbeddedStore::open(Config::new(dir.path())).await {
            Ok(store) => {
                let keys = store
                    .range(RangeRequest::prefix(""))
                    .await
                    .map(|page| page.kvs.len());
                panic!("a damaged file opened (with {keys:?} keys)")
            }
            Err(err) => {
                let message = err.to_string();
                assert!(
                    message.contains(&path.display().to_string()),
                    "names the file: {message}"
                );
                message
            }
        }
    }

    #[tokio::test]
    async fn damaged_files_are_refused_with_the_path_and_the_problem() {
        let template = tempfile::tempdir().expect("temp dir");
        let good = valid_file(template.path()).await;

        let foreign = open_damaged(b"# just some text file\nkey = value\n").await;
        assert!(
            foreign.contains("not a CCattler store") || foreign.contains("cannot"),
            "{foreign}"
        );

        let empty = open_damaged(b"").await;
        assert!(empty.contains("empty"), "{empty}");

        let truncated = open_damaged(&good[..good.len() / 2]).await;
        assert!(!truncated.is_empty());

        let mut flipped = good.clone();
        let middle = flipped.len() / 2;
        for byte in &mut flipped[middle..middle + 64] {
            *byte ^= 0x5a;
        }
        let corrupt = open_damaged(&flipped).await;
        assert!(corrupt.contains("corrupt"), "{corrupt}");
    }

    #[tokio::test]
    async fn a_database_of_another_program_is_not_mistaken_for_a_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(FILE_NAME);
        {
            let db = redb::Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let table: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("other");
                txn.open_table(table)
                    .expect("table")
                    .insert("a", "b")
                    .expect("insert");
            }
            txn.commit().expect("commit");
        }
        let err = EmbeddedStore::open(Config::new(dir.path()))
            .await
            .expect_err("foreign database");
        assert!(err.to_string().contains("not a CCattler store"), "{err}");
    }
}
