//! Secret values and the files built from them: `cca secret set|ls|rm`
//! (`PUT|GET|DELETE /v1/secrets…`, values sealed with the cluster's secret
//! key at `desired/secret/{name}`, never answered or logged), and the
//! agent's `GET /v1/agent/nodes/{node}/instances/{id}/files`: the
//! connection URLs and granted secrets of an instance placed on the node,
//! which the agent writes before creating it.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use cca_model::cluster::EventLevel;
use cca_model::keys;
use cca_model::spec::ConnectionSpec;
use cca_store::{Compare, CompareOp, Op, Txn};

use crate::error::{ApiError, ApiResult, JsonBody};
use crate::secrets::{MAX_SECRET_BYTES, SealedSecret, SecretKey, SecretValue, connection_url};
use crate::state::{ApiState, encode, now_millis};
use crate::types::{
    DeleteSecretReply, InstanceFile, InstanceFiles, SecretInfo, SetSecretReply, SetSecretRequest,
};
use crate::update::read_modify_write;

/// `PUT /v1/secrets/{name}`: seals and stores a value.
pub(crate) async fn set(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<SetSecretRequest>,
) -> ApiResult<Json<SetSecretReply>> {
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
    let secret_key = state.secret_key()?;
    let sealed = secret_key
        .seal(&name, &SecretValue::new(request.value), now_millis())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let key = keys::desired_secret(&name);
    let (created, revision) = read_modify_write(&state, &format!("secret `{name}`"), || async {
        let existing = state.store().get(&key).await?;
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

/// `GET /v1/secrets`: every secret declared, set or granted; never a value.
pub(crate) async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<SecretInfo>>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
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
    Ok(Json(secrets.into_values().collect()))
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
    key: Option<std::sync::Arc<SecretKey>>,
    service: &'a str,
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
        let key = match &self.key {
            Some(key) => std::sync::Arc::clone(key),
            None => {
                let key = self.state.secret_key()?;
                self.key = Some(std::sync::Arc::clone(&key));
                key
            }
        };
        key.open(name, &sealed)
            .map_err(|error| ApiError::internal(error.to_string()))
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
