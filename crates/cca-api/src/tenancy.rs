//! Tenants. A user with a tenant sees and changes only their tenant's
//! objects (the roles' `own` condition); what gives an object its tenant
//! is who applied it: a tenant user's program is stamped with their
//! tenant on every object it holds (services, gates, connections, network
//! policies, secret declarations: each spec's `tenant`), a
//! cluster-wide user applies cluster-wide programs or, with `?tenant=T`
//! (`cca apply --tenant T`), a tenant's. A service's instances, logs, exec
//! and events are its tenant's; a secret value set by a tenant user is
//! theirs.
//!
//! Why a tenant's objects reach only its own services: a program's
//! references (a gate's services, its target's and its paths', a
//! policy's services, a service's connections and secrets, a
//! connection's secret) must name objects the same program defines
//! (`cca_model::validity`), so they carry
//! the same stamp, and a program may not take over an object of another
//! tenant. The one reference that is not a name is `*` in a network rule:
//! in a tenant's program it may not reach other tenants' services
//! ([`stamp`]).
//!
//! Names stay cluster-wide: a program may not take over an object of any
//! kind of another tenant (refused, naming only what the program itself
//! named), a gate may not claim a host a gate outside the program serves,
//! and `--prune` deletes only what belongs to the program's tenant.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use cca_model::spec::{Peer, Program, RuleAction};
use cca_model::{Key, Kind, keys};
use cca_store::KeyValue;
use serde::Deserialize;

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

/// Stamps `tenant` on the program and every object it holds; in a
/// tenant's program, refuses a network rule that would reach other
/// tenants' services.
pub(crate) fn stamp(program: &mut Program, tenant: Option<String>) -> ApiResult<()> {
    if tenant.is_some() {
        check_rules(program)?;
    }
    for spec in program.services.values_mut() {
        spec.tenant.clone_from(&tenant);
    }
    for gate in program.gates.values_mut() {
        gate.tenant.clone_from(&tenant);
    }
    for connection in program.connections.values_mut() {
        connection.tenant.clone_from(&tenant);
    }
    for secret in program.secrets.values_mut() {
        secret.tenant.clone_from(&tenant);
    }
    for policy in program.networks.values_mut() {
        policy.tenant.clone_from(&tenant);
    }
    program.tenant = tenant;
    Ok(())
}

/// A tenant's network rules may decide only flows of its own services.
/// Every node enforces every policy, first matching rule first, so `to *`
/// would reach every tenant's services: `deny * -> *` would cut them all
/// off, `allow web -> *` would open them to `web` ahead of their own
/// tenants' denies. Left is `to` one of its own services, or `deny` from
/// one of its own services to `*` (which decides only flows that service
/// starts).
fn check_rules(program: &Program) -> ApiResult<()> {
    for (name, policy) in &program.networks {
        for (index, rule) in policy.rules.iter().enumerate() {
            let reaches_others = rule.to == Peer::Any
                && (rule.action == RuleAction::Allow || rule.from == Peer::Any);
            if reaches_others {
                return Err(forbidden(format!(
                    "network policy `{name}` rules[{index}]: a tenant's rule with `-> *` would \
                     decide flows to other tenants' services; name your service after `->` \
                     (only `deny SERVICE -> *` may use `*` there)"
                )));
            }
        }
    }
    Ok(())
}

/// The part of every spec a program writes that says whose it is.
#[derive(Deserialize)]
struct Tenanted {
    #[serde(default)]
    tenant: Option<String>,
}

/// The tenant of the object stored at `key` in `current`; `None` when it
/// is cluster-wide, absent or does not decode (only a cluster-wide program
/// may then replace or prune it).
fn held_tenant(current: &BTreeMap<String, KeyValue>, key: &str) -> Option<String> {
    current
        .get(key)
        .and_then(|kv| serde_json::from_slice::<Tenanted>(&kv.value).ok())
        .and_then(|held| held.tenant)
}

/// Every object `program` names: (noun, name, key).
fn named(program: &Program) -> Vec<(&'static str, &str, String)> {
    let mut named = Vec::new();
    named.extend(
        program
            .services
            .keys()
            .map(|name| ("service", name.as_str(), keys::desired_service(name))),
    );
    named.extend(
        program
            .gates
            .keys()
            .map(|name| ("gate", name.as_str(), keys::desired_gate(name))),
    );
    named.extend(
        program
            .connections
            .keys()
            .map(|name| ("connection", name.as_str(), keys::desired_connection(name))),
    );
    named.extend(program.secrets.keys().map(|name| {
        let key = keys::desired_secret_declaration(name);
        ("secret", name.as_str(), key)
    }));
    named.extend(program.networks.keys().map(|name| {
        let key = keys::desired_network_policy(name);
        ("network policy", name.as_str(), key)
    }));
    named
}

/// Refuses a program that would take over an object of another tenant (or
/// a cluster-wide one, for a tenant's program), naming only the object the
/// program itself named.
pub(crate) fn check_takeover(
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
) -> ApiResult<()> {
    for (noun, name, key) in named(program) {
        if !current.contains_key(&key) {
            continue;
        }
        if held_tenant(current, &key) != program.tenant {
            return Err(forbidden(format!(
                "{noun} `{name}` exists and belongs to another tenant (or is cluster-wide): \
                 choose another name"
            )));
        }
    }
    Ok(())
}

/// Refuses (409) a gate of `program` that claims a host a stored gate
/// outside the program serves, unless this apply prunes that gate: a host
/// is served by one gate, whoever's (`cca_model::validity` checks this
/// within a program). The other gate is named only when the caller may
/// see it (it is of the program's tenant, or the program is cluster-wide).
pub(crate) fn check_hosts(
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
    prune: bool,
) -> ApiResult<()> {
    if program.gates.is_empty() {
        return Ok(());
    }
    let prefix = Kind::Gate.prefix();
    for (key, kv) in current.range(prefix.to_owned()..) {
        if !key.starts_with(prefix) {
            break;
        }
        let Some(Key::Gate { gate: held }) = Key::parse(key) else {
            continue;
        };
        if program.gates.contains_key(&held)
            || (prune && may_prune(key, current, program.tenant.as_deref()))
        {
            continue;
        }
        let Ok(spec) = serde_json::from_slice::<cca_model::spec::GateSpec>(&kv.value) else {
            continue;
        };
        for (name, gate) in &program.gates {
            let Some(host) = gate.hosts.iter().find(|host| spec.hosts.contains(host)) else {
                continue;
            };
            let other = if program.tenant.is_none() || spec.tenant == program.tenant {
                format!("gate `{held}`")
            } else {
                "a gate of another tenant (or a cluster-wide one)".to_owned()
            };
            return Err(ApiError::conflict(format!(
                "gate `{name}`: host `{host}` is already served by {other}; a host is served \
                 by one gate: choose another host, or remove it from the other gate first"
            )));
        }
    }
    Ok(())
}

/// Whether a program of `tenant` may prune the program-managed fact `key`:
/// objects of its own tenant (a service's tags and grants are its
/// service's); facts of other kinds only for cluster-wide programs.
pub(crate) fn may_prune(
    key: &str,
    current: &BTreeMap<String, KeyValue>,
    tenant: Option<&str>,
) -> bool {
    let owner = match Key::parse(key) {
        Some(
            Key::Service { service }
            | Key::ServiceTag { service, .. }
            | Key::ServiceGrant { service, .. },
        ) => keys::desired_service(&service),
        Some(
            Key::Gate { .. }
            | Key::Connection { .. }
            | Key::SecretDeclaration { .. }
            | Key::NetworkPolicy { .. },
        ) => key.to_owned(),
        _ => return tenant.is_none(),
    };
    held_tenant(current, &owner).as_deref() == tenant
}

#[cfg(test)]
mod tests {
    use cca_model::spec::{
        ConnectionSpec, GateSpec, NetworkPolicy, NetworkRule, SecretSpec, ServiceSpec, Workload,
    };

    use super::*;

    fn kv(key: &str, value: Vec<u8>) -> (String, KeyValue) {
        let kv = KeyValue {
            key: key.into(),
            value,
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            lease: None,
        };
        (key.into(), kv)
    }

    fn gate(name: &str, host: &str) -> GateSpec {
        GateSpec {
            name: name.into(),
            hosts: vec![host.into()],
            service: "web".into(),
            port: 80,
            sticky: None,
            tls: None,
            ..GateSpec::default()
        }
    }

    fn rule(action: RuleAction, from: Peer, to: Peer) -> NetworkRule {
        NetworkRule {
            action,
            from,
            to,
            ports: Vec::new(),
            protocol: None,
        }
    }

    fn web() -> Peer {
        Peer::Service("web".into())
    }

    /// A program with one object of every kind, all named `x` but the
    /// service `web` and the gate `shop` (host `shop.example`).
    fn program() -> Program {
        let mut program = Program::default();
        program.services.insert(
            "web".into(),
            ServiceSpec::new("web", Workload::process("sleep 600")),
        );
        program
            .gates
            .insert("shop".into(), gate("shop", "shop.example"));
        program.connections.insert(
            "x".into(),
            ConnectionSpec {
                name: "x".into(),
                driver: "postgresql".into(),
                user: None,
                secret: None,
                host: "db".into(),
                port: 5432,
                database: None,
                params: BTreeMap::new(),
                tenant: None,
            },
        );
        program.secrets.insert(
            "x".into(),
            SecretSpec {
                name: "x".into(),
                description: None,
                tenant: None,
            },
        );
        program.networks.insert(
            "x".into(),
            NetworkPolicy {
                name: "x".into(),
                rules: vec![rule(RuleAction::Deny, Peer::Any, web())],
                tenant: None,
            },
        );
        program
    }

    /// The store after `program` was applied: its facts, as written.
    fn stored(program: &Program) -> BTreeMap<String, KeyValue> {
        program
            .facts()
            .expect("encodes")
            .into_iter()
            .map(|fact| kv(&fact.key, fact.value))
            .collect()
    }

    #[test]
    fn a_tenants_program_is_stamped_on_every_object_it_holds() {
        let mut program = program();
        stamp(&mut program, Some("a".into())).expect("a tenant may hold every kind");
        let a = Some("a".to_owned());
        assert_eq!(program.tenant, a);
        assert_eq!(program.services["web"].tenant, a);
        assert_eq!(program.gates["shop"].tenant, a);
        assert_eq!(program.connections["x"].tenant, a);
        assert_eq!(program.secrets["x"].tenant, a);
        assert_eq!(program.networks["x"].tenant, a);
        // What is stored says whose each object is.
        let current = stored(&program);
        for (_, _, key) in named(&program) {
            assert_eq!(held_tenant(&current, &key), a, "{key}");
        }
    }

    #[test]
    fn a_tenants_network_rule_may_not_decide_flows_to_other_tenants() {
        let refused = [
            rule(RuleAction::Deny, Peer::Any, Peer::Any),
            rule(RuleAction::Allow, web(), Peer::Any),
            rule(RuleAction::Allow, Peer::Any, Peer::Any),
        ];
        for (index, bad) in refused.into_iter().enumerate() {
            let mut program = program();
            let policy = program.networks.get_mut("x").expect("policy");
            policy.rules.push(bad);
            let error = stamp(&mut program.clone(), Some("a".into())).expect_err("reaches out");
            assert_eq!(error.status, StatusCode::FORBIDDEN);
            assert!(
                error
                    .message
                    .starts_with("network policy `x` rules[1]: a tenant's rule with `-> *`"),
                "{index}: {}",
                error.message
            );
            // A cluster-wide program may decide every flow.
            stamp(&mut program, None).expect("cluster-wide");
        }
        let mut program = program();
        let policy = program.networks.get_mut("x").expect("policy");
        policy.rules.push(rule(RuleAction::Allow, Peer::Any, web()));
        policy.rules.push(rule(RuleAction::Deny, web(), Peer::Any));
        stamp(&mut program, Some("a".into())).expect("rules about its own service");
    }

    #[test]
    fn no_object_of_any_kind_is_taken_over_across_tenants() {
        let mut of_a = program();
        stamp(&mut of_a, Some("a".into())).expect("stamps");
        let current = stored(&of_a);
        check_takeover(&of_a, &current).expect("a re-applies its own");

        // Each kind alone, in b's program and in a cluster-wide one.
        // Each keeps one kind first in `named`'s order, so the refusal names it.
        type Trim = fn(&mut Program);
        let kinds: [(&str, Trim); 5] = [
            ("service `web`", |p| {
                p.gates.clear();
                p.connections.clear();
                p.secrets.clear();
                p.networks.clear();
            }),
            ("gate `shop`", |p| {
                p.services.clear();
            }),
            ("connection `x`", |p| {
                p.services.clear();
                p.gates.clear();
            }),
            ("secret `x`", |p| {
                p.services.clear();
                p.gates.clear();
                p.connections.clear();
            }),
            ("network policy `x`", |p| {
                p.services.clear();
                p.gates.clear();
                p.connections.clear();
                p.secrets.clear();
            }),
        ];
        for (named, keep_from) in kinds {
            for tenant in [Some("b"), None] {
                let mut other = program();
                keep_from(&mut other);
                stamp(&mut other, tenant.map(str::to_owned)).expect("stamps");
                let error = check_takeover(&other, &current).expect_err(named);
                assert_eq!(error.status, StatusCode::FORBIDDEN);
                assert_eq!(
                    error.message,
                    format!(
                        "{named} exists and belongs to another tenant (or is cluster-wide): \
                         choose another name"
                    )
                );
            }
        }
    }

    #[test]
    fn prune_deletes_only_the_programs_tenants_objects_of_every_kind() {
        let mut of_a = program();
        stamp(&mut of_a, Some("a".into())).expect("stamps");
        let mut cluster_wide = program();
        cluster_wide.gates.clear();
        cluster_wide
            .gates
            .insert("lobby".into(), gate("lobby", "lobby.example"));
        let mut current = stored(&of_a);
        let renamed: BTreeMap<String, KeyValue> = stored(&cluster_wide)
            .into_iter()
            .map(|(key, kv)| {
                let key = key.replacen("/x", "/y", 1).replacen("/web", "/api", 1);
                (key.clone(), KeyValue { key, ..kv })
            })
            .collect();
        current.extend(renamed);
        for key in current.keys() {
            let of_a = key.contains("/x") || key.contains("/web") || key.contains("/shop");
            assert_eq!(may_prune(key, &current, Some("a")), of_a, "{key} by a");
            assert!(!may_prune(key, &current, Some("b")), "{key} by b");
            assert_eq!(may_prune(key, &current, None), !of_a, "{key} cluster-wide");
        }
        assert!(!may_prune("desired/node/n1", &current, Some("a")));
        assert!(may_prune("desired/node/n1", &current, None));
    }

    /// A gate's path routes reach only services of the same program (the
    /// model's rules), and so of the same tenant (no takeover).
    #[test]
    fn a_tenants_gate_paths_reach_only_its_own_services() {
        let path = |service: &str| cca_model::spec::GatePath {
            prefix: "/api".into(),
            service: service.into(),
            port: 80,
        };
        let mut of_b = Program::default();
        of_b.services.insert(
            "api".into(),
            ServiceSpec::new("api", Workload::process("sleep 600")),
        );
        stamp(&mut of_b, Some("b".into())).expect("stamps");
        let current = stored(&of_b);
        let shop = || {
            let mut program = Program::default();
            program.services.insert(
                "web".into(),
                ServiceSpec::new("web", Workload::process("sleep 600")),
            );
            program
                .gates
                .insert("shop".into(), gate("shop", "shop.example"));
            program
        };

        // Tenant a names b's service without defining it: refused as an
        // undefined reference before anything is written.
        let mut of_a = shop();
        of_a.gates
            .get_mut("shop")
            .expect("gate")
            .paths
            .push(path("api"));
        stamp(&mut of_a, Some("a".into())).expect("stamps");
        let error = crate::validate::check_program(&of_a).expect_err("not in the program");
        let problems: Vec<String> = error
            .problems
            .iter()
            .map(|problem| format!("{}: {}", problem.subject, problem.message))
            .collect();
        assert_eq!(
            problems,
            ["gate `shop` paths[0].service: undefined service `api`"]
        );

        // Defining it too is taking b's service over: refused.
        of_a.services.insert(
            "api".into(),
            ServiceSpec::new("api", Workload::process("sleep 600")),
        );
        stamp(&mut of_a, Some("a".into())).expect("stamps");
        crate::validate::check_program(&of_a).expect("sound on its own");
        let error = check_takeover(&of_a, &current).expect_err("b's service");
        assert_eq!(error.status, StatusCode::FORBIDDEN);
        assert!(
            error
                .message
                .starts_with("service `api` exists and belongs to another tenant"),
            "{}",
            error.message
        );

        // A path to its own service is a's to write.
        let mut own = shop();
        own.gates
            .get_mut("shop")
            .expect("gate")
            .paths
            .push(path("web"));
        stamp(&mut own, Some("a".into())).expect("stamps");
        crate::validate::check_program(&own).expect("its own service");
        check_takeover(&own, &current).expect("nothing of b's");
    }

    #[test]
    fn a_host_is_served_by_one_gate_across_programs_and_tenants() {
        let mut of_a = program();
        stamp(&mut of_a, Some("a".into())).expect("stamps");
        let current = stored(&of_a);
        let mut of_b = Program::default();
        of_b.gates
            .insert("mine".into(), gate("mine", "shop.example"));
        stamp(&mut of_b, Some("b".into())).expect("stamps");
        for prune in [false, true] {
            let error = check_hosts(&of_b, &current, prune).expect_err("a's host");
            assert_eq!(error.status, StatusCode::CONFLICT);
            assert_eq!(
                error.message,
                "gate `mine`: host `shop.example` is already served by a gate of another tenant \
                 (or a cluster-wide one); a host is served by one gate: choose another host, or \
                 remove it from the other gate first"
            );
        }
        // Tenant a's own second gate, or a cluster-wide program, is told
        // which gate; a's prune deletes `shop`, so the host is free.
        let mut again = of_b.clone();
        stamp(&mut again, Some("a".into())).expect("stamps");
        let error = check_hosts(&again, &current, false).expect_err("a's host");
        assert!(
            error.message.contains("served by gate `shop`"),
            "{}",
            error.message
        );
        check_hosts(&again, &current, true).expect("pruned with the apply");
        stamp(&mut again, None).expect("stamps");
        let error = check_hosts(&again, &current, true).expect_err("not a cluster-wide prune");
        assert!(error.message.contains("gate `shop`"), "{}", error.message);
        // The gate itself, re-applied, keeps its host.
        check_hosts(&of_a, &current, false).expect("its own host");
        let mut elsewhere = of_b;
        elsewhere.gates.get_mut("mine").expect("gate").hosts = vec!["other.example".into()];
        check_hosts(&elsewhere, &current, false).expect("another host");
    }
}
