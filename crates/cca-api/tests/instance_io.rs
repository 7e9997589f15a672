//! Logs and exec through the API, against a fake agent: a tiny axum server
//! on a loopback port implementing the agent's contract, registered as a
//! node with its `agent_url`, with instances placed on it straight in the
//! store. Checks the relayed streams (tail, follow, service merging with
//! prefixes), exec pass-through, and every error's status and message.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use cca_api::{ApiConfig, Lane, LaneLimits};
use cca_model::keys;
use cca_store::{Op, Txn};
use cca_wire::types::{ExecCommand, ExecResult, RegisterRequest};
use cca_wire::{ClientError, LogLines};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use support::{Harness, harness, harness_with, json as to_json, program};

const WAIT: Duration = Duration::from_secs(10);

// ---- the fake agent -------------------------------------------------------

#[derive(Debug, Deserialize)]
struct FakeLogsQuery {
    tail: Option<usize>,
    #[serde(default)]
    follow: bool,
}

/// Instances the fake runs; `*-stopped` ones exist but are not running.
fn known(id: &str) -> bool {
    id.starts_with("web-") || id.starts_with("quiet-")
}

fn fake_error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// Three lines per instance; with follow, two more a little later, then
/// the end — except `quiet-*`, which then stays silent until dropped.
async fn fake_logs(Path(id): Path<String>, Query(query): Query<FakeLogsQuery>) -> Response {
    if !known(&id) {
        return fake_error(StatusCode::NOT_FOUND, format!("no instance `{id}` here"));
    }
    let kept: Vec<String> = ["one", "two", "three"]
        .iter()
        .map(|word| format!("{id} {word}\n"))
        .collect();
    let skip = query.tail.map_or(0, |tail| kept.len().saturating_sub(tail));
    let past = futures_util::stream::iter(kept.into_iter().skip(skip));
    if !query.follow {
        return Body::from_stream(past.map(|line| Ok::<_, Infallible>(Bytes::from(line))))
            .into_response();
    }
    let quiet = id.starts_with("quiet-");
    let later = futures_util::stream::iter(1..=2).then(move |n| {
        let id = id.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            format!("{id} later-{n}\n")
        }
    });
    let stream = past
        .chain(later)
        .map(|line| Ok::<_, Infallible>(Bytes::from(line)));
    if quiet {
        let forever = stream.chain(futures_util::stream::pending());
        return Body::from_stream(forever).into_response();
    }
    Body::from_stream(stream).into_response()
}

async fn fake_exec(Path(id): Path<String>, Json(command): Json<ExecCommand>) -> Response {
    if !known(&id) {
        return fake_error(StatusCode::NOT_FOUND, format!("no instance `{id}` here"));
    }
    if id.ends_with("-stopped") {
        return fake_error(
            StatusCode::CONFLICT,
            format!("instance `{id}` is not running"),
        );
    }
    Json(ExecResult {
        code: Some(3),
        signal: None,
        stdout: format!(
            "{id}: {} ({}ms)\n",
            command.argv.join(" "),
            command.timeout_ms
        ),
        stderr: "warning\n".into(),
        timed_out: false,
    })
    .into_response()
}

/// Serves the fake agent on a loopback port; returns its URL.
async fn fake_agent() -> String {
    let app = axum::Router::new()
        .route("/v1/instances/{id}/logs", get(fake_logs))
        .route("/v1/instances/{id}/exec", post(fake_exec))
        .route("/v1/inspect", get(fake_inspect));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{address}")
}

/// The agent of n1 caches web-1 (as placed), web-2 with another spec, and
/// web-9, which the store does not place; it lacks nothing else.
async fn fake_inspect() -> Json<serde_json::Value> {
    let desired = |id: &str, hash: &str| json!({"id": id, "service": "web", "spec_hash": hash});
    Json(json!({
        "node": "n1",
        "at": 1,
        "connected": true,
        "cache": {"revision": 1, "known": true, "origin": {"store": "s", "epoch": "e"}},
        "desired": [desired("web-1", "h"), desired("web-2", "h-old"), desired("web-9", "h")],
        "runtime": [],
        "unclaimed": [],
        "drift": [{"id": "web-1", "problem": "assigned here, exited in the runtime"}],
        "reports": {"statuses_sent": 3, "last_tick": []},
    }))
}

/// A URL where nothing listens (a port bound, then released).
async fn dead_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{address}")
}

// ---- cluster setup --------------------------------------------------------

async fn register(h: &Harness, name: &str, agent_url: Option<String>) {
    let request = RegisterRequest {
        agent_url,
        ..support::node_request(name)
    };
    let (status, body) = h
        .call("POST", "/v1/agent/register", Some(to_json(&request)))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn place(h: &Harness, service: &str, id: &str, node: &str) {
    let instance = support::instance(id, service, node);
    let key = keys::derived_instance(service, id);
    let value = serde_json::to_vec(&instance).expect("encodes");
    h.store
        .txn(Txn::new().then(Op::put(key, value)))
        .await
        .expect("placed");
}

/// Services `web` (web-1, web-2 on the fake agent's node `n1`) and `api`
/// (api-1 on `n2`, registered without an agent URL).
async fn cluster(h: &Harness) {
    let (status, body) = h
        .call(
            "POST",
            "/v1/apply",
            Some(to_json(&program(&[("web", 2), ("api", 1)]))),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    register(h, "n1", Some(fake_agent().await)).await;
    register(h, "n2", None).await;
    place(h, "web", "web-1", "n1").await;
    place(h, "web", "web-2", "n1").await;
    place(h, "api", "api-1", "n2").await;
}

async fn all_lines(mut lines: LogLines) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(line) = tokio::time::timeout(WAIT, lines.next())
        .await
        .expect("the stream goes on or ends in time")
    {
        out.push(line.expect("a line"));
    }
    out
}

fn assert_error(
    status: StatusCode,
    body: &serde_json::Value,
    expected: StatusCode,
    texts: &[&str],
) {
    assert_eq!(status, expected, "{body}");
    let message = body["error"].as_str().expect("a JSON error");
    for text in texts {
        assert!(message.contains(text), "`{text}` missing from: {message}");
    }
}

// ---- logs -----------------------------------------------------------------

#[tokio::test]
async fn instance_logs_relay_the_agents_tail() {
    let h = harness().await;
    cluster(&h).await;
    let (client, _stop) = h.serve().await;
    let all = client
        .instance_logs("web-1", None, false)
        .await
        .expect("logs");
    assert_eq!(
        all_lines(all).await,
        ["web-1 one", "web-1 two", "web-1 three"]
    );
    let tail = client
        .instance_logs("web-1", Some(1), false)
        .await
        .expect("logs");
    assert_eq!(all_lines(tail).await, ["web-1 three"]);
}

#[tokio::test]
async fn followed_logs_stream_until_the_agent_ends() {
    let h = harness().await;
    cluster(&h).await;
    let (client, _stop) = h.serve().await;
    let lines = client
        .instance_logs("web-2", Some(2), true)
        .await
        .expect("logs");
    assert_eq!(
        all_lines(lines).await,
        ["web-2 two", "web-2 three", "web-2 later-1", "web-2 later-2"]
    );
}

#[tokio::test]
async fn logs_answer_text_through_the_router() {
    let h = harness().await;
    cluster(&h).await;
    let (status, body) = h.call("GET", "/v1/instances/web-1/logs?tail=2", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!("web-1 two\nweb-1 three\n"));
}

#[tokio::test]
async fn service_logs_prefix_each_instance_in_turn_or_merged() {
    let h = harness().await;
    cluster(&h).await;
    let (client, _stop) = h.serve().await;
    let in_turn = client
        .service_logs("web", Some(1), false)
        .await
        .expect("logs");
    assert_eq!(
        all_lines(in_turn).await,
        ["[web-1] web-1 three", "[web-2] web-2 three"]
    );
    let merged = client
        .service_logs("web", Some(1), true)
        .await
        .expect("logs");
    let mut lines = all_lines(merged).await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "[web-1] web-1 later-1",
            "[web-1] web-1 later-2",
            "[web-1] web-1 three",
            "[web-2] web-2 later-1",
            "[web-2] web-2 later-2",
            "[web-2] web-2 three",
        ]
    );
}

#[tokio::test]
async fn service_logs_note_instances_they_cannot_reach() {
    let h = harness().await;
    cluster(&h).await;
    place(&h, "web", "web-3", "n2").await;
    let (client, _stop) = h.serve().await;
    let lines = all_lines(
        client
            .service_logs("web", Some(1), false)
            .await
            .expect("logs"),
    )
    .await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with("[web-3] cca: node `n2`") && lines[0].contains("without an agent URL"),
        "{lines:?}"
    );
    assert_eq!(lines[1..], ["[web-1] web-1 three", "[web-2] web-2 three"]);
}

#[tokio::test]
async fn a_followed_stream_holds_no_request_permit() {
    let mut config = ApiConfig::default();
    for lane in Lane::ALL {
        *config.lanes.get_mut(lane) = LaneLimits {
            in_flight: 1,
            queued: 0,
            queue_timeout: Duration::from_millis(200),
        };
    }
    let h = harness_with(config).await;
    cluster(&h).await;
    place(&h, "web", "quiet-1", "n1").await;
    let (client, _stop) = h.serve().await;
    let mut lines = client
        .instance_logs("quiet-1", Some(1), true)
        .await
        .expect("logs");
    let first = tokio::time::timeout(WAIT, lines.next())
        .await
        .expect("in time");
    assert_eq!(first.expect("open").expect("line"), "quiet-1 three");
    // The stream stays open; other requests, of its lane too, are still
    // served.
    client
        .nodes()
        .await
        .expect("a bulk read served while a bulk stream is open");
    client
        .status()
        .await
        .expect("served while a stream is open");
    let result = client
        .exec("web-1", &command(&["true"]))
        .await
        .expect("exec");
    assert_eq!(result.code, Some(3));
}

// ---- exec -----------------------------------------------------------------

fn command(argv: &[&str]) -> ExecCommand {
    ExecCommand {
        argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
        timeout_ms: 5000,
    }
}

#[tokio::test]
async fn exec_passes_the_agents_result_through() {
    let h = harness().await;
    cluster(&h).await;
    let (client, _stop) = h.serve().await;
    let result = client
        .exec("web-1", &command(&["ls", "-l"]))
        .await
        .expect("exec");
    assert_eq!(
        result,
        ExecResult {
            code: Some(3),
            signal: None,
            stdout: "web-1: ls -l (5000ms)\n".into(),
            stderr: "warning\n".into(),
            timed_out: false,
        }
    );
}

#[tokio::test]
async fn exec_passes_the_agents_refusal_through() {
    let h = harness().await;
    cluster(&h).await;
    place(&h, "web", "web-stopped", "n1").await;
    let (status, body) = h
        .call(
            "POST",
            "/v1/instances/web-stopped/exec",
            Some(to_json(&command(&["ls"]))),
        )
        .await;
    assert_error(
        status,
        &body,
        StatusCode::CONFLICT,
        &["instance `web-stopped` is not running", "node `n1`"],
    );
    let (client, _stop) = h.serve().await;
    let error = client
        .exec("web-stopped", &command(&["ls"]))
        .await
        .expect_err("refused");
    assert!(
        matches!(error, ClientError::Api { status: 409, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn exec_refuses_an_empty_command() {
    let h = harness().await;
    cluster(&h).await;
    let (status, body) = h
        .call(
            "POST",
            "/v1/instances/web-1/exec",
            Some(to_json(&command(&[]))),
        )
        .await;
    assert_error(status, &body, StatusCode::UNPROCESSABLE_ENTITY, &["argv"]);
}

// ---- errors ---------------------------------------------------------------

#[tokio::test]
async fn unknown_instances_and_services_are_404() {
    let h = harness().await;
    cluster(&h).await;
    for (method, uri, what) in [
        (
            "GET",
            "/v1/instances/nope/logs",
            "instance `nope` not found",
        ),
        (
            "POST",
            "/v1/instances/nope/exec",
            "instance `nope` not found",
        ),
        (
            "GET",
            "/v1/services/nope/logs?follow=true",
            "service `nope` not found",
        ),
    ] {
        let body = (method == "POST").then(|| to_json(&command(&["ls"])));
        let (status, body) = h.call(method, uri, body).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, &[what]);
    }
}

#[tokio::test]
async fn the_agents_404_is_passed_through() {
    let h = harness().await;
    cluster(&h).await;
    place(&h, "web", "gone-1", "n1").await;
    let (status, body) = h.call("GET", "/v1/instances/gone-1/logs", None).await;
    assert_error(
        status,
        &body,
        StatusCode::NOT_FOUND,
        &["no instance `gone-1` here", "node `n1`"],
    );
}

#[tokio::test]
async fn a_node_without_agent_url_is_502() {
    let h = harness().await;
    cluster(&h).await;
    for uri in ["/v1/instances/api-1/logs", "/v1/services/api/logs"] {
        let (status, body) = h.call("GET", uri, None).await;
        assert_error(
            status,
            &body,
            StatusCode::BAD_GATEWAY,
            &["node `n2`", "without an agent URL"],
        );
    }
}

#[tokio::test]
async fn an_unregistered_node_is_502() {
    let h = harness().await;
    cluster(&h).await;
    place(&h, "web", "web-9", "ghost").await;
    let (status, body) = h
        .call(
            "POST",
            "/v1/instances/web-9/exec",
            Some(to_json(&command(&["ls"]))),
        )
        .await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_GATEWAY,
        &["node `ghost`", "not registered"],
    );
}

#[tokio::test]
async fn an_agent_that_is_down_is_502_naming_node_and_url() {
    let h = harness().await;
    cluster(&h).await;
    let url = dead_url().await;
    register(&h, "n3", Some(url.clone())).await;
    place(&h, "web", "web-5", "n3").await;
    let (status, body) = h.call("GET", "/v1/instances/web-5/logs", None).await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_GATEWAY,
        &["agent of node `n3`", &url, "cannot be reached"],
    );
    let (status, body) = h
        .call(
            "POST",
            "/v1/instances/web-5/exec",
            Some(to_json(&command(&["ls"]))),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_GATEWAY, &["node `n3`", &url]);
    let (client, _stop) = h.serve().await;
    let error = client
        .instance_logs("web-5", None, false)
        .await
        .expect_err("agent down");
    assert_eq!(error.status(), Some(502));
}

// ---- get instances --all ----------------------------------------------------

async fn report(h: &Harness, id: &str, state: cca_model::cluster::InstanceState) {
    let status = cca_model::cluster::InstanceStatus {
        id: id.into(),
        service: "web".into(),
        node: "n1".into(),
        state,
        healthy: None,
        pid: None,
        address: None,
        own_network: false,
        host_ports: BTreeMap::new(),
        restarts: 0,
        last_exit: None,
        message: None,
        updated_at: 0,
    };
    let value = serde_json::to_vec(&status).expect("encodes");
    h.store
        .txn(Txn::new().then(Op::put(keys::observed_instance(id), value)))
        .await
        .expect("reported");
}

/// By default every placed instance but a stopped one is listed (failed
/// ones too); `running` keeps the running ones; `all` adds stopped ones
/// and reports without a placement; `pending` adds a row per instance of
/// unplaced demand. The status counts each node's instances by state.
#[tokio::test]
async fn failed_instances_are_listed_by_default_pending_demand_on_request_and_counted_per_node() {
    use cca_model::cluster::{InstanceState, Unplaced, UnplacedReason};
    let h = harness().await;
    cluster(&h).await;
    report(&h, "web-1", InstanceState::Running).await;
    report(&h, "web-2", InstanceState::Failed).await;
    report(&h, "web-old", InstanceState::Stopped).await;
    let unplaced = Unplaced {
        service: "web".into(),
        count: 2,
        reason: UnplacedReason::InsufficientCapacity,
        constraint: "cpu".into(),
        nearest_node: None,
        since: 5,
    };
    let value = serde_json::to_vec(&unplaced).expect("encodes");
    h.store
        .txn(Txn::new().then(Op::put(keys::derived_unplaced("web"), value)))
        .await
        .expect("written");
    let ids = |rows: serde_json::Value| -> Vec<String> {
        rows.as_array()
            .expect("rows")
            .iter()
            .map(|row| format!("{}={}", row["id"], row["state"]).replace('"', ""))
            .collect()
    };
    let (_, listed) = h.call("GET", "/v1/instances?service=web", None).await;
    assert_eq!(ids(listed), ["web-1=running", "web-2=failed"]);
    let (_, running) = h
        .call("GET", "/v1/instances?service=web&running=true", None)
        .await;
    assert_eq!(ids(running), ["web-1=running"]);
    let (_, pending) = h
        .call("GET", "/v1/instances?service=web&pending=true", None)
        .await;
    assert_eq!(
        ids(pending),
        [
            "web-1=running",
            "web-2=failed",
            "(web pending 1)=pending",
            "(web pending 2)=pending",
        ]
    );
    let (_, on_node) = h
        .call("GET", "/v1/instances?node=n1&pending=true", None)
        .await;
    assert!(
        !ids(on_node).iter().any(|row| row.contains("pending")),
        "pending demand is on no node"
    );
    let (_, all) = h
        .call("GET", "/v1/instances?service=web&all=true", None)
        .await;
    assert_eq!(
        ids(all),
        ["web-1=running", "web-2=failed", "web-old=stopped"]
    );
    // The status counts them per node (api-1 is placed, not reported yet).
    let (_, status) = h.call("GET", "/v1/status", None).await;
    assert_eq!(
        status["per_node"],
        json!([
            {"node": "n1", "status": "ready", "running": 1, "failed": 1, "other": 0, "unclaimed": 0},
            {"node": "n2", "status": "ready", "running": 0, "failed": 0, "other": 1, "unclaimed": 0},
        ])
    );
    // The logs of an instance whose placement is gone are still asked of
    // the node it last reported from.
    let (status, body) = h
        .call("GET", "/v1/instances/web-old/logs?tail=1", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!("web-old three\n"));
}

/// The agent's own view comes back with where its cache and the store
/// differ; a node without an agent URL is 502, an unknown one 404.
#[tokio::test]
async fn a_node_inspection_relays_the_agent_and_adds_the_store_drift() {
    let h = harness().await;
    cluster(&h).await;
    let (status, inspection) = h.call("GET", "/v1/nodes/n1/inspect", None).await;
    assert_eq!(status, StatusCode::OK, "{inspection}");
    assert_eq!(inspection["agent"]["drift"][0]["id"], "web-1");
    assert_eq!(inspection["agent"]["reports"]["statuses_sent"], 3);
    let revision = inspection["store_revision"].as_i64().expect("a revision");
    assert!(revision > 1, "{inspection}");
    let behind = format!("(its cache is at revision 1, the store at {revision})");
    assert_eq!(
        inspection["store_drift"],
        json!([
            {"id": "web-2", "problem": format!("the store places spec h, the agent's cache holds h-old {behind}")},
            {"id": "web-9", "problem": format!("in the agent's cache, not placed here by the store {behind}")},
        ])
    );
    let (status, body) = h.call("GET", "/v1/nodes/n2/inspect", None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("without an agent URL")),
        "{body}"
    );
    let (status, _) = h.call("GET", "/v1/nodes/n7/inspect", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
