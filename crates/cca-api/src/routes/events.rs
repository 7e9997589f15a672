//! The event and audit logs: `GET /v1/events` (with `follow`, then the
//! new events as they are logged), `GET /v1/audit`, and the retention task that deletes entries of either older than its retention
//! period or beyond its maximum count. Keys sort by time
//! (`events/{at:013}-{seq:010}-{origin:08x}`, `audit/…` alike), so "the
//! oldest" is "the first keys".

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use cca_model::cluster::{AuditOutcome, AuditRecord, Event, Millis};
use cca_store::{KeyValue, Op, RangeRequest, Revision, Store, Txn, WatchEvent, WatchMessage};
use serde::Deserialize;

use crate::error::{ApiResult, QueryArgs};
use crate::state::{ApiState, now_millis};
use crate::types::{AuditEntry, EventRecord};

/// Events returned when the query does not say.
const DEFAULT_LIMIT: usize = 100;
/// Deletes per retention transaction (keeps each one small), or fewer
/// where the store takes fewer (etcd: 128).
const DELETE_BATCH: usize = 1_000;

/// Query of `GET /v1/events`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventQuery {
    /// Only events at or after this time (ms since the epoch).
    since: Option<Millis>,
    /// Only events whose subject starts with this (`service/web`, `node/`).
    subject: Option<String>,
    /// At most this many, the newest (default 100).
    limit: Option<usize>,
    /// Then keep the response open and send each new event as it is
    /// logged (NDJSON, one record a line, the listed ones first).
    #[serde(default)]
    follow: bool,
}

/// `GET /v1/events`: for a tenant's user, only events about their
/// tenant's services and instances.
pub(crate) async fn list(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<EventQuery>,
) -> ApiResult<Response> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    let (mut records, revision) =
        read_events(&state, query.since, query.subject.as_deref(), limit).await?;
    let lens = crate::authz::Lens::of(
        &state,
        caller.as_deref(),
        cca_model::access::Resource::Event,
    );
    keep_visible(&state, lens.as_ref(), &mut records);
    if !query.follow {
        return Ok(Json(records).into_response());
    }
    let permit = state.stream_permit()?;
    // Opened before answering, so that a failure is an error status; from
    // the listing's revision on, so that no event falls between the two.
    let mut stream = state
        .store()
        .watch(cca_model::Kind::Event.prefix(), revision + 1)
        .await?;
    let subject = query.subject;
    let producer_state = state.clone();
    Ok(super::watch::ndjson(&state, permit, |lines| async move {
        for record in &records {
            if !lines.send(record).await {
                return;
            }
        }
        // A compaction or a store error ends the stream: the client lists
        // again (what it missed is in the log).
        while let Some(Ok(WatchMessage::Events { events, .. })) =
            lines.next_message(&mut stream).await
        {
            let mut new: Vec<EventRecord> = events
                .iter()
                .filter_map(|event| match event {
                    WatchEvent::Put(kv) => decode(kv),
                    WatchEvent::Delete { .. } => None,
                })
                .filter(|record| about(record, subject.as_deref()))
                .collect();
            keep_visible(&producer_state, lens.as_ref(), &mut new);
            for record in &new {
                if !lines.send(record).await {
                    return;
                }
            }
        }
    }))
}

fn about(record: &EventRecord, subject: Option<&str>) -> bool {
    subject.is_none_or(|s| record.event.subject.starts_with(s))
}

/// Keeps the records `lens` lets its user read (a tenant's user: those
/// about their tenant's services and instances).
pub(crate) fn keep_visible(
    state: &ApiState,
    lens: Option<&crate::authz::Lens>,
    records: &mut Vec<EventRecord>,
) {
    if lens.is_none() {
        return;
    }
    let view = state.cache().view();
    crate::authz::filter_by_service(lens, &view, records, |record| {
        let subject = &record.event.subject;
        if let Some(service) = subject.strip_prefix("service/") {
            Some(service.to_owned())
        } else if let Some(id) = subject.strip_prefix("instance/") {
            view.instances
                .get(id)
                .map(|instance| instance.service.clone())
                .or_else(|| view.statuses.get(id).map(|status| status.service.clone()))
        } else {
            None
        }
    });
}

/// The newest `limit` events about `subject`, oldest first.
pub(crate) async fn recent_about(
    state: &ApiState,
    subject: &str,
    limit: usize,
) -> ApiResult<Vec<EventRecord>> {
    Ok(read_events(state, None, Some(subject), limit).await?.0)
}

/// The newest `limit` events (at or after `since`, about `subject`),
/// oldest first, and the revision they were read at.
async fn read_events(
    state: &ApiState,
    since: Option<Millis>,
    subject: Option<&str>,
    limit: usize,
) -> ApiResult<(Vec<EventRecord>, Revision)> {
    let mut request = RangeRequest::prefix(cca_model::Kind::Event.prefix());
    if let Some(since) = since {
        request = request.after(cca_model::keys::events_from(since));
    }
    let page = state.store().range(request).await?;
    let mut records: Vec<EventRecord> = page
        .kvs
        .iter()
        .filter_map(decode)
        .filter(|record| about(record, subject))
        .collect();
    let skip = records.len().saturating_sub(limit);
    records.drain(..skip);
    Ok((records, page.revision))
}

fn decode(kv: &KeyValue) -> Option<EventRecord> {
    let event: Event = serde_json::from_slice(&kv.value).ok()?;
    Some(EventRecord {
        key: kv.key.clone(),
        event,
    })
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    /// Only records at or after this time (ms since the epoch).
    since: Option<Millis>,
    /// Only records of callers whose identity starts with this
    /// (`user:alice`, `node:`).
    who: Option<String>,
    /// Only refusals.
    #[serde(default)]
    denied: bool,
    /// At most this many, the newest (default 100).
    limit: Option<usize>,
}

/// `GET /v1/audit`: the newest audit records matching the query, oldest
/// first.
pub(crate) async fn audit(
    State(state): State<ApiState>,
    QueryArgs(query): QueryArgs<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    let mut request = RangeRequest::prefix(cca_model::Kind::Audit.prefix());
    if let Some(since) = query.since {
        request = request.after(cca_model::keys::audit_from(since));
    }
    let page = state.store().range(request).await?;
    let mut entries: Vec<AuditEntry> = page
        .kvs
        .iter()
        .filter_map(|kv| {
            let record: AuditRecord = serde_json::from_slice(&kv.value).ok()?;
            Some(AuditEntry {
                key: kv.key.clone(),
                record,
            })
        })
        .filter(|entry| !query.denied || entry.record.outcome == AuditOutcome::Denied)
        .filter(|entry| {
            query.who.as_deref().is_none_or(|who| {
                entry
                    .record
                    .who
                    .as_deref()
                    .is_some_and(|caller| caller.starts_with(who))
            })
        })
        .collect();
    let skip = entries
        .len()
        .saturating_sub(query.limit.unwrap_or(DEFAULT_LIMIT));
    entries.drain(..skip);
    Ok(Json(entries))
}

/// Deletes old events and audit records every retention interval until
/// shutdown.
pub(crate) async fn retention_task(state: ApiState) {
    let mut shutdown = state.shutdown_signal();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(state.config().retention_interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let config = state.config();
        let cutoff =
            |retention| now_millis().saturating_sub(cca_model::clock::span_millis(retention));
        if let Err(error) = prune_events(
            state.store(),
            cutoff(config.event_retention),
            config.max_events,
        )
        .await
        {
            tracing::warn!(%error, "event retention failed; retrying next interval");
        }
        let audit = Log::Audit;
        if let Err(error) = prune(
            state.store(),
            audit,
            cutoff(config.audit_retention),
            config.max_audit_records,
        )
        .await
        {
            tracing::warn!(%error, "audit retention failed; retrying next interval");
        }
        if let Err(error) = super::revoke::prune_revocations(&state).await {
            tracing::warn!(%error, "pruning expired revocations failed; retrying next interval");
        }
    }
}

/// The logs retention prunes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Log {
    Events,
    Audit,
}

impl Log {
    fn kind(self) -> cca_model::Kind {
        match self {
            Log::Events => cca_model::Kind::Event,
            Log::Audit => cca_model::Kind::Audit,
        }
    }

    fn from(self, at: Millis) -> String {
        match self {
            Log::Events => cca_model::keys::events_from(at),
            Log::Audit => cca_model::keys::audit_from(at),
        }
    }
}

/// Deletes events before `cutoff` and the oldest beyond `max_events`;
/// returns how many were deleted.
pub(crate) async fn prune_events(
    store: &dyn Store,
    cutoff: Millis,
    max_events: usize,
) -> cca_store::Result<usize> {
    prune(store, Log::Events, cutoff, max_events).await
}

/// Deletes entries of `log` before `cutoff` and the oldest beyond `max`;
/// returns how many were deleted.
pub(crate) async fn prune(
    store: &dyn Store,
    log: Log,
    cutoff: Millis,
    max: usize,
) -> cca_store::Result<usize> {
    let page = store
        .range(RangeRequest::prefix(log.kind().prefix()))
        .await?;
    let excess = page.kvs.len().saturating_sub(max);
    let cutoff_key = log.from(cutoff);
    let doomed: Vec<&str> = page
        .kvs
        .iter()
        .enumerate()
        .filter(|(index, kv)| *index < excess || kv.key < cutoff_key)
        .map(|(_, kv)| kv.key.as_str())
        .collect();
    for batch in doomed.chunks(DELETE_BATCH.min(store.max_txn_ops()).max(1)) {
        let txn = Txn {
            compares: Vec::new(),
            ops: batch.iter().map(|key| Op::delete(*key)).collect(),
        };
        store.txn(txn).await?;
    }
    Ok(doomed.len())
}
