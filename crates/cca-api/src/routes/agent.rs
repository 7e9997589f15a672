//! Endpoints for node agents: register (node info plus a leased
//! heartbeat key, its lease's TTL set by the fleet's size), heartbeat
//! (lease keep-alive, and a move to another lease when the fleet's size
//! changed what it should last), the node-scoped stream of
//! assignments, observed-state reports, and the host ports something
//! outside the cluster holds on the node. An agent may only report on
//! instances placed on its own node — except to say one stopped or failed,
//! which it must be able to do after the placement moved away.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::Response;
use cca_control::View;
use cca_model::cluster::{Heartbeat, HeldPorts, Instance, InstanceState, InstanceStatus, NodeInfo};
use cca_model::keys;
use cca_model::recovery::Unclaimed;
use cca_model::usage::NodeUsage;
use cca_store::{Compare, CompareOp, LeaseId, Op, Revision, StoreError, Txn, TxnOutcome};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult, JsonBody, QueryArgs};
use crate::hub::Subscription;
use crate::routes::watch::{LineSender, ndjson};
use crate::state::{ApiState, encode, now_millis};
use crate::types::{
    AssignmentLine, HeartbeatReply, HeartbeatRequest, HeldPortsReply, MAX_REPORT_BATCH,
    NetworkLine, RefusedReport, RegisterReply, RegisterRequest, ReportBatch, ReportBatchReply,
    Resume, UnclaimedReply, WriteReply,
};
use crate::validate::check_name;

/// Registers a node: writes `observed/node/{n}` (kept across restarts,
/// with its first registration time) and `observed/heartbeat/{n}` attached
/// to a fresh lease the agent must keep alive.
pub(crate) async fn register(
    State(state): State<ApiState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<crate::tls::Peer>>>,
    JsonBody(request): JsonBody<RegisterRequest>,
) -> ApiResult<Json<RegisterReply>> {
    check_name("node", &request.name)?;
    let caller = peer.and_then(|axum::Extension(axum::extract::ConnectInfo(peer))| peer.identity);
    crate::auth::check_node(&state, caller.as_ref(), &request.name)?;
    // Counted from here: a registration waiting on the store is a node
    // joining, which the TTLs granted meanwhile should allow for.
    let _registering = state.fleet().registering();
    let name = request.name.clone();
    let node_key = keys::observed_node(&name);
    let previous = state.store().get(&node_key).await?;
    let registered_at = previous
        .as_ref()
        .and_then(|kv| serde_json::from_slice::<NodeInfo>(&kv.value).ok())
        .map_or_else(now_millis, |info| info.registered_at);
    let old_lease = state
        .store()
        .get(&keys::observed_heartbeat(&name))
        .await?
        .and_then(|kv| kv.lease);
    let fleet = state.fleet().joined_by(&state.cache().view(), &name);
    let ttl = state.config().node_leases.ttl_for(fleet);
    let lease_id = state.store().grant_lease(ttl).await?;
    let info = node_info(request, registered_at);
    let heartbeat = Heartbeat {
        lease_ttl_secs: ttl.as_secs(),
        started_at: now_millis(),
        lease: lease_id,
    };
    let txn = Txn::new()
        .then(Op::put(&node_key, encode(&info)))
        .then(Op::put_with_lease(
            keys::observed_heartbeat(&name),
            encode(&heartbeat),
            lease_id,
        ));
    let revision = state.store().txn(txn).await?.revision();
    if let Some(old) = old_lease.filter(|old| *old != lease_id) {
        // The heartbeat key now rides the new lease; the old one would
        // only linger until it expires.
        let _ = state.store().revoke_lease(old).await;
    }
    Ok(Json(RegisterReply {
        node: name,
        lease_id,
        ttl_secs: ttl.as_secs(),
        revision,
    }))
}

fn node_info(request: RegisterRequest, registered_at: i64) -> NodeInfo {
    NodeInfo {
        name: request.name,
        cpu: request.cpu,
        memory: request.memory,
        arch: request.arch,
        zone: request.zone,
        labels: request.labels,
        addresses: request.addresses,
        agent_url: request.agent_url,
        registered_at,
        gate: request.gate,
    }
}

/// Keeps the node's lease alive. A lease that is gone (expired, revoked,
/// or not this node's) is 409: the agent must register again. Whether the
/// lease is the node's is read from the cache, which is current but for
/// a registration made a moment ago: only then does it cost a store read,
/// so a renewal is no read and no commit. A lease whose TTL no longer fits
/// the fleet (`NodeLeases::move_to`) is replaced by one that does, and the
/// answer names it: rare (a few times per node as a fleet grows by
/// thousands), it costs a read, a grant, a commit and a revocation, so
/// only a few are served at once (`Fleet::room_to_move`); a heartbeat
/// that finds no room is a plain renewal, and the next one tries again.
pub(crate) async fn heartbeat(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(request): JsonBody<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatReply>> {
    check_name("node", &node)?;
    let cached = state
        .cache()
        .view()
        .heartbeats
        .get(&node)
        .map(|held| held.value.lease);
    if cached != Some(request.lease_id) {
        let current = state
            .store()
            .get(&keys::observed_heartbeat(&node))
            .await?
            .and_then(|kv| kv.lease);
        if current != Some(request.lease_id) {
            return Err(re_register(&node, request.lease_id));
        }
    }
    let ttl = match state.store().keep_alive(request.lease_id).await {
        Ok(ttl) => ttl,
        Err(StoreError::LeaseNotFound(_)) => return Err(re_register(&node, request.lease_id)),
        Err(error) => return Err(error.into()),
    };
    let fleet = state.cache().view().heartbeats.len();
    if let Some(fitting) = state.config().node_leases.move_to(ttl, fleet)
        && let Some(_room) = state.fleet().room_to_move()
        && let Some(moved) = move_lease(&state, &node, request.lease_id, fitting)
            .await
            .unwrap_or_else(|error| {
                // The renewal stands: a failed move must not fail it.
                tracing::warn!(node, %error, "moving a node's heartbeat to another lease failed; the next heartbeat tries again");
                None
            })
    {
        return Ok(Json(HeartbeatReply {
            ttl_secs: fitting.as_secs(),
            lease_id: Some(moved),
        }));
    }
    Ok(Json(HeartbeatReply {
        ttl_secs: ttl.as_secs(),
        lease_id: None,
    }))
}

/// Moves `node`'s heartbeat key from lease `from` to a new lease of `ttl`
/// (the fleet's size changed what its leases should last), then revokes
/// `from`; the new lease, or `None` when the key changed meanwhile (a
/// registration: the move is dropped, the next heartbeat decides again).
/// The key is rewritten, never deleted, so the node stays ready.
async fn move_lease(
    state: &ApiState,
    node: &str,
    from: LeaseId,
    ttl: Duration,
) -> ApiResult<Option<LeaseId>> {
    let key = keys::observed_heartbeat(node);
    let Some(held) = state
        .store()
        .get(&key)
        .await?
        .filter(|kv| kv.lease == Some(from))
    else {
        return Ok(None);
    };
    let started_at = serde_json::from_slice::<Heartbeat>(&held.value)
        .map_or_else(|_| now_millis(), |heartbeat| heartbeat.started_at);
    let lease = state.store().grant_lease(ttl).await?;
    let heartbeat = Heartbeat {
        lease_ttl_secs: ttl.as_secs(),
        started_at,
        lease,
    };
    let txn = Txn::new()
        .when(Compare::mod_revision(
            &key,
            CompareOp::Equal,
            held.mod_revision,
        ))
        .then(Op::put_with_lease(&key, encode(&heartbeat), lease));
    // Whichever lease does not hold the key afterwards would only linger
    // until it expired. After an error, the outcome is unknown: neither
    // is revoked (an unused new lease expires on its own).
    match state.store().txn(txn).await? {
        TxnOutcome::Committed { .. } => {
            let _ = state.store().revoke_lease(from).await;
            tracing::info!(
                node,
                from,
                to = lease,
                ttl_secs = ttl.as_secs(),
                "moved a node's heartbeat to a lease of the fleet's TTL"
            );
            Ok(Some(lease))
        }
        TxnOutcome::CompareFailed { .. } => {
            let _ = state.store().revoke_lease(lease).await;
            Ok(None)
        }
    }
}

fn re_register(node: &str, lease: i64) -> ApiError {
    ApiError::conflict(format!(
        "lease {lease} is not the live lease of node `{node}` (it expired or was replaced); register again"
    ))
}

/// Query of the assignment stream.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AssignmentQuery {
    /// Resume after a revision already seen (the stream replays changes
    /// from `from` on, without a snapshot). Absent or 0: snapshot first.
    #[serde(default)]
    from: Revision,
    /// The epoch of the snapshot `from` was counted from: a resume point
    /// of another epoch gets a snapshot (see `hub::start_of`).
    #[serde(default)]
    epoch: String,
}

impl AssignmentQuery {
    fn resume(self) -> Resume {
        Resume {
            from: self.from.max(0),
            epoch: self.epoch,
        }
    }
}

/// Streams the instances placed on `node`: a snapshot (unless resuming),
/// then puts and deletes as placements change. Every stream is fed by the
/// server's one [`AssignmentHub`](crate::hub::AssignmentHub), so a change
/// costs the same whatever the number of nodes.
pub(crate) async fn assignments(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    QueryArgs(query): QueryArgs<AssignmentQuery>,
) -> ApiResult<Response> {
    check_name("node", &node)?;
    let permit = state.stream_permit()?;
    let subscription = state
        .assignment_hub()
        .subscribe(&state, &node, &query.resume())
        .await?;
    Ok(ndjson(&state, permit, move |lines| async move {
        relay(lines, subscription, |compact_revision| {
            AssignmentLine::Compacted { compact_revision }
        })
        .await;
    }))
}

/// Streams the cluster's network map to `node`: a snapshot (unless
/// resuming), then each revision's changes. Every stream is fed by the
/// server's one [`NetworkFeed`](crate::netfeed::NetworkFeed), which encodes
/// each line once for all of them.
pub(crate) async fn network(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    QueryArgs(query): QueryArgs<AssignmentQuery>,
) -> ApiResult<Response> {
    check_name("node", &node)?;
    let permit = state.stream_permit()?;
    let subscription = state
        .network_feed()
        .subscribe(&state, &query.resume())
        .await;
    Ok(ndjson(&state, permit, move |lines| async move {
        relay(lines, subscription, |compact_revision| {
            NetworkLine::Compacted { compact_revision }
        })
        .await;
    }))
}

/// Sends a subscription's lines until it or the client ends: its first
/// lines, then each live one; a compacted subscription gets the one line
/// `compacted` makes.
async fn relay<L: Line, C: serde::Serialize>(
    lines: LineSender,
    subscription: Subscription<L>,
    compacted: impl FnOnce(Revision) -> C,
) {
    let (first, mut live) = match subscription {
        Subscription::Live { first, live } => (first, live),
        Subscription::Compacted { compact_revision } => {
            lines.send(&compacted(compact_revision)).await;
            return;
        }
    };
    for line in first {
        if !line.send_to(&lines).await {
            return;
        }
    }
    loop {
        let line = tokio::select! {
            line = live.recv() => line,
            () = lines.stopped() => return,
        };
        // The index dropping the stream (it fell behind, or the index
        // rebuilds) ends it: the agent resumes or resnapshots.
        let Some(line) = line else { return };
        if !line.send_to(&lines).await {
            return;
        }
    }
}

/// A line an index hands its streams: a shared value, or bytes already
/// encoded once for every stream.
trait Line: Send {
    /// Sends it; false once the client is gone.
    fn send_to(self, lines: &LineSender) -> impl Future<Output = bool> + Send;
}

impl Line for crate::hub::Line {
    async fn send_to(self, lines: &LineSender) -> bool {
        lines.send(&*self).await
    }
}

impl Line for bytes::Bytes {
    async fn send_to(self, lines: &LineSender) -> bool {
        lines.send_encoded(self).await
    }
}

fn decode_instance(value: &[u8]) -> Option<Instance> {
    serde_json::from_slice(value).ok()
}

/// Writes `observed/instance/{id}` for an instance of the reporting node.
pub(crate) async fn report(
    State(state): State<ApiState>,
    Path((node, id)): Path<(String, String)>,
    JsonBody(status): JsonBody<InstanceStatus>,
) -> ApiResult<Json<WriteReply>> {
    check_name("node", &node)?;
    check_name("instance", &id)?;
    if status.id != id || status.node != node {
        return Err(ApiError::invalid(format!(
            "the report is about instance `{}` on node `{}`, but was sent for `{id}` on `{node}`",
            status.id, status.node
        )));
    }
    known_node(&state, &node).await?;
    match prepare_report(&state, &node, &status).await? {
        ReportWrite::Unchanged { revision, .. } => Ok(Json(WriteReply { revision })),
        ReportWrite::Put(txn) => commit(&state, txn, &id).await,
    }
}

/// Writes the observed state of several instances of the reporting node,
/// each checked as [`report`] checks one, in as few transactions as the
/// store allows. They are checked against the cache's view, not read from
/// the store one by one (two reads per report were most of the work on
/// etcd); the transactions' compares catch a view that lagged, and a chunk
/// that fails them is retried report by report against the store, so only
/// a report that really conflicts is refused, on its own.
pub(crate) async fn report_batch(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(batch): JsonBody<ReportBatch>,
) -> ApiResult<Json<ReportBatchReply>> {
    check_name("node", &node)?;
    if batch.statuses.len() > MAX_REPORT_BATCH {
        return Err(ApiError::invalid(format!(
            "a batch carries at most {MAX_REPORT_BATCH} reports, this one {}; split it",
            batch.statuses.len()
        )));
    }
    known_node(&state, &node).await?;
    let view = state.cache().view();
    let mut reply = ReportBatchReply::default();
    let mut writes = Vec::new();
    let mut recheck = Vec::new();
    for status in &batch.statuses {
        if let Err(error) = check_batched(&node, status) {
            reply.refused.push(refusal(&status.id, &error));
            continue;
        }
        match check_report(&node, status, current_in_view(&view, status)) {
            // What the view says may be old: the compares of a put, or
            // of an unchanged record, hold only if it is not.
            Ok(write) => writes.push((status, write.guarded())),
            // A lagging view must not refuse: the store decides.
            Err(_) => recheck.push(status),
        }
    }
    // Each report is at most two compares and one put.
    let per_txn = (state.store().max_txn_ops() / 2).max(1);
    for chunk in writes.chunks(per_txn) {
        if !commit_chunk(&state, chunk, &mut reply).await? {
            recheck.extend(chunk.iter().map(|(status, _)| *status));
        }
    }
    for status in recheck {
        commit_checked_in_store(&state, &node, status, &mut reply).await?;
    }
    Ok(Json(reply))
}

/// What only a batch needs checking: each report's own names and node.
fn check_batched(node: &str, status: &InstanceStatus) -> ApiResult<()> {
    check_name("instance", &status.id)?;
    if status.node != node {
        return Err(ApiError::invalid(format!(
            "the report is about instance `{}` on node `{}`, but was sent by `{node}`",
            status.id, status.node
        )));
    }
    Ok(())
}

fn refusal(id: &str, error: &ApiError) -> RefusedReport {
    RefusedReport {
        id: id.to_owned(),
        status: error.status.as_u16(),
        message: error.message.clone(),
    }
}

/// Commits one chunk of a batch in one transaction; false when a compare
/// failed (the view lagged, or an instance changed meanwhile) and nothing
/// was written.
async fn commit_chunk(
    state: &ApiState,
    chunk: &[(&InstanceStatus, Txn)],
    reply: &mut ReportBatchReply,
) -> ApiResult<bool> {
    let mut merged = Txn::new();
    for (_, txn) in chunk {
        merged.compares.extend(txn.compares.iter().cloned());
        merged.ops.extend(txn.ops.iter().cloned());
    }
    match state.store().txn(merged).await? {
        TxnOutcome::Committed { revision } => {
            if chunk.iter().any(|(_, txn)| !txn.ops.is_empty()) {
                reply.revision = Some(revision);
            }
            Ok(true)
        }
        TxnOutcome::CompareFailed { .. } => Ok(false),
    }
}

/// Checks one report against the store and commits it on its own; a
/// refusal or a conflict is answered for it alone.
async fn commit_checked_in_store(
    state: &ApiState,
    node: &str,
    status: &InstanceStatus,
    reply: &mut ReportBatchReply,
) -> ApiResult<()> {
    let written = match prepare_report(state, node, status).await {
        Ok(ReportWrite::Unchanged { .. }) => return Ok(()),
        Ok(ReportWrite::Put(txn)) => commit(state, txn, &status.id).await,
        Err(error) => Err(error),
    };
    match written {
        Ok(Json(written)) => reply.revision = Some(written.revision),
        Err(error) if error.status.is_client_error() => {
            reply.refused.push(refusal(&status.id, &error));
        }
        Err(error) => return Err(error),
    }
    Ok(())
}

/// What a report needs written.
enum ReportWrite {
    /// The record at `key` already says exactly this (all but
    /// `updated_at`): an agent re-sending its reports rewrites nothing.
    Unchanged { revision: Revision, key: String },
    /// The put, guarded by the placement and the record as checked.
    Put(Txn),
}

impl ReportWrite {
    /// The transaction for a check made on the cache's view: an
    /// unchanged record is still compared, so that a view which lagged
    /// behind a newer record cannot hide a change.
    fn guarded(self) -> Txn {
        match self {
            ReportWrite::Put(txn) => txn,
            ReportWrite::Unchanged { revision, key } => {
                Txn::new().when(Compare::mod_revision(key, CompareOp::Equal, revision))
            }
        }
    }
}

/// What a report is checked against: the instance's placement under the
/// reported service and its current record, each with its mod revision
/// (0: absent).
struct Current {
    placement: Option<(Instance, Revision)>,
    observed: Option<(Option<InstanceStatus>, Revision)>,
}

/// Reads what a report is checked against from the store.
async fn current_in_store(state: &ApiState, status: &InstanceStatus) -> ApiResult<Current> {
    let placement_key = keys::derived_instance(&status.service, &status.id);
    let placement = state.store().get(&placement_key).await?;
    let observed = state
        .store()
        .get(&keys::observed_instance(&status.id))
        .await?;
    Ok(Current {
        placement: placement.and_then(|kv| Some((decode_instance(&kv.value)?, kv.mod_revision))),
        observed: observed.map(|kv| {
            let record = serde_json::from_slice::<InstanceStatus>(&kv.value).ok();
            (record, kv.mod_revision)
        }),
    })
}

/// The same from the cache's view (which may lag: the compares tell).
fn current_in_view(view: &View, status: &InstanceStatus) -> Current {
    Current {
        placement: view
            .instances
            .get(&status.id)
            .filter(|placed| placed.value.service == status.service)
            .map(|placed| ((*placed.value).clone(), placed.mod_revision)),
        observed: view
            .statuses
            .get(&status.id)
            .map(|record| (Some((*record.value).clone()), record.mod_revision)),
    }
}

/// Checks a report of `node` against its placement and the current
/// record as read from the store, and prepares the write.
async fn prepare_report(
    state: &ApiState,
    node: &str,
    status: &InstanceStatus,
) -> ApiResult<ReportWrite> {
    check_name("service", &status.service)?;
    let current = current_in_store(state, status).await?;
    check_report(node, status, current)
}

/// The rules of a report: an agent reports on instances placed on its node
/// (or says one stopped or failed after it moved away), and does not
/// overwrite another node's record of an instance not placed on it.
fn check_report(node: &str, status: &InstanceStatus, current: Current) -> ApiResult<ReportWrite> {
    let id = status.id.as_str();
    check_name("service", &status.service)?;
    let placed_here = current
        .placement
        .as_ref()
        .is_some_and(|(instance, _)| instance.node == node);
    let ended = matches!(status.state, InstanceState::Stopped | InstanceState::Failed);
    if !placed_here && !ended {
        return Err(ApiError::conflict(format!(
            "instance `{id}` is not placed on node `{node}`; only a stopped or failed report is accepted"
        )));
    }
    let record = current
        .observed
        .as_ref()
        .and_then(|(record, _)| record.as_ref());
    check_reporter(record, node, id, placed_here)?;
    let observed_key = keys::observed_instance(id);
    if let Some((Some(record), revision)) = &current.observed
        && same_report(record, status)
    {
        return Ok(ReportWrite::Unchanged {
            revision: *revision,
            key: observed_key,
        });
    }
    // The placement must still be as checked. While the instance is
    // placed here no other node may write its record, and this node's
    // reports come one after another, so the record needs no compare (one
    // would fail whenever the view has not yet seen this node's previous
    // report); after a move it must still be as checked.
    let placement = Compare::mod_revision(
        keys::derived_instance(&status.service, id),
        CompareOp::Equal,
        current
            .placement
            .as_ref()
            .map_or(0, |(_, revision)| *revision),
    );
    let mut txn = Txn::new().when(placement);
    if !placed_here {
        txn = txn.when(Compare::mod_revision(
            &observed_key,
            CompareOp::Equal,
            current
                .observed
                .as_ref()
                .map_or(0, |(_, revision)| *revision),
        ));
    }
    Ok(ReportWrite::Put(
        txn.then(Op::put(&observed_key, encode(status))),
    ))
}

/// True when the stored record says what `status` says, but for the time
/// it was sent.
fn same_report(stored: &InstanceStatus, status: &InstanceStatus) -> bool {
    *stored
        == InstanceStatus {
            updated_at: stored.updated_at,
            ..status.clone()
        }
}

/// A record written by another node may only be overwritten by the node
/// the instance is placed on now.
fn check_reporter(
    record: Option<&InstanceStatus>,
    node: &str,
    id: &str,
    placed_here: bool,
) -> ApiResult<()> {
    match record.map(|record| record.node.as_str()) {
        Some(owner) if owner != node && !placed_here => Err(ApiError::conflict(format!(
            "instance `{id}` is reported by node `{owner}`, not `{node}`"
        ))),
        _ => Ok(()),
    }
}

/// Deletes `observed/instance/{id}` when the reporting node wrote it.
pub(crate) async fn forget(
    State(state): State<ApiState>,
    Path((node, id)): Path<(String, String)>,
) -> ApiResult<Json<WriteReply>> {
    check_name("node", &node)?;
    check_name("instance", &id)?;
    let key = keys::observed_instance(&id);
    let kv =
        state.store().get(&key).await?.ok_or_else(|| {
            ApiError::not_found(format!("instance `{id}` has no observed record"))
        })?;
    let owner = serde_json::from_slice::<InstanceStatus>(&kv.value)
        .map(|status| status.node)
        .ok();
    if owner.as_deref() != Some(node.as_str()) {
        return Err(ApiError::conflict(format!(
            "the record of instance `{id}` was not written by node `{node}`"
        )));
    }
    let txn = Txn::new()
        .when(Compare::mod_revision(
            &key,
            CompareOp::Equal,
            kv.mod_revision,
        ))
        .then(Op::delete(&key));
    commit(&state, txn, &id).await
}

/// `PUT /v1/agent/nodes/{node}/held-ports`: every host port the node's
/// agent finds held by something outside the cluster, replacing what was
/// there (`observed/held-ports/{node}`; an empty set deletes it). The
/// scheduler hands none of them out on the node. A report that changes
/// nothing costs no write.
pub(crate) async fn held_ports(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(held): JsonBody<HeldPorts>,
) -> ApiResult<Json<HeldPortsReply>> {
    check_name("node", &node)?;
    if held.ports.contains(&0) {
        return Err(ApiError::invalid(
            "port 0 is no host port: report the ports found held, 1-65535",
        ));
    }
    known_node(&state, &node).await?;
    let key = keys::observed_held_ports(&node);
    let revision =
        replace_node_fact(&state, &key, &held, held.ports.is_empty(), "held ports").await?;
    Ok(Json(HeldPortsReply { revision }))
}

/// The most instances one unclaimed report may carry.
const MAX_UNCLAIMED: usize = 10_000;

/// `PUT /v1/agent/nodes/{node}/unclaimed`: the instances the node runs
/// that this store does not place there (it resynced with a new, restored
/// or rewound store), replacing what was there
/// (`observed/unclaimed/{node}`; none deletes it). The scheduler adopts
/// the ones that match what it would place. The reply names the reported
/// services the store knows: the agent stops an instance a grace period
/// after its service is known unless it was adopted.
pub(crate) async fn unclaimed(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(report): JsonBody<Unclaimed>,
) -> ApiResult<Json<UnclaimedReply>> {
    check_name("node", &node)?;
    if report.instances.len() > MAX_UNCLAIMED {
        return Err(ApiError::invalid(format!(
            "an unclaimed report carries at most {MAX_UNCLAIMED} instances, this one {}",
            report.instances.len()
        )));
    }
    for instance in &report.instances {
        check_name("instance", &instance.id)?;
        check_name("service", &instance.service)?;
    }
    known_node(&state, &node).await?;
    let key = keys::observed_unclaimed(&node);
    let empty = report.instances.is_empty();
    let revision = replace_node_fact(&state, &key, &report, empty, "unclaimed instances").await?;
    let view = state.cache().view();
    let known_services = report
        .instances
        .iter()
        .filter(|instance| view.services.contains_key(&instance.service))
        .map(|instance| instance.service.clone())
        .collect();
    Ok(Json(UnclaimedReply {
        revision,
        known_services,
    }))
}

/// Replaces the node-reported fact at `key` with `value` (`empty`: deletes
/// it), guarded on what was read; the revision that recorded it, or `None`
/// when it changed nothing. `what` names it in a conflict.
async fn replace_node_fact<T>(
    state: &ApiState,
    key: &str,
    value: &T,
    empty: bool,
    what: &str,
) -> ApiResult<Option<Revision>>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
{
    let current = state.store().get(key).await?;
    let stored = current
        .as_ref()
        .and_then(|kv| serde_json::from_slice::<T>(&kv.value).ok());
    let unchanged = match &stored {
        Some(stored) => stored == value,
        None => empty && current.is_none(),
    };
    if unchanged {
        return Ok(None);
    }
    let compare = match &current {
        Some(kv) => Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision),
        None => Compare::absent(key),
    };
    let op = if empty {
        Op::delete(key)
    } else {
        Op::put(key, encode(value))
    };
    match state.store().txn(Txn::new().when(compare).then(op)).await? {
        TxnOutcome::Committed { revision } => Ok(Some(revision)),
        TxnOutcome::CompareFailed { .. } => Err(ApiError::conflict(format!(
            "the {what} recorded at `{key}` changed while reporting; report again"
        ))),
    }
}

/// Most instances one usage report may list: far above what a node runs,
/// low enough that a report stays a small fact.
const MAX_USAGE_INSTANCES: usize = 10_000;

/// `PUT /v1/agent/nodes/{node}/usage`: what the node and its running
/// instances used over the agent's last period, replacing the previous
/// report (`observed/usage/{node}`). The agent is the only writer of its
/// node's report, so it is put without a compare.
pub(crate) async fn usage(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(report): JsonBody<NodeUsage>,
) -> ApiResult<Json<WriteReply>> {
    check_name("node", &node)?;
    if report.period_ms == 0 {
        return Err(ApiError::invalid(
            "a usage report's period_ms is 0: report the length of the period summarised",
        ));
    }
    if report.instances.len() > MAX_USAGE_INSTANCES {
        return Err(ApiError::invalid(format!(
            "a usage report lists {} instances, more than {MAX_USAGE_INSTANCES}",
            report.instances.len()
        )));
    }
    if report.requests.len() > MAX_USAGE_INSTANCES {
        return Err(ApiError::invalid(format!(
            "a usage report counts requests of {} services, more than {MAX_USAGE_INSTANCES}",
            report.requests.len()
        )));
    }
    for id in report.instances.keys() {
        check_name("instance", id)?;
    }
    for service in report.requests.keys() {
        check_name("service", service)?;
    }
    known_node(&state, &node).await?;
    let key = keys::observed_usage(&node);
    match state
        .store()
        .txn(Txn::new().then(Op::put(&key, encode(&report))))
        .await?
    {
        TxnOutcome::Committed { revision } => Ok(Json(WriteReply { revision })),
        TxnOutcome::CompareFailed { .. } => Err(ApiError::internal(format!(
            "the usage of node `{node}` was not recorded: a transaction without a compare failed one"
        ))),
    }
}

/// Whether `node` is registered: the cache says so for every node but one
/// registered a moment ago, so only then is the store read (a report
/// batch then costs no read; what it writes is guarded by its compares).
async fn known_node(state: &ApiState, node: &str) -> ApiResult<()> {
    if state.cache().view().nodes.contains_key(node) {
        return Ok(());
    }
    match state.store().get(&keys::observed_node(node)).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!(
            "node `{node}` is not registered; register first"
        ))),
    }
}

async fn commit(state: &ApiState, txn: Txn, id: &str) -> ApiResult<Json<WriteReply>> {
    match state.store().txn(txn).await? {
        TxnOutcome::Committed { revision } => Ok(Json(WriteReply { revision })),
        TxnOutcome::CompareFailed { .. } => Err(ApiError::conflict(format!(
            "instance `{id}` changed while reporting; read the assignment again and retry"
        ))),
    }
}
