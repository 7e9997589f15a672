//! Secret values and the files built from them: `cca secret set|ls|rm`
//! (`PUT|GET|DELETE /v1/secrets…`, values sealed under the server's
//! primary key-encryption key at `desired/secret/{name}`, never answered
//! or logged), `cca secret rotate-key` (`POST /v1/secret-key/rotate`:
//! every record's data key re-wrapped under the primary, each in its own
//! guarded write so a concurrent `set` is never lost), and the agent's
//! `GET /v1/agent/nodes/{node}/instances/{id}/files`: the connection URLs
//! and granted secrets of an instance placed on the node, which the agent
//! writes before creating it. Sealing and opening run on the blocking
//! pool: a KMS command may take a while.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use cca_model::cluster::EventLevel;
use cca_model::keys;
use cca_model::spec::{ConnectionSpec, SecretSpec};
use cca_store::{Compare, CompareOp, Op, RangeRequest, Txn, TxnOutcome};
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::secrets::{
    MAX_SECRET_BYTES, ProviderError, Rewrap, SealedSecret, SecretError, SecretKey, SecretValue,
    connection_url,
};
use crate::state::{ApiState, encode, now_millis};
use crate::types::{
    DeleteSecretReply, InstanceFile, InstanceFiles, RotateFailure, RotateSecretKeyReply,
    SecretInfo, SetSecretReply, SetSecretRequest,
};
use crate::update::{UPDATE_DEADLINE, read_modify_write};

/// Records a rotation re-wraps at once: enough to fill the store's group
/// commits and a KMS's pipeline, few enough to leave the pool to requests.
const ROTATE_PARALLEL: usize = 16;
/// Keys read per page when listing the records to rotate.
const ROTATE_PAGE: usize = 1000;

/// `PUT /v1/secrets/{name}`: seals and stores a value.
pub(crate) async fn set(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<SetSecretRequest>,
) -> ApiResult<Json<SetSecretReply>> {
    let tenant = crate::tenancy::of_caller(&state, caller.as_deref());
    check_secret_name(&name)?;
    if request.value.is_empty() {
        return Err(ApiError::invalid(format!(
            "secret `{name}`: the value is empty"
        )));
    }
    if request.value.len() > MAX_SECRET_BYTES {
        return Err(ApiError::invalid(format!(
            "secret `{name}`: the value is {} bytes, over the limit of {MAX_SECRET_BYTES}",
            request.value.len()
        )));
    }
    let tenant = declared_tenant(&state, &name, tenant).await?;
    let secret_key = state.secret_key()?;
    let value = SecretValue::new(request.value);
    let sealed_name = name.clone();
    let mut sealed = blocking(move || secret_key.seal(&sealed_name, &value, now_millis()))
        .await?
        .map_err(secret_error)?;
    sealed.tenant.clone_from(&tenant);
    let key = keys::desired_secret(&name);
    let (created, revision) = read_modify_write(&state, &format!("secret `{name}`"), || async {
        let existing = state.store().get(&key).await?;
        let held = existing
            .as_ref()
            .and_then(|kv| serde_json::from_slice::<SealedSecret>(&kv.value).ok())
            .map(|sealed| sealed.tenant);
        if let Some(held) = held
            && held != tenant
        {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                format!("secret `{name}` belongs to another tenant (or is cluster-wide)"),
            ));
        }
        let guard = match &existing {
            Some(kv) => Compare::mod_revision(&key, CompareOp::Equal, kv.mod_revision),
            None => Compare::absent(&key),
        };
        let verb = if existing.is_some() {
            "replaced"
        } else {
            "set"
        };
        let txn = Txn::new()
            .when(guard)
            .then(Op::put(&key, encode(&sealed)))
            .then(state.event_op(
                EventLevel::Info,
                &format!("secret/{name}"),
                format!("value {verb}"),
            ));
        Ok((txn, existing.is_none()))
    })
    .await?;
    Ok(Json(SetSecretReply {
        name,
        created,
        revision,
    }))
}

/// The tenant a value of secret `name` set by a caller of `tenant` gets:
/// theirs; for a cluster-wide caller, the tenant that declared the secret
/// (they set it for that tenant). A tenant's user may not set a secret
/// another tenant declared, or one declared cluster-wide: only its
/// declarer's services could receive it.
async fn declared_tenant(
    state: &ApiState,
    name: &str,
    tenant: Option<String>,
) -> ApiResult<Option<String>> {
    let Some(kv) = state
        .store()
        .get(&keys::desired_secret_declaration(name))
        .await?
    else {
        return Ok(tenant);
    };
    let declared = serde_json::from_slice::<SecretSpec>(&kv.value)
        .ok()
        .and_then(|spec| spec.tenant);
    match tenant {
        None => Ok(declared),
        Some(own) if declared.as_deref() == Some(own.as_str()) => Ok(Some(own)),
        Some(_) => Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "secret `{name}` is declared by another tenant (or is cluster-wide): only its \
                 declarer's services could read it; choose another name"
            ),
        )),
    }
}

/// `GET /v1/secrets`: every secret declared, set or granted; never a value.
pub(crate) async fn list(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
) -> ApiResult<Json<Vec<SecretInfo>>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    let lens = crate::authz::Lens::of(
        &state,
        caller.as_deref(),
        cca_model::access::Resource::Secret,
    );
    let mut secrets: BTreeMap<String, SecretInfo> = BTreeMap::new();
    for name in view.secret_declarations.keys() {
        entry(&mut secrets, name).declared = true;
    }
    for (name, sealed) in view.secrets.iter() {
        let info = entry(&mut secrets, name);
        info.set = true;
        info.set_at = Some(sealed.set_at);
    }
    for (service, grants) in view.grants.iter() {
        for secret in grants.keys() {
            entry(&mut secrets, secret).used_by.push(service.clone());
        }
    }
    let mut secrets: Vec<SecretInfo> = secrets.into_values().collect();
    if let Some(lens) = &lens {
        // A secret's tenant is its value's, or its declaration's while it
        // has no value (as `authz` judges a named secret).
        lens.retain(&mut secrets, |info| {
            let tenant = match view.secrets.get(&info.name) {
                Some(sealed) => sealed.value.tenant.clone(),
                None => view
                    .secret_declarations
                    .get(&info.name)
                    .and_then(|declared| declared.value.tenant.clone()),
            };
            (tenant, BTreeMap::new())
        });
    }
    Ok(Json(secrets))
}

fn entry<'a>(secrets: &'a mut BTreeMap<String, SecretInfo>, name: &str) -> &'a mut SecretInfo {
    secrets
        .entry(name.to_owned())
        .or_insert_with(|| SecretInfo {
            name: name.to_owned(),
            declared: false,
            set: false,
            set_at: None,
            used_by: Vec::new(),
        })
}

/// `DELETE /v1/secrets/{name}`: forgets a value (the declaration stays).
pub(crate) async fn delete(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<DeleteSecretReply>> {
    check_secret_name(&name)?;
    let key = keys::desired_secret(&name);
    let ((), revision) = read_modify_write(&state, &format!("secret `{name}`"), || async {
        let kv = state.store().get(&key).await?.ok_or_else(|| {
            ApiError::not_found(format!("secret `{name}` has no value to remove"))
        })?;
        let txn = Txn::new()
            .when(Compare::mod_revision(
                &key,
                CompareOp::Equal,
                kv.mod_revision,
            ))
            .then(Op::delete(&key))
            .then(state.event_op(
                EventLevel::Info,
                &format!("secret/{name}"),
                "value removed".to_owned(),
            ));
        Ok((txn, ()))
    })
    .await?;
    Ok(Json(DeleteSecretReply { name, revision }))
}

/// `GET /v1/agent/nodes/{node}/instances/{id}/files`: one file per
/// connection the instance's service references (`connections/{name}`,
/// the URL) and per secret granted explicitly (`secrets/{name}`, the value).
pub(crate) async fn instance_files(
    State(state): State<ApiState>,
    Path((node, id)): Path<(String, String)>,
) -> ApiResult<Json<InstanceFiles>> {
    let view = state.cache().view();
    let instance = view
        .instances
        .get(&id)
        .ok_or_else(|| ApiError::not_found(format!("instance `{id}` is not placed")))?;
    if instance.value.node != node {
        return Err(ApiError::conflict(format!(
            "instance `{id}` is placed on node `{}`, not `{node}`: its files go to that node only",
            instance.value.node
        )));
    }
    let service = &instance.value.service;
    let spec = view.services.get(service).ok_or_else(|| {
        ApiError::conflict(format!(
            "service `{service}` of instance `{id}` has no spec (being deleted?)"
        ))
    })?;
    let mut values = Values {
        state: &state,
        key: None,
        service,
        tenant: spec.value.tenant.clone(),
    };
    let mut files = Vec::new();
    for name in &spec.value.connections {
        // From the view, like the spec: a program being applied is seen
        // whole there (the store may hold half of a staged apply).
        let connection = view.connections.get(name).ok_or_else(|| {
            let problem = match view.invalid.get(&keys::desired_connection(name)) {
                Some(reason) => format!("does not decode: {reason}"),
                None => "is not defined: apply the program that declares it".to_owned(),
            };
            ApiError::conflict(format!(
                "connection `{name}` used by service `{service}` {problem}"
            ))
        })?;
        let connection: &ConnectionSpec = &connection.value;
        // The program's references keep a connection in its services'
        // tenant; a fact written otherwise is not handed over.
        if connection.tenant != values.tenant {
            return Err(ApiError::conflict(format!(
                "connection `{name}` used by service `{service}` belongs to another tenant: \
                 define the connection in the service's own program"
            )));
        }
        let password = match &connection.secret {
            Some(secret) => Some(values.get(secret).await?),
            None => None,
        };
        files.push(InstanceFile {
            path: format!("connections/{name}"),
            content: connection_url(connection, password.as_ref()),
        });
    }
    let explicit = crate::hub::explicit_grants(&view, service);
    for name in &explicit {
        let value = values.get(name).await?;
        files.push(InstanceFile {
            path: format!("secrets/{name}"),
            content: value.expose().to_owned(),
        });
    }
    Ok(Json(InstanceFiles {
        instance: id,
        files,
    }))
}

/// Reads and opens secret values for one request, taking the key once.
struct Values<'a> {
    state: &'a ApiState,
    key: Option<Arc<SecretKey>>,
    service: &'a str,
    /// The service's tenant: only its secrets are opened.
    tenant: Option<String>,
}

impl Values<'_> {
    async fn get(&mut self, name: &str) -> ApiResult<SecretValue> {
        let kv = self
            .state
            .store()
            .get(&keys::desired_secret(name))
            .await?
            .ok_or_else(|| {
                ApiError::conflict(format!(
                    "secret `{name}` (used by service `{}`) has no value: set it with `cca secret set {name}`",
                    self.service
                ))
            })?;
        let sealed: SealedSecret = serde_json::from_slice(&kv.value).map_err(|error| {
            ApiError::internal(format!(
                "stored secret `{name}` does not decode: {error}; set it again with `cca secret set {name}`"
            ))
        })?;
        if sealed.tenant != self.tenant {
            return Err(ApiError::conflict(format!(
                "secret `{name}` (used by service `{}`) belongs to another tenant: a service \
                 receives only its own tenant's secrets",
                self.service
            )));
        }
        let key = match &self.key {
            Some(key) => Arc::clone(key),
            None => {
                let key = self.state.secret_key()?;
                self.key = Some(Arc::clone(&key));
                key
            }
        };
        let name = name.to_owned();
        blocking(move || key.open(&name, &sealed))
            .await?
            .map_err(secret_error)
    }
}

/// `POST /v1/secret-key/rotate`: re-wraps every record's data key under
/// the primary KEK. Records are listed from the store (the view may lag)
/// and each is rewritten in its own read-modify-write guarded by its mod
/// revision: a `set` or `rm` in between wins and the record is read again.
/// One record failing (a KEK no longer accepted, a damaged record) does
/// not stop the others; the answer names it.
pub(crate) async fn rotate_key(
    State(state): State<ApiState>,
) -> ApiResult<Json<RotateSecretKeyReply>> {
    let secret_key = state.secret_key()?;
    let prefix = keys::desired_secret("");
    let mut names = Vec::new();
    let mut after = None;
    loop {
        let page = state
            .store()
            .range(RangeRequest {
                prefix: prefix.clone(),
                after: after.take(),
                limit: ROTATE_PAGE,
            })
            .await?;
        names.extend(
            page.kvs
                .iter()
                .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_owned)),
        );
        match page.continuation {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let outcomes: Vec<(String, Result<Rotated, String>)> = futures_util::stream::iter(names)
        .map(|name| {
            let state = state.clone();
            let key = Arc::clone(&secret_key);
            async move {
                let outcome = rotate_one(&state, key, &name).await;
                (name, outcome)
            }
        })
        .buffer_unordered(ROTATE_PARALLEL)
        .collect()
        .await;
    let mut reply = RotateSecretKeyReply {
        key_id: secret_key.id().to_owned(),
        rewrapped: 0,
        current: 0,
        failed: Vec::new(),
    };
    for (name, outcome) in outcomes {
        match outcome {
            Ok(Rotated::Rewrapped) => reply.rewrapped += 1,
            Ok(Rotated::Current) => reply.current += 1,
            Ok(Rotated::Gone) => {}
            Err(error) => reply.failed.push(RotateFailure { name, error }),
        }
    }
    reply.failed.sort_by(|a, b| a.name.cmp(&b.name));
    let (level, failed) = if reply.failed.is_empty() {
        (EventLevel::Info, String::new())
    } else {
        let names: Vec<&str> = reply.failed.iter().map(|f| f.name.as_str()).collect();
        (
            EventLevel::Warning,
            format!(", {} failed: {}", names.len(), names.join(", ")),
        )
    };
    let message = format!(
        "data keys re-wrapped under {}: {} re-wrapped, {} already current{failed}",
        reply.key_id, reply.rewrapped, reply.current
    );
    tracing::info!(
        key_id = %reply.key_id,
        rewrapped = reply.rewrapped,
        current = reply.current,
        failed = reply.failed.len(),
        "secret key rotation"
    );
    // The answer is what matters; a lost event is only logged.
    if let Err(error) = state
        .store()
        .txn(Txn::new().then(state.event_op(level, "secret-key", message)))
        .await
    {
        tracing::warn!(%error, "recording the secret key rotation's event failed");
    }
    Ok(Json(reply))
}

/// What a rotation did to one record.
enum Rotated {
    Rewrapped,
    Current,
    /// Removed since it was listed.
    Gone,
}

async fn rotate_one(state: &ApiState, key: Arc<SecretKey>, name: &str) -> Result<Rotated, String> {
    let store_key = keys::desired_secret(name);
    let deadline = Instant::now() + UPDATE_DEADLINE;
    let mut pause = Duration::from_millis(2);
    loop {
        let Some(kv) = state
            .store()
            .get(&store_key)
            .await
            .map_err(|error| error.to_string())?
        else {
            return Ok(Rotated::Gone);
        };
        let sealed: SealedSecret = serde_json::from_slice(&kv.value).map_err(|error| {
            format!("the stored record does not decode: {error}; set it again with `cca secret set {name}`")
        })?;
        let rewrap_key = Arc::clone(&key);
        let rewrap_name = name.to_owned();
        let rewrap = blocking(move || rewrap_key.rewrap(&rewrap_name, &sealed))
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string())?;
        let Rewrap::Rewrapped(record) = rewrap else {
            return Ok(Rotated::Current);
        };
        let txn = Txn::new()
            .when(Compare::mod_revision(
                &store_key,
                CompareOp::Equal,
                kv.mod_revision,
            ))
            .then(Op::put(&store_key, encode(&record)));
        match state.store().txn(txn).await {
            Ok(TxnOutcome::Committed { .. }) => return Ok(Rotated::Rewrapped),
            Ok(_) => {}
            Err(error) => return Err(error.to_string()),
        }
        if Instant::now() + pause >= deadline {
            return Err(format!(
                "it kept changing for {}s while re-wrapping it; rotate again",
                UPDATE_DEADLINE.as_secs()
            ));
        }
        let micros = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..=micros))).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Runs sealing or opening on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ApiError::internal("sealing or opening a secret failed unexpectedly"))
}

/// A KMS command that fails is the KMS's unavailability (503); anything
/// else (a key not accepted, a damaged record) is the server's (500).
pub(crate) fn secret_error(error: SecretError) -> ApiError {
    match &error {
        SecretError::Provider { error: cause, .. }
            if !matches!(
                **cause,
                ProviderError::Unwrap { .. } | ProviderError::Wrap { .. }
            ) =>
        {
            ApiError::unavailable(error.to_string())
        }
        _ => ApiError::internal(error.to_string()),
    }
}

/// Secret names as `.cca` files allow them: letters, digits, `_` and `-`.
fn check_secret_name(name: &str) -> ApiResult<()> {
    if name.is_empty()
        || name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ApiError::invalid(format!(
            "secret name `{}` is not valid: use letters, digits, `_` and `-` (at most 253)",
            name.escape_debug()
        )));
    }
    Ok(())
}
