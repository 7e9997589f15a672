//! Applies of any size, all or nothing, on both backends: 10,000 services
//! apply on the embedded store and on a real etcd with its default limits
//! (128 operations and 1.5 MiB per request); and an apply cut off after any
//! of its transactions (the server killed) leaves the old program or the
//! new one visible, never a mix: to a fresh server's cache, revision by
//! revision in the store's history, and in the store once settled.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use cca_api::{ApiConfig, ApiState};
use cca_control::{Cache, View};
use cca_model::spec::Program;
use cca_model::{Kind, keys};
use cca_store::etcd::EtcdStore;
use cca_store::testing::CrashAfter;
use cca_store::testing::etcd::EtcdServer;
use cca_store::{RangeRequest, Store, WatchMessage};

/// Service name → replicas: what a program amounts to for these tests.
type Shape = BTreeMap<String, u32>;

fn program(names: impl Iterator<Item = usize>, replicas: u32) -> Program {
    let names: Vec<String> = names.map(|n| format!("s{n:05}")).collect();
    let services: Vec<(&str, u32)> = names.iter().map(|name| (name.as_str(), replicas)).collect();
    support::program(&services)
}

fn shape(program: &Program) -> Shape {
    program
        .services
        .iter()
        .map(|(name, spec)| (name.clone(), spec.replicas))
        .collect()
}

fn shape_of(view: &View) -> Shape {
    view.services
        .iter()
        .map(|(name, spec)| (name.clone(), spec.replicas))
        .collect()
}

async fn state_over(store: Arc<dyn Store>) -> ApiState {
    let cache = Arc::new(Cache::start(Arc::clone(&store)).await.expect("cache"));
    ApiState::new(
        store,
        cache,
        ApiConfig::default(),
        cca_api::no_extra_metrics(),
    )
}

async fn apply(
    state: &ApiState,
    program: &Program,
    prune: bool,
) -> (StatusCode, serde_json::Value) {
    let app = cca_api::app(state.clone());
    let uri = if prune {
        "/v1/apply?prune=true"
    } else {
        "/v1/apply"
    };
    support::call(&app, "POST", uri, Some(support::json(program))).await
}

/// The program-managed shape in the store's own keys (not the view).
async fn stored_shape(store: &dyn Store) -> Shape {
    let page = store
        .range(RangeRequest::prefix(Kind::Service.prefix()))
        .await
        .expect("range");
    let mut view = View::default();
    for kv in page.kvs {
        view.put(&kv.key, &kv.value, kv.mod_revision);
    }
    shape_of(&view)
}

async fn staged_keys(store: &dyn Store) -> (bool, usize) {
    let applying = store.get(&keys::applying()).await.expect("get").is_some();
    let chunks = store
        .range(RangeRequest::prefix(Kind::ApplyChunk.prefix()))
        .await
        .expect("range")
        .kvs
        .len();
    (applying, chunks)
}

async fn etcd_store(etcd: &EtcdServer) -> Arc<dyn Store> {
    let store = EtcdStore::connect(cca_store::etcd::Config::new(vec![etcd.endpoint()]))
        .await
        .expect("connect");
    Arc::new(store)
}

async fn embedded_store(dir: &std::path::Path) -> Arc<dyn Store> {
    let config = cca_store::embedded::Config::new(dir);
    Arc::new(
        cca_store::embedded::EmbeddedStore::open(config)
            .await
            .expect("open"),
    )
}

async fn ten_thousand_services(store: Arc<dyn Store>) {
    let state = state_over(Arc::clone(&store)).await;
    let wanted = program(0..10_000, 1);
    let (status, report) = apply(&state, &wanted, false).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["created"].as_array().map(Vec::len), Some(20_000));
    let view = support::fresh(&state).await;
    assert_eq!(shape_of(view.as_ref()), shape(&wanted));
    assert_eq!(stored_shape(store.as_ref()).await, shape(&wanted));
    assert_eq!(
        staged_keys(store.as_ref()).await,
        (false, 0),
        "nothing staged is left"
    );
    // The same program again writes nothing; a prune of half deletes half.
    let (_, again) = apply(&state, &wanted, false).await;
    assert_eq!(again["unchanged"], 20_000, "{again}");
    let half = program(0..5_000, 1);
    let (status, pruned) = apply(&state, &half, true).await;
    assert_eq!(status, StatusCode::OK, "{pruned}");
    assert_eq!(stored_shape(store.as_ref()).await, shape(&half));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_services_apply_on_the_embedded_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    ten_thousand_services(embedded_store(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_services_apply_on_etcd_with_its_default_limits() {
    let etcd = EtcdServer::start();
    ten_thousand_services(etcd_store(&etcd).await).await;
}

/// Every revision of the store's history from `from` on, replayed into a
/// view: each must show `old` or `new` whole.
async fn assert_history_never_mixes(store: &dyn Store, from: i64, old: &Shape, new: &Shape) {
    let until = store.current_revision().await.expect("revision");
    let mut view = View::default();
    let mut stream = store.watch("", 1).await.expect("watch from the start");
    while view.revision < until {
        let Some(message) = stream.next().await else {
            break;
        };
        let WatchMessage::Events { revision, events } = message.expect("history") else {
            panic!("history was compacted");
        };
        for event in events {
            match event {
                cca_store::WatchEvent::Put(kv) => {
                    view.put(&kv.key, &kv.value, kv.mod_revision);
                }
                cca_store::WatchEvent::Delete { key, revision } => {
                    view.delete(&key, revision);
                }
            }
        }
        view.revision = revision;
        if revision >= from {
            let seen = shape_of(&view);
            assert!(
                seen == *old || seen == *new,
                "revision {revision} shows a mix: {} services",
                seen.len()
            );
        }
    }
}

/// Cuts the apply of `new` over `old` after each of its transactions in
/// turn, as if the server were killed there.
async fn killed_at_any_point(open: impl AsyncFn() -> (Arc<dyn Store>, Box<dyn std::any::Any>)) {
    let old_program = program(0..12, 1);
    let new_program = program(4..20, 2);
    let (old, new) = (shape(&old_program), shape(&new_program));
    let mut outcomes = BTreeMap::from([("old", 0), ("new", 0)]);
    for commits in 1.. {
        let (store, _guard) = open().await;
        let before = state_over(Arc::clone(&store)).await;
        let (status, _) = apply(&before, &old_program, false).await;
        assert_eq!(status, StatusCode::OK);
        let from = store.current_revision().await.expect("revision") + 1;

        // Transactions of 8 operations: the new program is staged.
        let crashing: Arc<dyn Store> = Arc::new(CrashAfter::new(Arc::clone(&store), commits, 8));
        let doomed = state_over(crashing).await;
        let (status, report) = apply(&doomed, &new_program, true).await;
        let finished = status == StatusCode::OK;
        drop(doomed);

        // A new server over the same store sees one program whole.
        let after = state_over(Arc::clone(&store)).await;
        let seen = shape_of(&*support::fresh(&after).await);
        assert!(
            seen == old || seen == new,
            "cut after {commits} commits ({status}: {report}): the view shows a mix"
        );
        *outcomes
            .entry(if seen == new { "new" } else { "old" })
            .or_default() += 1;
        assert_history_never_mixes(store.as_ref(), from, &old, &new).await;

        // Once it settles (as it does when it starts serving), the store's
        // own keys hold that same program and nothing is left mid-apply.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(cca_api::serve(listener, after.clone(), async {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while staged_keys(store.as_ref()).await.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !staged_keys(store.as_ref()).await.0,
            "the commit record was not settled"
        );
        assert_eq!(stored_shape(store.as_ref()).await, seen);
        assert_eq!(shape_of(&*support::fresh(&after).await), seen);
        let _ = stop.send(());
        let _ = serving.await;
        if finished {
            // Staged: chunks, the commit, the copies, the record's removal.
            assert!(
                commits > 10,
                "the apply took {commits} transactions: it was not staged"
            );
            break;
        }
    }
    assert!(
        outcomes["old"] > 0 && outcomes["new"] > 1,
        "some cuts must fall before the commit and several after it: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_killed_at_any_point_shows_one_program_on_the_embedded_store() {
    killed_at_any_point(async || {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = embedded_store(dir.path()).await;
        (store, Box::new(dir) as Box<dyn std::any::Any>)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_killed_at_any_point_shows_one_program_on_etcd() {
    killed_at_any_point(async || {
        let etcd = EtcdServer::start();
        let store = etcd_store(&etcd).await;
        (store, Box::new(etcd) as Box<dyn std::any::Any>)
    })
    .await;
}

/// A scale while a killed server's staged apply is committed but not yet
/// copied into place finishes the copy first, then lands on the new
/// program (it would otherwise write the old spec the store still holds,
/// and the copy would undo it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_after_a_half_copied_apply_lands_on_the_new_program() {
    let old_program = program(0..12, 1);
    let new_program = program(4..20, 2);
    for commits in 1.. {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = embedded_store(dir.path()).await;
        let before = state_over(Arc::clone(&store)).await;
        assert_eq!(apply(&before, &old_program, false).await.0, StatusCode::OK);
        let crashing: Arc<dyn Store> = Arc::new(CrashAfter::new(Arc::clone(&store), commits, 8));
        let (status, _) = apply(&state_over(crashing).await, &new_program, true).await;
        assert_ne!(
            status,
            StatusCode::OK,
            "the apply ended before its copy was cut"
        );
        let (applying, chunks) = staged_keys(store.as_ref()).await;
        if !(applying && chunks > 1) {
            continue;
        }
        // Committed, some chunks still staged: scale a service the new
        // program changed and one it created.
        let after = state_over(Arc::clone(&store)).await;
        let app = cca_api::app(after.clone());
        for (service, replicas) in [("s00004", 5), ("s00019", 7)] {
            let uri = format!("/v1/services/{service}/scale");
            let body = serde_json::json!({ "replicas": replicas });
            let (status, reply) = support::call(&app, "POST", &uri, Some(body)).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
        }
        assert!(!staged_keys(store.as_ref()).await.0, "settled first");
        let mut wanted = shape(&new_program);
        wanted.insert("s00004".into(), 5);
        wanted.insert("s00019".into(), 7);
        assert_eq!(stored_shape(store.as_ref()).await, wanted);
        return;
    }
}
