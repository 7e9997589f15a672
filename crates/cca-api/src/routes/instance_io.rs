//! Logs and exec of instances: the API finds the node an instance is on,
//! that node's agent (`NodeInfo::agent_url`), and proxies the request to
//! it. Log streams are relayed chunk by chunk as the agent sends them (a
//! producer task per response, holding a stream permit rather than a
//! request permit, ending when the agent ends, the client leaves or the
//! server shuts down); service logs merge the streams of every instance,
//! each line prefixed `[{instance}] `. Failures answer JSON errors: 404
//! for an unknown instance or service, 502 when the node or its agent
//! cannot be reached, the agent's own 4xx passed through.
//!
//! An agent with a node certificate serves HTTPS (its agent URL says
//! `https://`) to API servers alone: the server calls it presenting its
//! own certificate, and accepts only a certificate of the cluster CA that
//! names exactly that node (`cca://node/{node}`), so another node's
//! agent, even at that address, cannot answer for it.

use std::sync::OnceLock;
use std::time::Duration;

use cca_trust::identity::Identity;
use cca_wire::tls::ExpectedPeer;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use cca_control::View;
use futures_util::future::join_all;
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use crate::error::{ApiError, ApiResult, JsonBody, QueryArgs};
use crate::read::{self, InstanceFilter};
use crate::routes::reads::fresh_view;
use crate::state::ApiState;
use crate::types::{ErrorBody, ExecCommand, ExecResult};
use cca_wire::client::segment;

/// How long connecting to an agent may take before it counts as down.
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest exec accepted: the request holds a request permit meanwhile.
const MAX_EXEC_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Extra time the agent gets past an exec's own timeout to answer.
const EXEC_ANSWER_GRACE: Duration = Duration::from_secs(10);
/// HTTPS clients of agents kept at once (one per node called).
const MAX_AGENT_CLIENTS: usize = 16_384;
/// Chunks buffered between an agent and a slow client.
const CHUNK_BUFFER: usize = 64;

/// Query of the logs endpoints, forwarded to the agents.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsQuery {
    /// Only the last this many lines of each instance; absent: all kept.
    tail: Option<usize>,
    /// Keep streaming new lines until the instances exit.
    #[serde(default)]
    follow: bool,
}

/// `GET /v1/instances/{id}/logs`: the agent's stream, relayed as is.
pub(crate) async fn instance_logs(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    QueryArgs(query): QueryArgs<LogsQuery>,
) -> ApiResult<Response> {
    let permit = state.stream_permit()?;
    let view = fresh_view(&state).await?;
    let agent = AgentTarget::of_instance(&state, &view, &id)?;
    let upstream = agent.open_logs(&query).await?;
    Ok(text_stream(&state, permit, |out| async move {
        relay_verbatim(upstream, &out).await;
    }))
}

/// `GET /v1/services/{name}/logs`: every instance's stream, each line
/// prefixed with its instance; merged as lines arrive when following,
/// otherwise one instance's tail after the other.
pub(crate) async fn service_logs(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    QueryArgs(query): QueryArgs<LogsQuery>,
) -> ApiResult<Response> {
    let permit = state.stream_permit()?;
    let view = fresh_view(&state).await?;
    let ids = instances_of_service(&view, &name)?;
    let opened = join_all(
        ids.iter()
            .map(|id| open_instance_logs(&state, &view, id, &query)),
    )
    .await;
    let (upstreams, failures) = split_opened(ids, opened)?;
    let follow = query.follow;
    Ok(text_stream(&state, permit, move |out| async move {
        for (id, error) in failures {
            if !out.send(note(&id, &error.message)).await {
                return;
            }
        }
        let relays = upstreams
            .into_iter()
            .map(|(id, upstream)| relay_prefixed(id, upstream, &out));
        if follow {
            join_all(relays).await;
        } else {
            for relay in relays {
                if !relay.await {
                    return;
                }
            }
        }
    }))
}

/// `POST /v1/instances/{id}/exec`: runs a command through the agent.
pub(crate) async fn exec(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    JsonBody(command): JsonBody<ExecCommand>,
) -> ApiResult<Json<ExecResult>> {
    check_exec(&command)?;
    let view = fresh_view(&state).await?;
    let agent = AgentTarget::of_instance(&state, &view, &id)?;
    agent.exec(&command).await.map(Json)
}

fn check_exec(command: &ExecCommand) -> ApiResult<()> {
    if command.argv.first().is_none_or(String::is_empty) {
        return Err(ApiError::invalid(
            "exec needs a command: `argv` must start with a non-empty program name",
        ));
    }
    if command.timeout_ms == 0 || command.timeout_ms > MAX_EXEC_TIMEOUT_MS {
        return Err(ApiError::invalid(format!(
            "exec `timeout_ms` must be between 1 and {MAX_EXEC_TIMEOUT_MS} (10 minutes), not {}",
            command.timeout_ms
        )));
    }
    Ok(())
}

/// The agent serving one instance.
#[derive(Debug, Clone)]
struct AgentTarget {
    instance: String,
    node: String,
    /// The agent's base URL, without a trailing `/`.
    url: String,
    /// The client for it: plain, or HTTPS expecting the node's certificate.
    http: reqwest::Client,
}

impl AgentTarget {
    /// Finds the agent of the node `id` is placed on (or, when its
    /// placement is gone, last reported from).
    fn of_instance(state: &ApiState, view: &View, id: &str) -> ApiResult<Self> {
        let node = view
            .instances
            .get(id)
            .map(|placement| placement.node.clone())
            .or_else(|| view.statuses.get(id).map(|status| status.node.clone()))
            .ok_or_else(|| ApiError::not_found(format!("instance `{id}` not found")))?;
        let info = view.nodes.get(&node).ok_or_else(|| {
            bad_gateway(format!(
                "instance `{id}` is on node `{node}`, which is not registered, so its agent \
                 cannot be reached; check `cca get nodes`"
            ))
        })?;
        let url = info.agent_base_url().ok_or_else(|| {
            bad_gateway(format!(
                "node `{node}` (of instance `{id}`) registered without an agent URL, so \
                     its agent serves no logs or exec; restart its agent with an address the \
                     API server can reach"
            ))
        })?;
        let http = agent_http(state, &node, url)?;
        Ok(Self {
            instance: id.to_owned(),
            node,
            url: url.to_owned(),
            http,
        })
    }

    fn endpoint(&self, action: &str) -> String {
        format!(
            "{}/v1/instances/{}/{action}",
            self.url,
            segment(&self.instance)
        )
    }

    /// Asks the agent for the instance's log stream.
    async fn open_logs(&self, query: &LogsQuery) -> ApiResult<reqwest::Response> {
        let mut request = self
            .http
            .get(self.endpoint("logs"))
            .query(&[("follow", query.follow)]);
        if let Some(tail) = query.tail {
            request = request.query(&[("tail", tail)]);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        self.check_status(response).await
    }

    /// Runs `command` through the agent and returns its result.
    async fn exec(&self, command: &ExecCommand) -> ApiResult<ExecResult> {
        let timeout = Duration::from_millis(command.timeout_ms) + EXEC_ANSWER_GRACE;
        let response = self
            .http
            .post(self.endpoint("exec"))
            .json(command)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let response = self.check_status(response).await?;
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        serde_json::from_slice(&body).map_err(|error| {
            bad_gateway(format!(
                "the agent of node `{}` at {} answered exec with something that is not an \
                 exec result ({error}); are the agent and the API server the same version?",
                self.node, self.url
            ))
        })
    }

    /// Passes a successful answer on; turns an error answer into ours:
    /// the agent's 4xx as is (with its message), anything else a 502.
    async fn check_status(&self, response: reqwest::Response) -> ApiResult<reqwest::Response> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        let message = ErrorBody::read(&body).error;
        match StatusCode::from_u16(status.as_u16()) {
            Ok(status) if status.is_client_error() => Err(ApiError::new(
                status,
                format!("{message} (said the agent of node `{}`)", self.node),
            )),
            _ => Err(bad_gateway(format!(
                "the agent of node `{}` at {} failed with HTTP {status}: {message}",
                self.node, self.url
            ))),
        }
    }

    fn unreachable(&self, error: &reqwest::Error) -> ApiError {
        let what = if error.is_timeout() {
            "did not answer in time"
        } else {
            "cannot be reached"
        };
        bad_gateway(format!(
            "the agent of node `{}` at {} {what}: {}; check that the agent runs and that \
             the API server can reach that address",
            self.node,
            self.url,
            error_chain(error)
        ))
    }
}

pub(crate) fn bad_gateway(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, message)
}

/// An error with its causes, `outer: inner: …`.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// The HTTP client for `node`'s agent at `url`: the one plain client,
/// shared for its connection pool, or over HTTPS the node's own client,
/// built once. Only the connection is bounded in time: a followed log
/// stream may stay quiet for as long as its instance does.
pub(crate) fn agent_http(state: &ApiState, node: &str, url: &str) -> ApiResult<reqwest::Client> {
    static PLAIN: OnceLock<reqwest::Client> = OnceLock::new();
    if !url.starts_with("https://") {
        return Ok(PLAIN
            .get_or_init(|| {
                reqwest::Client::builder()
                    .connect_timeout(AGENT_CONNECT_TIMEOUT)
                    .build()
                    .unwrap_or_default()
            })
            .clone());
    }
    let agents = state.agent_tls().ok_or_else(|| {
        bad_gateway(format!(
            "the agent of node `{node}` serves HTTPS at {url}, and this server has no \
             certificate to call it with; start `cca server` with the --config-dir that \
             holds the cluster CA"
        ))
    })?;
    let mut clients = agents
        .clients
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(client) = clients.get(node) {
        return Ok(client.clone());
    }
    let unusable = |error: String| {
        bad_gateway(format!(
            "cannot build the HTTPS client for the agent of node `{node}`: {error}"
        ))
    };
    let config = agents
        .tls
        .clone()
        .expecting(ExpectedPeer::Exactly(Identity::Node(node.to_owned())))
        .rustls_config()
        .map_err(|error| unusable(error.to_string()))?;
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .connect_timeout(AGENT_CONNECT_TIMEOUT)
        .build()
        .map_err(|error| unusable(error.to_string()))?;
    // Nodes come and go; a cluster's worth of clients is kept, and a
    // forgotten one costs one handshake more.
    if clients.len() >= MAX_AGENT_CLIENTS {
        clients.clear();
    }
    clients.insert(node.to_owned(), client.clone());
    Ok(client)
}

/// Every instance of the service, placed or reported, ended ones too
/// (their logs are often what one wants). 404 when the service is
/// neither defined nor has instances.
fn instances_of_service(view: &View, name: &str) -> ApiResult<Vec<String>> {
    let filter = InstanceFilter {
        service: Some(name.to_owned()),
        all: true,
        ..InstanceFilter::default()
    };
    let ids: Vec<String> = read::instances(view, &filter)
        .into_iter()
        .map(|row| row.id)
        .collect();
    if ids.is_empty() && !view.services.contains_key(name) {
        return Err(ApiError::not_found(format!("service `{name}` not found")));
    }
    Ok(ids)
}

async fn open_instance_logs(
    state: &ApiState,
    view: &View,
    id: &str,
    query: &LogsQuery,
) -> ApiResult<reqwest::Response> {
    AgentTarget::of_instance(state, view, id)?
        .open_logs(query)
        .await
}

/// Instances whose stream opened, instances whose did not. When none
/// opened, the first failure is the answer.
#[allow(clippy::type_complexity, reason = "a pair of plain lists")]
fn split_opened(
    ids: Vec<String>,
    opened: Vec<ApiResult<reqwest::Response>>,
) -> ApiResult<(Vec<(String, reqwest::Response)>, Vec<(String, ApiError)>)> {
    let mut upstreams = Vec::new();
    let mut failures = Vec::new();
    for (id, result) in ids.into_iter().zip(opened) {
        match result {
            Ok(upstream) => upstreams.push((id, upstream)),
            Err(error) => failures.push((id, error)),
        }
    }
    if upstreams.is_empty()
        && let Some((_, error)) = failures.first()
    {
        return Err(error.clone());
    }
    Ok((upstreams, failures))
}

/// The producer's end of a streamed text response.
#[derive(Debug)]
struct ChunkSender {
    chunks: mpsc::Sender<Result<Bytes, std::io::Error>>,
    shutdown: watch::Receiver<bool>,
}

impl ChunkSender {
    /// Sends one chunk; false once the client is gone.
    async fn send(&self, chunk: Bytes) -> bool {
        self.chunks.send(Ok(chunk)).await.is_ok()
    }

    /// Ends the response as broken, so the client sees an error instead
    /// of a complete stream.
    async fn abort(&self, reason: String) {
        let error = std::io::Error::other(reason);
        let _ = self.chunks.send(Err(error)).await;
    }

    /// Resolves when the client is gone or the server is shutting down.
    async fn stopped(&self) {
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = self.chunks.closed() => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }

    /// The next chunk from the agent: `Ok(None)` at its end, also when
    /// this response should stop.
    async fn next_chunk(
        &self,
        upstream: &mut reqwest::Response,
    ) -> Result<Option<Bytes>, reqwest::Error> {
        tokio::select! {
            chunk = upstream.chunk() => chunk,
            () = self.stopped() => Ok(None),
        }
    }
}

/// Starts `produce` and answers `text/plain` with what it sends. The
/// stream permit is held until the producer ends.
fn text_stream<F, Fut>(state: &ApiState, permit: OwnedSemaphorePermit, produce: F) -> Response
where
    F: FnOnce(ChunkSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (chunks, mut receiver) = mpsc::channel(CHUNK_BUFFER);
    let sender = ChunkSender {
        chunks,
        shutdown: state.shutdown_signal(),
    };
    let producer = produce(sender);
    tokio::spawn(async move {
        producer.await;
        drop(permit);
    });
    let stream = futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx));
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Relays one agent's stream unchanged; a broken agent stream breaks ours.
async fn relay_verbatim(mut upstream: reqwest::Response, out: &ChunkSender) {
    loop {
        match out.next_chunk(&mut upstream).await {
            Ok(Some(chunk)) => {
                if !out.send(chunk).await {
                    return;
                }
            }
            Ok(None) => return,
            Err(error) => {
                let reason = format!("the agent's log stream broke: {}", error_chain(&error));
                out.abort(reason).await;
                return;
            }
        }
    }
}

/// Relays one instance's stream line by line with its prefix; a broken
/// agent stream becomes a note line. False once the client is gone.
async fn relay_prefixed(id: String, mut upstream: reqwest::Response, out: &ChunkSender) -> bool {
    let mut lines = PrefixedLines::new(&id);
    loop {
        let lines_out = match out.next_chunk(&mut upstream).await {
            Ok(Some(chunk)) => lines.feed(&chunk),
            Ok(None) => return send_some(out, lines.finish()).await,
            Err(error) => {
                let rest = lines.finish();
                let broke = format!("the agent's log stream broke: {}", error_chain(&error));
                return send_some(out, rest).await && out.send(note(&id, &broke)).await;
            }
        };
        if !send_some(out, lines_out).await {
            return false;
        }
    }
}

async fn send_some(out: &ChunkSender, chunk: Option<Bytes>) -> bool {
    match chunk {
        Some(chunk) => out.send(chunk).await,
        None => true,
    }
}

/// A line of the API's own about one instance, in the merged stream.
fn note(id: &str, message: &str) -> Bytes {
    Bytes::from(format!("[{id}] cca: {message}\n"))
}

/// Splits a byte stream into whole lines, each prefixed `[{id}] `; a line
/// cut between chunks is held until its end arrives.
#[derive(Debug)]
struct PrefixedLines {
    prefix: Vec<u8>,
    partial: Vec<u8>,
}

impl PrefixedLines {
    fn new(id: &str) -> Self {
        Self {
            prefix: format!("[{id}] ").into_bytes(),
            partial: Vec::new(),
        }
    }

    /// The whole lines completed by `chunk`, prefixed; `None` if none.
    fn feed(&mut self, chunk: &[u8]) -> Option<Bytes> {
        self.partial.extend_from_slice(chunk);
        let end = self.partial.iter().rposition(|b| *b == b'\n')? + 1;
        let complete: Vec<u8> = self.partial.drain(..end).collect();
        let mut out = Vec::with_capacity(complete.len() + self.prefix.len() * 4);
        for line in complete.split_inclusive(|b| *b == b'\n') {
            out.extend_from_slice(&self.prefix);
            out.extend_from_slice(line);
        }
        Some(Bytes::from(out))
    }

    /// A last line without its `\n`, prefixed and ended.
    fn finish(&mut self) -> Option<Bytes> {
        if self.partial.is_empty() {
            return None;
        }
        self.partial.push(b'\n');
        let rest = std::mem::take(&mut self.partial);
        self.feed(&rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: Option<Bytes>) -> String {
        bytes.map_or_else(String::new, |b| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn lines_are_prefixed_and_held_until_complete() {
        let mut lines = PrefixedLines::new("web-1");
        assert_eq!(text(lines.feed(b"one\ntw")), "[web-1] one\n");
        assert_eq!(text(lines.feed(b"o")), "");
        assert_eq!(
            text(lines.feed(b"\nthree\nfour")),
            "[web-1] two\n[web-1] three\n"
        );
        assert_eq!(text(lines.finish()), "[web-1] four\n");
        assert_eq!(text(lines.finish()), "");
    }

    #[test]
    fn exec_needs_a_program_and_a_sane_timeout() {
        let command = |argv: &[&str], timeout_ms| ExecCommand {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            timeout_ms,
        };
        assert!(check_exec(&command(&["ls"], 1000)).is_ok());
        let empty = check_exec(&command(&[], 1000)).expect_err("no program");
        assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
        let zero = check_exec(&command(&["ls"], 0)).expect_err("no time");
        assert!(zero.message.contains("between 1 and"), "{}", zero.message);
    }
}
