//! Revoked certificates: `POST /v1/revocations` takes back one certificate
//! (by serial) or every certificate of a node or a user issued until now;
//! `GET /v1/revocations` lists them, and `GET
//! /v1/agent/nodes/{node}/revocations` lists the certificates' for agents,
//! which refuse them at their own API. The records are facts
//! (`trust/revoked/{id}`); [`follow_revocations`] turns the cache's copy
//! into what the TLS listeners check at every handshake, and closes open
//! connections of what was revoked. The retention task deletes a record
//! once every certificate it could refuse has expired.

use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use cca_model::access::{RevocationRecord, RevokedTarget};
use cca_model::clock::system_now;
use cca_model::keys;
use cca_store::{Compare, CompareOp, Op, Txn};
use cca_trust::identity::check_name;
use cca_trust::revocation::{Revocations, RevokedEntry, Serial};
use cca_wire::types::{RevocationEntry, RevokeRequest};

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::state::{ApiState, encode, now_millis};
use crate::tls::{Peer, RevocationList};

/// `POST /v1/revocations`.
pub(crate) async fn revoke(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<ConnectInfo<Peer>>>,
    JsonBody(request): JsonBody<RevokeRequest>,
) -> ApiResult<Json<RevocationEntry>> {
    let target = target(&request)?;
    let by = caller
        .and_then(|axum::Extension(ConnectInfo(peer))| peer.identity)
        .map_or_else(String::new, |identity| {
            format!("{}:{}", identity.kind(), identity.name())
        });
    let record = RevocationRecord {
        target,
        at: now_millis(),
        by,
        reason: request.reason,
    };
    let id = record.target.id();
    state
        .store()
        .txn(Txn::new().then(Op::put(keys::revocation(&id), encode(&record))))
        .await?;
    Ok(Json(RevocationEntry { id, record }))
}

/// Exactly one target, checked.
fn target(request: &RevokeRequest) -> ApiResult<RevokedTarget> {
    let named = |kind: &str, name: &str| {
        check_name(name).map_err(|error| ApiError::invalid(format!("the {kind}: {error}")))?;
        Ok(RevokedTarget::Identity {
            kind: kind.to_owned(),
            name: name.to_owned(),
        })
    };
    match (&request.serial, &request.node, &request.user) {
        (Some(serial), None, None) => {
            let serial: Serial = serial
                .parse()
                .map_err(|error| ApiError::invalid(format!("the serial: {error}")))?;
            Ok(RevokedTarget::Serial {
                serial: serial.as_str().to_owned(),
            })
        }
        (None, Some(node), None) => named("node", node),
        (None, None, Some(user)) => named("user", user),
        _ => Err(ApiError::invalid(
            "revoke exactly one of: a certificate's serial, a node, a user",
        )),
    }
}

/// `GET /v1/revocations`.
pub(crate) async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<RevocationEntry>>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    Ok(Json(
        view.revocations
            .iter()
            .map(|(id, held)| RevocationEntry {
                id: id.clone(),
                record: (*held.value).clone(),
            })
            .collect(),
    ))
}

/// `GET /v1/agent/nodes/{node}/revocations`: the certificate revocations,
/// for an agent to refuse them at its own API's handshakes. Only a node
/// may ask, and only as itself (`auth`); it learns which certificates
/// are revoked, never a user token's id. Read from the cache, not the
/// store: every node polls it, and a revocation a moment late is what a
/// period means anyway.
pub(crate) async fn for_node(State(state): State<ApiState>) -> Json<Vec<RevocationEntry>> {
    let view = state.cache().view();
    Json(
        view.revocations
            .iter()
            .filter(|(_, held)| !matches!(held.value.target, RevokedTarget::Token { .. }))
            .map(|(id, held)| RevocationEntry {
                id: id.clone(),
                record: (*held.value).clone(),
            })
            .collect(),
    )
}

/// Keeps `list` equal to the revocations in the cache, from now until the
/// cache stops.
pub(crate) async fn follow_revocations(state: ApiState, list: Arc<RevocationList>) {
    let mut views = state.cache().views();
    let mut shown: Option<Vec<(String, i64)>> = None;
    loop {
        let view = Arc::clone(&views.borrow_and_update());
        let revisions: Vec<(String, i64)> = view
            .revocations
            .iter()
            .map(|(id, held)| (id.clone(), held.mod_revision))
            .collect();
        if shown.as_ref() != Some(&revisions) {
            let entries = view.revocations.iter().filter_map(|(id, held)| {
                let entry = RevokedEntry::from_record(&held.value);
                let token = matches!(held.value.target, RevokedTarget::Token { .. });
                if entry.is_none() && !token {
                    tracing::warn!(%id, "a revocation record names nothing revocable: ignored");
                }
                entry
            });
            list.replace(Revocations::new(entries));
            shown = Some(revisions);
        }
        if views.changed().await.is_err() {
            return;
        }
    }
}

/// Deletes the revocation records whose certificates have all expired
/// (each only if unchanged since read: revoking again moves the cutoff).
pub(crate) async fn prune_revocations(state: &ApiState) -> Result<(), cca_store::StoreError> {
    let view = state.cache().view();
    let now = system_now();
    for (id, held) in view.revocations.iter() {
        let expired = match (&held.value.target, RevokedEntry::from_record(&held.value)) {
            (RevokedTarget::Token { expires_at, .. }, _) => *expires_at < now_millis(),
            (_, Some(entry)) => !Revocations::new([entry]).prunable(now).is_empty(),
            (_, None) => false,
        };
        if !expired {
            continue;
        }
        let key = keys::revocation(id);
        let txn = Txn::new()
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                held.mod_revision,
            ))
            .then(Op::delete(&key));
        state.store().txn(txn).await?;
    }
    Ok(())
}
