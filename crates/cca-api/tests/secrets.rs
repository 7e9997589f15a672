//! Secret values through the API: set, list and remove without a value
//! ever coming back; values sealed at rest; the agent's files endpoint
//! answering an instance's connection URLs and granted secrets only to the
//! node it is placed on, and naming a secret without a value; assignment
//! lines naming a grant committed with or just before their placement even
//! when the cache (which the assignment hub indexes) lags behind the store.

mod support;

use support::instance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use cca_api::SecretKey;
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
        },
    );
    for name in ["db_password", "api_token", "report"] {
        program.secrets.insert(
            name.into(),
            SecretSpec {
                name: name.into(),
                description: None,
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
    let mut stream = client.assignments("n1", 0).await.expect("stream");
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

    let mut stream = client.assignments("n1", 0).await.expect("stream");
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
