//! The agent's own small HTTP API, for the API server to proxy `cca logs`
//! and `cca exec` to: `GET /v1/instances/{id}/logs?tail&follow` streams
//! output lines as text; `POST /v1/instances/{id}/exec` runs a command in
//! the instance's context; on a gate node, `GET /v1/gates/{gate}` answers
//! the gate's targets and their backends' health here (`cca describe
//! gate`); `GET /v1/inspect` answers the agent's own view (`cca
//! node-inspect`, [`crate::inspect`]). Errors are JSON `{"error": "..."}`.
//!
//! Exec runs commands on the node, so on a node with a certificate the API
//! is served over HTTPS ([`server_tls`]) to the API server alone: the
//! handshake requires a client certificate of the cluster CA naming an
//! API server (`cca://server/NAME`), and refuses anyone else, other nodes
//! and users included. It serves the node's own certificate, the one its
//! renewals replace, so a renewed certificate serves from the next
//! handshake on, and refuses the certificates the cluster revoked
//! (`revocations` keeps its listener's list). A node without a
//! certificate (`cca dev --insecure`, tests) serves plain HTTP.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cca_runtime::{ExecRequest, InstanceState, LogOptions, Runtime};
use cca_tls::{ExpectedPeer, ServerTls};
use cca_wire::types::{ExecCommand, ExecResult};
use serde::Deserialize;

use crate::AgentError;
use crate::enrol::NodeTrust;
use crate::inspect::Inspector;

/// Longest exec timeout accepted.
const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Deserialize)]
struct LogQuery {
    tail: Option<usize>,
    #[serde(default)]
    follow: bool,
}

/// The agent API's routes over a runtime, the agent's view for
/// inspection, and the node's gate if it is a gate node.
pub fn router(
    runtime: Arc<dyn Runtime>,
    inspector: Inspector,
    gate: Option<Arc<cca_gate::Gate>>,
) -> axum::Router {
    let instances = axum::Router::new()
        .route("/v1/instances/{id}/logs", get(logs))
        .route("/v1/instances/{id}/exec", post(exec))
        .with_state(runtime);
    let gates = axum::Router::new()
        .route("/v1/gates/{gate}", get(gate_health))
        .with_state(gate);
    let inspection = axum::Router::new()
        .route("/v1/inspect", get(inspect))
        .with_state(inspector);
    instances.merge(gates).merge(inspection)
}

async fn inspect(State(inspector): State<Inspector>) -> Response {
    match inspector.inspect().await {
        Ok(inspection) => Json(inspection).into_response(),
        Err(err) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the node's runtime could not list its instances: {err}"),
        ),
    }
}

async fn gate_health(
    State(gate): State<Option<Arc<cca_gate::Gate>>>,
    Path(name): Path<String>,
) -> Response {
    let Some(gate) = gate else {
        return error(
            StatusCode::NOT_FOUND,
            "this node serves no gates (it runs without --gate-listen)".into(),
        );
    };
    match gate.describe(&name) {
        Some(targets) => Json(targets).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("this gate node does not know gate `{name}` (yet)"),
        ),
    }
}

/// The agent API's TLS: the node's certificate (replaced by renewals),
/// served only to API servers of the node's cluster.
pub fn server_tls(trust: &NodeTrust) -> Result<ServerTls, AgentError> {
    let ca_pem = trust.tls.ca_pem().ok_or_else(|| {
        AgentError::Trust("the node's TLS names no cluster CA to check the API server with".into())
    })?;
    ServerTls::requiring(
        ca_pem,
        Arc::clone(&trust.renewal.presented),
        ExpectedPeer::Server,
    )
    .map_err(|error| AgentError::Trust(format!("the agent API's TLS: {error}")))
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn logs(
    State(runtime): State<Arc<dyn Runtime>>,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> Response {
    if let Err(err) = runtime.inspect(&id).await {
        return error(
            StatusCode::NOT_FOUND,
            format!("instance `{id}` is not on this node: {err}"),
        );
    }
    let options = LogOptions {
        tail: query.tail,
        follow: query.follow,
    };
    let stream = match runtime.logs(&id, options).await {
        Ok(stream) => stream,
        Err(err) => return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut stream = stream;
        while let Some(line) = stream.next_line().await {
            let chunk = line.map(|line| line + "\n").map_err(std::io::Error::other);
            if sender.send(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut receiver = receiver;
    let body = Body::from_stream(futures_util::stream::poll_fn(move |context| {
        receiver.poll_recv(context)
    }));
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn exec(
    State(runtime): State<Arc<dyn Runtime>>,
    Path(id): Path<String>,
    Json(command): Json<ExecCommand>,
) -> Response {
    let status = match runtime.inspect(&id).await {
        Ok(status) => status,
        Err(err) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("instance `{id}` is not on this node: {err}"),
            );
        }
    };
    if status.state != InstanceState::Running {
        return error(
            StatusCode::CONFLICT,
            format!("instance `{id}` is {}, not running", status.state),
        );
    }
    if command.argv.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "exec needs a command (argv is empty)".to_owned(),
        );
    }
    let timeout = Duration::from_millis(command.timeout_ms).min(MAX_EXEC_TIMEOUT);
    match runtime
        .exec(&id, ExecRequest::new(command.argv, timeout))
        .await
    {
        Ok(output) => Json(ExecResult {
            code: output.code,
            signal: output.signal,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            timed_out: output.timed_out,
        })
        .into_response(),
        Err(err) => error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    }
}
