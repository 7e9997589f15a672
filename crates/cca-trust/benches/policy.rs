//! The per-request cost of authorization at 1,000 policies (issue 14's
//! target: ≤ 5 µs per decision): `decide` against 1,000 custom roles of
//! three rules each with the user holding five of them and a built-in
//! role, against one role of 1,000 rules, and against 1,000 rules no
//! index can narrow; what rebuilding the set after a role change costs;
//! and filtering a list of 1,000 services. Figures and the command are in
//! docs/authorization.md.

use std::collections::BTreeMap;
use std::hint::black_box;

use cca_model::access::{
    Action, Conditions, Effect, Resource, RoleRecord, Rule, TenantCondition, UserRecord,
};
use cca_trust::policy::{PolicySet, Principal, Request};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

fn rule(
    effect: Effect,
    actions: &[Action],
    resources: &[Resource],
    tenant: TenantCondition,
    tags: &[(&str, String)],
) -> Rule {
    Rule {
        effect,
        actions: actions.to_vec(),
        resources: resources.to_vec(),
        when: Conditions {
            tenant,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        },
    }
}

/// Role `i` of the 1,000: workloads of one tenant, logs and exec on one
/// team's instances, and never exec into production.
fn small_role(i: usize) -> RoleRecord {
    use Action::*;
    use Resource::{Gate, Instance, Service};
    RoleRecord {
        name: format!("role-{i}"),
        description: String::new(),
        rules: vec![
            rule(
                Effect::Allow,
                &[Read, Write, Delete],
                &[Service, Instance, Gate],
                TenantCondition::In(vec![format!("t{}", i % 50)]),
                &[],
            ),
            rule(
                Effect::Allow,
                &[Logs, Exec],
                &[Instance],
                TenantCondition::Own,
                &[("team", format!("team{}", i % 100))],
            ),
            rule(
                Effect::Deny,
                &[Exec],
                &[Instance],
                TenantCondition::Any,
                &[("env", "prod".to_owned())],
            ),
        ],
    }
}

/// One role of 1,000 rules: by tenant, by team tag, and by team tag next
/// to a tag every rule shares.
fn big_role() -> RoleRecord {
    use Action::*;
    use Resource::{Instance, Service};
    let rules = (0..1_000)
        .map(|i| match i % 3 {
            0 => rule(
                Effect::Allow,
                &[Read, Logs],
                &[Service, Instance],
                TenantCondition::In(vec![format!("t{i}")]),
                &[],
            ),
            1 => rule(
                Effect::Allow,
                &[Read, Write],
                &[Service, Instance],
                TenantCondition::Own,
                &[("team", format!("team{i}"))],
            ),
            _ => rule(
                Effect::Deny,
                &[Exec],
                &[Instance],
                TenantCondition::Any,
                &[("env", "prod".to_owned()), ("team", format!("team{i}"))],
            ),
        })
        .collect();
    RoleRecord {
        name: "big".into(),
        description: String::new(),
        rules,
    }
}

/// 1,000 rules with the same action, resource and no tags: each tenant
/// condition must be tried in turn.
fn flat_role() -> RoleRecord {
    let rules = (0..1_000)
        .map(|i| {
            rule(
                Effect::Allow,
                &[Action::Read],
                &[Resource::Service],
                if i % 2 == 0 {
                    TenantCondition::Own
                } else {
                    TenantCondition::In(vec![format!("t{i}"), format!("u{i}")])
                },
                &[],
            )
        })
        .collect();
    RoleRecord {
        name: "flat".into(),
        description: String::new(),
        rules,
    }
}

fn user(roles: &[String], tenant: &str) -> UserRecord {
    UserRecord {
        name: "bob".into(),
        roles: roles.to_vec(),
        tenant: Some(tenant.into()),
        created_at: 0,
        created_by: String::new(),
    }
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn decide(c: &mut Criterion) {
    let roles: Vec<RoleRecord> = (0..1_000).map(small_role).collect();
    let set = PolicySet::new(&roles).expect("valid roles");
    // Five custom roles spread over the set, and a built-in one.
    let held: Vec<String> = [17, 250, 503, 750, 999]
        .iter()
        .map(|i| format!("role-{i}"))
        .chain(["developer".to_owned()])
        .collect();
    let bob = user(&held, "t3");
    let principal = Principal::of(&bob);
    let team = tags(&[("team", "team3"), ("env", "dev")]);
    let prod = tags(&[("team", "team50"), ("env", "prod")]);
    let mut group = c.benchmark_group("decide_1000_roles");
    // role-503 grants tenant t3: found after two roles and two hash look-ups.
    let allow = Request::new(Action::Write, Resource::Gate)
        .in_tenant(Some("t3"))
        .tagged(&team);
    assert!(set.decide(&principal, &allow).is_allowed());
    group.bench_function("allow", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&allow)))
    });
    let denied = Request::new(Action::Exec, Resource::Instance)
        .in_tenant(Some("t3"))
        .tagged(&prod);
    assert!(!set.decide(&principal, &denied).is_allowed());
    group.bench_function("deny_rule", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&denied)))
    });
    let other = Request::new(Action::Delete, Resource::Secret)
        .in_tenant(Some("t9"))
        .tagged(&team);
    assert!(!set.decide(&principal, &other).is_allowed());
    group.bench_function("no_rule", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&other)))
    });
    group.finish();

    let set = PolicySet::new([&big_role(), &flat_role()]).expect("valid roles");
    let big = user(&["big".to_owned()], "t7");
    let principal = Principal::of(&big);
    let mut group = c.benchmark_group("decide_one_role_1000_rules");
    let last_tenant = Request::new(Action::Logs, Resource::Instance).in_tenant(Some("t999"));
    assert!(set.decide(&principal, &last_tenant).is_allowed());
    group.bench_function("allow_by_tenant", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&last_tenant)))
    });
    let team997 = tags(&[("team", "team997"), ("env", "dev")]);
    let by_tag = Request::new(Action::Write, Resource::Service)
        .in_tenant(Some("t7"))
        .tagged(&team997);
    assert!(set.decide(&principal, &by_tag).is_allowed());
    group.bench_function("allow_by_tag", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&by_tag)))
    });
    let prod998 = tags(&[("team", "team998"), ("env", "prod")]);
    let deny = Request::new(Action::Exec, Resource::Instance)
        .in_tenant(Some("t7"))
        .tagged(&prod998);
    assert!(!set.decide(&principal, &deny).is_allowed());
    group.bench_function("deny_rule", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&deny)))
    });
    let flat = user(&["flat".to_owned()], "t7");
    let principal = Principal::of(&flat);
    let nowhere = Request::new(Action::Read, Resource::Service).in_tenant(Some("x"));
    assert!(!set.decide(&principal, &nowhere).is_allowed());
    group.bench_function("unindexed_no_rule", |b| {
        b.iter(|| set.decide(black_box(&principal), black_box(&nowhere)))
    });
    group.finish();
}

fn rebuild(c: &mut Criterion) {
    let roles: Vec<RoleRecord> = (0..1_000).map(small_role).collect();
    c.bench_function("rebuild_1000_roles", |b| {
        b.iter(|| PolicySet::new(black_box(&roles)).expect("valid"))
    });
    let big = big_role();
    c.bench_function("rebuild_one_role_1000_rules", |b| {
        b.iter(|| PolicySet::new([black_box(&big)]).expect("valid"))
    });
    let set = PolicySet::new(&roles).expect("valid");
    c.bench_function("drop_1000_roles", |b| {
        b.iter_batched(|| set.clone(), drop, BatchSize::LargeInput)
    });
}

fn visible(c: &mut Criterion) {
    let roles: Vec<RoleRecord> = (0..1_000).map(small_role).collect();
    let set = PolicySet::new(&roles).expect("valid roles");
    let held: Vec<String> = ["role-3", "role-53", "developer"]
        .iter()
        .map(|r| (*r).to_owned())
        .collect();
    let bob = user(&held, "t3");
    let principal = Principal::of(&bob);
    let services: Vec<(String, BTreeMap<String, String>)> = (0..1_000)
        .map(|i| (format!("t{}", i % 50), tags(&[("team", "x")])))
        .collect();
    c.bench_function("visible_filter_1000_services", |b| {
        b.iter(|| {
            let visible = set.visible(black_box(&principal), Resource::Service);
            services
                .iter()
                .filter(|(tenant, tags)| visible.shows(Some(tenant), tags))
                .count()
        })
    });
}

criterion_group!(benches, decide, rebuild, visible);
criterion_main!(benches);
