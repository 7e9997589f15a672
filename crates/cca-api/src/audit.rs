//! The audit log: who changed what, and who was refused. Every request
//! with a method that can change something (everything but GET, HEAD and
//! OPTIONS, and `POST /v1/diff`, a read) that succeeded, and every refusal
//! for who asked (401, 403) on any route, becomes an [`AuditRecord`] under
//! `audit/`. A request that failed otherwise (refused input, a conflict,
//! an unknown object) changed nothing and was not about who asked: it is
//! left to the request metrics, and a refused request leaves the store as
//! it was. Agent routes are recorded only when refused: a node's
//! heartbeats and reports (several a second across a cluster) would drown
//! what people did.
//!
//! A change's record is committed before its answer is sent: whoever got
//! the answer can find the record, and one more write per change is
//! cheap next to the change. Refusals cost nothing to send, so a flood of
//! them must not become a flood of writes: they go through a bounded queue
//! to one writer that commits them in batches. If the store falls so far
//! behind that the queue is full, refusals are dropped and counted, and
//! the writer says how many in a warning and in the next batch's first
//! record, so a gap is visible in the log itself. Retention (age and
//! count) is the event log's task's (`routes::events`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use cca_model::cluster::{AuditOutcome, AuditRecord};
use cca_model::keys::EventIds;
use cca_store::{Op, Store, Txn};
use tokio::sync::mpsc;

use crate::state::{ApiState, now_millis};
use crate::tls::Peer;

/// Records waiting for the writer at most.
const QUEUE: usize = 4_096;
/// Records per transaction at most (under etcd's 128 operations).
const BATCH: usize = 100;

/// The sending side of the log, held by the API state.
#[derive(Debug)]
pub(crate) struct AuditLog {
    sender: mpsc::Sender<AuditRecord>,
    dropped: Arc<AtomicU64>,
    ids: EventIds,
}

impl AuditLog {
    /// The log and the writer that must run for it (see [`write_loop`]).
    pub(crate) fn new() -> (Self, AuditWriter) {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let log = Self {
            sender,
            dropped: Arc::clone(&dropped),
            ids: EventIds::new(fastrand::u32(..)),
        };
        (log, AuditWriter { receiver, dropped })
    }

    /// Queues a refusal for the writer.
    fn queue(&self, record: AuditRecord) {
        if self.sender.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Commits a change's record now.
    async fn commit(&self, record: AuditRecord, store: &dyn Store) {
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new().then(Op::put(self.ids.audit_key(record.at), value));
        if let Err(error) = store.txn(txn).await {
            tracing::warn!(%error, path = %record.path, "writing an audit record failed");
        }
    }
}

/// The receiving side: taken once by [`write_loop`].
#[derive(Debug)]
pub(crate) struct AuditWriter {
    receiver: mpsc::Receiver<AuditRecord>,
    dropped: Arc<AtomicU64>,
}

/// Commits records in batches until every sender is gone (the state
/// dropped) or `stop` resolves, then writes what is still queued.
pub(crate) async fn write_loop(
    mut writer: AuditWriter,
    store: Arc<dyn Store>,
    stop: impl std::future::Future<Output = ()>,
) {
    let ids = EventIds::new(fastrand::u32(..));
    let mut batch = Vec::with_capacity(BATCH);
    tokio::pin!(stop);
    loop {
        let received = tokio::select! {
            received = writer.receiver.recv_many(&mut batch, BATCH) => received,
            () = &mut stop => break,
        };
        if received == 0 {
            break;
        }
        commit(&mut batch, &writer.dropped, &ids, store.as_ref()).await;
    }
    writer.receiver.close();
    while writer.receiver.recv_many(&mut batch, BATCH).await > 0 {
        commit(&mut batch, &writer.dropped, &ids, store.as_ref()).await;
    }
}

async fn commit(
    batch: &mut Vec<AuditRecord>,
    dropped: &AtomicU64,
    ids: &EventIds,
    store: &dyn Store,
) {
    let lost = dropped.swap(0, Ordering::Relaxed);
    if lost > 0 {
        tracing::warn!(lost, "audit records dropped: the store fell behind");
        let at = batch.first().map_or_else(now_millis, |first| first.at);
        batch.insert(0, lost_record(at, lost));
    }
    let txn = batch.drain(..).fold(Txn::new(), |txn, record| {
        let value = serde_json::to_vec(&record).unwrap_or_default();
        txn.then(Op::put(ids.audit_key(record.at), value))
    });
    if let Err(error) = store.txn(txn).await {
        tracing::warn!(%error, "writing audit records failed");
    }
}

/// The record that says how many were lost before it.
fn lost_record(at: i64, lost: u64) -> AuditRecord {
    AuditRecord {
        at,
        who: None,
        address: String::new(),
        method: "-".into(),
        path: format!("({lost} audit records dropped: the store fell behind)"),
        status: 0,
        outcome: AuditOutcome::Failed,
        detail: None,
    }
}

/// Whether a request with `method` on `route` that got `status` is audited.
fn audited(method: &Method, route: &str, status: u16) -> bool {
    match AuditOutcome::of_status(status) {
        AuditOutcome::Denied => true,
        AuditOutcome::Failed => false,
        AuditOutcome::Done => {
            let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
            // A renewed certificate, or a gate's, is a credential issued:
            // recorded, though the rest of a node's work is not.
            !reads
                && route != "/v1/diff"
                && (!route.starts_with("/v1/agent/")
                    || route == RENEW_ROUTE
                    || route == GATE_CERTIFICATE_ROUTE)
        }
    }
}

/// The route a node renews its certificate on.
const RENEW_ROUTE: &str = "/v1/agent/nodes/{node}/certificate";
/// The route a gate node gets a gate's certificate on.
const GATE_CERTIFICATE_ROUTE: &str = "/v1/agent/nodes/{node}/gates/{gate}/certificate";

/// What a route tells the audit log beyond its path: set as a response
/// extension, read back by [`record`].
#[derive(Clone, Debug)]
pub(crate) struct AuditDetail(pub(crate) String);

/// Records the request once it is answered (see the module documentation).
pub(crate) async fn record(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(String::new, |route| route.as_str().to_owned());
    let path = request.uri().path().to_owned();
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|ConnectInfo(peer)| peer.clone());
    let reads_for = reads_audited_for(&request);
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let changed_or_refused = audited(&method, &route, status);
    let read_on_record =
        reads_for.is_some() && AuditOutcome::of_status(status) == AuditOutcome::Done;
    if changed_or_refused || read_on_record {
        let record = AuditRecord {
            at: now_millis(),
            // The caller `auth` established (a token's user too), else
            // the certificate's.
            who: response
                .extensions()
                .get::<crate::auth::Caller>()
                .map(|caller| &caller.identity)
                .or_else(|| peer.as_ref().and_then(|peer| peer.identity.as_ref()))
                .map(|identity| format!("{}:{}", identity.kind(), identity.name())),
            address: peer.map_or_else(String::new, |peer| peer.address.to_string()),
            method: method.to_string(),
            path,
            status,
            outcome: AuditOutcome::of_status(status),
            detail: response
                .extensions()
                .get::<AuditDetail>()
                .map(|AuditDetail(detail)| detail.clone())
                .or_else(|| reads_for.map(|client| format!("via {client}"))),
        };
        // A change is on record before its answer; a refusal, or a read a
        // client asked to have audited, goes through the batching writer.
        match record.outcome {
            AuditOutcome::Done if changed_or_refused => {
                state.audit().commit(record, state.store()).await;
            }
            _ => state.audit().queue(record),
        }
    }
    response
}

/// The client a request names in [`cca_wire::client::AUDIT_READS`]
/// (letters, digits and `-`, at most 32): its reads are audited too.
fn reads_audited_for(request: &Request) -> Option<String> {
    let client = request
        .headers()
        .get(cca_wire::client::AUDIT_READS)?
        .to_str()
        .ok()?;
    let plain = !client.is_empty()
        && client.len() <= 32
        && client
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-');
    plain.then(|| client.to_owned())
}

/// How long a stopping server waits for the writer to empty its queue.
pub(crate) const FLUSH_DEADLINE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(value: &str) -> Request {
        Request::builder()
            .header(cca_wire::client::AUDIT_READS, value)
            .body(axum::body::Body::empty())
            .unwrap_or_default()
    }

    #[test]
    fn a_client_named_plainly_has_its_reads_audited() {
        assert_eq!(reads_audited_for(&asking("mcp")), Some("mcp".to_owned()));
        assert_eq!(
            reads_audited_for(&asking("my-console-2")),
            Some("my-console-2".into())
        );
        for odd in ["", "a b", "mcp;drop", &"x".repeat(33)] {
            assert_eq!(reads_audited_for(&asking(odd)), None, "{odd:?}");
        }
        let plain = Request::builder()
            .body(axum::body::Body::empty())
            .unwrap_or_default();
        assert_eq!(reads_audited_for(&plain), None);
    }

    #[test]
    fn changes_and_refusals_are_audited_reads_and_agent_work_are_not() {
        assert!(audited(&Method::POST, "/v1/apply", 200));
        assert!(
            !audited(&Method::DELETE, "/v1/services/{name}", 404),
            "changed nothing"
        );
        assert!(audited(&Method::GET, "/v1/services", 401));
        assert!(audited(
            &Method::PUT,
            "/v1/agent/nodes/{node}/instances/{id}",
            403
        ));
        assert!(!audited(&Method::GET, "/v1/services", 200));
        assert!(!audited(&Method::POST, "/v1/diff", 200));
        assert!(audited(
            &Method::POST,
            "/v1/agent/nodes/{node}/gates/{gate}/certificate",
            200
        ));
        assert!(!audited(
            &Method::GET,
            "/v1/agent/nodes/{node}/gates/{gate}/tls",
            200
        ));
        assert!(!audited(
            &Method::POST,
            "/v1/agent/nodes/{node}/heartbeat",
            200
        ));
    }
}
