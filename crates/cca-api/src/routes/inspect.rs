//! `GET /v1/nodes/{node}/inspect` (`cca node-inspect`): asks the node's
//! agent for its own view (`GET /v1/inspect` on the agent API: its cache,
//! its runtime, the drift between them, its reports) and adds where the
//! agent's cache and the store differ, so an operator sees in one answer
//! whether a node runs what the store asks and, if not, which side is
//! behind.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use cca_control::View;

use crate::error::{ApiError, ApiResult};
use crate::routes::instance_io::bad_gateway;
use crate::routes::reads::fresh_view;
use crate::state::ApiState;
use crate::types::{AgentInspection, Drift, NodeInspection};

/// How long the agent has to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /v1/nodes/{node}/inspect`.
pub(crate) async fn inspect(
    State(state): State<ApiState>,
    Path(node): Path<String>,
) -> ApiResult<Json<NodeInspection>> {
    let view = fresh_view(&state).await?;
    let info = view
        .nodes
        .get(&node)
        .ok_or_else(|| ApiError::not_found(format!("node `{node}` not found")))?;
    let url = info.agent_base_url().ok_or_else(|| {
        bad_gateway(format!(
            "node `{node}` registered without an agent URL, so its agent cannot be \
                 inspected; restart its agent with an address the API server can reach"
        ))
    })?;
    let agent = ask_agent(&state, &node, url).await?;
    Ok(Json(NodeInspection {
        store_revision: view.revision,
        store_drift: store_drift(&view, &node, &agent),
        agent,
    }))
}

async fn ask_agent(state: &ApiState, node: &str, url: &str) -> ApiResult<AgentInspection> {
    let http = super::instance_io::agent_http(state, node, url)?;
    let unreachable = |error: reqwest::Error| {
        bad_gateway(format!(
            "the agent of node `{node}` at {url} did not answer: {error}; is it running \
             (`cca get nodes` shows whether the node is ready)?"
        ))
    };
    let response = http
        .get(format!("{url}/v1/inspect"))
        .timeout(AGENT_TIMEOUT)
        .send()
        .await
        .map_err(unreachable)?;
    let status = response.status();
    let body = response.bytes().await.map_err(unreachable)?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|value| value["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(bad_gateway(format!(
            "the agent of node `{node}` answered {status}: {reason}"
        )));
    }
    serde_json::from_slice(&body).map_err(|error| {
        bad_gateway(format!(
            "the agent of node `{node}` answered something that is not an inspection \
             ({error}); is it an older version?"
        ))
    })
}

/// Where the agent's cache and the store's placements on `node` differ.
fn store_drift(view: &View, node: &str, agent: &AgentInspection) -> Vec<Drift> {
    let placed: BTreeMap<&str, &str> = view
        .instances
        .values()
        .filter(|instance| instance.node == node)
        .map(|instance| (instance.id.as_str(), instance.spec_hash.as_str()))
        .collect();
    let cached: BTreeMap<&str, &str> = agent
        .desired
        .iter()
        .map(|desired| (desired.id.as_str(), desired.spec_hash.as_str()))
        .collect();
    let behind = if agent.cache.revision < view.revision {
        format!(
            " (its cache is at revision {}, the store at {})",
            agent.cache.revision, view.revision
        )
    } else {
        String::new()
    };
    let mut drift = Vec::new();
    for (id, hash) in &placed {
        let problem = match cached.get(id) {
            None => format!("placed here by the store, not in the agent's cache{behind}"),
            Some(cached_hash) if cached_hash != hash => format!(
                "the store places spec {hash}, the agent's cache holds {cached_hash}{behind}"
            ),
            Some(_) => continue,
        };
        drift.push(Drift {
            id: (*id).to_owned(),
            problem,
        });
    }
    for id in cached.keys().filter(|id| !placed.contains_key(*id)) {
        drift.push(Drift {
            id: (*id).to_owned(),
            problem: format!("in the agent's cache, not placed here by the store{behind}"),
        });
    }
    drift
}
