//! Secret values through the API: set, list and remove without a value
//! ever coming back; values sealed at rest; the agent's files endpoint
//! answering an instance's connection URLs and granted secrets only to the
//! node it is placed on, and naming a secret without a value; assignment
//! lines naming a grant committed with or just before their placement even
//! when the cache (which the assignment hub indexes) lags behind the store;
//! a key rotation end to end (key file A to KMS command B, format-1 and
//! foreign records, a concurrent `set`, then A dropped) and its cost.

mod support;

use support::instance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use cca_api::SecretKey;
use cca_api::secrets::{CommandProvider, LocalKey, SecretValue};
use cca_model::keys;
use cca_model::spec::{ConnectionSpec, SecretGrant, SecretSpec};
use serde_json::json;

async fn keyed_harness() -> support::Harness {
    let h = support::harness().await;
    let key = SecretKey::from_bytes(&[9; 32]).expect("32 bytes");
    let _ = h.state.clone().with_secret_key(key);
    h
}

/// `web` uses connection `app_db` (secret `db_password`) and is granted
/// `api_token` explicitly; `report` is declared and unused.
fn program() -> cca_model::spec::Program {
    let mut program = support::program(&[("web", 1)]);
    if let Some(web) = program.services.get_mut("web") {
        web.connections = vec!["app_db".into()];
    }
    program.connections.insert(
        "app_db".into(),
        ConnectionSpec {
            name: "app_db".into(),
            driver: "postgresql".into(),
            user: Some("app".into()),
            secret: Some("db_password".into()),
            host: "postgres".into(),
            port: 5432,
            database: Some("app".into()),
            params: BTreeMap::new(),
            tenant: None,
        },
    );
    for name in ["db_password", "api_token", "report"] {
        program.secrets.insert(
            name.into(),
            SecretSpec {
                name: name.into(),
                description: None,
                tenant: None,
            },
        );
    }
    program.grants.insert(
        "web".into(),
        BTreeMap::from([
            (
                "db_password".into(),
                SecretGrant::Connection {
                    connection: "app_db".into(),
                },
            ),
            ("api_token".into(), SecretGrant::Explicit),
        ]),
    );
    program
}

#[tokio::test]
async fn secrets_are_set_listed_and_removed_without_showing_values() {
    let h = keyed_harness().await;
    let (status, _) = h
        .call("POST", "/v1/apply", Some(support::json(&program())))
        .await;
    assert_eq!(status, StatusCode::OK);

    let (status, reply) = h
        .call(
            "PUT",
            "/v1/secrets/db_password",
            Some(json!({"value": "p@ss:w/rd"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["created"], true);
    let (_, reply) = h
        .call(
            "PUT",
            "/v1/secrets/db_password",
            Some(json!({"value": "p@ss:w/rd"})),
        )
        .await;
    assert_eq!(reply["created"], false);
    // Set without a declaration is allowed (and listed as such).
    let (status, _) = h
        .call("PUT", "/v1/secrets/extra", Some(json!({"value": "x"})))
        .await;
    assert_eq!(status, StatusCode::OK);

    // Stored sealed: the value is nowhere in the store.
    let stored = h
        .store
        .get(&keys::desired_secret("db_password"))
        .await
        .expect("get")
        .expect("stored");
    let text = String::from_utf8_lossy(&stored.value);
    assert!(!text.contains("p@ss"), "{text}");
    assert!(text.contains("AES-256-GCM"), "{text}");

    let (status, list) = h.call("GET", "/v1/secrets", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!list.to_string().contains("p@ss"));
    let by_name: BTreeMap<String, serde_json::Value> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|info| {
            (
                info["name"].as_str().expect("name").to_owned(),
                info.clone(),
            )
        })
        .collect();
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        ["api_token", "db_password", "extra", "report"]
    );
    assert_eq!(by_name["db_password"]["declared"], true);
    assert_eq!(by_name["db_password"]["set"], true);
    assert!(by_name["db_password"]["set_at"].as_i64().is_some());
    assert_eq!(by_name["db_password"]["used_by"], json!(["web"]));
    assert_eq!(by_name["api_token"]["set"], false);
    assert_eq!(by_name["extra"]["declared"], false);
    assert_eq!(by_name["report"]["used_by"], json!([]));

    // A prune never touches values.
    let (status, _) = h
        .call(
            "POST",
            "/v1/apply?prune=true",
            Some(support::json(&program())),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(h.keys().await.contains(&keys::desired_secret("extra")));

    let (status, _) = h.call("DELETE", "/v1/secrets/extra", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply) = h.call("DELETE", "/v1/secrets/extra", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reply}");

    let (status, reply) = h
        .call("PUT", "/v1/secrets/a.b", Some(json!({"value": "x"})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    let (status, _) = h
        .call("PUT", "/v1/secrets/empty", Some(json!({"value": ""})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_server_without_a_key_refuses_to_store_values() {
    let h = support::harness().await;
    let (status, reply) = h
        .call("PUT", "/v1/secrets/db", Some(json!({"value": "x"})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        reply["error"]
            .as_str()
            .expect("message")
            .contains("--secret-key-file")
    );
    assert!(h.keys().await.is_empty());
}

#[tokio::test]
async fn the_files_endpoint_answers_the_instance_node_only() {
    let h = keyed_harness().await;
    let (status, _) = h
        .call("POST", "/v1/apply", Some(support::json(&program())))
        .await;
    assert_eq!(status, StatusCode::OK);
    let placed = instance("web-1", "web", "n1");
    h.store
        .txn(cca_store::Txn::new().then(cca_store::Op::put(
            keys::derived_instance("web", "web-1"),
            serde_json::to_vec(&placed).expect("encodes"),
        )))
        .await
        .expect("placed");
    let revision = h.revision().await;
    h.state
        .cache()
        .view_at_least(revision)
        .await
        .expect("cache catches up");

    let files = "/v1/agent/nodes/n1/instances/web-1/files";
    // Nothing set yet: the message names the secret and the command.
    let (status, reply) = h.call("GET", files, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    let message = reply["error"].as_str().expect("message");
    assert!(
        message.contains("secret `db_password`") && message.contains("cca secret set db_password"),
        "{message}"
    );

    let (client, _stop) = h.serve().await;
    client
        .set_secret("db_password", "p@ss:w/rd".into())
        .await
        .expect("set");
    let error = client
        .instance_files("n1", "web-1")
        .await
        .expect_err("api_token is not set");
    assert_eq!(error.status(), Some(409));
    assert!(
        error.to_string().contains("cca secret set api_token"),
        "{error}"
    );
    client
        .set_secret("api_token", "tok\nen".into())
        .await
        .expect("set");

    let answer = client.instance_files("n1", "web-1").await.expect("files");
    let files: Vec<(&str, &str)> = answer
        .files
        .iter()
        .map(|file| (file.path.as_str(), file.content.as_str()))
        .collect();
    assert_eq!(
        files,
        [
            (
                "connections/app_db",
                "postgresql://app:p%40ss%3Aw%2Frd@postgres:5432/app"
            ),
            ("secrets/api_token", "tok\nen"),
        ]
    );
    let shown = format!("{answer:?}");
    assert!(
        !shown.contains("p%40ss") && !shown.contains("tok\\nen"),
        "{shown}"
    );

    // Another node, or an instance not placed, gets nothing.
    let error = client
        .instance_files("n2", "web-1")
        .await
        .expect_err("wrong node");
    assert_eq!(error.status(), Some(409));
    assert!(error.to_string().contains("placed on node `n1`"), "{error}");
    let error = client
        .instance_files("n1", "web-9")
        .await
        .expect_err("not placed");
    assert_eq!(error.status(), Some(404));

    // The assignment stream names the explicit grant.
    let mut stream = client
        .assignments("n1", &cca_wire::types::Resume::SNAPSHOT)
        .await
        .expect("stream");
    let line = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a line")
        .expect("not ended")
        .expect("decodes");
    match line {
        cca_wire::types::AssignmentLine::Snapshot { assignments, .. } => {
            assert_eq!(assignments.len(), 1);
            assert_eq!(assignments[0].secrets, ["api_token"]);
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

fn put<T: serde::Serialize>(key: String, value: &T) -> cca_store::Op {
    cca_store::Op::put(key, serde_json::to_vec(value).expect("encodes"))
}

#[tokio::test]
async fn assignments_name_grants_committed_with_or_before_their_placement() {
    let dir = tempfile::tempdir().expect("temp dir");
    let embedded: Arc<dyn cca_store::Store> = Arc::new(
        cca_store::embedded::EmbeddedStore::open(cca_store::embedded::Config::new(dir.path()))
            .await
            .expect("store opens"),
    );
    let (open_gate, gate) = tokio::sync::watch::channel(false);
    let store = support::gated(embedded, gate);
    let cache = Arc::new(
        cca_control::Cache::start(Arc::clone(&store))
            .await
            .expect("cache starts"),
    );
    let state = cca_api::ApiState::new(
        Arc::clone(&store),
        cache,
        cca_api::ApiConfig::default(),
        Arc::new(String::new),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(cca_api::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let client = cca_wire::Client::new(&format!("http://{address}"));

    let mut stream = client
        .assignments("n1", &cca_wire::types::Resume::SNAPSHOT)
        .await
        .expect("stream");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a line")
            .expect("not ended")
            .expect("decodes")
    };
    assert!(matches!(
        next().await,
        cca_wire::types::AssignmentLine::Snapshot { ref assignments, .. } if assignments.is_empty()
    ));

    // `web`: its grant committed just before its placement; `api`: its
    // grant and placement in one transaction.
    store
        .txn(
            cca_store::Txn::new()
                .then(put(
                    keys::desired_service("web"),
                    &support::service("web", 1),
                ))
                .then(put(
                    keys::desired_service_secret("web", "api_token"),
                    &SecretGrant::Explicit,
                )),
        )
        .await
        .expect("granted");
    store
        .txn(cca_store::Txn::new().then(put(
            keys::derived_instance("web", "web-1"),
            &instance("web-1", "web", "n1"),
        )))
        .await
        .expect("placed");
    store
        .txn(
            cca_store::Txn::new()
                .then(put(
                    keys::desired_service("api"),
                    &support::service("api", 1),
                ))
                .then(put(
                    keys::desired_service_secret("api", "db_password"),
                    &SecretGrant::Explicit,
                ))
                .then(put(
                    keys::derived_instance("api", "api-1"),
                    &instance("api-1", "api", "n1"),
                )),
        )
        .await
        .expect("granted and placed");
    // The store holds both placements; the cache, and so the hub that
    // indexes it, has seen nothing yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    open_gate.send_replace(true);

    for (id, secret) in [("web-1", "api_token"), ("api-1", "db_password")] {
        match next().await {
            cca_wire::types::AssignmentLine::Put { assignment, .. } => {
                assert_eq!(assignment.instance.id, id);
                assert_eq!(assignment.secrets, [secret], "{id}");
                assert!(assignment.spec.is_some(), "{id} has its spec");
            }
            other => panic!("expected {id}'s placement, got {other:?}"),
        }
    }
}

/// A stand-in KMS: "wraps" by prefixing the key id and checks it on
/// unwrap; no secrecy, only the protocol of `--secret-key-command`.
const FAKE_KMS: &str = r#"op="$1"; id="$2"; input=$(cat)
case "$op" in
wrap) printf '%s:%s' "$id" "$input" | base64 -w0 ;;
unwrap) decoded=$(printf '%s' "$input" | base64 -d) || exit 4
  case "$decoded" in
  "$id:"*) printf '%s\n' "${decoded#"$id:"}" ;;
  *) echo "not wrapped by $id" >&2; exit 3 ;;
  esac ;;
*) echo "unknown operation $op" >&2; exit 2 ;;
esac
"#;

/// The KMS command of key `key_id`, its script written into `dir` (run
/// by `sh`: a file just written may be busy in a forked test thread).
fn kms(dir: &std::path::Path, key_id: &str) -> CommandProvider {
    let script = dir.join("kms.sh");
    std::fs::write(&script, FAKE_KMS).expect("script written");
    CommandProvider::new(
        &format!("/bin/sh {}", script.display()),
        key_id,
        cca_api::secrets::DEFAULT_COMMAND_TIMEOUT,
    )
    .expect("provider")
}

/// A server restarted over `h`'s store with `key`: a new state and cache.
async fn restarted(h: &support::Harness, key: SecretKey) -> axum::Router {
    let cache = Arc::new(
        cca_control::Cache::start(Arc::clone(&h.store))
            .await
            .expect("cache starts"),
    );
    let state = cca_api::ApiState::new(
        Arc::clone(&h.store),
        cache,
        cca_api::ApiConfig::default(),
        cca_api::no_extra_metrics(),
    )
    .with_secret_key(key);
    cca_api::app(state)
}

async fn stored(h: &support::Harness, name: &str) -> cca_model::spec::SealedSecret {
    let kv = h
        .store
        .get(&keys::desired_secret(name))
        .await
        .expect("get")
        .expect("stored");
    serde_json::from_slice(&kv.value).expect("decodes")
}

async fn put_record(h: &support::Harness, name: &str, record: &cca_model::spec::SealedSecret) {
    h.store
        .txn(cca_store::Txn::new().then(put(keys::desired_secret(name), record)))
        .await
        .expect("written");
}

#[tokio::test]
async fn a_key_rotation_rewraps_every_record_and_the_old_key_can_go() {
    let h = support::harness().await;
    let key_a = h.dir.path().join("a.key");
    let (a, created) = SecretKey::load_or_create(&key_a).expect("key A");
    assert!(created);
    let _ = h.state.clone().with_secret_key(a.clone());
    let mut program = program();
    program
        .grants
        .get_mut("web")
        .expect("web")
        .insert("legacy".into(), cca_model::spec::SecretGrant::Explicit);
    program.secrets.insert(
        "legacy".into(),
        SecretSpec {
            name: "legacy".into(),
            description: None,
            tenant: None,
        },
    );
    let (status, _) = h
        .call("POST", "/v1/apply", Some(support::json(&program)))
        .await;
    assert_eq!(status, StatusCode::OK);
    h.store
        .txn(cca_store::Txn::new().then(put(
            keys::derived_instance("web", "web-1"),
            &instance("web-1", "web", "n1"),
        )))
        .await
        .expect("placed");
    for (name, value) in [("db_password", "p@ss:w/rd"), ("api_token", "tok-1")] {
        let (status, reply) = h
            .call(
                "PUT",
                &format!("/v1/secrets/{name}"),
                Some(json!({"value": value})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{reply}");
    }
    // Written by an older server (format 1, directly under A), and one
    // under a key no server has.
    let legacy = a
        .seal_format_1("legacy", &SecretValue::new("old-style"), 3)
        .expect("format 1");
    put_record(&h, "legacy", &legacy).await;
    let stranger = SecretKey::from_bytes(&[5; 32])
        .expect("32 bytes")
        .seal("stranger", &SecretValue::new("lost"), 4)
        .expect("sealed");
    put_record(&h, "stranger", &stranger).await;
    assert_eq!(stored(&h, "db_password").await.key_id, a.id());

    // Restart with the KMS's key B as primary and A still accepted.
    let kms_dir = tempfile::tempdir().expect("tempdir");
    let b = kms(kms_dir.path(), "kek-b");
    let a_again = LocalKey::load(&key_a).expect("key A");
    let both = restarted(&h, SecretKey::new(b.clone()).accepting(a_again)).await;
    let files = "/v1/agent/nodes/n1/instances/web-1/files";
    let expected = json!([
        {"path": "connections/app_db", "content": "postgresql://app:p%40ss%3Aw%2Frd@postgres:5432/app"},
        {"path": "secrets/api_token", "content": "tok-1"},
        {"path": "secrets/legacy", "content": "old-style"},
    ]);
    let (status, reply) = support::call(&both, "GET", files, None).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["files"], expected, "before the rotation");

    // Rotate while a `set` of api_token races it (the set is never lost)
    // and an agent reads the instance's files (they keep being served).
    let (rotation, set, during) = tokio::join!(
        support::call(&both, "POST", "/v1/secret-key/rotate", None),
        support::call(
            &both,
            "PUT",
            "/v1/secrets/api_token",
            Some(json!({"value": "tok-2"}))
        ),
        support::call(&both, "GET", files, None),
    );
    assert_eq!(set.0, StatusCode::OK, "{}", set.1);
    assert_eq!(during.0, StatusCode::OK, "{}", during.1);
    assert_eq!(during.1["files"][0], expected[0], "during the rotation");
    let (status, reply) = rotation;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["key_id"], "kek-b");
    assert_eq!(
        reply["rewrapped"].as_u64().expect("count") + reply["current"].as_u64().expect("count"),
        3,
        "{reply}"
    );
    assert!(reply["rewrapped"].as_u64().expect("count") >= 2, "{reply}");
    let failed = reply["failed"].as_array().expect("failed");
    assert_eq!(failed.len(), 1, "{reply}");
    assert_eq!(failed[0]["name"], "stranger");
    let error = failed[0]["error"].as_str().expect("error");
    assert!(
        error.contains("does not accept") && error.contains("kek-b"),
        "{error}"
    );
    assert!(!reply.to_string().contains("lost"), "{reply}");
    for name in ["db_password", "api_token", "legacy"] {
        let record = stored(&h, name).await;
        assert_eq!(
            (record.format, record.key_id.as_str()),
            (2, "kek-b"),
            "{name}"
        );
    }
    assert_eq!(stored(&h, "legacy").await.set_at, 3, "set_at is kept");
    assert_eq!(stored(&h, "stranger").await, stranger, "left as it was");
    let (status, reply) = support::call(&both, "POST", "/v1/secret-key/rotate", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (reply["rewrapped"].as_u64(), reply["current"].as_u64()),
        (Some(0), Some(3))
    );
    let (_, events) = support::call(&both, "GET", "/v1/events", None).await;
    assert!(
        events
            .to_string()
            .contains("0 re-wrapped, 3 already current, 1 failed: stranger"),
        "{events}"
    );

    // A dropped: a server with B only still opens every secret.
    let b_only = restarted(&h, SecretKey::new(b)).await;
    let (status, reply) = support::call(&b_only, "GET", files, None).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let mut expected = expected;
    expected[1]["content"] = json!("tok-2");
    assert_eq!(reply["files"], expected, "after the rotation, without A");
}

#[tokio::test]
async fn a_kms_that_fails_answers_503_naming_the_command() {
    let h = support::harness().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("down.sh");
    std::fs::write(&script, "echo 'KMS unreachable' >&2; exit 1").expect("written");
    let down = CommandProvider::new(
        &format!("/bin/sh {}", script.display()),
        "kek-1",
        cca_api::secrets::DEFAULT_COMMAND_TIMEOUT,
    )
    .expect("provider");
    let _ = h.state.clone().with_secret_key(SecretKey::new(down));
    let (status, reply) = h
        .call("PUT", "/v1/secrets/db", Some(json!({"value": "hunter2"})))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    let message = reply["error"].as_str().expect("message");
    assert!(
        message.contains("wrap kek-1") && message.contains("KMS unreachable"),
        "{message}"
    );
    assert!(!message.contains("hunter2"));
    assert!(h.keys().await.is_empty(), "nothing written");
}

/// The cost of rotating 1,000 secrets with a key file as the new primary
/// (docs/secrets.md): three runs, each moving every record to the other
/// key. `cargo test -p cca-api --test secrets -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn rotation_of_1000_secrets_timed() {
    let h = support::harness().await;
    let keys = [[1u8; 32], [2u8; 32]];
    let local = |bytes: &[u8; 32]| LocalKey::from_bytes(bytes).expect("32 bytes");
    let first = SecretKey::new(local(&keys[0]));
    for chunk in (0..1000).collect::<Vec<_>>().chunks(100) {
        let mut txn = cca_store::Txn::new();
        for index in chunk {
            let name = format!("s{index:04}");
            let sealed = first
                .seal(&name, &SecretValue::new(format!("value-{index}")), 1)
                .expect("sealed");
            txn = txn.then(put(keys::desired_secret(&name), &sealed));
        }
        h.store.txn(txn).await.expect("written");
    }
    let mut runs = Vec::new();
    for run in 0..3 {
        let (new, old) = (&keys[(run + 1) % 2], &keys[run % 2]);
        let app = restarted(&h, SecretKey::new(local(new)).accepting(local(old))).await;
        let started = std::time::Instant::now();
        let (status, reply) = support::call(&app, "POST", "/v1/secret-key/rotate", None).await;
        runs.push(started.elapsed());
        assert_eq!(status, StatusCode::OK);
        assert_eq!(reply["rewrapped"], 1000, "{reply}");
    }
    runs.sort();
    println!(
        "rotation of 1000 secrets, key file to key file: min {:?} median {:?} max {:?}",
        runs[0], runs[1], runs[2]
    );

    // Then to the stand-in KMS command: a process per wrap, and per
    // unwrap once the old key is a KMS key too.
    let dir = tempfile::tempdir().expect("tempdir");
    let kek = |id: &str| kms(dir.path(), id);
    let steps = [
        (
            "key file to KMS",
            SecretKey::new(kek("kek-b")).accepting(local(&keys[1])),
        ),
        (
            "KMS to KMS",
            SecretKey::new(kek("kek-c")).accepting(kek("kek-b")),
        ),
        (
            "KMS to KMS",
            SecretKey::new(kek("kek-b")).accepting(kek("kek-c")),
        ),
    ];
    for (what, key) in steps {
        let app = restarted(&h, key).await;
        let started = std::time::Instant::now();
        let (status, reply) = support::call(&app, "POST", "/v1/secret-key/rotate", None).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(reply["rewrapped"], 1000, "{reply}");
        println!("rotation of 1000 secrets, {what}: {took:?}");
    }
}
