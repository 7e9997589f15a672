//! Tenants. A user with a tenant sees and changes only their tenant's
//! objects (the roles' `own` condition); what gives an object its tenant
//! is who applied it: a tenant user's program is stamped with their
//! tenant on every service (`ServiceSpec::tenant`), a cluster-wide user
//! applies cluster-wide programs or, with `?tenant=T` (`cca apply
//! --tenant T`), a tenant's. A service's instances, logs, exec and events
//! are its tenant's; a secret value set by a tenant user is theirs.
//!
//! Names stay cluster-wide: a program may not take over a service of
//! another tenant (refused, naming only the service the program itself
//! named), and `--prune` deletes only what belongs to the program's
//! tenant. Gates, connections, network policies, groups and secret
//! declarations carry no tenant yet: only cluster-wide programs may hold
//! them.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use cca_model::spec::{Program, ServiceSpec};
use cca_model::{Key, keys};
use cca_store::KeyValue;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::state::ApiState;

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

/// The tenant of the caller: their record's (`None` for cluster-wide
/// users and when nobody authenticates).
pub(crate) fn of_caller(state: &ApiState, caller: Option<&Caller>) -> Option<String> {
    let caller = caller?;
    let cca_trust::identity::Identity::User(name) = &caller.identity else {
        return None;
    };
    crate::authz::user_record(
        &state.cache().view(),
        name,
        caller.via == crate::auth::Via::Certificate,
    )
    .and_then(|user| user.tenant)
}

/// The tenant a program is applied for: the caller's own, or — for a
/// cluster-wide caller — the one asked for.
pub(crate) fn of_program(own: Option<String>, asked: Option<String>) -> ApiResult<Option<String>> {
    match (own, asked) {
        (Some(own), Some(asked)) if own != asked => Err(forbidden(format!(
            "you belong to tenant `{own}` and may apply programs only for it, not for `{asked}`"
        ))),
        (Some(own), _) => Ok(Some(own)),
        (None, asked) => Ok(asked),
    }
}

/// Stamps `tenant` on the program and its services; refuses kinds that
/// carry no tenant in a tenant's program.
pub(crate) fn stamp(program: &mut Program, tenant: Option<String>) -> ApiResult<()> {
    if tenant.is_some() {
        let cluster_wide = [
            ("gates", program.gates.len()),
            ("connections", program.connections.len()),
            ("network policies", program.networks.len()),
            ("groups", program.groups.len()),
            ("secret declarations", program.secrets.len()),
        ];
        let held: Vec<&str> = cluster_wide
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(kind, _)| *kind)
            .collect();
        if !held.is_empty() {
            return Err(forbidden(format!(
                "a tenant's program may hold services only; {} are cluster-wide: ask a \
                 cluster-wide user to apply them",
                held.join(", ")
            )));
        }
    }
    for spec in program.services.values_mut() {
        spec.tenant.clone_from(&tenant);
    }
    program.tenant = tenant;
    Ok(())
}

/// The tenant of the service `service` as `current` holds it; `None` when
/// it is cluster-wide or absent.
fn service_tenant(current: &BTreeMap<String, KeyValue>, service: &str) -> Option<String> {
    current
        .get(&keys::desired_service(service))
        .and_then(|kv| serde_json::from_slice::<ServiceSpec>(&kv.value).ok())
        .and_then(|spec| spec.tenant)
}

/// Refuses a program that would take over a service of another tenant.
pub(crate) fn check_takeover(
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
) -> ApiResult<()> {
    for name in program.services.keys() {
        if !current.contains_key(&keys::desired_service(name)) {
            continue;
        }
        let held = service_tenant(current, name);
        if held != program.tenant {
            return Err(forbidden(format!(
                "service `{name}` exists and belongs to another tenant (or is cluster-wide): \
                 choose another name"
            )));
        }
    }
    Ok(())
}

/// Whether a program of `tenant` may prune the program-managed fact `key`:
/// facts of its own tenant's services; other kinds only for cluster-wide
/// programs.
pub(crate) fn may_prune(
    key: &str,
    current: &BTreeMap<String, KeyValue>,
    tenant: Option<&str>,
) -> bool {
    let service = match Key::parse(key) {
        Some(
            Key::Service { service }
            | Key::ServiceTag { service, .. }
            | Key::ServiceGrant { service, .. },
        ) => service,
        _ => return tenant.is_none(),
    };
    service_tenant(current, &service).as_deref() == tenant
}
