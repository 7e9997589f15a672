//! What a gate node needs to serve a gate's HTTPS: `POST
//! /v1/agent/nodes/{node}/gates/{gate}/certificate` signs the node's CSR
//! for a `tls { self_signed }` gate with the cluster CA (its key never
//! leaves the node), and `GET /v1/agent/nodes/{node}/gates/{gate}/tls`
//! hands over the chain and key a `tls { cert key }` gate's two secrets
//! hold, versioned so a node polling it gets `304 Not Modified` until a
//! secret is set again. `auth` keeps both to the node the certificate
//! names; here the node must be a gate node (registered with a gate
//! listener) and the gate must take its certificate the way asked.
//!
//! `GET /v1/gates/{name}` (`cca describe gate`) is the users' view: the
//! gate, and what each gate node says of its targets' backends (asked of
//! every gate node's agent at once, each within a few seconds; one that
//! does not answer is shown with the reason).
//!
//! The agent routes read the server's cache: a gate node learns its gates from the
//! network map, which comes from the same cache, so a gate it asks about
//! is there. A certificate issued is audited (a credential); a poll of the
//! secrets is not, as an instance's files are not.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cca_control::View;
use cca_model::clock::system_now;
use cca_model::spec::{GateSpec, Tls};
use cca_trust::gate::{GATE_CERT_VALIDITY, GateHosts};
use cca_wire::types::{
    GateCertificate, GateCertificateRequest, GateDetail, GateNodeHealth, GateTls,
};

use crate::audit::AuditDetail;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::routes::secrets::{blocking, secret_error};
use crate::secrets::SealedSecret;
use crate::state::ApiState;

/// `POST /v1/agent/nodes/{node}/gates/{gate}/certificate`.
pub(crate) async fn certificate(
    State(state): State<ApiState>,
    Path((node, gate)): Path<(String, String)>,
    JsonBody(request): JsonBody<GateCertificateRequest>,
) -> ApiResult<Response> {
    // Fresh, not merely cached: a certificate is rare, and another
    // server's cache may be behind the one that fed the node its map.
    let view = crate::routes::reads::fresh_view(&state).await?;
    let spec = gate_of(&view, &node, &gate)?;
    if spec.tls != Some(Tls::SelfSigned) {
        return Err(ApiError::conflict(format!(
            "gate `{gate}` {}: only a `tls {{ self_signed }}` gate gets its certificate from \
             the cluster CA",
            tls_kind(spec)
        )));
    }
    let hosts = GateHosts::new(&spec.hosts).map_err(|error| {
        ApiError::conflict(format!(
            "gate `{gate}`'s hosts cannot be named in a certificate: {error}"
        ))
    })?;
    let ca = state.gate_authority()?;
    let certificate = ca
        .sign_gate_csr(&request.csr_pem, &hosts, GATE_CERT_VALIDITY, system_now())
        .map_err(|error| {
            ApiError::invalid(format!(
                "the certificate request for gate `{gate}`: {error}"
            ))
        })?;
    let mut response = Json(GateCertificate {
        certificate_pem: certificate,
        ca_pem: ca.cert_pem().to_owned(),
    })
    .into_response();
    response.extensions_mut().insert(AuditDetail(format!(
        "certificate for gate `{gate}` ({hosts}) issued to node `{node}`"
    )));
    Ok(response)
}

/// `GET /v1/agent/nodes/{node}/gates/{gate}/tls`.
pub(crate) async fn tls(
    State(state): State<ApiState>,
    Path((node, gate)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let view = state.cache().view();
    let spec = gate_of(&view, &node, &gate)?;
    let Some(Tls::Secrets { cert, key }) = &spec.tls else {
        return Err(ApiError::conflict(format!(
            "gate `{gate}` {}: only a `tls {{ cert key }}` gate's chain and key come from \
             secrets",
            tls_kind(spec)
        )));
    };
    let cert_sealed = sealed(&view, spec, cert, "cert")?;
    let key_sealed = sealed(&view, spec, key, "key")?;
    // The two records' revisions: either set again (or re-wrapped, which
    // costs one needless fetch) makes a new version.
    let version = format!("{}.{}", cert_sealed.mod_revision, key_sealed.mod_revision);
    let etag = HeaderValue::from_str(&format!("\"{version}\""))
        .map_err(|_| ApiError::internal("a gate's TLS version is not a header value"))?;
    if matches(&headers, &version) {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        response.headers_mut().insert(header::ETAG, etag);
        return Ok(response);
    }
    let secret_key = state.secret_key()?;
    let opened = {
        let (cert, key) = (cert.clone(), key.clone());
        let (cert_sealed, key_sealed) = (
            cert_sealed.value.as_ref().clone(),
            key_sealed.value.as_ref().clone(),
        );
        blocking(move || {
            let chain = secret_key.open(&cert, &cert_sealed)?;
            let key = secret_key.open(&key, &key_sealed)?;
            Ok::<_, crate::secrets::SecretError>((chain, key))
        })
        .await?
        .map_err(secret_error)?
    };
    let (chain, key) = opened;
    let mut response = Json(GateTls {
        version,
        chain_pem: chain.expose().to_owned(),
        key_pem: key.expose().to_owned(),
    })
    .into_response();
    response.headers_mut().insert(header::ETAG, etag);
    Ok(response)
}

/// Gate `gate` as node `node` may ask about it: the node must be
/// registered as a gate node, and the gate must exist.
fn gate_of<'v>(view: &'v View, node: &str, gate: &str) -> ApiResult<&'v GateSpec> {
    gate_node(view, node, "get gates' certificates and keys")?;
    view.gates
        .get(gate)
        .map(|spec| spec.value.as_ref())
        .ok_or_else(|| ApiError::not_found(format!("gate `{gate}` is not defined")))
}

/// Checks that `node` is registered as a gate node (with a gate
/// listener): only gate nodes may `what`.
pub(crate) fn gate_node(view: &View, node: &str, what: &str) -> ApiResult<()> {
    let info = view.nodes.get(node).ok_or_else(|| {
        ApiError::not_found(format!(
            "node `{node}` is not registered: its agent registers when it starts"
        ))
    })?;
    if info.value.gate.is_off() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "node `{node}` is not a gate node (it registered no gate listener): only gate \
                 nodes {what}"
            ),
        ));
    }
    Ok(())
}

fn tls_kind(spec: &GateSpec) -> &'static str {
    match spec.tls {
        None => "serves no TLS",
        Some(Tls::SelfSigned) => "is `tls { self_signed }`",
        Some(Tls::Secrets { .. }) => "takes its certificate from secrets",
    }
}

/// Secret `name`, the gate's `field`, with a value of the gate's tenant.
fn sealed<'v>(
    view: &'v View,
    spec: &GateSpec,
    name: &str,
    field: &str,
) -> ApiResult<&'v cca_control::view::Versioned<SealedSecret>> {
    let gate = &spec.name;
    let sealed = view.secrets.get(name).ok_or_else(|| {
        ApiError::conflict(format!(
            "secret `{name}` (the {field} of gate `{gate}`) has no value: set it with \
             `cca secret set {name}`"
        ))
    })?;
    if sealed.value.tenant != spec.tenant {
        return Err(ApiError::conflict(format!(
            "secret `{name}` (the {field} of gate `{gate}`) belongs to another tenant: a gate \
             serves only its own tenant's secrets"
        )));
    }
    Ok(sealed)
}

/// Whether `If-None-Match` names `version` (or is `*`), weak or strong.
fn matches(headers: &HeaderMap, version: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| {
            let tag = tag.trim();
            tag.strip_prefix("W/").unwrap_or(tag).trim_matches('"')
        })
        .any(|tag| tag == version || tag == "*")
}

/// How long `describe gate` waits for a gate node's agent.
const GATE_NODE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `GET /v1/gates/{name}`.
pub(crate) async fn describe(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<GateDetail>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    let spec = view
        .gates
        .get(&name)
        .map(|held| GateSpec::clone(&held.value))
        .ok_or_else(|| ApiError::not_found(format!("gate `{name}` not found")))?;
    let asks = view
        .nodes
        .iter()
        .filter(|(_, info)| !info.gate.is_off())
        .map(|(node, info)| {
            let state = state.clone();
            let gate = name.clone();
            let node = node.clone();
            let listen = info.gate.clone();
            let url = info.agent_base_url().map(str::to_owned);
            async move {
                let (targets, error) =
                    match ask_gate_node(&state, &node, url.as_deref(), &gate).await {
                        Ok(targets) => (targets, None),
                        Err(error) => (Vec::new(), Some(error)),
                    };
                GateNodeHealth {
                    node,
                    listen,
                    targets,
                    error,
                }
            }
        });
    let nodes = futures_util::future::join_all(asks).await;
    Ok(Json(GateDetail { spec, nodes }))
}

/// What gate node `node`'s agent says of `gate`'s targets.
async fn ask_gate_node(
    state: &ApiState,
    node: &str,
    url: Option<&str>,
    gate: &str,
) -> Result<Vec<cca_model::net::GateTargetHealth>, String> {
    let url = url.ok_or("the node registered without an agent URL")?;
    let http = crate::routes::instance_io::agent_http(state, node, url)
        .map_err(|error| error.to_string())?;
    let response = http
        .get(format!("{url}/v1/gates/{gate}"))
        .timeout(GATE_NODE_TIMEOUT)
        .send()
        .await
        .map_err(|error| format!("its agent at {url} did not answer: {error}"))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|error| format!("its agent at {url} broke off: {error}"))?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|value| value["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(format!("its agent answered {status}: {reason}"));
    }
    serde_json::from_slice(&body)
        .map_err(|error| format!("its agent's answer is not a gate report ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_names_the_version_weak_or_strong_or_in_a_list() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::IF_NONE_MATCH,
                HeaderValue::from_str(value).expect("header"),
            );
            headers
        };
        assert!(matches(&with("\"4.7\""), "4.7"));
        assert!(matches(&with("W/\"4.7\""), "4.7"));
        assert!(matches(&with("\"1.2\", \"4.7\""), "4.7"));
        assert!(matches(&with("*"), "4.7"));
        assert!(!matches(&with("\"4.8\""), "4.7"));
        assert!(!matches(&HeaderMap::new(), "4.7"));
    }
}
