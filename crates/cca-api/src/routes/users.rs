//! Users, roles and user tokens: `PUT|GET|DELETE /v1/users[/{name}]`,
//! `PUT|GET|DELETE /v1/roles[/{name}]`, `POST /v1/users/{name}/tokens`
//! (a signed token, shown once) and `POST /v1/logout` (the presented token
//! is revoked). Records are facts (`trust/user/{name}`,
//! `trust/role/{name}`); what they allow is `authz`'s. Removing a user
//! also revokes every certificate issued to them until then; their tokens
//! stop working with their record.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use cca_model::access::{RevocationRecord, RevokedTarget, RoleRecord, UserRecord};
use cca_model::clock::system_now;
use cca_model::keys;
use cca_store::{Op, Txn};
use cca_trust::policy::{builtin_roles, check_role, is_builtin};
use cca_wire::types::{IssuedToken, LoggedOut, RoleInfo, UserRequest, UserTokenRequest};

use crate::auth::{Caller, Via};
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::state::{ApiState, encode, now_millis};

/// A user token's life unless asked otherwise.
const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(8 * 3600);
/// The longest a user token may live.
const MAX_TOKEN_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

type MaybeCaller = Option<axum::Extension<Caller>>;

fn by(caller: &MaybeCaller) -> String {
    caller
        .as_ref()
        .map_or_else(String::new, |axum::Extension(caller)| {
            format!("{}:{}", caller.identity.kind(), caller.identity.name())
        })
}

/// `PUT /v1/users/{name}`: makes the user, or changes their roles and
/// tenant (keeping when and by whom they were made).
pub(crate) async fn put_user(
    State(state): State<ApiState>,
    caller: MaybeCaller,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<UserRequest>,
) -> ApiResult<Json<UserRecord>> {
    let existing = state
        .cache()
        .view()
        .users
        .get(&name)
        .map(|held| (held.value.created_at, held.value.created_by.clone()));
    let (created_at, created_by) = existing.unwrap_or_else(|| (now_millis(), by(&caller)));
    let record = UserRecord {
        name: name.clone(),
        roles: request.roles,
        tenant: request.tenant,
        created_at,
        created_by,
    };
    let policies = state.policies().current();
    policies
        .check_user(&record)
        .map_err(|error| ApiError::invalid(error.to_string()))?;
    state
        .store()
        .txn(Txn::new().then(Op::put(keys::user(&name), encode(&record))))
        .await?;
    Ok(Json(record))
}

/// `GET /v1/users`.
pub(crate) async fn users(State(state): State<ApiState>) -> ApiResult<Json<Vec<UserRecord>>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    Ok(Json(
        view.users
            .values()
            .map(|held| (*held.value).clone())
            .collect(),
    ))
}

/// `GET /v1/users/{name}`.
pub(crate) async fn user(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<UserRecord>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    view.users
        .get(&name)
        .map(|held| Json((*held.value).clone()))
        .ok_or_else(|| ApiError::not_found(format!("user `{name}` not found")))
}

/// `DELETE /v1/users/{name}`: the record goes, and every certificate
/// issued to the user until now is revoked, in one transaction.
pub(crate) async fn delete_user(
    State(state): State<ApiState>,
    caller: MaybeCaller,
    Path(name): Path<String>,
) -> ApiResult<Json<UserRecord>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    let Some(held) = view.users.get(&name) else {
        return Err(ApiError::not_found(format!("user `{name}` not found")));
    };
    let revocation = RevocationRecord {
        target: RevokedTarget::Identity {
            kind: "user".into(),
            name: name.clone(),
        },
        at: now_millis(),
        by: by(&caller),
        reason: "user removed".into(),
    };
    let txn = Txn::new().then(Op::delete(keys::user(&name))).then(Op::put(
        keys::revocation(&revocation.target.id()),
        encode(&revocation),
    ));
    state.store().txn(txn).await?;
    Ok(Json((*held.value).clone()))
}

/// `PUT /v1/roles/{name}`.
pub(crate) async fn put_role(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    JsonBody(role): JsonBody<RoleRecord>,
) -> ApiResult<Json<RoleRecord>> {
    if role.name != name {
        return Err(ApiError::invalid(format!(
            "the role's name `{}` differs from the path's `{name}`",
            role.name
        )));
    }
    check_role(&role).map_err(|error| ApiError::invalid(error.to_string()))?;
    state
        .store()
        .txn(Txn::new().then(Op::put(keys::role(&name), encode(&role))))
        .await?;
    Ok(Json(role))
}

/// `GET /v1/roles`: the built-in roles, then the custom ones.
pub(crate) async fn roles(State(state): State<ApiState>) -> ApiResult<Json<Vec<RoleInfo>>> {
    let view = crate::routes::reads::fresh_view(&state).await?;
    let builtin = builtin_roles().into_iter().map(|role| RoleInfo {
        role,
        builtin: true,
    });
    let custom = view.roles.values().map(|held| RoleInfo {
        role: (*held.value).clone(),
        builtin: false,
    });
    Ok(Json(builtin.chain(custom).collect()))
}

/// `DELETE /v1/roles/{name}`.
pub(crate) async fn delete_role(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<RoleRecord>> {
    if is_builtin(&name) {
        return Err(ApiError::invalid(format!(
            "`{name}` is a built-in role: it cannot be removed"
        )));
    }
    let view = crate::routes::reads::fresh_view(&state).await?;
    let Some(held) = view.roles.get(&name) else {
        return Err(ApiError::not_found(format!("role `{name}` not found")));
    };
    state
        .store()
        .txn(Txn::new().then(Op::delete(keys::role(&name))))
        .await?;
    Ok(Json((*held.value).clone()))
}

/// `POST /v1/users/{name}/tokens`: for a user with a record (or the local
/// admin), by someone who may write users or by the user themself.
pub(crate) async fn token(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    JsonBody(request): JsonBody<UserTokenRequest>,
) -> ApiResult<Json<IssuedToken>> {
    let Some(tokens) = state.token_authority() else {
        return Err(ApiError::unavailable(
            "this server issues no tokens: it has no cluster CA and token key (`cca init`)",
        ));
    };
    let view = crate::routes::reads::fresh_view(&state).await?;
    if crate::authz::user_record(&view, &name, true).is_none() {
        return Err(ApiError::not_found(format!(
            "user `{name}` not found: `cca user create {name} --role ROLE` first"
        )));
    }
    let ttl = match request.ttl_secs.map(Duration::from_secs) {
        None => DEFAULT_TOKEN_TTL,
        Some(ttl) if ttl.is_zero() || ttl > MAX_TOKEN_TTL => {
            return Err(ApiError::invalid(format!(
                "a token's ttl is more than 0 s and at most {} days",
                MAX_TOKEN_TTL.as_secs() / 86_400
            )));
        }
        Some(ttl) => ttl,
    };
    let (token, claims) = tokens.issue(&name, system_now(), ttl);
    Ok(Json(IssuedToken {
        token,
        jti: claims.jti.unwrap_or_default(),
        expires_at: claims.exp,
    }))
}

/// `POST /v1/logout`: revokes the token the caller presented.
pub(crate) async fn logout(
    State(state): State<ApiState>,
    caller: MaybeCaller,
) -> ApiResult<Json<LoggedOut>> {
    let Some(axum::Extension(Caller {
        via: Via::Token {
            jti: Some(jti),
            expires_at,
        },
        ..
    })) = &caller
    else {
        return Ok(Json(LoggedOut { revoked: None }));
    };
    let record = RevocationRecord {
        target: RevokedTarget::Token {
            jti: jti.clone(),
            expires_at: i64::try_from(expires_at.saturating_mul(1000)).unwrap_or(i64::MAX),
        },
        at: now_millis(),
        by: by(&caller),
        reason: "logged out".into(),
    };
    state
        .store()
        .txn(Txn::new().then(Op::put(
            keys::revocation(&record.target.id()),
            encode(&record),
        )))
        .await?;
    Ok(Json(LoggedOut {
        revoked: Some(jti.clone()),
    }))
}
