//! Read endpoints: `get` and `describe` for services, instances and nodes,
//! `status` and `/metrics`. All answer from one cache snapshot that
//! reflects at least the store's revision at the time of the request, so a
//! read after a write sees the write.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use cca_model::access::Resource;

use crate::authz::{Lens, filter_by_service};
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use cca_control::View;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult, QueryArgs};
use crate::read::{self, InstanceFilter};
use crate::routes::events::recent_about;
use crate::state::{ApiState, now_millis};
use crate::tls::Peer;
use crate::types::{
    CallerIdentity, ClusterStatus, InstanceDetail, InstanceSummary, InstanceTop, NodeDetail,
    NodeSummary, NodeTop, Principal, ScaleStatus, ServiceDetail, ServiceHistory, ServiceSummary,
};

/// How long a read waits for the cache to catch up with the store before
/// answering from the snapshot it has.
const CATCH_UP: Duration = Duration::from_secs(2);

/// A snapshot at least as new as the store was when the request arrived.
pub(crate) async fn fresh_view(state: &ApiState) -> ApiResult<Arc<View>> {
    let revision = state.store().current_revision().await?;
    match tokio::time::timeout(CATCH_UP, state.cache().view_at_least(revision)).await {
        Ok(view) => Ok(view?),
        Err(_) => Ok(state.cache().view()),
    }
}

/// Query of `GET /v1/services`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServiceQuery {
    /// `k=v[,k=v…]`: services carrying every tag.
    tag: Option<String>,
}

/// Query of `GET /v1/instances`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InstanceQuery {
    service: Option<String>,
    node: Option<String>,
    tag: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    running: bool,
    #[serde(default)]
    pending: bool,
}

fn tags(raw: Option<&str>) -> ApiResult<Vec<(String, String)>> {
    let raw: Vec<String> = raw
        .into_iter()
        .flat_map(|text| text.split(','))
        .filter(|tag| !tag.is_empty())
        .map(str::to_owned)
        .collect();
    read::parse_tags(&raw).map_err(ApiError::bad_request)
}

pub(crate) async fn services(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<ServiceQuery>,
) -> ApiResult<Json<Vec<ServiceSummary>>> {
    let tags = tags(query.tag.as_deref())?;
    let view = fresh_view(&state).await?;
    let mut services = read::services(&view, &tags);
    let lens = Lens::of(&state, caller.as_deref(), Resource::Service);
    filter_by_service(lens.as_ref(), &view, &mut services, |s| {
        Some(s.name.clone())
    });
    Ok(Json(services))
}

/// `GET /v1/top/nodes`: each node's last usage report against its
/// capacity and its instances' requests.
pub(crate) async fn top_nodes(State(state): State<ApiState>) -> ApiResult<Json<Vec<NodeTop>>> {
    let view = fresh_view(&state).await?;
    Ok(Json(read::top_nodes(&view)))
}

/// `GET /v1/top/workloads[?tag=k=v]`: each placed instance's last reported
/// usage against its request, for the services the caller may read.
pub(crate) async fn top_workloads(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<ServiceQuery>,
) -> ApiResult<Json<Vec<InstanceTop>>> {
    let tags = tags(query.tag.as_deref())?;
    let view = fresh_view(&state).await?;
    let mut rows = read::top_instances(&view, &tags);
    let lens = Lens::of(&state, caller.as_deref(), Resource::Service);
    filter_by_service(lens.as_ref(), &view, &mut rows, |row| {
        Some(row.service.clone())
    });
    Ok(Json(rows))
}

pub(crate) async fn service(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<ServiceDetail>> {
    let view = fresh_view(&state).await?;
    let spec = view
        .services
        .get(&name)
        .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))?;
    let filter = InstanceFilter {
        service: Some(name.clone()),
        all: true,
        ..InstanceFilter::default()
    };
    Ok(Json(ServiceDetail {
        summary: read::service_summary(&view, &name, spec),
        spec: (*spec.value).clone(),
        instances: read::instances(&view, &filter),
        unplaced: view.unplaced.get(&name).map(|u| (*u.value).clone()),
        endpoints: view
            .endpoints
            .get(&name)
            .into_iter()
            .flat_map(|ports| ports.values())
            .map(|endpoints| (*endpoints.value).clone())
            .collect(),
        events: recent_about(&state, &format!("service/{name}"), 20).await?,
        usage: read::service_usage(&view, &name),
        rollout: read::rollout(&view, &name),
        vertical: read::vertical(&view, &name),
    }))
}

/// `GET /v1/services/{name}/scale`: the replica count and what sets it.
pub(crate) async fn scale_status(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<ScaleStatus>> {
    let view = fresh_view(&state).await?;
    read::scale(&view, &name, now_millis())
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))
}

/// The kept versions of a service's spec (also after the service is
/// deleted, while versions remain).
pub(crate) async fn service_history(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<ServiceHistory>> {
    let view = fresh_view(&state).await?;
    read::history(&view, &name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("service `{name}` not found")))
}

pub(crate) async fn instances(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    QueryArgs(query): QueryArgs<InstanceQuery>,
) -> ApiResult<Json<Vec<InstanceSummary>>> {
    let filter = InstanceFilter {
        tags: tags(query.tag.as_deref())?,
        service: query.service,
        node: query.node,
        all: query.all,
        running: query.running,
        pending: query.pending,
    };
    let view = fresh_view(&state).await?;
    let mut instances = read::instances(&view, &filter);
    let lens = Lens::of(&state, caller.as_deref(), Resource::Instance);
    filter_by_service(lens.as_ref(), &view, &mut instances, |i| {
        Some(i.service.clone())
    });
    Ok(Json(instances))
}

pub(crate) async fn instance(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<InstanceDetail>> {
    let view = fresh_view(&state).await?;
    let summary = read::instance_summary(&view, &id)
        .ok_or_else(|| ApiError::not_found(format!("instance `{id}` not found")))?;
    Ok(Json(InstanceDetail {
        usage: read::instance_usage(&view, &summary.node, &id),
        placement: view.instances.get(&id).map(|i| (*i.value).clone()),
        status: view.statuses.get(&id).map(|s| (*s.value).clone()),
        summary,
    }))
}

pub(crate) async fn nodes(State(state): State<ApiState>) -> ApiResult<Json<Vec<NodeSummary>>> {
    let view = fresh_view(&state).await?;
    Ok(Json(read::nodes(&view)))
}

pub(crate) async fn node(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<NodeDetail>> {
    let view = fresh_view(&state).await?;
    let (Some(summary), Some(info)) = (read::node_summary(&view, &name), view.nodes.get(&name))
    else {
        return Err(ApiError::not_found(format!("node `{name}` not found")));
    };
    let filter = InstanceFilter {
        node: Some(name.clone()),
        all: true,
        ..InstanceFilter::default()
    };
    Ok(Json(NodeDetail {
        summary,
        info: (*info.value).clone(),
        control: view
            .node_controls
            .get(&name)
            .map(|c| (*c.value).clone())
            .unwrap_or_default(),
        condition: view.node_statuses.get(&name).map(|s| (*s.value).clone()),
        heartbeat: view.heartbeats.get(&name).map(|h| (*h.value).clone()),
        instances: read::instances(&view, &filter),
        drain_held_by: read::drain_held_by(&view, &name),
        unclaimed: view
            .unclaimed
            .get(&name)
            .map(|reported| reported.value.instances.clone())
            .unwrap_or_default(),
        usage: read::node_usage(&view, &name),
    }))
}

pub(crate) async fn status(State(state): State<ApiState>) -> ApiResult<Json<ClusterStatus>> {
    let view = fresh_view(&state).await?;
    Ok(Json(read::status(&view)))
}

/// Prometheus text: the API's request and admission metrics, then the
/// plugged-in ones.
pub(crate) async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    let mut text = state.requests().render();
    state.admission().render(&mut text);
    text.push_str(&state.extra_metrics());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

/// `GET /v1/identity`: who the server takes the caller for, how it
/// proved it, and a user's roles and tenant.
pub(crate) async fn identity(
    State(state): State<ApiState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<Peer>>>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
) -> Json<CallerIdentity> {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(peer))| peer);
    let caller = caller.map(|axum::Extension(caller)| caller);
    let identity = caller
        .as_ref()
        .map(|caller| caller.identity.clone())
        .or_else(|| peer.as_ref().and_then(|peer| peer.identity.clone()));
    let via = caller.as_ref().map(|caller| {
        match caller.via {
            crate::auth::Via::Certificate => "certificate",
            crate::auth::Via::Token { .. } => "token",
            crate::auth::Via::Oidc => "oidc",
        }
        .to_owned()
    });
    let user = match (&identity, &caller) {
        (Some(cca_trust::identity::Identity::User(name)), Some(caller)) => {
            crate::authz::user_record(
                &state.cache().view(),
                name,
                caller.via == crate::auth::Via::Certificate,
            )
        }
        _ => None,
    };
    Json(CallerIdentity {
        identity: identity.map(|identity| Principal {
            kind: identity.kind().to_owned(),
            name: identity.name().to_owned(),
        }),
        address: peer.map_or_else(String::new, |peer| peer.address.to_string()),
        via,
        user,
    })
}
