//! The authorization engine: each built-in role's matrix, tenant and tag
//! conditions, deny-overrides within and across roles, unknown and
//! invalid roles, the words of a denial, list filtering, and — by
//! property — that the indexed engine decides exactly as a plain scan of
//! every rule does, that a matching deny always wins and that removing
//! deny rules never takes a grant away.

use std::collections::BTreeMap;

use cca_model::access::{
    Action, Conditions, Effect, Resource, RoleRecord, Rule, TenantCondition, UserRecord,
};
use cca_trust::policy::{
    Decision, DenyReason, PolicyError, PolicySet, Principal, Request, builtin_roles, check_role,
};
use proptest::prelude::*;

fn user(name: &str, roles: &[&str], tenant: Option<&str>) -> UserRecord {
    UserRecord {
        name: name.into(),
        roles: roles.iter().map(|role| (*role).to_owned()).collect(),
        tenant: tenant.map(str::to_owned),
        created_at: 0,
        created_by: "user:admin".into(),
    }
}

fn rule(effect: Effect, grant: &str, tenant: TenantCondition, tags: &[(&str, &str)]) -> Rule {
    let (actions, resources) = grant.split_once(':').expect("ACTIONS:RESOURCES");
    Rule {
        effect,
        actions: actions
            .split(',')
            .map(|a| a.parse().expect("action"))
            .collect(),
        resources: resources
            .split(',')
            .map(|r| r.parse().expect("resource"))
            .collect(),
        when: Conditions {
            tenant,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        },
    }
}

fn allow(grant: &str) -> Rule {
    rule(Effect::Allow, grant, TenantCondition::Own, &[])
}

fn deny(grant: &str) -> Rule {
    rule(Effect::Deny, grant, TenantCondition::Own, &[])
}

fn role(name: &str, rules: Vec<Rule>) -> RoleRecord {
    RoleRecord {
        name: name.into(),
        description: String::new(),
        rules,
    }
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Asks `set` whether `user` may `grant` (`action:resource`) an object
/// in `tenant` with `tags`, and checks `allows` agrees with `decide`.
fn check(
    set: &PolicySet,
    user: &UserRecord,
    grant: &str,
    tenant: Option<&str>,
    tags: &BTreeMap<String, String>,
) -> Decision {
    let (action, resource) = grant.split_once(':').expect("action:resource");
    let request = Request::new(
        action.parse().expect("action"),
        resource.parse().expect("resource"),
    )
    .in_tenant(tenant)
    .tagged(tags);
    let principal = Principal::of(user);
    let decision = set.decide(&principal, &request);
    assert_eq!(
        set.allows(&principal, &request),
        decision.is_allowed(),
        "allows and decide disagree on {grant}"
    );
    decision
}

fn allowed(set: &PolicySet, user: &UserRecord, grant: &str, tenant: Option<&str>) -> bool {
    check(set, user, grant, tenant, &BTreeMap::new()).is_allowed()
}

/// `read,write:service,gate` → the pairs it names (`*` for all).
fn pairs(grants: &str) -> Vec<(Action, Resource)> {
    let mut out = Vec::new();
    for grant in grants.split_whitespace() {
        let (actions, resources) = grant.split_once(':').expect("ACTIONS:RESOURCES");
        for action in actions.split(',') {
            let actions = match action.parse().expect("action") {
                Action::Any => Action::CONCRETE.to_vec(),
                one => vec![one],
            };
            for resource in resources.split(',') {
                let resources = match resource.parse().expect("resource") {
                    Resource::Any => Resource::CONCRETE.to_vec(),
                    one => vec![one],
                };
                for &a in &actions {
                    for &r in &resources {
                        out.push((a, r));
                    }
                }
            }
        }
    }
    out
}

const WORKLOADS: &str = "service,instance,gate,connection,secret,network-policy";

#[test]
fn each_built_in_role_allows_exactly_its_matrix() {
    let set = PolicySet::new([]).expect("built-ins only");
    let matrix = [
        ("admin", "*:*".to_owned()),
        ("operator", format!("*:{WORKLOADS},node,event,cluster")),
        (
            "developer",
            format!("read,write,delete,logs,exec:{WORKLOADS} read:event,node,cluster"),
        ),
        ("viewer", format!("read:{WORKLOADS},event,node,cluster")),
    ];
    for (name, grants) in &matrix {
        let expected = pairs(grants);
        let cluster_wide = user("c", &[name], None);
        let tenant_a = user("t", &[name], Some("a"));
        for action in Action::CONCRETE {
            for resource in Resource::CONCRETE {
                let grant = format!("{action}:{resource}");
                let own = expected.contains(&(action, resource));
                let everywhere = *name == "admin";
                for (who, object, want) in [
                    (&cluster_wide, Some("a"), own),
                    (&cluster_wide, None, own),
                    (&tenant_a, Some("a"), own),
                    (&tenant_a, Some("b"), everywhere),
                    (&tenant_a, None, everywhere),
                ] {
                    assert_eq!(
                        allowed(&set, who, &grant, object),
                        want,
                        "{name} ({:?}) {grant} on an object in {object:?}",
                        who.tenant
                    );
                }
            }
        }
    }
    // The records `cca role` shows are the ones judged.
    let names: Vec<_> = builtin_roles().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["admin", "operator", "developer", "viewer"]);
}

#[test]
fn tenant_conditions_own_any_and_in() {
    let set = PolicySet::new(&[
        role("own", vec![allow("read:service")]),
        role(
            "any",
            vec![rule(
                Effect::Allow,
                "read:service",
                TenantCondition::Any,
                &[],
            )],
        ),
        role(
            "in-bc",
            vec![rule(
                Effect::Allow,
                "read:service",
                TenantCondition::In(vec!["b".into(), "c".into()]),
                &[],
            )],
        ),
    ])
    .expect("valid roles");
    let cases = [
        // role, user's tenant, object's tenant, allowed
        ("own", Some("a"), Some("a"), true),
        ("own", Some("a"), Some("b"), false),
        ("own", Some("a"), None, false),
        ("own", None, Some("b"), true),
        ("own", None, None, true),
        ("any", Some("a"), Some("b"), true),
        ("any", Some("a"), None, true),
        ("in-bc", Some("a"), Some("a"), false),
        ("in-bc", Some("a"), Some("b"), true),
        ("in-bc", Some("a"), Some("c"), true),
        ("in-bc", None, Some("a"), false),
        ("in-bc", None, None, false),
    ];
    for (name, tenant, object, want) in cases {
        let who = user("u", &[name], tenant);
        assert_eq!(
            allowed(&set, &who, "read:service", object),
            want,
            "{name}: user in {tenant:?}, object in {object:?}"
        );
        assert!(
            !allowed(&set, &who, "write:service", object),
            "{name} grants read only"
        );
    }
}

#[test]
fn every_tag_of_a_rule_must_be_on_the_object_with_its_value() {
    let red_prod = rule(
        Effect::Allow,
        "exec:instance",
        TenantCondition::Own,
        &[("team", "red"), ("env", "prod")],
    );
    // Many rules share `env=prod`, so `red_prod` is filed under
    // `team=red`: the lookup must still check `env`.
    let mut rules: Vec<Rule> = (0..20)
        .map(|i| {
            rule(
                Effect::Allow,
                "exec:instance",
                TenantCondition::Own,
                &[("env", "prod"), ("team", &format!("t{i}"))],
            )
        })
        .collect();
    rules.push(red_prod);
    let set = PolicySet::new(&[role("red-exec", rules)]).expect("valid");
    let who = user("u", &["red-exec"], Some("a"));
    let cases = [
        (tags(&[("team", "red"), ("env", "prod")]), true),
        (tags(&[("team", "red"), ("env", "prod"), ("x", "y")]), true),
        (tags(&[("team", "t7"), ("env", "prod")]), true),
        (tags(&[("team", "red")]), false),
        (tags(&[("team", "red"), ("env", "dev")]), false),
        (tags(&[("team", "blue"), ("env", "prod")]), false),
        (tags(&[("env", "prod")]), false),
        (BTreeMap::new(), false),
    ];
    for (object_tags, want) in cases {
        let decision = check(&set, &who, "exec:instance", Some("a"), &object_tags);
        assert_eq!(decision.is_allowed(), want, "{object_tags:?}");
    }
    let decision = check(
        &set,
        &who,
        "exec:instance",
        Some("a"),
        &tags(&[("team", "red"), ("env", "prod")]),
    );
    assert_eq!(
        decision,
        Decision::Allow {
            role: "red-exec".into(),
            rule_index: 20
        }
    );
    assert!(
        !check(
            &set,
            &who,
            "exec:instance",
            Some("b"),
            &tags(&[("team", "red"), ("env", "prod")])
        )
        .is_allowed(),
        "tags do not lift the tenant condition"
    );
}

#[test]
fn a_decision_names_the_first_rule_that_applies() {
    let in_a = |effect| {
        rule(
            effect,
            "read:service",
            TenantCondition::In(vec!["a".into()]),
            &[],
        )
    };
    let tagged = |effect| rule(effect, "read:service", TenantCondition::Any, &[("t", "1")]);
    let set = PolicySet::new(&[
        role(
            "two-in",
            vec![allow("read:gate"), in_a(Effect::Allow), in_a(Effect::Allow)],
        ),
        role(
            "two-tags",
            vec![tagged(Effect::Allow), tagged(Effect::Allow)],
        ),
        role(
            "deny-twice",
            vec![in_a(Effect::Deny), tagged(Effect::Deny), in_a(Effect::Deny)],
        ),
    ])
    .expect("valid");
    let cases = [
        (&["two-in"][..], Some("a"), tags(&[]), ("two-in", 1)),
        (
            &["two-tags"][..],
            None,
            tags(&[("t", "1")]),
            ("two-tags", 0),
        ),
        (
            &["viewer", "two-in"][..],
            Some("a"),
            tags(&[]),
            ("viewer", 0),
        ),
    ];
    for (roles, tenant, object_tags, (role, rule_index)) in cases {
        let who = user("u", roles, None);
        assert_eq!(
            check(&set, &who, "read:service", tenant, &object_tags),
            Decision::Allow {
                role: role.into(),
                rule_index
            },
            "{roles:?}"
        );
    }
    let who = user("u", &["two-in", "deny-twice"], None);
    let Decision::Deny(denial) = check(&set, &who, "read:service", Some("a"), &tags(&[("t", "1")]))
    else {
        panic!("denied")
    };
    assert_eq!(
        denial.reason,
        DenyReason::DeniedBy {
            role: "deny-twice".into(),
            rule_index: 0
        }
    );
}

#[test]
fn deny_wins_within_a_role_and_across_roles() {
    let set = PolicySet::new(&[
        role(
            "dev-no-exec",
            vec![allow("*:instance"), deny("exec:instance")],
        ),
        role("no-exec", vec![allow("read:event"), deny("exec,logs:*")]),
        role(
            "no-red",
            vec![rule(
                Effect::Deny,
                "*:*",
                TenantCondition::Any,
                &[("team", "red")],
            )],
        ),
    ])
    .expect("valid");
    let alone = user("bob", &["dev-no-exec"], Some("a"));
    assert!(allowed(&set, &alone, "logs:instance", Some("a")));
    let Decision::Deny(denial) = check(&set, &alone, "exec:instance", Some("a"), &tags(&[])) else {
        panic!("deny wins within a role")
    };
    assert_eq!(
        denial.reason,
        DenyReason::DeniedBy {
            role: "dev-no-exec".into(),
            rule_index: 1
        }
    );

    let both = user("bob", &["developer", "no-exec"], Some("a"));
    assert!(allowed(&set, &both, "write:service", Some("a")));
    let Decision::Deny(denial) = check(&set, &both, "exec:instance", Some("a"), &tags(&[])) else {
        panic!("a deny of another role wins over developer's allow")
    };
    assert_eq!(
        denial.to_string(),
        "user `bob` (roles developer, no-exec, tenant `a`) may not exec into instance in \
         tenant `a`: denied by rule 2 of role `no-exec`"
    );
    // Whatever the order the roles are held in.
    let reversed = user("bob", &["no-exec", "developer"], Some("a"));
    assert!(!allowed(&set, &reversed, "logs:service", Some("a")));

    let admin = user("root", &["admin", "no-red"], None);
    assert!(allowed(&set, &admin, "delete:service", Some("b")));
    assert!(
        !check(
            &set,
            &admin,
            "delete:service",
            Some("b"),
            &tags(&[("team", "red")])
        )
        .is_allowed(),
        "a deny with a tag condition beats admin on tagged objects"
    );
}

#[test]
fn a_denial_says_who_may_not_do_what_and_why() {
    let set = PolicySet::new([]).expect("built-ins");
    let bob = user("bob", &["developer"], Some("a"));
    let Decision::Deny(denial) = check(&set, &bob, "delete:service", Some("b"), &tags(&[])) else {
        panic!("another tenant's service")
    };
    assert_eq!(
        denial.to_string(),
        "user `bob` (roles developer, tenant `a`) may not delete service of another tenant: \
         no rule allows it",
        "another tenant's name is not told"
    );
    let nobody = user("eve", &[], None);
    let Decision::Deny(denial) = check(&set, &nobody, "read:node", None, &tags(&[])) else {
        panic!("no roles")
    };
    assert_eq!(
        denial.to_string(),
        "user `eve` (no roles, cluster-wide) may not read node: no rule allows it"
    );
    let vague = Request::new(Action::Any, Resource::Service);
    let admin = user("root", &["admin"], None);
    let Decision::Deny(denial) = set.decide(&Principal::of(&admin), &vague) else {
        panic!("a request for `*` is never allowed, even to admin")
    };
    assert_eq!(denial.reason, DenyReason::NotSpecific);
    assert!(denial.to_string().contains("not `*`"), "{denial}");
    assert!(!set.allows(
        &Principal::of(&admin),
        &Request::new(Action::Read, Resource::Any)
    ));
}

#[test]
fn unknown_roles_grant_nothing_and_are_reported() {
    let set = PolicySet::new(&[role("ops", vec![allow("read:service")])]).expect("valid");
    let who = user("u", &["ghost", "ops", "developr"], Some("a"));
    assert!(allowed(&set, &who, "read:service", Some("a")));
    assert!(!allowed(&set, &who, "write:service", Some("a")));
    assert_eq!(set.unknown_roles(&who), ["ghost", "developr"]);
    assert!(set.has_role("viewer") && set.has_role("ops") && !set.has_role("ghost"));
    let error = set.check_user(&who).expect_err("an unknown role");
    assert_eq!(
        error,
        PolicyError::UnknownRole {
            user: "u".into(),
            role: "ghost".into()
        }
    );
    assert!(error.to_string().contains("no role `ghost`"), "{error}");
    assert_eq!(
        set.check_user(&user("u", &["ops", "viewer"], Some("a"))),
        Ok(())
    );
    let error = set
        .check_user(&user("U", &["viewer"], None))
        .expect_err("bad user name");
    assert!(error.to_string().contains("cannot name a user"), "{error}");
    let error = set
        .check_user(&user("u", &["viewer"], Some("A b")))
        .expect_err("bad tenant name");
    assert!(
        error.to_string().contains("cannot name a tenant"),
        "{error}"
    );
}

#[test]
fn invalid_roles_are_refused_with_the_problem_named() {
    let mut no_actions = allow("read:service");
    no_actions.actions.clear();
    let mut no_resources = deny("read:service");
    no_resources.resources.clear();
    let no_tenants = rule(
        Effect::Allow,
        "read:service",
        TenantCondition::In(vec![]),
        &[],
    );
    let bad_tenant = rule(
        Effect::Allow,
        "read:service",
        TenantCondition::In(vec!["Blue".into()]),
        &[],
    );
    let bad_tag = rule(
        Effect::Allow,
        "read:service",
        TenantCondition::Own,
        &[("a b", "x")],
    );
    let cases = [
        (
            role("r", vec![allow("read:gate"), no_actions]),
            "rule 2 of role `r` lists no actions: write `*` to mean every action",
        ),
        (
            role("r", vec![no_resources]),
            "rule 1 of role `r` lists no resources",
        ),
        (role("r", vec![no_tenants]), "an empty list"),
        (role("r", vec![bad_tenant]), "`Blue` cannot name a tenant"),
        (
            role("r", vec![bad_tag]),
            "the tag `a b`, which is not a tag name",
        ),
        (
            role("viewer", vec![allow("*:*")]),
            "`viewer` is a built-in role: give the custom role another name",
        ),
        (role("Ops Team", vec![]), "`Ops Team` cannot name a role"),
        (
            role("big", vec![allow("read:service"); 10_001]),
            "role `big` has 10001 rules, more than the 10000",
        ),
    ];
    for (record, words) in cases {
        let error = check_role(&record).expect_err(words);
        assert!(error.to_string().contains(words), "{error} lacks {words}");
        let error = PolicySet::new([&record]).expect_err(words);
        assert!(error.to_string().contains(words), "{error} lacks {words}");
    }
    let twice = role("ops", vec![allow("read:service")]);
    let error = PolicySet::new([&twice, &twice]).expect_err("a duplicate");
    assert_eq!(
        error.to_string(),
        "role `ops` is given twice: each role has one definition"
    );
    assert_eq!(
        check_role(&role("empty", vec![])),
        Ok(()),
        "grants nothing, harms nothing"
    );
}

#[test]
fn stored_roles_that_fail_their_checks_deny_their_holders_everything() {
    let mut broken = deny("exec:instance");
    broken.actions.clear();
    let stored = [
        role("broken", vec![allow("read:service"), broken]),
        role("admin", vec![deny("*:*")]),
        role("fine", vec![allow("read:service")]),
    ];
    let (set, problems) = PolicySet::from_stored(&stored);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(matches!(
        problems[0],
        PolicyError::NoActions { rule: 2, .. }
    ));
    assert!(matches!(problems[1], PolicyError::BuiltinName { .. }));
    let holder = user("u", &["developer", "broken"], Some("a"));
    let Decision::Deny(denial) = check(&set, &holder, "read:service", Some("a"), &tags(&[])) else {
        panic!("fail closed")
    };
    assert_eq!(
        denial.reason,
        DenyReason::InvalidRole {
            role: "broken".into()
        }
    );
    assert!(
        denial.to_string().contains("role `broken` is invalid"),
        "{denial}"
    );
    let admin = user("root", &["admin"], None);
    assert!(
        allowed(&set, &admin, "delete:user", None),
        "a stored role cannot replace a built-in one"
    );
    assert!(allowed(
        &set,
        &user("f", &["fine"], None),
        "read:service",
        None
    ));
}

#[test]
fn visible_filters_a_list_as_reading_each_object_would() {
    let set = PolicySet::new(&[
        role(
            "red-reader",
            vec![rule(
                Effect::Allow,
                "read:service",
                TenantCondition::Any,
                &[("team", "red")],
            )],
        ),
        role(
            "hide-secret",
            vec![rule(
                Effect::Deny,
                "read:*",
                TenantCondition::Any,
                &[("hidden", "yes")],
            )],
        ),
    ])
    .expect("valid");
    let objects = [
        (Some("a"), tags(&[])),
        (Some("a"), tags(&[("hidden", "yes")])),
        (Some("b"), tags(&[("team", "red")])),
        (Some("b"), tags(&[])),
        (None, tags(&[("team", "red")])),
        (None, tags(&[])),
    ];
    let users = [
        user("dev", &["developer"], Some("a")),
        user(
            "dev2",
            &["developer", "red-reader", "hide-secret"],
            Some("a"),
        ),
        user("root", &["admin"], None),
        user("root2", &["admin", "hide-secret"], None),
        user("nobody", &["ghost"], Some("a")),
    ];
    for who in &users {
        let principal = Principal::of(who);
        let visible = set.visible(&principal, Resource::Service);
        let shown: Vec<bool> = objects
            .iter()
            .map(|(tenant, tags)| visible.shows(*tenant, tags))
            .collect();
        let read: Vec<bool> = objects
            .iter()
            .map(|(tenant, tags)| check(&set, who, "read:service", *tenant, tags).is_allowed())
            .collect();
        assert_eq!(shown, read, "{}", who.name);
        if visible.everything() {
            assert!(read.iter().all(|r| *r), "{}: everything", who.name);
        }
        if visible.nothing() {
            assert!(read.iter().all(|r| !*r), "{}: nothing", who.name);
        }
    }
    let everything = |name: &str| {
        let who = users.iter().find(|u| u.name == name).expect("a user");
        set.visible(&Principal::of(who), Resource::Service)
            .everything()
    };
    let nothing = |name: &str| {
        let who = users.iter().find(|u| u.name == name).expect("a user");
        set.visible(&Principal::of(who), Resource::Service)
            .nothing()
    };
    assert!(everything("root") && !nothing("root"));
    assert!(!everything("root2"), "a deny rule means filtering");
    assert!(!everything("dev") && !nothing("dev"));
    assert!(nothing("nobody"));
}

// The property tests: small universes so that random rules often apply.

const TENANTS: [&str; 3] = ["a", "b", "c"];
const TAG_KEYS: [&str; 2] = ["team", "env"];
const TAG_VALUES: [&str; 2] = ["x", "y"];
const ACTIONS: [Action; 3] = [Action::Read, Action::Exec, Action::Any];
const RESOURCES: [Resource; 3] = [Resource::Service, Resource::Secret, Resource::Any];

fn tenant_condition() -> impl Strategy<Value = TenantCondition> {
    prop_oneof![
        Just(TenantCondition::Own),
        Just(TenantCondition::Any),
        proptest::sample::subsequence(TENANTS.to_vec(), 1..=2).prop_map(|tenants| {
            TenantCondition::In(tenants.into_iter().map(str::to_owned).collect())
        }),
    ]
}

fn tag_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        proptest::sample::select(TAG_KEYS.to_vec()).prop_map(str::to_owned),
        proptest::sample::select(TAG_VALUES.to_vec()).prop_map(str::to_owned),
        0..=2,
    )
}

fn any_rule() -> impl Strategy<Value = Rule> {
    (
        prop_oneof![Just(Effect::Allow), Just(Effect::Allow), Just(Effect::Deny)],
        proptest::sample::subsequence(ACTIONS.to_vec(), 1..=2),
        proptest::sample::subsequence(RESOURCES.to_vec(), 1..=2),
        tenant_condition(),
        // Mostly no tags, so that several rules often apply at once and
        // which one a decision names is put to the test.
        prop_oneof![2 => Just(BTreeMap::new()), 1 => tag_map()],
    )
        .prop_map(|(effect, actions, resources, tenant, tags)| Rule {
            effect,
            actions,
            resources,
            when: Conditions { tenant, tags },
        })
}

fn roles() -> impl Strategy<Value = Vec<RoleRecord>> {
    proptest::collection::vec(proptest::collection::vec(any_rule(), 0..6), 1..4).prop_map(|roles| {
        roles
            .into_iter()
            .enumerate()
            .map(|(i, rules)| role(&format!("r{i}"), rules))
            .collect()
    })
}

#[derive(Clone, Debug)]
struct Case {
    roles: Vec<RoleRecord>,
    held: Vec<String>,
    tenant: Option<String>,
    action: Action,
    resource: Resource,
    object_tenant: Option<String>,
    object_tags: BTreeMap<String, String>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        roles(),
        proptest::collection::vec(
            prop_oneof![
                (0..4usize).prop_map(|i| format!("r{i}")),
                Just("viewer".to_owned()),
                Just("ghost".to_owned()),
            ],
            0..4,
        ),
        proptest::option::of(proptest::sample::select(TENANTS.to_vec())),
        proptest::sample::select(vec![Action::Read, Action::Exec, Action::Write]),
        proptest::sample::select(vec![Resource::Service, Resource::Secret, Resource::Node]),
        proptest::option::of(proptest::sample::select(TENANTS.to_vec())),
        tag_map(),
    )
        .prop_map(
            |(roles, held, tenant, action, resource, object_tenant, object_tags)| Case {
                roles,
                held,
                tenant: tenant.map(str::to_owned),
                action,
                resource,
                object_tenant: object_tenant.map(str::to_owned),
                object_tags,
            },
        )
}

impl Case {
    fn user(&self) -> UserRecord {
        UserRecord {
            name: "p".into(),
            roles: self.held.clone(),
            tenant: self.tenant.clone(),
            created_at: 0,
            created_by: String::new(),
        }
    }

    fn decide(&self, roles: &[RoleRecord]) -> Decision {
        let set = PolicySet::new(roles).expect("generated roles are valid");
        let user = self.user();
        let request = Request::new(self.action, self.resource)
            .in_tenant(self.object_tenant.as_deref())
            .tagged(&self.object_tags);
        let decision = set.decide(&Principal::of(&user), &request);
        let visible = set.visible(&Principal::of(&user), self.resource);
        if self.action == Action::Read {
            assert_eq!(
                visible.shows(self.object_tenant.as_deref(), &self.object_tags),
                decision.is_allowed(),
                "visible disagrees with decide"
            );
        }
        decision
    }

    /// The rule of the engine, written as a plain scan of every rule.
    fn model(&self) -> Option<(String, usize)> {
        let all: Vec<RoleRecord> = builtin_roles()
            .into_iter()
            .chain(self.roles.iter().cloned())
            .collect();
        let applies = |rule: &Rule| {
            let action = rule
                .actions
                .iter()
                .any(|a| *a == Action::Any || *a == self.action);
            let resource = rule
                .resources
                .iter()
                .any(|r| *r == Resource::Any || *r == self.resource);
            let tenant = match &rule.when.tenant {
                TenantCondition::Any => true,
                TenantCondition::Own => self.tenant.is_none() || self.object_tenant == self.tenant,
                TenantCondition::In(list) => self
                    .object_tenant
                    .as_ref()
                    .is_some_and(|t| list.contains(t)),
            };
            let tags = rule
                .when
                .tags
                .iter()
                .all(|(k, v)| self.object_tags.get(k) == Some(v));
            action && resource && tenant && tags
        };
        let mut allowed = None;
        for name in &self.held {
            let Some(role) = all.iter().find(|r| r.name == *name) else {
                continue;
            };
            let first = |effect| {
                role.rules
                    .iter()
                    .position(|rule| rule.effect == effect && applies(rule))
            };
            if first(Effect::Deny).is_some() {
                return None;
            }
            if allowed.is_none() {
                allowed = first(Effect::Allow).map(|index| (name.clone(), index));
            }
        }
        allowed
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_index_decides_as_a_scan_of_every_rule(case in case()) {
        let decision = case.decide(&case.roles);
        let expected = case.model();
        match (&decision, &expected) {
            (Decision::Allow { role, rule_index }, Some((want_role, want_index))) => {
                prop_assert_eq!(&**role, want_role.as_str());
                prop_assert_eq!(rule_index, want_index);
            }
            (Decision::Deny(_), None) => {}
            _ => prop_assert!(false, "engine {:?}, model {:?}", decision, expected),
        }
    }

    #[test]
    fn a_matching_deny_turns_any_allow_into_a_deny(case in case(), at in 0..4usize) {
        let Decision::Allow { .. } = case.decide(&case.roles) else {
            return Ok(());
        };
        // A deny rule that applies to exactly this request, added to one
        // custom role the user holds (built-ins cannot change).
        let held: Vec<usize> = (0..case.roles.len())
            .filter(|i| case.held.contains(&format!("r{i}")))
            .collect();
        prop_assume!(!held.is_empty());
        let target = held[at % held.len()];
        let mut roles = case.roles.clone();
        let index = at % (roles[target].rules.len() + 1);
        roles[target].rules.insert(index, Rule {
            effect: Effect::Deny,
            actions: vec![case.action],
            resources: vec![case.resource],
            when: Conditions {
                tenant: TenantCondition::Any,
                tags: case.object_tags.clone(),
            },
        });
        let Decision::Deny(denial) = case.decide(&roles) else {
            return Err(TestCaseError::fail("a matching deny rule did not win"));
        };
        let is_denied_by = matches!(denial.reason, DenyReason::DeniedBy { .. });
        prop_assert!(is_denied_by, "{:?}", denial.reason);
    }

    #[test]
    fn removing_deny_rules_never_turns_an_allow_into_a_deny(case in case()) {
        let was_allowed = case.decide(&case.roles).is_allowed();
        let mut roles = case.roles.clone();
        for role in &mut roles {
            role.rules.retain(|rule| rule.effect == Effect::Allow);
        }
        let now_allowed = case.decide(&roles).is_allowed();
        prop_assert!(!was_allowed || now_allowed);
        // And with no deny rules, allowing is exactly "some allow applies".
        let stripped = Case { roles, ..case };
        prop_assert_eq!(now_allowed, stripped.model().is_some());
    }
}
