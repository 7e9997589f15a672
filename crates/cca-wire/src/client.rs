//! The typed client of the API: one method per endpoint, errors carrying
//! the server's status and message (and the problems of a refused
//! program, and how long a busy server asked to be left alone: its
//! `Retry-After`). Used by the CLI and the agents.
//! Over HTTPS ([`Client::with_tls`]) it trusts only the cluster CA and
//! presents a client certificate when it has one (`crate::tls`).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use cca_model::cluster::{InstanceStatus, Millis};
use cca_model::spec::Program;
use cca_model::validity::Problem;
use cca_model::{LeaseId, Revision};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::*;

/// What can go wrong talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error; a refused program lists its
    /// problems, one per line after the message.
    #[error("{message} (HTTP {status}){}", problem_lines(.problems))]
    Api {
        status: u16,
        message: String,
        problems: Vec<Problem>,
        /// The `Retry-After` of a 429 or 503 (in seconds; an HTTP-date
        /// is not read).
        retry_after: Option<Duration>,
    },
    /// No answer: the server is down, unreachable, or the connection broke.
    #[error("cannot reach the API server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server answered something this client does not understand.
    #[error("unexpected answer from the API server: {0}")]
    Decode(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// How long the server asked the client to wait before trying again:
    /// the `Retry-After` of a 429 (load shed) or 503 (unavailable), when
    /// it sent one. A caller retrying waits at least this long.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// The `Retry-After` of a response that asks the client to come back
/// later (429, 503), in delta-seconds (RFC 9110); absent otherwise.
fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let seconds = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

pub type ClientResult<T> = Result<T, ClientError>;

fn problem_lines(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|problem| format!("\n  {problem}"))
        .collect()
}

/// Filters of [`Client::instances`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct InstanceQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `k=v` filters, all of which must hold.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "comma_joined")]
    pub tags: Vec<String>,
    /// Stopped instances and reports without a placement too.
    pub all: bool,
    /// Only running instances.
    pub running: bool,
    /// One `pending` row per instance of unplaced demand too.
    pub pending: bool,
}

/// The server's clock against this host's, from one request
/// ([`Client::identity_and_clock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerClock {
    /// The server's `Date` header (whole seconds); `None` when it sent
    /// none that parses.
    pub date: Option<std::time::SystemTime>,
    /// This host's clock when the request went and the answer came.
    pub sent: std::time::SystemTime,
    pub received: std::time::SystemTime,
}

/// Filters of [`Client::events`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct EventQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// Filters of [`Client::audit`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Millis>,
    /// Callers whose identity starts with this (`user:alice`, `node:`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub who: Option<String>,
    /// Only refusals.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

fn comma_joined<S: serde::Serializer>(tags: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&tags.join(","))
}

/// A client of one API server.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// A user's token, sent as `Authorization: Bearer` on every request.
    bearer: Option<Bearer>,
    /// The client's name in [`AUDIT_READS`]: the server then audits its
    /// reads too.
    audit_reads: Option<&'static str>,
}

/// The request header asking the server to audit a read as well as the
/// writes and refusals it always audits; its value names the client
/// (`mcp`), recorded with the read. Clients that act for someone else (an
/// assistant's MCP server) send it, so that every call is on record.
pub const AUDIT_READS: &str = "x-cca-audit-reads";

/// A bearer token that `Debug` does not print.
#[derive(Clone)]
struct Bearer(std::sync::Arc<str>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer([hidden])")
    }
}

impl Client {
    /// A client of the server at `base` (`http://127.0.0.1:9770`).
    pub fn new(base: &str) -> Self {
        Self::with_http(reqwest::Client::new(), base)
    }

    /// A client that speaks HTTP/2 without negotiation (h2c prior
    /// knowledge; the server answers both): every request and stream of
    /// this client, and of its clones, is multiplexed on one connection
    /// — two descriptors however many agents share it (`cca benchmark`).
    /// The server allows 200 concurrent streams per connection; a caller
    /// holding more long-lived streams should use more clients. It speaks
    /// plain HTTP only, so it loads no root certificates: reading and
    /// parsing the system's bundle cost about 2 ms and 300 KiB per client,
    /// which thousands of simulated agents' clients would all pay.
    pub fn http2(base: &str) -> ClientResult<Self> {
        let http = reqwest::Client::builder()
            .http2_prior_knowledge()
            .tls_certs_only(std::iter::empty())
            .build()
            .map_err(|error| ClientError::Unreachable {
                url: base.to_owned(),
                reason: format!("cannot build an HTTP/2 client: {error}"),
            })?;
        Ok(Self::with_http(http, base))
    }

    /// A client of `base` (`https://…`) over TLS with `tls`'s trust and
    /// certificate; HTTP/2 when the server offers it.
    pub fn with_tls(base: &str, tls: &crate::tls::ClientTls) -> ClientResult<Self> {
        let unusable = |reason: String| ClientError::Unreachable {
            url: base.to_owned(),
            reason,
        };
        let config = tls
            .rustls_config()
            .map_err(|error| unusable(error.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .build()
            .map_err(|error| unusable(format!("cannot build an HTTPS client: {error}")))?;
        Ok(Self::with_http(http, base))
    }

    /// A client using a configured `reqwest::Client` (timeouts and such).
    pub fn with_http(http: reqwest::Client, base: &str) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            bearer: None,
            audit_reads: None,
        }
    }

    /// Presents `token` (a user's) on every request.
    #[must_use]
    pub fn with_bearer(mut self, token: &str) -> Self {
        self.bearer = Some(Bearer(token.into()));
        self
    }

    /// Asks the server to audit this client's reads too, as `client`'s
    /// ([`AUDIT_READS`]).
    #[must_use]
    pub fn auditing_reads(mut self, client: &'static str) -> Self {
        self.audit_reads = Some(client);
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Applies `program` (for `program.tenant`, when a cluster-wide user
    /// applies for a tenant).
    pub async fn apply(&self, program: &Program, prune: bool) -> ClientResult<ApplyReport> {
        self.json(self.program_request("/v1/apply", program, prune))
            .await
    }

    pub async fn diff(&self, program: &Program, prune: bool) -> ClientResult<ApplyReport> {
        self.json(self.program_request("/v1/diff", program, prune))
            .await
    }

    fn program_request(&self, path: &str, program: &Program, prune: bool) -> RequestBuilder {
        let mut request = self.request(Method::POST, path).query(&[("prune", prune)]);
        if let Some(tenant) = &program.tenant {
            request = request.query(&[("tenant", tenant)]);
        }
        request.json(program)
    }

    /// Services carrying every `k=v` tag.
    pub async fn services(&self, tags: &[String]) -> ClientResult<Vec<ServiceSummary>> {
        let mut request = self.request(Method::GET, "/v1/services");
        if !tags.is_empty() {
            request = request.query(&[("tag", tags.join(","))]);
        }
        self.json(request).await
    }

    pub async fn service(&self, name: &str) -> ClientResult<ServiceDetail> {
        let path = format!("/v1/services/{}", segment(name));
        self.json(self.request(Method::GET, &path)).await
    }

    /// The kept versions of a service's spec, newest first.
    pub async fn service_history(&self, name: &str) -> ClientResult<ServiceHistory> {
        let path = format!("/v1/services/{}/history", segment(name));
        self.json(self.request(Method::GET, &path)).await
    }

    pub async fn scale(&self, service: &str, replicas: u32) -> ClientResult<ScaleReport> {
        let path = format!("/v1/services/{}/scale", segment(service));
        let request = self
            .request(Method::POST, &path)
            .json(&ScaleRequest { replicas });
        self.json(request).await
    }

    /// `service`'s replica count and what sets it (`cca scale why`).
    pub async fn scale_status(&self, service: &str) -> ClientResult<ScaleStatus> {
        let path = format!("/v1/services/{}/scale", segment(service));
        self.json(self.request(Method::GET, &path)).await
    }

    /// Where `service`'s rollout stands (`cca rollout status|why|history`).
    pub async fn rollout(&self, service: &str) -> ClientResult<RolloutStatus> {
        let path = format!("/v1/services/{}/rollout", segment(service));
        self.json(self.request(Method::GET, &path)).await
    }

    /// Pauses (`true`) or resumes `service`'s rollout.
    pub async fn pause_rollout(
        &self,
        service: &str,
        pause: bool,
    ) -> ClientResult<RolloutControlReport> {
        let verb = if pause { "pause" } else { "resume" };
        let path = format!("/v1/services/{}/rollout/{verb}", segment(service));
        self.json(self.request(Method::POST, &path)).await
    }

    /// Rolls `service` to an older version: `to` (a hash or a unique
    /// prefix), else its rollout's previous one.
    pub async fn undo_rollout(
        &self,
        service: &str,
        to: Option<&str>,
    ) -> ClientResult<RolloutControlReport> {
        let path = format!("/v1/services/{}/rollout/undo", segment(service));
        let request = self.request(Method::POST, &path).json(&UndoArgs {
            to: to.map(str::to_owned),
        });
        self.json(request).await
    }

    pub async fn delete_service(&self, name: &str) -> ClientResult<DeleteReport> {
        let path = format!("/v1/services/{}", segment(name));
        self.json(self.request(Method::DELETE, &path)).await
    }

    pub async fn instances(&self, query: &InstanceQuery) -> ClientResult<Vec<InstanceSummary>> {
        self.json(self.request(Method::GET, "/v1/instances").query(query))
            .await
    }

    pub async fn instance(&self, id: &str) -> ClientResult<InstanceDetail> {
        let path = format!("/v1/instances/{}", segment(id));
        self.json(self.request(Method::GET, &path)).await
    }

    pub async fn nodes(&self) -> ClientResult<Vec<NodeSummary>> {
        self.json(self.request(Method::GET, "/v1/nodes")).await
    }

    pub async fn node(&self, name: &str) -> ClientResult<NodeDetail> {
        let path = format!("/v1/nodes/{}", segment(name));
        self.json(self.request(Method::GET, &path)).await
    }

    /// The node's agent's own view, and where its cache and the store
    /// differ (`cca node-inspect`).
    pub async fn inspect_node(&self, name: &str) -> ClientResult<crate::types::NodeInspection> {
        let path = format!("/v1/nodes/{}/inspect", segment(name));
        self.json(self.request(Method::GET, &path)).await
    }

    /// A gate and each gate node's view of its backends.
    pub async fn gate(&self, name: &str) -> ClientResult<crate::types::GateDetail> {
        let path = format!("/v1/gates/{}", segment(name));
        self.json(self.request(Method::GET, &path)).await
    }

    pub async fn drain(&self, node: &str) -> ClientResult<NodeControlReport> {
        self.node_action(node, "drain").await
    }

    pub async fn disable_node(&self, node: &str) -> ClientResult<NodeControlReport> {
        self.node_action(node, "disable").await
    }

    pub async fn enable_node(&self, node: &str) -> ClientResult<NodeControlReport> {
        self.node_action(node, "enable").await
    }

    async fn node_action(&self, node: &str, action: &str) -> ClientResult<NodeControlReport> {
        let path = format!("/v1/nodes/{}/{action}", segment(node));
        self.json(self.request(Method::POST, &path)).await
    }

    /// Ends a pause of lost-node replacement: the missing nodes are gone.
    pub async fn resume_replacement(&self) -> ClientResult<ReplacementResumed> {
        self.json(self.request(Method::POST, "/v1/cluster/resume-replacement"))
            .await
    }

    /// Who the server takes this client for.
    pub async fn identity(&self) -> ClientResult<CallerIdentity> {
        self.json(self.request(Method::GET, "/v1/identity")).await
    }

    /// Who the server takes this client for, and the server's clock as
    /// its `Date` header gives it (whole seconds), with when the request
    /// went and the answer came by this host's clock: a pre-flight's
    /// clock-skew check.
    pub async fn identity_and_clock(&self) -> ClientResult<(CallerIdentity, ServerClock)> {
        let sent = cca_model::clock::system_now();
        let response = self.send(self.request(Method::GET, "/v1/identity")).await?;
        let received = cca_model::clock::system_now();
        let date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| httpdate::parse_http_date(value).ok());
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.unreachable(&error))?;
        let identity = serde_json::from_slice(&bytes)
            .map_err(|error| ClientError::Decode(error.to_string()))?;
        Ok((
            identity,
            ServerClock {
                date,
                sent,
                received,
            },
        ))
    }

    pub async fn status(&self) -> ClientResult<ClusterStatus> {
        self.json(self.request(Method::GET, "/v1/status")).await
    }

    /// The newest audit records matching `query`, oldest first.
    pub async fn audit(&self, query: &AuditQuery) -> ClientResult<Vec<AuditEntry>> {
        self.json(self.request(Method::GET, "/v1/audit").query(query))
            .await
    }

    pub async fn events(&self, query: &EventQuery) -> ClientResult<Vec<EventRecord>> {
        self.json(self.request(Method::GET, "/v1/events").query(query))
            .await
    }

    /// The events `query` lists, then each new one as it is logged, until
    /// the server ends the stream (it shuts down, or the store's history
    /// was compacted under it: list again).
    pub async fn follow_events(&self, query: &EventQuery) -> ClientResult<LineStream<EventRecord>> {
        let request = self
            .request(Method::GET, "/v1/events")
            .query(query)
            .query(&[("follow", "true")]);
        self.stream(request).await
    }

    /// Changes under `prefix` from revision `from` (0: from now).
    pub async fn watch(&self, prefix: &str, from: Revision) -> ClientResult<LineStream<WatchLine>> {
        let request = self
            .request(Method::GET, "/v1/watch")
            .query(&[("prefix", prefix.to_owned()), ("from", from.to_string())]);
        self.stream(request).await
    }

    /// The output of one instance, relayed from its node's agent: the last
    /// `tail` lines (all kept lines when `None`), then, with `follow`, new
    /// lines until the instance exits.
    pub async fn instance_logs(
        &self,
        id: &str,
        tail: Option<usize>,
        follow: bool,
    ) -> ClientResult<LogLines> {
        let path = format!("/v1/instances/{}/logs", segment(id));
        self.logs(&path, tail, follow).await
    }

    /// The output of every instance of a service, each line prefixed
    /// `[{instance}] `; merged as lines arrive with `follow`, otherwise one
    /// instance's tail after the other.
    pub async fn service_logs(
        &self,
        name: &str,
        tail: Option<usize>,
        follow: bool,
    ) -> ClientResult<LogLines> {
        let path = format!("/v1/services/{}/logs", segment(name));
        self.logs(&path, tail, follow).await
    }

    async fn logs(&self, path: &str, tail: Option<usize>, follow: bool) -> ClientResult<LogLines> {
        let mut request = self.request(Method::GET, path).query(&[("follow", follow)]);
        if let Some(tail) = tail {
            request = request.query(&[("tail", tail)]);
        }
        let response = self.send(request).await?;
        Ok(LogLines {
            response,
            buffer: Vec::new(),
        })
    }

    /// Runs a command in an instance's context through its node's agent.
    /// A command that fails is still `Ok`: see the result's code.
    pub async fn exec(&self, id: &str, command: &ExecCommand) -> ClientResult<ExecResult> {
        let path = format!("/v1/instances/{}/exec", segment(id));
        self.json(self.request(Method::POST, &path).json(command))
            .await
    }

    /// Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> ClientResult<String> {
        let response = self.send(self.request(Method::GET, "/metrics")).await?;
        response
            .text()
            .await
            .map_err(|error| self.unreachable(&error))
    }

    pub async fn register(&self, request: &RegisterRequest) -> ClientResult<RegisterReply> {
        self.json(
            self.request(Method::POST, "/v1/agent/register")
                .json(request),
        )
        .await
    }

    /// Keeps the node's lease alive; a 409 means "register again".
    pub async fn heartbeat(&self, node: &str, lease_id: LeaseId) -> ClientResult<HeartbeatReply> {
        let path = format!("/v1/agent/nodes/{}/heartbeat", segment(node));
        let request = self
            .request(Method::POST, &path)
            .json(&HeartbeatRequest { lease_id });
        self.json(request).await
    }

    /// The node's assignments: a snapshot then changes, or with `from > 0`
    /// the changes from that revision on.
    pub async fn assignments(
        &self,
        node: &str,
        resume: &Resume,
    ) -> ClientResult<LineStream<AssignmentLine>> {
        let path = format!("/v1/agent/nodes/{}/assignments", segment(node));
        let request = self
            .request(Method::GET, &path)
            .query(&resume_query(resume));
        self.stream(request).await
    }

    /// The cluster's network map as `node` follows it: a snapshot then
    /// each revision's changes, or with `from > 0` the changes from that
    /// revision on.
    pub async fn network(
        &self,
        node: &str,
        resume: &Resume,
    ) -> ClientResult<LineStream<NetworkLine>> {
        let path = format!("/v1/agent/nodes/{}/network", segment(node));
        let request = self
            .request(Method::GET, &path)
            .query(&resume_query(resume));
        self.stream(request).await
    }

    pub async fn report(&self, node: &str, status: &InstanceStatus) -> ClientResult<WriteReply> {
        let path = format!(
            "/v1/agent/nodes/{}/instances/{}",
            segment(node),
            segment(&status.id)
        );
        self.json(self.request(Method::PUT, &path).json(status))
            .await
    }

    /// Reports several instances of `node` at once (at most 1,000); the
    /// reply lists the ones refused.
    pub async fn report_batch(
        &self,
        node: &str,
        statuses: Vec<InstanceStatus>,
    ) -> ClientResult<ReportBatchReply> {
        let path = format!("/v1/agent/nodes/{}/reports", segment(node));
        let body = ReportBatch { statuses };
        self.json(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Node `node`'s host ports held by something outside the cluster,
    /// all of them (an empty set: none any more).
    pub async fn report_held_ports(
        &self,
        node: &str,
        held: &cca_model::cluster::HeldPorts,
    ) -> ClientResult<HeldPortsReply> {
        let path = format!("/v1/agent/nodes/{}/held-ports", segment(node));
        self.json(self.request(Method::PUT, &path).json(held)).await
    }

    /// The store as a backup payload (`cca backup`), read a chunk at a
    /// time from [`ByteStream::next_chunk`].
    pub async fn backup(&self) -> ClientResult<ByteStream> {
        let response = self.send(self.request(Method::GET, "/v1/backup")).await?;
        Ok(ByteStream { response })
    }

    /// Reports the instances `node` runs that the store does not place
    /// there, replacing the last report (none: clears it).
    pub async fn report_unclaimed(
        &self,
        node: &str,
        report: &cca_model::recovery::Unclaimed,
    ) -> ClientResult<UnclaimedReply> {
        let path = format!("/v1/agent/nodes/{}/unclaimed", segment(node));
        self.json(self.request(Method::PUT, &path).json(report))
            .await
    }

    /// Every node's last reported usage (`cca top nodes`).
    pub async fn top_nodes(&self) -> ClientResult<Vec<crate::types::NodeTop>> {
        self.json(self.request(Method::GET, "/v1/top/nodes")).await
    }

    /// Every placed instance's last reported usage, of the services
    /// carrying every tag in `tags` (`cca top workloads`).
    pub async fn top_workloads(
        &self,
        tags: &[String],
    ) -> ClientResult<Vec<crate::types::InstanceTop>> {
        let mut request = self.request(Method::GET, "/v1/top/workloads");
        if !tags.is_empty() {
            request = request.query(&[("tag", tags.join(","))]);
        }
        self.json(request).await
    }

    /// What node `node` and its running instances used over the agent's
    /// last period (replacing the previous report).
    pub async fn report_usage(
        &self,
        node: &str,
        usage: &cca_model::usage::NodeUsage,
    ) -> ClientResult<WriteReply> {
        let path = format!("/v1/agent/nodes/{}/usage", segment(node));
        self.json(self.request(Method::PUT, &path).json(usage))
            .await
    }

    pub async fn forget_instance(&self, node: &str, id: &str) -> ClientResult<WriteReply> {
        let path = format!(
            "/v1/agent/nodes/{}/instances/{}",
            segment(node),
            segment(id)
        );
        self.json(self.request(Method::DELETE, &path)).await
    }

    /// Seals and stores the value of secret `name` (UTF-8, at most 64 KiB).
    pub async fn set_secret(&self, name: &str, value: String) -> ClientResult<SetSecretReply> {
        let path = format!("/v1/secrets/{}", segment(name));
        let body = SetSecretRequest { value };
        self.json(self.request(Method::PUT, &path).json(&body))
            .await
    }

    /// Every secret declared, set or granted, without values.
    pub async fn secrets(&self) -> ClientResult<Vec<SecretInfo>> {
        self.json(self.request(Method::GET, "/v1/secrets")).await
    }

    pub async fn delete_secret(&self, name: &str) -> ClientResult<DeleteSecretReply> {
        let path = format!("/v1/secrets/{}", segment(name));
        self.json(self.request(Method::DELETE, &path)).await
    }

    /// Re-wraps every secret's data key under the server's primary
    /// key-encryption key (values untouched); says how many were
    /// re-wrapped, already current, or failed (by name).
    pub async fn rotate_secret_key(&self) -> ClientResult<RotateSecretKeyReply> {
        self.json(self.request(Method::POST, "/v1/secret-key/rotate"))
            .await
    }

    /// Makes a join token; its secret is in the answer and nowhere else.
    pub async fn create_token(&self, request: &CreateTokenRequest) -> ClientResult<CreatedToken> {
        self.json(self.request(Method::POST, "/v1/tokens").json(request))
            .await
    }

    /// Every join token, without secrets.
    pub async fn tokens(&self) -> ClientResult<Vec<TokenInfo>> {
        self.json(self.request(Method::GET, "/v1/tokens")).await
    }

    /// Revokes join token `id`: it admits no one from now on.
    pub async fn revoke_token(&self, id: &str) -> ClientResult<TokenInfo> {
        let path = format!("/v1/tokens/{}", segment(id));
        self.json(self.request(Method::DELETE, &path)).await
    }

    /// Enrols a node: a join token and a CSR for a node certificate. Send
    /// it only over a connection whose CA matched the token's fingerprint
    /// ([`crate::tls::ClientTls::pinned`]).
    pub async fn join(&self, request: &JoinRequest) -> ClientResult<NodeCertificate> {
        self.json(self.request(Method::POST, "/v1/join").json(request))
            .await
    }

    /// A new certificate for `node`, asked over mTLS with its current one.
    pub async fn renew_certificate(
        &self,
        node: &str,
        request: &RenewRequest,
    ) -> ClientResult<NodeCertificate> {
        let path = format!("/v1/agent/nodes/{}/certificate", segment(node));
        self.json(self.request(Method::POST, &path).json(request))
            .await
    }

    /// The certificate revocations, as `node` sees them (its agent API
    /// refuses them).
    pub async fn node_revocations(&self, node: &str) -> ClientResult<Vec<RevocationEntry>> {
        let path = format!("/v1/agent/nodes/{}/revocations", segment(node));
        self.json(self.request(Method::GET, &path)).await
    }

    /// A certificate for `node`'s key for gate `gate` (a `tls {
    /// self_signed }` gate), asked by the gate node as itself.
    pub async fn gate_certificate(
        &self,
        node: &str,
        gate: &str,
        request: &GateCertificateRequest,
    ) -> ClientResult<GateCertificate> {
        let path = format!(
            "/v1/agent/nodes/{}/gates/{}/certificate",
            segment(node),
            segment(gate)
        );
        self.json(self.request(Method::POST, &path).json(request))
            .await
    }

    /// Gate node `node`'s report of when it last forwarded a request to
    /// each service (the server keeps the later time per service).
    pub async fn report_gate_activity(
        &self,
        node: &str,
        services: BTreeMap<String, Millis>,
    ) -> ClientResult<GateActivityReply> {
        let path = format!("/v1/agent/nodes/{}/gate-activity", segment(node));
        let body = GateActivityReport { services };
        self.json(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Gate node `node` asks to wake `service`, asleep with
    /// `scale_to_zero`, for a request it holds. Idempotent: waking an
    /// awake service changes nothing.
    pub async fn wake_service(&self, node: &str, service: &str) -> ClientResult<WakeReply> {
        let path = format!(
            "/v1/agent/nodes/{}/services/{}/wake",
            segment(node),
            segment(service)
        );
        self.json(self.request(Method::POST, &path)).await
    }

    /// The chain and key of gate `gate` (a `tls { cert key }` gate), asked
    /// by gate node `node`; `None` when they are still at version `known`
    /// (the server answered 304 Not Modified).
    pub async fn gate_tls(
        &self,
        node: &str,
        gate: &str,
        known: Option<&str>,
    ) -> ClientResult<Option<GateTls>> {
        let path = format!(
            "/v1/agent/nodes/{}/gates/{}/tls",
            segment(node),
            segment(gate)
        );
        let mut request = self.request(Method::GET, &path);
        if let Some(version) = known {
            request = request.header(reqwest::header::IF_NONE_MATCH, format!("\"{version}\""));
        }
        let response = request
            .send()
            .await
            .map_err(|error| self.unreachable(&error))?;
        if response.status() == StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        let response = self.checked(response).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.unreachable(&error))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|error| ClientError::Decode(error.to_string()))
    }

    /// Revokes certificates (see [`RevokeRequest`]).
    pub async fn revoke(&self, request: &RevokeRequest) -> ClientResult<RevocationEntry> {
        self.json(self.request(Method::POST, "/v1/revocations").json(request))
            .await
    }

    /// Every revocation in force.
    pub async fn revocations(&self) -> ClientResult<Vec<RevocationEntry>> {
        self.json(self.request(Method::GET, "/v1/revocations"))
            .await
    }

    /// Makes or changes user `name`.
    pub async fn put_user(
        &self,
        name: &str,
        request: &UserRequest,
    ) -> ClientResult<cca_model::access::UserRecord> {
        let path = format!("/v1/users/{}", segment(name));
        self.json(self.request(Method::PUT, &path).json(request))
            .await
    }

    pub async fn users(&self) -> ClientResult<Vec<cca_model::access::UserRecord>> {
        self.json(self.request(Method::GET, "/v1/users")).await
    }

    /// Removes user `name` and revokes their certificates and tokens.
    pub async fn delete_user(&self, name: &str) -> ClientResult<cca_model::access::UserRecord> {
        let path = format!("/v1/users/{}", segment(name));
        self.json(self.request(Method::DELETE, &path)).await
    }

    /// A signed token for user `name`.
    pub async fn user_token(
        &self,
        name: &str,
        request: &UserTokenRequest,
    ) -> ClientResult<IssuedToken> {
        let path = format!("/v1/users/{}/tokens", segment(name));
        self.json(self.request(Method::POST, &path).json(request))
            .await
    }

    /// Makes or changes custom role `role.name`.
    pub async fn put_role(
        &self,
        role: &cca_model::access::RoleRecord,
    ) -> ClientResult<cca_model::access::RoleRecord> {
        let path = format!("/v1/roles/{}", segment(&role.name));
        self.json(self.request(Method::PUT, &path).json(role)).await
    }

    pub async fn roles(&self) -> ClientResult<Vec<RoleInfo>> {
        self.json(self.request(Method::GET, "/v1/roles")).await
    }

    pub async fn delete_role(&self, name: &str) -> ClientResult<cca_model::access::RoleRecord> {
        let path = format!("/v1/roles/{}", segment(name));
        self.json(self.request(Method::DELETE, &path)).await
    }

    /// Revokes the token this client presents.
    pub async fn logout(&self) -> ClientResult<LoggedOut> {
        self.json(self.request(Method::POST, "/v1/logout")).await
    }

    /// The files (connection URLs, secret values) of an instance placed on
    /// `node`, for its agent to write before creating it.
    pub async fn instance_files(&self, node: &str, id: &str) -> ClientResult<InstanceFiles> {
        let path = format!(
            "/v1/agent/nodes/{}/instances/{}/files",
            segment(node),
            segment(id)
        );
        self.json(self.request(Method::GET, &path)).await
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(client) = self.audit_reads {
            request = request.header(AUDIT_READS, client);
        }
        match &self.bearer {
            Some(Bearer(token)) => request.bearer_auth(&**token),
            None => request,
        }
    }

    async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> ClientResult<T> {
        let response = self.send(request).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.unreachable(&error))?;
        serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode(error.to_string()))
    }

    async fn stream<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
    ) -> ClientResult<LineStream<T>> {
        let response = self.send(request).await?;
        Ok(LineStream {
            response,
            buffer: Vec::new(),
            kind: PhantomData,
        })
    }

    /// Sends a request; error statuses become [`ClientError::Api`].
    async fn send(&self, request: RequestBuilder) -> ClientResult<Response> {
        let response = request
            .send()
            .await
            .map_err(|error| self.unreachable(&error))?;
        self.checked(response).await
    }

    /// A response whose status is an error becomes [`ClientError::Api`].
    async fn checked(&self, response: Response) -> ClientResult<Response> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(status, response.headers());
        let body = response.bytes().await.unwrap_or_default();
        let ErrorBody { error, problems } = ErrorBody::read(&body);
        Err(ClientError::Api {
            status: status.as_u16(),
            message: error,
            problems,
            retry_after,
        })
    }

    fn unreachable(&self, error: &reqwest::Error) -> ClientError {
        let mut reason = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        ClientError::Unreachable {
            url: self.base.clone(),
            reason,
        }
    }
}

/// Escapes a name for one path segment (the server relays agent URLs with it too).
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A stream of newline-delimited JSON values.
#[derive(Debug)]
pub struct LineStream<T> {
    response: Response,
    buffer: Vec<u8>,
    kind: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> LineStream<T> {
    /// The next line; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Option<ClientResult<T>> {
        loop {
            if let Some(line) = self.next_buffered() {
                return Some(line);
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => return None,
                Err(error) => {
                    return Some(Err(ClientError::Unreachable {
                        url: self.response.url().to_string(),
                        reason: error.to_string(),
                    }));
                }
            }
        }
    }
}

impl<T: DeserializeOwned> LineStream<T> {
    /// The next line if a whole one has already arrived, without waiting:
    /// a reader can take every line of a burst and act on them at once.
    pub fn next_buffered(&mut self) -> Option<ClientResult<T>> {
        loop {
            let end = self.buffer.iter().position(|b| *b == b'\n')?;
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(
                serde_json::from_slice(&line).map_err(|e| ClientError::Decode(e.to_string())),
            );
        }
    }
}

/// A stream of text lines (log output), decoded as UTF-8 lossily.
#[derive(Debug)]
pub struct LogLines {
    response: Response,
    buffer: Vec<u8>,
}

impl LogLines {
    /// The next line without its `\n`; `None` when the server ended the
    /// stream. A last line without `\n` is returned too.
    pub async fn next(&mut self) -> Option<ClientResult<String>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(Ok(text_line(&line)));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) if self.buffer.is_empty() => return None,
                Ok(None) => {
                    let line = std::mem::take(&mut self.buffer);
                    return Some(Ok(text_line(&line)));
                }
                Err(error) => {
                    return Some(Err(ClientError::Unreachable {
                        url: self.response.url().to_string(),
                        reason: format!("the log stream broke: {error}"),
                    }));
                }
            }
        }
    }
}

/// A line's text without its `\n` (or `\r\n`).
fn text_line(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

/// A response body read a chunk at a time.
#[derive(Debug)]
pub struct ByteStream {
    response: Response,
}

impl ByteStream {
    /// The next chunk; `None` once the body ended.
    pub async fn next_chunk(&mut self) -> ClientResult<Option<Vec<u8>>> {
        let url = self.response.url().to_string();
        self.response
            .chunk()
            .await
            .map(|chunk| chunk.map(|bytes| bytes.to_vec()))
            .map_err(|error| ClientError::Unreachable {
                url,
                reason: format!("the response broke off: {error}"),
            })
    }
}

/// The query of a stream request: `from` and, when resuming, `epoch`.
fn resume_query(resume: &Resume) -> Vec<(&'static str, String)> {
    let mut query = vec![("from", resume.from.to_string())];
    if resume.from > 0 {
        query.push(("epoch", resume.epoch.clone()));
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_ours_or_their_text() {
        let ours = ErrorBody::read(br#"{"error":"service `web` not found"}"#);
        assert_eq!(ours.error, "service `web` not found");
        assert!(ours.problems.is_empty());
        let theirs = ErrorBody::read(b"<html>502 Bad Gateway</html>\n");
        assert_eq!(theirs.error, "<html>502 Bad Gateway</html>");
    }

    #[test]
    fn retry_after_is_read_from_429_and_503_only() {
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, value.parse().expect("a header value"));
            headers
        };
        let busy = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            retry_after(busy, &headers("3")),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(StatusCode::SERVICE_UNAVAILABLE, &headers(" 120 ")),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after(busy, &HeaderMap::new()), None);
        assert_eq!(retry_after(busy, &headers("soon")), None);
        assert_eq!(retry_after(busy, &headers("-1")), None);
        assert_eq!(
            retry_after(busy, &headers("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(retry_after(StatusCode::CONFLICT, &headers("3")), None);
    }

    /// A real socket: the client reads the header of a 429 as any server
    /// (or proxy) sends it, and says what the server said.
    #[tokio::test]
    async fn a_shed_request_carries_the_servers_retry_after() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accepts");
            let mut request = [0_u8; 4096];
            let _ = socket.read(&mut request).await.expect("reads");
            let body = br#"{"error":"server busy: the `user` lane is full; retry in 7 s"}"#;
            let head = format!(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                 retry-after: 7\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            socket.write_all(head.as_bytes()).await.expect("writes");
            socket.write_all(body).await.expect("writes");
        });
        let error = Client::new(&format!("http://{address}"))
            .status()
            .await
            .expect_err("shed");
        server.await.expect("the server answered");
        assert_eq!(error.status(), Some(429));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(
            error.to_string(),
            "server busy: the `user` lane is full; retry in 7 s (HTTP 429)"
        );
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(segment("web-1"), "web-1");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
