//! The conformance suite on the etcd backend, each case on its own fresh
//! etcd, plus what only the etcd backend has to get right: the key
//! namespace, values at etcd's request-size limit, and connection trouble —
//! a server that is down, one that stops answering or dies mid-request, and
//! one that restarts under a watch (also while history is compacted).

mod conformance;

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_store::etcd::{Config, EtcdStore};
use cca_store::testing::etcd::EtcdServer;
use cca_store::{
    MAX_VALUE_BYTES, Op, RangeRequest, Revision, Store, StoreError, Txn, WatchEvent, WatchMessage,
    WatchStream,
};

async fn fixture() -> conformance::Fixture {
    let server = EtcdServer::start();
    let store = connect(&server).await;
    (
        Arc::new(store) as Arc<dyn Store>,
        Box::new(server) as Box<dyn Any + Send>,
    )
}

conformance_tests!(fixture);

async fn connect(server: &EtcdServer) -> EtcdStore {
    EtcdStore::connect(Config::new(vec![server.endpoint()]))
        .await
        .expect("connect to etcd")
}

async fn put(store: &EtcdStore, key: &str, value: &str) -> Revision {
    let outcome = store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("put");
    assert!(outcome.is_committed());
    outcome.revision()
}

/// The next message's revision and `key=value` / `-key` summary.
async fn next_change(watch: &mut WatchStream) -> (Revision, Vec<String>) {
    let message = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
        .await
        .expect("a watch message within 10 s")
        .expect("a watch message");
    let WatchMessage::Events { revision, events } = message else {
        panic!("expected events, got {message:?}");
    };
    let summary = events
        .iter()
        .map(|event| match event {
            WatchEvent::Put(kv) => format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)),
            WatchEvent::Delete { key, .. } => format!("-{key}"),
        })
        .collect();
    (revision, summary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_under_the_namespace_and_other_keys_are_invisible() {
    let server = EtcdServer::start();
    let store = connect(&server).await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("raw client");
    raw.put("elsewhere/x", "not ours", None)
        .await
        .expect("raw put");
    put(&store, "a", "1").await;

    let raw_ours = raw.get("cca/a", None).await.expect("raw get");
    assert_eq!(raw_ours.kvs()[0].value(), b"1");
    let page = store.range(RangeRequest::prefix("")).await.expect("range");
    let keys: Vec<&str> = page.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["a"]);

    raw.put(b"cca/\xff".to_vec(), "binary key", None)
        .await
        .expect("raw put");
    match store.range(RangeRequest::prefix("")).await {
        Err(StoreError::Backend(reason)) => assert!(reason.contains("not UTF-8"), "{reason}"),
        other => panic!("a non-UTF-8 key must be reported, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_up_to_the_limit_fit_and_larger_requests_are_invalid() {
    let server = EtcdServer::start();
    let store = connect(&server).await;
    let value = vec![7u8; MAX_VALUE_BYTES];
    let txn = Txn::new().then(Op::put("largest", value.clone()));
    assert!(store.txn(txn).await.expect("largest value").is_committed());
    assert_eq!(
        store
            .get("largest")
            .await
            .expect("get")
            .expect("largest")
            .value,
        value
    );

    // Each value fits, their sum does not: etcd refuses the request, the
    // larger one already in its gRPC layer.
    for values in [2, 3] {
        let txn = (0..values).fold(Txn::new(), |txn, i| {
            txn.then(Op::put(format!("big/{i}"), vec![1u8; 1024 * 1024]))
        });
        match store.txn(txn).await {
            Err(StoreError::InvalidRequest(reason)) => {
                assert!(reason.contains("too large"), "{reason}")
            }
            other => panic!("{values} MiB in one txn must be refused, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_no_etcd_is_unavailable_and_names_the_endpoint() {
    let server = EtcdServer::start();
    let endpoint = server.endpoint();
    drop(server);
    let mut config = Config::new(vec![endpoint.clone()]);
    config.retry_attempts = 2;
    match EtcdStore::connect(config).await {
        Err(StoreError::Unavailable { reason }) => assert!(reason.contains(&endpoint), "{reason}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_while_etcd_is_down_are_unavailable_and_apply_nothing() {
    let mut server = EtcdServer::start();
    let store = connect(&server).await;
    put(&store, "before", "1").await;
    server.kill();
    // Let the client notice the closed connection, so the txn below is
    // refused while connecting rather than lost on a dying connection.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    let txn = store.txn(Txn::new().then(Op::put("during", "1"))).await;
    assert!(
        matches!(txn, Err(StoreError::Unavailable { .. })),
        "{txn:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "gave up after {:?}",
        started.elapsed()
    );
    let read = store.get("before").await;
    assert!(
        matches!(read, Err(StoreError::Unavailable { .. })),
        "{read:?}"
    );

    server.restart();
    assert_eq!(store.get("during").await.expect("get after restart"), None);
    assert!(store.get("before").await.expect("get").is_some());
    put(&store, "after", "1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_that_gets_no_answer_has_an_unknown_outcome() {
    let server = EtcdServer::start();
    let mut config = Config::new(vec![server.endpoint()]);
    config.request_timeout = Duration::from_millis(300);
    let store = EtcdStore::connect(config).await.expect("connect");
    put(&store, "k", "1").await;

    server.pause();
    let txn = store.txn(Txn::new().then(Op::put("k", "2"))).await;
    server.resume();
    assert!(
        matches!(txn, Err(StoreError::OutcomeUnknown { .. })),
        "{txn:?}"
    );
    // Whatever became of it, the store serves again once etcd answers.
    assert!(store.get("k").await.expect("get").is_some());
    put(&store, "k", "3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_cut_off_by_a_dying_server_has_an_unknown_outcome() {
    let mut server = EtcdServer::start();
    let store = Arc::new(connect(&server).await);
    // Frozen, the server takes the request off the wire but never answers;
    // killed, it resets the connection under the waiting txn.
    server.pause();
    let sender = Arc::clone(&store);
    let txn = tokio::spawn(async move { sender.txn(Txn::new().then(Op::put("k", "1"))).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    let txn = txn.await.expect("txn task");
    match txn {
        Err(StoreError::OutcomeUnknown { reason }) => {
            assert!(reason.contains(&server.endpoint()), "{reason}");
        }
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_across_an_etcd_restart_without_gaps_or_duplicates() {
    let mut server = EtcdServer::start();
    let store = connect(&server).await;
    let other = connect(&server).await;
    let mut watch = store.watch("w/", 0).await.expect("watch");
    let first = put(&store, "w/1", "a").await;
    assert_eq!(
        next_change(&mut watch).await,
        (first, vec!["w/1=a".to_owned()])
    );

    server.restart();
    // Written while the watch is (probably still) reconnecting: the watch
    // must replay them from where it stopped.
    let mut expected = Vec::new();
    for i in 2..=4 {
        let key = format!("w/{i}");
        expected.push((put(&other, &key, "b").await, vec![format!("{key}=b")]));
    }
    for change in expected {
        assert_eq!(next_change(&mut watch).await, change);
    }
    let live = put(&other, "w/5", "c").await;
    assert_eq!(
        next_change(&mut watch).await,
        (live, vec!["w/5=c".to_owned()])
    );
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
    assert!(quiet.is_err(), "no duplicate may follow: {quiet:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resuming_into_compacted_history_reports_the_compaction() {
    let mut server = EtcdServer::start();
    // A slow retry, so that history is compacted before the watch is back.
    let mut config = Config::new(vec![server.endpoint()]);
    config.retry_base_delay = Duration::from_secs(3);
    config.retry_max_delay = Duration::from_secs(3);
    let watching = EtcdStore::connect(config).await.expect("connect");
    let mut watch = watching.watch("w/", 0).await.expect("watch");
    let first = put(&watching, "w/1", "a").await;
    assert_eq!(next_change(&mut watch).await.0, first);

    server.kill();
    // The watch's first attempt to resume fails; its next one is >= 1.5 s away.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart();
    let other = connect(&server).await;
    put(&other, "w/2", "b").await;
    let third = put(&other, "w/3", "c").await;
    other.compact(third).await.expect("compact");

    let message = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
        .await
        .expect("a watch message within 10 s")
        .expect("a watch message");
    assert_eq!(
        message,
        WatchMessage::Compacted {
            compact_revision: third
        }
    );
    assert!(watch.next().await.is_none(), "a compacted watch ends");
}

/// An etcd replaced by an empty one under a watch (wiped, or restored from
/// an old snapshot): the watch does not wait for revisions of a history
/// that is gone, it reports a compaction so its consumer reads everything
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_an_etcd_that_went_back_in_time_reports_a_compaction() {
    let mut server = EtcdServer::start();
    let store = connect(&server).await;
    let mut watch = store.watch("w/", 0).await.expect("watch");
    let mut last = 0;
    for i in 0..20 {
        last = put(&store, &format!("w/{i}"), "a").await;
    }
    while next_change(&mut watch).await.0 < last {}
    server.wipe_and_restart();
    let message = tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect("the watch ends in time");
    match message {
        Some(Ok(WatchMessage::Compacted { compact_revision })) => {
            assert!(compact_revision < last, "{compact_revision} vs {last}");
        }
        other => panic!("expected a compaction, got {other:?}"),
    }
}

/// Renewals reuse keep-alive streams: many leases renewed at once, twice
/// (the second time on pooled streams), each get their own TTL back, an
/// unknown lease is told apart from the others, and renewals go on after
/// etcd restarts under the pooled streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_at_once_over_reused_streams_and_after_a_restart() {
    let mut server = EtcdServer::start();
    let store = Arc::new(connect(&server).await);
    let mut leases = Vec::new();
    for _ in 0..200 {
        leases.push(
            store
                .grant_lease(Duration::from_secs(30))
                .await
                .expect("grant"),
        );
    }
    let revoked = leases[7];
    store.revoke_lease(revoked).await.expect("revoke");

    let renew_all = |leases: Vec<i64>| {
        let store = Arc::clone(&store);
        async move {
            let mut renewals = tokio::task::JoinSet::new();
            for lease in leases {
                let store = Arc::clone(&store);
                renewals.spawn(async move { (lease, store.keep_alive(lease).await) });
            }
            renewals.join_all().await
        }
    };
    for (lease, renewed) in renew_all(leases.clone())
        .await
        .into_iter()
        .chain(renew_all(leases.clone()).await)
    {
        if lease == revoked {
            assert!(
                matches!(renewed, Err(StoreError::LeaseNotFound(id)) if id == revoked),
                "{renewed:?}"
            );
        } else {
            let ttl = renewed.unwrap_or_else(|err| panic!("lease {lease}: {err}"));
            assert!(
                ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
                "lease {lease}: {ttl:?}"
            );
        }
    }

    server.restart();
    let alive: Vec<i64> = leases.into_iter().filter(|&l| l != revoked).collect();
    for (lease, renewed) in renew_all(alive).await {
        renewed.unwrap_or_else(|err| panic!("lease {lease} after the restart: {err}"));
    }
}
