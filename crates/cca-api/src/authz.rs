//! What a user may do: every route (but the open ones and the agent
//! routes, which `auth` keeps to their own node) maps to the action and
//! kind of object it touches ([`requirement`]), the object's tenant and
//! tags come from the cache, and the cluster's roles
//! (`cca_trust::policy`, built-in and custom, rebuilt by
//! [`follow_roles`] when a role changes) decide, deny winning. The user's
//! stored record, not their token's claims, says which roles they hold, so
//! a role taken away counts from the next request.
//!
//! The local admin (`user:admin`, whose certificate `cca init` makes) holds
//! the `admin` role without a record, so the first users can be made; to
//! retire it, revoke its certificate (`cca cert revoke --user admin`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::http::{Method, StatusCode};
use cca_control::View;
use cca_model::access::{Action, Resource, UserRecord};
use cca_model::spec::Program;
use cca_trust::config_dir::ADMIN_USER;
use cca_trust::policy::{Decision, PolicySet, Principal, Request};

use crate::error::ApiError;
use crate::state::ApiState;

/// What a route needs, and how to find the object it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Requirement {
    pub(crate) action: Action,
    pub(crate) resource: Resource,
    /// Which path segment names the object, if one does.
    pub(crate) object: Object,
}

/// How a route names its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// A list or the cluster: no one object.
    None,
    /// `{name}` or `{id}`: the last variable segment.
    Named,
}

const fn need(action: Action, resource: Resource, object: Object) -> Requirement {
    Requirement {
        action,
        resource,
        object,
    }
}

/// The requirement of `method` on `route` (the matched pattern); `None`
/// for a route this table does not know, which is refused.
pub(crate) fn requirement(method: &Method, route: &str) -> Option<Requirement> {
    use Action::{Delete, Exec, Logs, Read, Write};
    use Object::{Named, None as Whole};
    use Resource::{
        Audit, Cluster, Event, Gate, Instance, Node, Role, Secret, Service, Token, User,
    };
    let read = *method == Method::GET || *method == Method::HEAD;
    let delete = *method == Method::DELETE;
    let pick = |action_for_reads, other| if read { action_for_reads } else { other };
    Some(match route {
        // A program touches every kind of object it holds; the handler
        // checks each other kind (`check_program`, from `routes::ops`).
        "/v1/apply" => need(Write, Service, Whole),
        "/v1/diff" => need(Read, Service, Whole),
        "/v1/services" => need(Read, Service, Whole),
        "/v1/services/{name}" if delete => need(Delete, Service, Named),
        "/v1/services/{name}" => need(Read, Service, Named),
        "/v1/services/{name}/scale" => need(pick(Read, Write), Service, Named),
        "/v1/services/{name}/history" | "/v1/services/{name}/rollout" => need(Read, Service, Named),
        "/v1/services/{name}/rollout/pause"
        | "/v1/services/{name}/rollout/resume"
        | "/v1/services/{name}/rollout/undo" => need(Write, Service, Named),
        "/v1/services/{name}/logs" => need(Logs, Service, Named),
        "/v1/instances" => need(Read, Instance, Whole),
        "/v1/instances/{id}" => need(Read, Instance, Named),
        "/v1/instances/{id}/logs" => need(Logs, Instance, Named),
        "/v1/instances/{id}/exec" => need(Exec, Instance, Named),
        "/v1/top/nodes" => need(Read, Node, Whole),
        // Filtered by the services the caller may read.
        "/v1/top/workloads" => need(Read, Service, Whole),
        "/v1/nodes" => need(Read, Node, Whole),
        "/v1/nodes/{name}" | "/v1/nodes/{name}/inspect" => need(Read, Node, Named),
        "/v1/nodes/{name}/drain" | "/v1/nodes/{name}/disable" | "/v1/nodes/{name}/enable" => {
            need(Write, Node, Named)
        }
        "/v1/gates/{name}" => need(Read, Gate, Named),
        "/v1/secrets" => need(Read, Secret, Whole),
        "/v1/secrets/{name}" if delete => need(Delete, Secret, Named),
        "/v1/secrets/{name}" => need(Write, Secret, Named),
        // A backup holds every fact, sealed secrets and users included.
        "/v1/secret-key/rotate" | "/v1/cluster/resume-replacement" | "/v1/backup" => {
            need(Write, Cluster, Whole)
        }
        "/v1/status" | "/metrics" => need(Read, Cluster, Whole),
        "/v1/events" => need(Read, Event, Whole),
        "/v1/audit" => need(Read, Audit, Whole),
        // A watch streams raw facts of every kind, credentials' records
        // included: for those who may read users.
        "/v1/watch" => need(Read, User, Whole),
        "/v1/tokens" => need(pick(Read, Write), Token, Whole),
        "/v1/tokens/{id}" => need(Delete, Token, Named),
        "/v1/revocations" => need(pick(Read, Write), User, Whole),
        "/v1/users" => need(pick(Read, Write), User, Whole),
        "/v1/users/{name}" if delete => need(Delete, User, Named),
        "/v1/users/{name}" => need(pick(Read, Write), User, Named),
        "/v1/users/{name}/tokens" => need(Write, User, Named),
        "/v1/roles" => need(pick(Read, Write), Role, Whole),
        "/v1/roles/{name}" if delete => need(Delete, Role, Named),
        "/v1/roles/{name}" => need(pick(Read, Write), Role, Named),
        // The console's pages read what the routes they summarize read;
        // the overview counts nodes and services alike, as `status` does.
        "/v1/console/overview" => need(Read, Cluster, Whole),
        "/v1/console/services" => need(Read, Service, Whole),
        "/v1/console/services/{name}" => need(Read, Service, Named),
        "/v1/console/nodes" => need(Read, Node, Whole),
        "/v1/console/nodes/{name}" => need(Read, Node, Named),
        "/v1/console/instances/{id}" => need(Read, Instance, Named),
        "/v1/console/events" => need(Read, Event, Whole),
        "/v1/console/diff" => need(Read, Service, Whole),
        "/v1/console/apply" => need(Write, Service, Whole),
        _ => return None,
    })
}

/// The roles in force, rebuilt when a custom role changes.
#[derive(Debug)]
pub(crate) struct Policies {
    current: RwLock<Arc<PolicySet>>,
}

impl Default for Policies {
    fn default() -> Self {
        let (set, _) = PolicySet::from_stored(std::iter::empty());
        Self {
            current: RwLock::new(Arc::new(set)),
        }
    }
}

impl Policies {
    pub(crate) fn current(&self) -> Arc<PolicySet> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn replace(&self, set: PolicySet) {
        let old = std::mem::replace(
            &mut *self
                .current
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            Arc::new(set),
        );
        drop(old);
    }
}

/// Keeps the API's roles equal to the cache's from now until the cache
/// stops. A stored role that does not check denies its holders everything
/// (logged), and a rebuild runs off the async workers.
pub(crate) async fn follow_roles(state: ApiState) {
    let mut views = state.cache().views();
    let mut shown: Option<Vec<(String, i64)>> = None;
    loop {
        let view = Arc::clone(&views.borrow_and_update());
        let revisions: Vec<(String, i64)> = view
            .roles
            .iter()
            .map(|(name, held)| (name.clone(), held.mod_revision))
            .collect();
        if shown.as_ref() != Some(&revisions) {
            let roles: Vec<_> = view
                .roles
                .values()
                .map(|held| (*held.value).clone())
                .collect();
            let built =
                tokio::task::spawn_blocking(move || PolicySet::from_stored(roles.iter())).await;
            if let Ok((set, problems)) = built {
                for problem in problems {
                    tracing::warn!(%problem, "a stored role is unusable: its holders may do nothing");
                }
                state.policies().replace(set);
            }
            shown = Some(revisions);
        }
        if views.changed().await.is_err() {
            return;
        }
    }
}

/// The local admin's record: the `admin` role, cluster-wide.
fn local_admin() -> UserRecord {
    UserRecord {
        name: ADMIN_USER.to_owned(),
        roles: vec!["admin".to_owned()],
        tenant: None,
        created_at: 0,
        created_by: "cca init".to_owned(),
    }
}

/// The record of user `name`: stored, or the local admin's when `name`
/// proved itself with a certificate and has none.
pub(crate) fn user_record(view: &View, name: &str, by_certificate: bool) -> Option<UserRecord> {
    match view.users.get(name) {
        Some(held) => Some((*held.value).clone()),
        None if by_certificate && name == ADMIN_USER => Some(local_admin()),
        None => None,
    }
}

/// The tenant and tags of the object `name` of `resource`, as the view
/// has them (none for cluster-wide objects and unknown names). A secret's
/// is its value's, or its declaration's while it has no value.
fn object<'v>(
    view: &'v View,
    resource: Resource,
    name: &str,
) -> (Option<&'v str>, BTreeMap<String, String>) {
    let own = match resource {
        Resource::Secret => Some(
            view.secrets
                .get(name)
                .map(|sealed| sealed.value.tenant.as_deref())
                .or_else(|| {
                    view.secret_declarations
                        .get(name)
                        .map(|declared| declared.value.tenant.as_deref())
                })
                .flatten(),
        ),
        Resource::Gate => Some(
            view.gates
                .get(name)
                .and_then(|gate| gate.value.tenant.as_deref()),
        ),
        Resource::Connection => Some(
            view.connections
                .get(name)
                .and_then(|connection| connection.value.tenant.as_deref()),
        ),
        Resource::NetworkPolicy => Some(
            view.network_policies
                .get(name)
                .and_then(|policy| policy.value.tenant.as_deref()),
        ),
        _ => None,
    };
    if let Some(tenant) = own {
        return (tenant, BTreeMap::new());
    }
    let service = match resource {
        Resource::Service => Some(name),
        Resource::Instance => view
            .instances
            .get(name)
            .map(|instance| instance.service.as_str())
            .or_else(|| {
                view.statuses
                    .get(name)
                    .map(|status| status.service.as_str())
            }),
        _ => None,
    };
    let Some(service) = service else {
        return (None, BTreeMap::new());
    };
    let tenant = view
        .services
        .get(service)
        .and_then(|spec| spec.value.tenant.as_deref());
    let tags = view
        .tags
        .get(service)
        .map(|tags| {
            tags.iter()
                .map(|(key, value)| (key.clone(), (*value.value).clone()))
                .collect()
        })
        .unwrap_or_default();
    (tenant, tags)
}

/// Kinds of objects that belong to tenants.
fn is_tenant_scoped(resource: Resource) -> bool {
    matches!(
        resource,
        Resource::Service
            | Resource::Instance
            | Resource::Gate
            | Resource::Connection
            | Resource::Secret
            | Resource::NetworkPolicy
            | Resource::Event
    )
}

/// Whether the view holds the object `name` of `resource` (the kinds
/// whose tenant the view knows).
fn exists(view: &View, resource: Resource, name: &str) -> bool {
    match resource {
        Resource::Service => view.services.contains_key(name),
        Resource::Instance => view.instances.contains_key(name) || view.statuses.contains_key(name),
        Resource::Secret => {
            view.secrets.contains_key(name) || view.secret_declarations.contains_key(name)
        }
        Resource::Gate => view.gates.contains_key(name),
        Resource::Connection => view.connections.contains_key(name),
        Resource::NetworkPolicy => view.network_policies.contains_key(name),
        _ => false,
    }
}

/// Whether `user` may do `need` (on the object named `name`): 403 naming
/// why when not.
pub(crate) fn check(
    state: &ApiState,
    view: &View,
    user: &UserRecord,
    need: Requirement,
    name: Option<&str>,
) -> Result<(), ApiError> {
    let (tenant, tags) = match (need.object, name) {
        (Object::Named, Some(name)) if exists(view, need.resource, name) => {
            object(view, need.resource, name)
        }
        // A list, or an object still to be made: the user acts in their
        // own tenant (what they make is stamped with it; lists are
        // filtered by `Lens`).
        _ if is_tenant_scoped(need.resource) => (user.tenant.as_deref(), BTreeMap::new()),
        _ => (None, BTreeMap::new()),
    };
    let request = Request::new(need.action, need.resource)
        .in_tenant(tenant)
        .tagged(&tags);
    match state
        .policies()
        .current()
        .decide(&Principal::of(user), &request)
    {
        Decision::Allow { .. } => Ok(()),
        Decision::Deny(denial) => Err(ApiError::new(StatusCode::FORBIDDEN, denial.to_string())),
    }
}

/// The other kinds of object a program holds, beyond its services (the
/// route's own `write:service` or `read:service`; a service's tags and
/// grants are part of it).
fn held_kinds(program: &Program) -> impl Iterator<Item = Resource> {
    [
        (Resource::Gate, program.gates.is_empty()),
        (Resource::Connection, program.connections.is_empty()),
        (Resource::NetworkPolicy, program.networks.is_empty()),
        (Resource::Secret, program.secrets.is_empty()),
    ]
    .into_iter()
    .filter(|(_, empty)| !empty)
    .map(|(resource, _)| resource)
}

/// Whether the user `caller` may do `action` on every other kind of
/// object `program` holds (gates, connections, network policies, secret
/// declarations) in the program's tenant: 403 naming the first they may
/// not. Callers that are not users (nobody authenticates, `cca dev`) pass,
/// as they do the route's check.
pub(crate) fn check_program(
    state: &ApiState,
    caller: Option<&crate::auth::Caller>,
    program: &Program,
    action: Action,
) -> Result<(), ApiError> {
    let Some(crate::auth::Caller {
        identity: cca_trust::identity::Identity::User(name),
        via,
    }) = caller
    else {
        return Ok(());
    };
    let view = state.cache().view();
    let Some(user) = user_record(&view, name, *via == crate::auth::Via::Certificate) else {
        return Ok(());
    };
    let policies = state.policies().current();
    for resource in held_kinds(program) {
        let request = Request::new(action, resource).in_tenant(program.tenant.as_deref());
        if let Decision::Deny(denial) = policies.decide(&Principal::of(&user), &request) {
            return Err(ApiError::new(StatusCode::FORBIDDEN, denial.to_string()));
        }
    }
    Ok(())
}

/// What a list shows a user: the objects they may read. `None` (nobody
/// authenticates, `cca dev`) shows everything.
pub(crate) struct Lens {
    policies: Arc<PolicySet>,
    user: UserRecord,
    resource: Resource,
}

impl Lens {
    /// The lens of `caller` on lists of `resource`.
    pub(crate) fn of(
        state: &ApiState,
        caller: Option<&crate::auth::Caller>,
        resource: Resource,
    ) -> Option<Lens> {
        let caller = caller?;
        let cca_trust::identity::Identity::User(name) = &caller.identity else {
            return None;
        };
        let user = user_record(
            &state.cache().view(),
            name,
            caller.via == crate::auth::Via::Certificate,
        )?;
        Some(Lens {
            policies: state.policies().current(),
            user,
            resource,
        })
    }

    /// Keeps the items the lens shows; `object` gives each item's tenant
    /// and tags. The user's roles are looked up once for the whole list.
    pub(crate) fn retain<T>(
        &self,
        items: &mut Vec<T>,
        object: impl Fn(&T) -> (Option<String>, BTreeMap<String, String>),
    ) {
        let visible = self
            .policies
            .visible(&Principal::of(&self.user), self.resource);
        if visible.everything() {
            return;
        }
        if visible.nothing() {
            items.clear();
            return;
        }
        items.retain(|item| {
            let (tenant, tags) = object(item);
            visible.shows(tenant.as_deref(), &tags)
        });
    }
}

/// Keeps the items of `items` that `lens` shows, by the service each
/// belongs to.
pub(crate) fn filter_by_service<T>(
    lens: Option<&Lens>,
    view: &View,
    items: &mut Vec<T>,
    service: impl Fn(&T) -> Option<String>,
) {
    if let Some(lens) = lens {
        lens.retain(items, |item| match service(item) {
            Some(name) => {
                let (tenant, tags) = object(view, Resource::Service, &name);
                (tenant.map(str::to_owned), tags)
            }
            None => (None, BTreeMap::new()),
        });
    }
}

#[cfg(test)]
mod tests {
    use cca_model::spec::{GateSpec, NetworkPolicy, SecretSpec};

    use super::*;

    fn developer(tenant: Option<&str>) -> UserRecord {
        UserRecord {
            name: "dev".into(),
            roles: vec!["developer".into()],
            tenant: tenant.map(str::to_owned),
            created_at: 0,
            created_by: "test".into(),
        }
    }

    /// A view holding tenant a's gate `shop`, network policy `p`,
    /// connection `c` and secret declaration `s` (no value yet), and the
    /// cluster-wide gate `lobby`.
    fn view() -> View {
        let mut view = View::default();
        let gate = |name: &str, tenant: Option<&str>| GateSpec {
            name: name.into(),
            hosts: vec![format!("{name}.example")],
            service: "web".into(),
            port: 80,
            sticky: None,
            tls: None,
            tenant: tenant.map(str::to_owned),
            ..GateSpec::default()
        };
        view.put("desired/gate/shop", &json(&gate("shop", Some("a"))), 2);
        view.put("desired/gate/lobby", &json(&gate("lobby", None)), 2);
        let policy = NetworkPolicy {
            name: "p".into(),
            rules: Vec::new(),
            tenant: Some("a".into()),
        };
        view.put("desired/network/policy/p", &json(&policy), 2);
        let connection = br#"{"name":"c","driver":"postgresql","user":null,"secret":null,
            "host":"db","port":5432,"database":null,"params":{},"tenant":"a"}"#;
        view.put("desired/connection/c", connection, 2);
        let declared = SecretSpec {
            name: "s".into(),
            description: None,
            tenant: Some("a".into()),
        };
        view.put("desired/secret-decl/s", &json(&declared), 2);
        view
    }

    fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
        serde_json::to_vec(value).expect("encodes")
    }

    #[test]
    fn gates_connections_policies_and_declared_secrets_are_their_tenants() {
        let view = view();
        for (resource, name) in [
            (Resource::Gate, "shop"),
            (Resource::Connection, "c"),
            (Resource::NetworkPolicy, "p"),
            (Resource::Secret, "s"),
        ] {
            assert!(exists(&view, resource, name), "{resource:?} {name}");
            assert_eq!(object(&view, resource, name).0, Some("a"), "{name}");
            assert!(!exists(&view, resource, "ghost"));
            assert!(is_tenant_scoped(resource));
        }
        assert!(exists(&view, Resource::Gate, "lobby"));
        assert_eq!(object(&view, Resource::Gate, "lobby").0, None);
    }

    #[test]
    fn a_tenants_user_is_refused_another_tenants_gate_and_policy_without_hearing_whose() {
        let view = view();
        let (policies, _) = PolicySet::from_stored(std::iter::empty());
        let (a, b, everyone) = (developer(Some("a")), developer(Some("b")), developer(None));
        for (resource, name) in [
            (Resource::Gate, "shop"),
            (Resource::NetworkPolicy, "p"),
            (Resource::Connection, "c"),
            (Resource::Secret, "s"),
        ] {
            for action in [Action::Read, Action::Write, Action::Delete] {
                let (tenant, tags) = object(&view, resource, name);
                let request = Request::new(action, resource)
                    .in_tenant(tenant)
                    .tagged(&tags);
                assert!(policies.allows(&Principal::of(&a), &request), "{name}");
                assert!(policies.allows(&Principal::of(&everyone), &request));
                let Decision::Deny(denial) = policies.decide(&Principal::of(&b), &request) else {
                    panic!("b may {action:?} a's {name}");
                };
                let told = denial.to_string();
                assert!(
                    told.contains("of another tenant") && !told.contains("`a`"),
                    "{told}"
                );
            }
        }
        // The cluster-wide gate is not a tenant's to read.
        let (tenant, _) = object(&view, Resource::Gate, "lobby");
        let request = Request::new(Action::Read, Resource::Gate).in_tenant(tenant);
        assert!(!policies.allows(&Principal::of(&a), &request));
    }

    #[test]
    fn a_program_needs_the_action_on_every_kind_it_holds() {
        let mut program = Program::default();
        assert_eq!(held_kinds(&program).count(), 0, "services: the route's");
        let declared = SecretSpec {
            name: "s".into(),
            description: None,
            tenant: None,
        };
        program.secrets.insert("s".into(), declared);
        let gate: GateSpec = serde_json::from_str(
            r#"{"name":"g","hosts":["g.example"],"service":"web","port":80,"sticky":null,"tls":null}"#,
        )
        .expect("gate");
        program.gates.insert("g".into(), gate);
        assert_eq!(
            held_kinds(&program).collect::<Vec<_>>(),
            [Resource::Gate, Resource::Secret]
        );
    }
}
