//! Scale to zero's two routes, for gate nodes only (registered with a
//! gate listener; `auth` keeps each to the node its certificate names):
//!
//! - `POST /v1/agent/nodes/{node}/gate-activity` records when the gate
//!   node last forwarded a request to each service
//!   (`observed/gate-activity/{node}`), merged with what was there: the
//!   later time per service wins, services that no longer exist go. A
//!   report that changes nothing costs no write.
//! - `POST /v1/agent/nodes/{node}/services/{service}/wake` marks an asleep
//!   service awake (`derived/scale/{service}`) in one transaction,
//!   compare-and-swap on that fact, with an event naming the gate node.
//!   It writes the fact itself rather than asking the scale controller:
//!   a request is held at the gate meanwhile, and the scheduler, which
//!   follows the fact, reacts at once. Idempotent: 202 either way.
//!
//! Both read the store, not the cache, for the facts they change: a wake
//! must see the sleep a controller committed a moment ago.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use cca_model::cluster::EventLevel;
use cca_model::keys;
use cca_model::scale::{GateActivity, ScaleCause, ScaleState};
use cca_model::spec::ServiceSpec;
use cca_store::{Compare, CompareOp, Op, Txn};
use cca_wire::types::{GateActivityReply, GateActivityReport, WakeReply};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::routes::gates::gate_node;
use crate::state::{ApiState, encode, now_millis};
use crate::update::read_modify_write_if;
use crate::validate::check_name;

/// `POST /v1/agent/nodes/{node}/gate-activity`.
pub(crate) async fn gate_activity(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(report): JsonBody<GateActivityReport>,
) -> ApiResult<Json<GateActivityReply>> {
    let view = state.cache().view();
    gate_node(&view, &node, "report gate activity")?;
    let key = keys::observed_gate_activity(&node);
    let exists = |service: &str| view.services.contains_key(service);
    let known: BTreeMap<String, i64> = report
        .services
        .into_iter()
        .filter(|(service, _)| exists(service))
        .collect();
    let what = format!("gate activity of node `{node}`");
    let ((), revision) = read_modify_write_if(&state, &what, || async {
        let held = state.store().get(&key).await?;
        let mut activity: GateActivity = match &held {
            Some(kv) => decode(&kv.value, &key)?,
            None => GateActivity::default(),
        };
        let before = activity.services.len();
        activity.services.retain(|service, _| exists(service));
        let changed = activity.merge(&known) || activity.services.len() != before;
        if !changed {
            return Ok((None, ()));
        }
        let compare = match &held {
            Some(kv) => Compare::mod_revision(&key, CompareOp::Equal, kv.mod_revision),
            None => Compare::absent(&key),
        };
        let txn = Txn::new()
            .when(compare)
            .then(Op::put(&key, encode(&activity)));
        Ok((Some(txn), ()))
    })
    .await?;
    Ok(Json(GateActivityReply { revision }))
}

/// `POST /v1/agent/nodes/{node}/services/{service}/wake`.
pub(crate) async fn wake(
    State(state): State<ApiState>,
    Path((node, service)): Path<(String, String)>,
) -> ApiResult<(StatusCode, Json<WakeReply>)> {
    let started = std::time::Instant::now();
    check_name("service", &service)?;
    gate_node(&state.cache().view(), &node, "wake services")?;
    let spec_key = keys::desired_service(&service);
    let key = keys::derived_scale(&service);
    let what = format!("service `{service}`");
    let (woke, revision) = read_modify_write_if(&state, &what, || async {
        let spec = state
            .store()
            .get(&spec_key)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("service `{service}` not found")))?;
        let spec: ServiceSpec = decode(&spec.value, &spec_key)?;
        if spec.scale_to_zero.is_none() {
            return Err(ApiError::conflict(format!(
                "service `{service}` does not scale to zero (no `scale_to_zero`): it never \
                 sleeps, so there is nothing to wake"
            )));
        }
        let Some(held) = state.store().get(&key).await? else {
            // No fact yet: the scale controller has not started its
            // first window, so it is awake.
            return Ok((None, false));
        };
        let current: ScaleState = decode(&held.value, &key)?;
        if !current.asleep {
            return Ok((None, false));
        }
        let awake = ScaleState {
            asleep: false,
            since: now_millis(),
            cause: ScaleCause::Woken { node: node.clone() },
        };
        let txn = Txn::new()
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                held.mod_revision,
            ))
            .then(Op::put(&key, encode(&awake)))
            .then(state.event_op(
                EventLevel::Info,
                &format!("service/{service}"),
                format!("woken by a request via gate node {node}"),
            ));
        Ok((Some(txn), true))
    })
    .await?;
    if woke {
        tracing::info!(
            service,
            node,
            revision,
            took_us = started.elapsed().as_micros() as u64,
            "scale to zero: woken"
        );
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(WakeReply {
            service,
            woke,
            revision,
        }),
    ))
}

fn decode<T: DeserializeOwned>(bytes: &[u8], key: &str) -> ApiResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| ApiError::internal(format!("stored `{key}` does not decode: {error}")))
}
