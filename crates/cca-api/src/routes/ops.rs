//! Write endpoints of users: apply, diff, scale, delete, and the operator
//! intents drain / disable / enable of a node. Each write is one store
//! transaction with compare-and-swap on what it read, and logs an event in
//! that same transaction; the updates go through the one
//! [`read_modify_write`] loop, which re-reads and re-applies on a conflict.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use cca_model::access::Action;
use cca_model::cluster::{EventLevel, NodeControl, ReplacementResume};
use cca_model::spec::{Program, ServiceSpec};
use cca_model::{Kind, keys};
use cca_store::{Compare, CompareOp, Op, RangeRequest, Txn};
use serde::Deserialize;

use crate::apply::apply_program;
use crate::error::{ApiError, ApiResult, JsonBody, QueryArgs};
use crate::routes::reads::fresh_view;
use crate::staged::{self, Generation, guard_desired};
use crate::state::{ApiState, encode, now_millis};
use crate::types::{
    ApplyReport, DeleteReport, NodeControlReport, ReplacementResumed, ScaleReport, ScaleRequest,
};
use crate::update::read_modify_write;
use crate::validate::{MAX_REPLICAS, check_name};

/// Query of apply and diff.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApplyQuery {
    /// Also delete program-managed facts the program does not have.
    #[serde(default)]
    prune: bool,
    /// The tenant a cluster-wide user applies for (`cca apply --tenant`).
    #[serde(default)]
    tenant: Option<String>,
}

pub(crate) async fn apply(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<ApplyQuery>,
    JsonBody(program): JsonBody<Program>,
) -> ApiResult<Json<ApplyReport>> {
    let program = for_tenant(&state, caller, Action::Write, query.tenant.clone(), program)?;
    apply_program(&state, &program, query.prune, false)
        .await
        .map(Json)
}

pub(crate) async fn diff(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<ApplyQuery>,
    JsonBody(program): JsonBody<Program>,
) -> ApiResult<Json<ApplyReport>> {
    let program = for_tenant(&state, caller, Action::Read, query.tenant.clone(), program)?;
    apply_program(&state, &program, query.prune, true)
        .await
        .map(Json)
}

/// The program stamped with the tenant it is applied for (`tenancy`),
/// once the caller may do `action` on every kind of object it holds in
/// that tenant (`authz::check_program`; the route checked services).
pub(crate) fn for_tenant(
    state: &ApiState,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    action: Action,
    asked: Option<String>,
    mut program: Program,
) -> ApiResult<Program> {
    let caller = caller.map(|axum::Extension(caller)| caller);
    let own = crate::tenancy::of_caller(state, caller.as_ref());
    let tenant = crate::tenancy::of_program(own, asked)?;
    crate::tenancy::stamp(&mut program, tenant)?;
    crate::authz::check_program(state, caller.as_ref(), &program, action)?;
    Ok(program)
}

/// Sets a service's replicas in its spec, guarded by the spec's revision.
/// The next `apply` of the service's file sets them back to the file's.
/// Refused (409) for a service with horizontal `autoscale`: the
/// autoscaler owns its count.
pub(crate) async fn scale(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<ScaleRequest>,
) -> ApiResult<Json<ScaleReport>> {
    check_name("service", &name)?;
    if request.replicas > MAX_REPLICAS {
        return Err(ApiError::invalid(format!(
            "{} replicas is more than the limit of {MAX_REPLICAS}",
            request.replicas
        )));
    }
    let key = keys::desired_service(&name);
    let replicas = request.replicas;
    let (previous, revision) = read_modify_write(&state, &format!("service `{name}`"), || async {
        let generation = program_write(&state).await?;
        let kv = state
            .store()
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))?;
        let mut spec: ServiceSpec = serde_json::from_slice(&kv.value).map_err(|error| {
            ApiError::internal(format!("stored spec of `{name}` does not decode: {error}"))
        })?;
        if let Some(h) = spec.autoscale.as_ref().and_then(|a| a.horizontal.as_ref()) {
            return Err(ApiError::conflict(format!(
                "service `{name}` is autoscaled (min {}, max {}): the autoscaler sets its \
                 replicas, so `scale` would fight it; change or remove `autoscale` in its file \
                 (`cca scale why {name}` shows what sets the count now)",
                h.min, h.max
            )));
        }
        let previous = spec.replicas;
        spec.replicas = replicas;
        let message = format!("scaled from {previous} to {replicas} replicas");
        let txn = guard_desired(Txn::new(), &generation)
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                kv.mod_revision,
            ))
            .then(Op::put(&key, encode(&spec)))
            .then(state.event_op(EventLevel::Info, &format!("service/{name}"), message));
        Ok((txn, previous))
    })
    .await?;
    Ok(Json(ScaleReport {
        service: name,
        previous,
        replicas,
        revision,
    }))
}

/// Deletes a service's spec, its sub-facts (tags, grants) and bookkeeping.
/// Its versions stay: instances being stopped still run one, and an agent
/// restarting them must get its spec; the next apply deletes those no
/// instance uses any more.
pub(crate) async fn delete_service(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<DeleteReport>> {
    check_name("service", &name)?;
    let key = keys::desired_service(&name);
    let sub_prefixes: Vec<String> = [Kind::ServiceTag, Kind::ServiceGrant]
        .into_iter()
        .filter_map(|kind| keys::service_sub_prefix(kind, &name))
        .collect();
    let (deleted, revision) = read_modify_write(&state, &format!("service `{name}`"), || async {
        let generation = program_write(&state).await?;
        let spec = state
            .store()
            .get(&key)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))?;
        let mut deleted = vec![key.clone()];
        let mut txn = guard_desired(Txn::new(), &generation)
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                spec.mod_revision,
            ))
            .then(Op::delete(&key));
        for prefix in &sub_prefixes {
            let subs = state.store().range(RangeRequest::prefix(prefix)).await?;
            deleted.extend(subs.kvs.iter().map(|kv| kv.key.clone()));
            txn = txn.then(Op::delete_prefix(prefix));
        }
        let txn = txn
            .then(Op::delete(keys::desired_service_meta(&name)))
            .then(Op::delete(keys::desired_rollout(&name)))
            .then(state.event_op(
                EventLevel::Info,
                &format!("service/{name}"),
                "deleted".into(),
            ));
        Ok((txn, deleted))
    })
    .await?;
    Ok(Json(DeleteReport {
        service: name,
        deleted,
        revision,
    }))
}

/// What a write of program-managed facts does before reading them: finish
/// a staged apply another server left half copied (its guard would fail
/// until then), and read the generation its transaction is guarded by.
async fn program_write(state: &ApiState) -> ApiResult<Generation> {
    staged::settle(state.store()).await?;
    Generation::read(state.store()).await
}

pub(crate) async fn drain(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeControlReport>> {
    change_node(&state, &name, "drain requested", |control| {
        control.drain = true;
    })
    .await
}

pub(crate) async fn disable(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeControlReport>> {
    change_node(&state, &name, "disabled: no new placements", |control| {
        control.disabled = true;
    })
    .await
}

/// Clears both drain and disable, like `kubectl uncordon`.
pub(crate) async fn enable(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeControlReport>> {
    change_node(&state, &name, "enabled", |control| {
        *control = NodeControl::default();
    })
    .await
}

/// Ends a pause of lost-node replacement: an operator says the nodes that
/// went missing are really gone. 409 when nothing is paused. The word is
/// dated no earlier than the pause, so a server whose clock lags the
/// leader's still ends it.
pub(crate) async fn resume_replacement(
    State(state): State<ApiState>,
) -> ApiResult<Json<ReplacementResumed>> {
    let view = fresh_view(&state).await?;
    let Some(pause) = view
        .disruption
        .as_ref()
        .filter(|held| held.value.paused)
        .map(|held| Arc::clone(&held.value))
    else {
        return Err(ApiError::conflict(
            "lost-node replacement is not paused; there is nothing to resume",
        ));
    };
    let resume = ReplacementResume {
        at: now_millis().max(pause.since),
    };
    let message = format!(
        "an operator resumed lost-node replacement: the {} nodes missing since the pause are \
         treated as gone",
        pause.missing
    );
    let txn = Txn::new()
        .then(Op::put(keys::desired_replacement_resume(), encode(&resume)))
        .then(state.event_op(EventLevel::Warning, "cluster", message));
    let revision = state.store().txn(txn).await?.revision();
    Ok(Json(ReplacementResumed {
        since: pause.since,
        missing: pause.missing,
        nodes: pause.nodes,
        revision,
    }))
}

/// Read-modify-write of `desired/node/{name}` for a registered node.
async fn change_node(
    state: &ApiState,
    name: &str,
    message: &str,
    change: impl Fn(&mut NodeControl),
) -> ApiResult<Json<NodeControlReport>> {
    check_name("node", name)?;
    if state
        .store()
        .get(&keys::observed_node(name))
        .await?
        .is_none()
    {
        return Err(ApiError::not_found(format!("node `{name}` not found")));
    }
    let key = keys::desired_node(name);
    let (control, revision) = read_modify_write(state, &format!("node `{name}`"), || async {
        let current = state.store().get(&key).await?;
        let mut control: NodeControl = match &current {
            Some(kv) => serde_json::from_slice(&kv.value).unwrap_or_default(),
            None => NodeControl::default(),
        };
        change(&mut control);
        let read_revision = current.as_ref().map_or(0, |kv| kv.mod_revision);
        let txn = Txn::new()
            .when(Compare::mod_revision(&key, CompareOp::Equal, read_revision))
            .then(Op::put(&key, encode(&control)))
            .then(state.event_op(EventLevel::Info, &format!("node/{name}"), message.into()));
        Ok((txn, control))
    })
    .await?;
    Ok(Json(NodeControlReport {
        node: name.to_owned(),
        control,
        revision,
    }))
}
