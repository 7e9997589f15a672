//! A service's rollout: where it stands, and an operator's word on it.
//!
//! - `GET /v1/services/{name}/rollout` reads it from a fresh view: the
//!   lifecycle controller's decision, progress counted from the instances,
//!   what the roll waits for.
//! - `POST .../rollout/pause` and `.../resume` hold and release it
//!   (`desired/rollout/{name}`); the scheduler and the lifecycle controller
//!   follow that fact.
//! - `POST .../rollout/undo` asks for an older kept version: the undo
//!   records the spec's version it was asked under, and holds until an
//!   apply changes that version.
//!
//! The writes compare-and-swap on the control fact and on the service's
//! spec (an undo is about the version read), with an event each.

use axum::Json;
use axum::extract::{Path, State};
use cca_model::cluster::EventLevel;
use cca_model::keys;
use cca_model::rollout::{RolloutControl, UndoRequest};
use cca_model::spec::{ServiceSpec, spec_hash};
use cca_store::{Compare, CompareOp, KeyValue, Op, RangeRequest, Txn};

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::read;
use crate::routes::reads::fresh_view;
use crate::state::{ApiState, encode, now_millis};
use crate::types::{RolloutControlReport, RolloutStatus, UndoArgs};
use crate::update::read_modify_write_if;
use crate::validate::check_name;

/// `GET /v1/services/{name}/rollout`.
pub(crate) async fn status(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutStatus>> {
    check_name("service", &name)?;
    let view = fresh_view(&state).await?;
    read::rollout(&view, &name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))
}

/// `POST /v1/services/{name}/rollout/pause`.
pub(crate) async fn pause(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutControlReport>> {
    set_paused(&state, &name, true).await
}

/// `POST /v1/services/{name}/rollout/resume`.
pub(crate) async fn resume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutControlReport>> {
    set_paused(&state, &name, false).await
}

async fn set_paused(
    state: &ApiState,
    name: &str,
    paused: bool,
) -> ApiResult<Json<RolloutControlReport>> {
    check_name("service", name)?;
    let message = if paused {
        "rollout paused: no instance is stopped or created to roll on, no automatic rollback"
    } else {
        "rollout resumed"
    };
    let ((control, changed), revision) =
        read_modify_write_if(state, &format!("service `{name}`"), || async {
            let (spec_kv, _) = read_spec(state, name).await?;
            let (held, mut control) = read_control(state, name).await?;
            if control.paused == paused {
                return Ok((None, (control, false)));
            }
            control.paused = paused;
            let txn = guarded(&spec_kv, held.as_ref(), name)
                .then(Op::put(keys::desired_rollout(name), encode(&control)))
                .then(state.event_op(EventLevel::Info, &format!("service/{name}"), message.into()));
            Ok((Some(txn), (control, true)))
        })
        .await?;
    Ok(Json(RolloutControlReport {
        service: name.to_owned(),
        control,
        changed,
        revision: revision.unwrap_or_default(),
    }))
}

/// `POST /v1/services/{name}/rollout/undo`.
pub(crate) async fn undo(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    JsonBody(args): JsonBody<UndoArgs>,
) -> ApiResult<Json<RolloutControlReport>> {
    check_name("service", &name)?;
    let view = fresh_view(&state).await?;
    let ((control, changed), revision) =
        read_modify_write_if(&state, &format!("service `{name}`"), || async {
            let (spec_kv, spec) = read_spec(&state, &name).await?;
            let current = spec_hash(&spec);
            let kept = kept_versions(&state, &name).await?;
            let to = match &args.to {
                Some(asked) => resolve(&name, asked, &kept, &current)?,
                None => previous(&view, &name)?,
            };
            let (held, mut control) = read_control(&state, &name).await?;
            // The latest word wins: an undo that still holds is what the
            // service is (or soon is) rolled to, else what is placed now.
            let holding = control
                .undo
                .as_ref()
                .filter(|undo| undo.holds_for(&current))
                .map(|undo| undo.to.clone());
            let going_to =
                holding.unwrap_or_else(|| view.placed_version_at(&name, current.clone()));
            if going_to == to {
                return Ok((None, (control, false)));
            }
            control.undo = Some(UndoRequest {
                to: to.clone(),
                from: current.clone(),
                at: now_millis(),
            });
            let message = format!(
                "undo requested: rolling back to version {to} (the spec stays at {current} until \
                 an apply changes it)"
            );
            let txn = guarded(&spec_kv, held.as_ref(), &name)
                .then(Op::put(keys::desired_rollout(&name), encode(&control)))
                .then(state.event_op(EventLevel::Info, &format!("service/{name}"), message));
            Ok((Some(txn), (control, true)))
        })
        .await?;
    Ok(Json(RolloutControlReport {
        service: name,
        control,
        changed,
        revision: revision.unwrap_or_default(),
    }))
}

/// The service's spec as stored, or 404.
async fn read_spec(state: &ApiState, name: &str) -> ApiResult<(KeyValue, ServiceSpec)> {
    let key = keys::desired_service(name);
    let kv = state
        .store()
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))?;
    let spec = serde_json::from_slice(&kv.value).map_err(|error| {
        ApiError::internal(format!("stored spec of `{name}` does not decode: {error}"))
    })?;
    Ok((kv, spec))
}

/// The control fact as stored (absent: nothing said yet).
async fn read_control(
    state: &ApiState,
    name: &str,
) -> ApiResult<(Option<KeyValue>, RolloutControl)> {
    let key = keys::desired_rollout(name);
    let Some(kv) = state.store().get(&key).await? else {
        return Ok((None, RolloutControl::default()));
    };
    let control = serde_json::from_slice(&kv.value)
        .map_err(|error| ApiError::internal(format!("stored `{key}` does not decode: {error}")))?;
    Ok((Some(kv), control))
}

/// A transaction that holds only while the spec and the control fact are
/// as read.
fn guarded(spec: &KeyValue, control: Option<&KeyValue>, name: &str) -> Txn {
    let control_revision = control.map_or(0, |kv| kv.mod_revision);
    Txn::new()
        .when(Compare::mod_revision(
            &spec.key,
            CompareOp::Equal,
            spec.mod_revision,
        ))
        .when(Compare::mod_revision(
            keys::desired_rollout(name),
            CompareOp::Equal,
            control_revision,
        ))
}

/// The hashes of the service's kept versions.
async fn kept_versions(state: &ApiState, name: &str) -> ApiResult<Vec<String>> {
    let prefix = keys::service_sub_prefix(cca_model::Kind::ServiceVersion, name)
        .ok_or_else(|| ApiError::internal("versions have no per-service prefix"))?;
    let page = state.store().range(RangeRequest::prefix(&prefix)).await?;
    Ok(page
        .kvs
        .iter()
        .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_owned))
        .collect())
}

/// The kept version `asked` names: a whole hash or a unique prefix.
fn resolve(name: &str, asked: &str, kept: &[String], current: &str) -> ApiResult<String> {
    let matches: Vec<&String> = kept
        .iter()
        .filter(|hash| hash.starts_with(asked) && !asked.is_empty())
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] if asked == current => Ok(current.to_owned()),
        [] => Err(ApiError::invalid(format!(
            "service `{name}` keeps no version `{asked}`; kept: {} (`cca rollout history {name}`)",
            kept.join(", ")
        ))),
        many => Err(ApiError::invalid(format!(
            "`{asked}` names {} versions of `{name}` ({}); give more of the hash",
            many.len(),
            many.iter()
                .map(|hash| hash.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The rollout's previous version, or 409 when there is none.
fn previous(view: &cca_control::View, name: &str) -> ApiResult<String> {
    view.rollouts
        .get(name)
        .and_then(|rollout| rollout.previous.clone())
        .filter(|previous| view.keeps_version(name, previous))
        .ok_or_else(|| {
            ApiError::conflict(format!(
                "service `{name}` has no previous version to roll back to; name one with \
                 `--to` (`cca rollout history {name}` lists them)"
            ))
        })
}
