//! Node enrolment: join tokens (`/v1/tokens`: made, listed and revoked by
//! users), the join itself (`POST /v1/join`: a token and a CSR in, a node
//! certificate out; the one route a caller without a certificate may
//! change something on) and renewal (`POST
//! /v1/agent/nodes/{node}/certificate`, over the node's own mTLS).
//!
//! A refused join is answered "invalid join token" whatever the reason,
//! so a guesser learns nothing about which tokens exist; the reason goes
//! to the audit log. A token's last use is spent with a compare-and-swap
//! on the revision read, so two nodes racing for it cannot both enrol.

use std::time::Duration;

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cca_model::access::JoinTokenRecord;
use cca_model::clock::system_now as now;
use cca_model::keys;
use cca_store::{Compare, CompareOp, Op, RangeRequest, Txn};
use cca_trust::identity::{Identity, check_name};
use cca_trust::join::{DEFAULT_TTL, JoinToken, TokenRules};
use cca_trust::pki::{self, ClusterCa, NODE_CERT_VALIDITY, Names};
use cca_wire::types::{
    CreateTokenRequest, CreatedToken, JoinRequest, NodeCertificate, RenewRequest, TokenInfo,
};

use crate::audit::AuditDetail;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::state::{ApiState, encode};
use crate::tls::Peer;
use crate::update::read_modify_write;

/// The longest a join token may live: long-lived tokens are how clusters
/// get joined by strangers.
const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a join retries its token's compare-and-swap against other
/// nodes joining with the same token.
const JOIN_PATIENCE: Duration = Duration::from_secs(5);

type Caller = Option<axum::Extension<ConnectInfo<Peer>>>;

fn caller_name(caller: Caller) -> String {
    caller
        .and_then(|axum::Extension(ConnectInfo(peer))| peer.identity)
        .map_or_else(
            || "anonymous".to_owned(),
            |identity| format!("{}:{}", identity.kind(), identity.name()),
        )
}

/// `POST /v1/tokens`.
pub(crate) async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    JsonBody(request): JsonBody<CreateTokenRequest>,
) -> ApiResult<Json<CreatedToken>> {
    let ca = state.authority()?;
    let ttl = match request.ttl_secs {
        None => DEFAULT_TTL,
        Some(0) => return Err(ApiError::invalid("a join token's ttl must be more than 0s")),
        Some(secs) if Duration::from_secs(secs) > MAX_TTL => {
            return Err(ApiError::invalid(format!(
                "a join token's ttl is at most {}h; this one asks {}h",
                MAX_TTL.as_secs() / 3600,
                secs / 3600
            )));
        }
        Some(secs) => Duration::from_secs(secs),
    };
    if let Some(node) = &request.node {
        check_name(node).map_err(|error| ApiError::invalid(format!("--node: {error}")))?;
    }
    if request.uses == Some(0) {
        return Err(ApiError::invalid(
            "a join token's uses must be at least 1 (leave it out for any number)",
        ));
    }
    let token = JoinToken::generate(&ca.fingerprint())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let mut record = token.to_stored(now(), ttl);
    record.node = request.node;
    record.uses_left = request.uses;
    record.description = request.description;
    record.created_by = caller_name(caller);
    let key = keys::join_token(token.id());
    let txn = Txn::new()
        .when(Compare::absent(&key))
        .then(Op::put(&key, encode(&record)));
    if !state.store().txn(txn).await?.is_committed() {
        return Err(ApiError::conflict(
            "a join token with the same random id exists already: ask again",
        ));
    }
    Ok(Json(CreatedToken {
        token: token.to_string(),
        info: info(&record),
    }))
}

/// `GET /v1/tokens`: every token, newest first; never a secret or hash.
pub(crate) async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<TokenInfo>>> {
    let range = state
        .store()
        .range(RangeRequest::prefix(cca_model::Kind::JoinToken.prefix()))
        .await?;
    let mut tokens: Vec<TokenInfo> = range
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<JoinTokenRecord>(&kv.value).ok())
        .map(|record| info(&record))
        .collect();
    tokens.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    Ok(Json(tokens))
}

/// `DELETE /v1/tokens/{id}`: the token admits no one from now on. The
/// record stays (revoked) so `cca token ls` and the audit log can name it.
pub(crate) async fn revoke(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<TokenInfo>> {
    let key = keys::join_token(&id);
    let (record, _) = read_modify_write(&state, &format!("join token `{id}`"), || async {
        let Some(kv) = state.store().get(&key).await? else {
            return Err(ApiError::not_found(format!(
                "join token `{id}` not found (see `cca token ls`)"
            )));
        };
        let mut record = decode(&id, &kv.value)?;
        record.revoked = true;
        let txn = Txn::new()
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                kv.mod_revision,
            ))
            .then(Op::put(&key, encode(&record)));
        Ok((txn, record))
    })
    .await?;
    Ok(Json(info(&record)))
}

/// `POST /v1/join`: see the module documentation.
pub(crate) async fn join(
    State(state): State<ApiState>,
    JsonBody(request): JsonBody<JoinRequest>,
) -> Response {
    match enrol(&state, &request).await {
        Ok(certificate) => {
            let mut response = Json(certificate).into_response();
            response.extensions_mut().insert(AuditDetail(format!(
                "node `{}` joined with token `{}`",
                request.node, request.token_id
            )));
            response
        }
        Err(Enrolment::Refused(reason)) => {
            tracing::warn!(node = %request.node, %reason, "join refused");
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid join token: ask the cluster's administrator for a new one \
                 (`cca token create`)",
            )
            .into_response();
            response
                .extensions_mut()
                .insert(AuditDetail(format!("node `{}`: {reason}", request.node)));
            response
        }
        Err(Enrolment::Failed(error)) => error.into_response(),
    }
}

enum Enrolment {
    /// The token did not admit the node: the reason is for the log only.
    Refused(String),
    Failed(ApiError),
}

impl From<ApiError> for Enrolment {
    fn from(error: ApiError) -> Self {
        Enrolment::Failed(error)
    }
}

async fn enrol(state: &ApiState, request: &JoinRequest) -> Result<NodeCertificate, Enrolment> {
    check_name(&request.node)
        .map_err(|error| ApiError::invalid(format!("the node's name: {error}")))?;
    let ca = state.authority()?;
    let mut signed: Option<String> = None;
    // Nodes joining at once with one token race for it: each spends a
    // use with a compare-and-swap and, losing, reads it again.
    let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
    let certificate = loop {
        let (record, revision) = read_token(state, &request.token_id).await?;
        record
            .admit(&request.secret, &request.node, now())
            .map_err(|refusal| Enrolment::Refused(refusal.to_string()))?;
        // Signed once the token admits the node and before a use is
        // spent, so a bad CSR costs no use; issued only if the spend
        // commits.
        let certificate = match signed.take() {
            Some(certificate) => certificate,
            None => sign_node(&ca, &request.node, &request.csr_pem)?,
        };
        let key = keys::join_token(&request.token_id);
        let txn = Txn::new()
            .when(Compare::mod_revision(&key, CompareOp::Equal, revision))
            .then(Op::put(&key, encode(&record.spend())));
        if state
            .store()
            .txn(txn)
            .await
            .map_err(ApiError::from)?
            .is_committed()
        {
            break certificate;
        }
        signed = Some(certificate);
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::conflict(
                "the join token kept changing while this node enrolled: try again",
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(5..50))).await;
    };
    Ok(NodeCertificate {
        certificate_pem: certificate,
        ca_pem: ca.cert_pem().to_owned(),
    })
}

/// The token's record and its revision; refused (for the log) when
/// there is none.
async fn read_token(state: &ApiState, id: &str) -> Result<(JoinTokenRecord, i64), Enrolment> {
    if !is_token_id(id) {
        return Err(Enrolment::Refused(
            "the token id is not one this server makes".into(),
        ));
    }
    let Some(kv) = state
        .store()
        .get(&keys::join_token(id))
        .await
        .map_err(ApiError::from)?
    else {
        return Err(Enrolment::Refused(format!("no join token `{id}`")));
    };
    Ok((decode(id, &kv.value)?, kv.mod_revision))
}

/// `POST /v1/agent/nodes/{node}/certificate`: a node (authenticated as
/// itself by `auth`) asks for a new certificate for a new key.
pub(crate) async fn renew(
    State(state): State<ApiState>,
    Path(node): Path<String>,
    JsonBody(request): JsonBody<RenewRequest>,
) -> ApiResult<Json<NodeCertificate>> {
    let ca = state.authority()?;
    let certificate = sign_node(&ca, &node, &request.csr_pem)?;
    Ok(Json(NodeCertificate {
        certificate_pem: certificate,
        ca_pem: ca.cert_pem().to_owned(),
    }))
}

/// Signs `csr_pem` for node `node`: its identity, its name as a DNS name
/// and the IP addresses it asks for. Clients check the identity a
/// certificate carries, so an address in a node's certificate never lets
/// it pass for the server or another node.
fn sign_node(ca: &ClusterCa, node: &str, csr_pem: &str) -> ApiResult<String> {
    let refused =
        |error: pki::Error| ApiError::invalid(format!("the certificate request: {error}"));
    let asked = pki::csr_names(csr_pem).map_err(refused)?;
    let allowed = Names {
        dns: vec![node.to_owned()],
        ips: asked.ips,
    };
    ca.sign_csr(
        csr_pem,
        &Identity::Node(node.to_owned()),
        &allowed,
        NODE_CERT_VALIDITY,
        now(),
    )
    .map_err(refused)
}

fn decode(id: &str, bytes: &[u8]) -> ApiResult<JoinTokenRecord> {
    serde_json::from_slice(bytes).map_err(|error| {
        ApiError::internal(format!(
            "join token `{id}` is unreadable in the store: {error}"
        ))
    })
}

/// Whether `id` could be a token's id: anything else is refused before
/// it becomes part of a store key.
fn is_token_id(id: &str) -> bool {
    id.len() == cca_trust::join::ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn info(record: &JoinTokenRecord) -> TokenInfo {
    let at = now();
    let state = if record.revoked {
        "revoked"
    } else if record.uses_left == Some(0) {
        "used up"
    } else if record.is_live(at) {
        "live"
    } else {
        "expired"
    };
    TokenInfo {
        id: record.id.clone(),
        created_at: record.created_at,
        expires_at: record.expires_at,
        node: record.node.clone(),
        uses_left: record.uses_left,
        revoked: record.revoked,
        description: record.description.clone(),
        created_by: record.created_by.clone(),
        state: state.to_owned(),
    }
}
