//! The store conformance suite: behaviours every backend must show, written
//! once against `dyn Store`. A backend's test file instantiates it with
//! `conformance_tests!(factory)`, where `factory` is an
//! `async fn() -> Fixture` giving a fresh, empty store per test.

#![allow(dead_code, unreachable_pub)]

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_store::{
    Compare, CompareOp, Op, RangeRequest, Revision, Store, StoreError, Txn, TxnOutcome, WatchEvent,
    WatchMessage, WatchStream,
};

/// A fresh store plus whatever must live as long as it (a temp dir, an etcd
/// process); dropping the guard tears it down.
pub type Fixture = (Arc<dyn Store>, Box<dyn Any + Send>);

/// One `#[tokio::test]` per conformance case, each on a fresh store.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::conformance_tests!(@cases $factory;
            put_get_and_revisions_increase,
            no_op_and_failed_txns_keep_the_revision,
            compares_on_mod_revision_value_and_existence,
            failed_compare_names_the_index_and_applies_nothing,
            delete_and_delete_prefix,
            invalid_requests_are_refused_with_a_reason,
            cas_under_16_concurrent_writers_loses_no_update,
            range_pages_through_100k_keys,
            one_mib_values_round_trip,
            watch_delivers_revisions_in_order_grouped,
            watch_from_zero_sees_only_new_changes,
            watch_resumes_from_a_revision_after_disconnect,
            compaction_yields_a_compacted_event,
            lease_expiry_deletes_keys_with_events,
            keep_alive_holds_and_revoke_deletes,
            unknown_leases_are_reported,
            a_snapshot_reads_one_revision_while_writes_go_on,
        );
    };
    (@cases $factory:path; $($case:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let (store, _guard) = $factory().await;
                $crate::conformance::$case(store).await;
            }
        )*
    };
}

const WAIT: Duration = Duration::from_secs(10);

async fn put(store: &Arc<dyn Store>, key: &str, value: &str) -> Revision {
    let outcome = store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("put");
    assert!(outcome.is_committed(), "unguarded put must commit");
    outcome.revision()
}

/// The next message, failing the test after [`WAIT`].
async fn next(stream: &mut WatchStream) -> WatchMessage {
    tokio::time::timeout(WAIT, stream.next_message())
        .await
        .expect("watch message within 10 s")
        .expect("watch message")
}

/// The next message must be the events of one revision.
async fn next_events(stream: &mut WatchStream) -> (Revision, Vec<WatchEvent>) {
    match next(stream).await {
        WatchMessage::Events { revision, events } => (revision, events),
        other => panic!("expected events, got {other:?}"),
    }
}

fn summary(events: &[WatchEvent]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            WatchEvent::Put(kv) => format!("put {}={}", kv.key, String::from_utf8_lossy(&kv.value)),
            WatchEvent::Delete { key, .. } => format!("delete {key}"),
        })
        .collect()
}

pub async fn put_get_and_revisions_increase(store: Arc<dyn Store>) {
    let start = store.current_revision().await.expect("revision");
    let first = put(&store, "a", "1").await;
    assert_eq!(first, start + 1);
    let second = put(&store, "a", "2").await;
    assert_eq!(second, start + 2);
    let kv = store.get("a").await.expect("get").expect("a exists");
    assert_eq!(kv.value, b"2");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first, second, 2)
    );
    assert_eq!(kv.lease, None);
    assert_eq!(store.get("missing").await.expect("get"), None);
    assert_eq!(store.current_revision().await.expect("revision"), second);
}

pub async fn no_op_and_failed_txns_keep_the_revision(store: Arc<dyn Store>) {
    let revision = put(&store, "a", "1").await;
    let empty = store.txn(Txn::new()).await.expect("empty txn");
    assert_eq!(empty, TxnOutcome::Committed { revision });
    let delete_missing = store
        .txn(Txn::new().then(Op::delete("nope")))
        .await
        .expect("delete");
    assert_eq!(delete_missing, TxnOutcome::Committed { revision });
    let failed = store
        .txn(
            Txn::new()
                .when(Compare::absent("a"))
                .then(Op::put("b", "1")),
        )
        .await
        .expect("txn");
    assert_eq!(failed, TxnOutcome::CompareFailed { index: 0, revision });
    assert_eq!(store.current_revision().await.expect("revision"), revision);
}

pub async fn compares_on_mod_revision_value_and_existence(store: Arc<dyn Store>) {
    let rev = put(&store, "k", "v1").await;
    let holds = |compare: Compare| {
        let store = Arc::clone(&store);
        async move {
            store
                .txn(Txn::new().when(compare))
                .await
                .expect("txn")
                .is_committed()
        }
    };
    assert!(holds(Compare::mod_revision("k", CompareOp::Equal, rev)).await);
    assert!(!holds(Compare::mod_revision("k", CompareOp::Equal, rev - 1)).await);
    assert!(holds(Compare::mod_revision("k", CompareOp::Greater, rev - 1)).await);
    assert!(holds(Compare::mod_revision("k", CompareOp::Less, rev + 1)).await);
    assert!(holds(Compare::mod_revision("k", CompareOp::NotEqual, 0)).await);
    assert!(holds(Compare::mod_revision("absent", CompareOp::Equal, 0)).await);
    assert!(holds(Compare::value("k", CompareOp::Equal, "v1")).await);
    assert!(holds(Compare::value("k", CompareOp::Greater, "v0")).await);
    assert!(!holds(Compare::value("k", CompareOp::NotEqual, "v1")).await);
    assert!(!holds(Compare::value("absent", CompareOp::Equal, "")).await);
    assert!(!holds(Compare::value("absent", CompareOp::NotEqual, "x")).await);
    assert!(holds(Compare::exists("k")).await);
    assert!(!holds(Compare::exists("absent")).await);
    assert!(holds(Compare::absent("absent")).await);
    assert!(!holds(Compare::absent("k")).await);
}

pub async fn failed_compare_names_the_index_and_applies_nothing(store: Arc<dyn Store>) {
    let rev = put(&store, "a", "1").await;
    put(&store, "b", "1").await;
    let outcome = store
        .txn(
            Txn::new()
                .when(Compare::exists("a"))
                .when(Compare::value("b", CompareOp::Equal, "1"))
                .when(Compare::mod_revision("a", CompareOp::Greater, rev))
                .then(Op::put("a", "2"))
                .then(Op::delete("b")),
        )
        .await
        .expect("txn");
    assert!(
        matches!(outcome, TxnOutcome::CompareFailed { index: 2, .. }),
        "{outcome:?}"
    );
    assert_eq!(store.get("a").await.expect("get").expect("a").value, b"1");
    assert!(store.get("b").await.expect("get").is_some());
}

pub async fn delete_and_delete_prefix(store: Arc<dyn Store>) {
    for key in ["dir/a", "dir/b", "dir/c/d", "dir2", "other"] {
        put(&store, key, "x").await;
    }
    let before = store.current_revision().await.expect("revision");
    let mut watch = store.watch("", 0).await.expect("watch");
    let outcome = store
        .txn(
            Txn::new()
                .then(Op::delete_prefix("dir/"))
                .then(Op::delete("other")),
        )
        .await
        .expect("delete");
    assert_eq!(
        outcome,
        TxnOutcome::Committed {
            revision: before + 1
        }
    );
    let left: Vec<String> = store
        .range(RangeRequest::prefix(""))
        .await
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(left, ["dir2"]);
    let (revision, events) = next_events(&mut watch).await;
    assert_eq!(revision, before + 1);
    assert_eq!(
        summary(&events),
        [
            "delete dir/a",
            "delete dir/b",
            "delete dir/c/d",
            "delete other"
        ]
    );
    assert!(events.iter().all(|event| event.revision() == before + 1));
}

pub async fn invalid_requests_are_refused_with_a_reason(store: Arc<dyn Store>) {
    let cases = [
        Txn::new().then(Op::put("", "x")),
        Txn::new().then(Op::delete_prefix("")),
        Txn::new().then(Op::put("big", vec![0u8; cca_store::MAX_VALUE_BYTES + 1])),
        Txn::new().then(Op::put("a", "1")).then(Op::put("a", "2")),
    ];
    for txn in cases {
        match store.txn(txn).await {
            Err(StoreError::InvalidRequest(reason)) => assert!(!reason.is_empty()),
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }
    assert_eq!(
        store
            .range(RangeRequest::prefix(""))
            .await
            .expect("range")
            .kvs,
        []
    );
}

pub async fn cas_under_16_concurrent_writers_loses_no_update(store: Arc<dyn Store>) {
    const WRITERS: usize = 16;
    const INCREMENTS: usize = 25;
    put(&store, "counter", "0").await;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..INCREMENTS {
                    loop {
                        let kv = store.get("counter").await.expect("get").expect("counter");
                        let value: u64 =
                            String::from_utf8_lossy(&kv.value).parse().expect("number");
                        let txn = Txn::new()
                            .when(Compare::mod_revision(
                                "counter",
                                CompareOp::Equal,
                                kv.mod_revision,
                            ))
                            .then(Op::put("counter", (value + 1).to_string()));
                        if store.txn(txn).await.expect("txn").is_committed() {
                            break;
                        }
                        conflicts += 1;
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.expect("writer task");
    }
    let kv = store.get("counter").await.expect("get").expect("counter");
    assert_eq!(kv.value, (WRITERS * INCREMENTS).to_string().as_bytes());
    assert_eq!(kv.version as usize, WRITERS * INCREMENTS + 1);
    // With 16 writers racing, some compares must have failed; otherwise the
    // test did not exercise contention at all.
    assert!(
        conflicts > 0,
        "no CAS conflict seen among {WRITERS} writers"
    );
}

pub async fn range_pages_through_100k_keys(store: Arc<dyn Store>) {
    const KEYS: usize = 100_000;
    const PER_TXN: usize = 100;
    let key = |i: usize| format!("bulk/{i:06}");
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for chunk in (writer * PER_TXN..KEYS).step_by(8 * PER_TXN) {
                    let txn = (chunk..chunk + PER_TXN).fold(Txn::new(), |txn, i| {
                        txn.then(Op::put(key(i), i.to_string()))
                    });
                    assert!(store.txn(txn).await.expect("bulk txn").is_committed());
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("bulk writer");
    }
    put(&store, "bulk0", "outside the prefix").await;

    let all = store
        .range(RangeRequest::prefix("bulk/"))
        .await
        .expect("range all");
    assert_eq!(all.kvs.len(), KEYS);
    assert_eq!(all.continuation, None);

    let mut seen = 0;
    let mut request = RangeRequest::prefix("bulk/").limit(7_000);
    loop {
        let page = store.range(request.clone()).await.expect("page");
        for (offset, kv) in page.kvs.iter().enumerate() {
            assert_eq!(
                kv.key,
                key(seen + offset),
                "pages must be contiguous and ordered"
            );
        }
        seen += page.kvs.len();
        match page.continuation {
            Some(last) => {
                assert_eq!(page.kvs.len(), 7_000);
                request = request.after(last);
            }
            None => break,
        }
    }
    assert_eq!(seen, KEYS);
}

pub async fn one_mib_values_round_trip(store: Arc<dyn Store>) {
    let value: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let txn = Txn::new().then(Op::put("big", value.clone()));
    assert!(store.txn(txn).await.expect("1 MiB put").is_committed());
    assert_eq!(
        store.get("big").await.expect("get").expect("big").value,
        value
    );
    let page = store
        .range(RangeRequest::prefix("big"))
        .await
        .expect("range");
    assert_eq!(page.kvs[0].value.len(), value.len());
}

pub async fn watch_delivers_revisions_in_order_grouped(store: Arc<dyn Store>) {
    let start = store.current_revision().await.expect("revision");
    let mut watch = store.watch("app/", start + 1).await.expect("watch");
    put(&store, "app/a", "1").await;
    put(&store, "elsewhere", "1").await;
    store
        .txn(
            Txn::new()
                .then(Op::put("app/b", "2"))
                .then(Op::put("app/c", "3"))
                .then(Op::put("zzz", "x")),
        )
        .await
        .expect("txn");
    store
        .txn(Txn::new().then(Op::delete("app/a")))
        .await
        .expect("delete");

    let (rev, events) = next_events(&mut watch).await;
    assert_eq!(
        (rev, summary(&events)),
        (start + 1, vec!["put app/a=1".to_owned()])
    );
    let (rev, events) = next_events(&mut watch).await;
    assert_eq!(rev, start + 3, "the put outside the prefix is skipped");
    assert_eq!(summary(&events), ["put app/b=2", "put app/c=3"]);
    let (rev, events) = next_events(&mut watch).await;
    assert_eq!(
        (rev, summary(&events)),
        (start + 4, vec!["delete app/a".to_owned()])
    );
    match &events[0] {
        WatchEvent::Delete { revision, .. } => assert_eq!(*revision, start + 4),
        other => panic!("expected a delete, got {other:?}"),
    }
}

pub async fn watch_from_zero_sees_only_new_changes(store: Arc<dyn Store>) {
    put(&store, "k", "old").await;
    let mut watch = store.watch("k", 0).await.expect("watch");
    let rev = put(&store, "k", "new").await;
    let (revision, events) = next_events(&mut watch).await;
    assert_eq!(
        (revision, summary(&events)),
        (rev, vec!["put k=new".to_owned()])
    );
}

pub async fn watch_resumes_from_a_revision_after_disconnect(store: Arc<dyn Store>) {
    let start = store.current_revision().await.expect("revision");
    let mut watch = store.watch("w/", start + 1).await.expect("watch");
    put(&store, "w/1", "a").await;
    let (seen, _) = next_events(&mut watch).await;
    drop(watch);
    // Changes made while nobody watches are replayed on resume, in order,
    // starting right after the last revision seen: no gap, no duplicate.
    for i in 2..=5 {
        put(&store, &format!("w/{i}"), "a").await;
    }
    let mut resumed = store.watch("w/", seen + 1).await.expect("resume");
    for i in 2..=5 {
        let (revision, events) = next_events(&mut resumed).await;
        assert_eq!(revision, seen + i - 1);
        assert_eq!(summary(&events), [format!("put w/{i}=a")]);
    }
    let live = put(&store, "w/6", "a").await;
    assert_eq!(next_events(&mut resumed).await.0, live);
}

pub async fn compaction_yields_a_compacted_event(store: Arc<dyn Store>) {
    let first = put(&store, "c", "1").await;
    put(&store, "c", "2").await;
    let third = put(&store, "c", "3").await;
    store.compact(third - 1).await.expect("compact");

    let mut old = store.watch("c", first).await.expect("watch");
    assert_eq!(
        next(&mut old).await,
        WatchMessage::Compacted {
            compact_revision: third - 1
        }
    );
    assert!(
        tokio::time::timeout(WAIT, old.next())
            .await
            .expect("stream ends")
            .is_none(),
        "a compacted watch ends"
    );

    let mut kept = store
        .watch("c", third)
        .await
        .expect("watch at the compaction point + 1");
    assert_eq!(next_events(&mut kept).await.0, third);

    match store.compact(first).await {
        Err(StoreError::Compacted {
            requested,
            compact_revision,
        }) => {
            assert_eq!((requested, compact_revision), (first, third - 1));
        }
        other => panic!("compacting old history must fail, got {other:?}"),
    }
    match store.compact(third + 100).await {
        Err(StoreError::FutureRevision { requested, current }) => {
            assert_eq!((requested, current), (third + 100, third));
        }
        other => panic!("compacting the future must fail, got {other:?}"),
    }
    assert_eq!(store.get("c").await.expect("get").expect("c").value, b"3");
}

pub async fn lease_expiry_deletes_keys_with_events(store: Arc<dyn Store>) {
    let lease = store
        .grant_lease(Duration::from_secs(1))
        .await
        .expect("grant");
    let txn = Txn::new()
        .then(Op::put_with_lease("node/a", "up", lease))
        .then(Op::put_with_lease("node/b", "up", lease))
        .then(Op::put("node/permanent", "stays"));
    let rev = store.txn(txn).await.expect("put").revision();
    assert_eq!(
        store.get("node/a").await.expect("get").expect("a").lease,
        Some(lease)
    );
    let mut watch = store.watch("node/", rev + 1).await.expect("watch");
    let started = Instant::now();
    let (revision, events) = next_events(&mut watch).await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "expired too early"
    );
    assert!(revision > rev);
    assert_eq!(summary(&events), ["delete node/a", "delete node/b"]);
    assert_eq!(store.get("node/a").await.expect("get"), None);
    assert!(store.get("node/permanent").await.expect("get").is_some());
    assert!(
        matches!(store.keep_alive(lease).await, Err(StoreError::LeaseNotFound(id)) if id == lease)
    );
}

pub async fn keep_alive_holds_and_revoke_deletes(store: Arc<dyn Store>) {
    let lease = store
        .grant_lease(Duration::from_secs(1))
        .await
        .expect("grant");
    store
        .txn(Txn::new().then(Op::put_with_lease("held", "x", lease)))
        .await
        .expect("put");
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let ttl = store.keep_alive(lease).await.expect("keep alive");
        assert_eq!(ttl, Duration::from_secs(1));
    }
    assert!(
        store.get("held").await.expect("get").is_some(),
        "kept-alive key vanished"
    );
    store.revoke_lease(lease).await.expect("revoke");
    assert_eq!(store.get("held").await.expect("get"), None);
    assert!(matches!(
        store.revoke_lease(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

pub async fn unknown_leases_are_reported(store: Arc<dyn Store>) {
    let unknown = 0x5eed_5eed;
    assert!(
        matches!(store.keep_alive(unknown).await, Err(StoreError::LeaseNotFound(id)) if id == unknown)
    );
    let put = store
        .txn(Txn::new().then(Op::put_with_lease("k", "v", unknown)))
        .await;
    assert!(
        matches!(put, Err(StoreError::LeaseNotFound(id)) if id == unknown),
        "{put:?}"
    );
    assert_eq!(store.get("k").await.expect("get"), None);
}

/// A snapshot is every key at one revision, in key order and in pages, and
/// writes made while it is read do not show in it.
pub async fn a_snapshot_reads_one_revision_while_writes_go_on(store: Arc<dyn Store>) {
    for i in 0..250 {
        put(&store, &format!("snap/{i:04}"), "before").await;
    }
    let mut snapshot = store.snapshot(100).await.expect("snapshot");
    let at = snapshot.revision;
    assert_eq!(snapshot.count, 250);
    put(&store, "snap/0000", "after").await;
    put(&store, "snap/9999", "after").await;
    let mut keys = Vec::new();
    let mut pages = 0;
    while let Some(page) = snapshot.pages.recv().await {
        let page = page.expect("a page");
        assert!(page.len() <= 100);
        pages += 1;
        for kv in page {
            assert_eq!(kv.value, b"before", "{} as of {at}", kv.key);
            assert!(kv.mod_revision <= at);
            keys.push(kv.key);
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(keys.len(), 250);
    assert!(
        keys.windows(2).all(|pair| pair[0] < pair[1]),
        "in key order"
    );
    assert!(store.current_revision().await.expect("revision") > at);
}
