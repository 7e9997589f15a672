//! Authorization: may this user do this to that object? Roles (the four
//! built-in ones and custom [`RoleRecord`]s) are compiled into a
//! [`PolicySet`], which judges each request with deny-overrides: a deny
//! rule that applies wins over every allow rule, and a request no allow
//! rule applies to is denied. Pure and synchronous: the API builds a set
//! from its cache of role facts, rebuilds it when a role changes, and asks
//! it on every request. Why a table of our own and not cedar-policy, what
//! each built-in role may do and what a decision costs is in
//! `docs/authorization.md`.
//!
//! A decision does not scan all rules: each role's rules are filed under
//! every (action, resource) pair they name, and within a pair by the
//! tenant an `in` condition names or by the rarest tag a rule asks for,
//! so a request looks at the few rules that could apply.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use cca_model::access::{
    self, Action, BadName, Conditions, Effect, Resource, RoleRecord, Rule, TenantCondition,
    UserRecord,
};
use cca_model::validity::{NAME_HELP, is_valid_name};

/// The names of the built-in roles, which custom roles may not take.
pub const BUILTIN_ROLES: [&str; 4] = ["admin", "operator", "developer", "viewer"];

/// Most rules a role may have: a bound on what one fact costs to compile.
pub const MAX_RULES: usize = 10_000;

/// The built-in roles as records, for `cca role` to show; they are not
/// stored.
pub fn builtin_roles() -> Vec<RoleRecord> {
    use Action::{Any as AnyAction, Delete, Exec, Logs, Read, Write};
    use Resource::*;
    let allow = |actions: &[Action], resources: &[Resource], tenant: TenantCondition| Rule {
        effect: Effect::Allow,
        actions: actions.to_vec(),
        resources: resources.to_vec(),
        when: Conditions {
            tenant,
            tags: BTreeMap::new(),
        },
    };
    let workloads = [Service, Instance, Gate, Connection, Secret, NetworkPolicy];
    let own = || TenantCondition::Own;
    vec![
        RoleRecord {
            name: "admin".into(),
            description: "everything, in every tenant".into(),
            rules: vec![allow(&[AnyAction], &[Resource::Any], TenantCondition::Any)],
        },
        RoleRecord {
            name: "operator".into(),
            description: "everything in its own tenant but users, roles, join tokens and \
                          the audit log"
                .into(),
            rules: vec![allow(
                &[AnyAction],
                &[
                    Service,
                    Instance,
                    Gate,
                    Connection,
                    Secret,
                    NetworkPolicy,
                    Node,
                    Event,
                    Cluster,
                ],
                own(),
            )],
        },
        RoleRecord {
            name: "developer".into(),
            description: "reads and changes workloads in its own tenant, their logs and exec; \
                          reads events, nodes and cluster status"
                .into(),
            rules: vec![
                allow(&[Read, Write, Delete, Logs, Exec], &workloads, own()),
                allow(&[Read], &[Event, Node, Cluster], own()),
            ],
        },
        RoleRecord {
            name: "viewer".into(),
            description: "reads workloads, events, nodes and cluster status in its own \
                          tenant; no logs, no exec"
                .into(),
            rules: vec![allow(
                &[Read],
                &[
                    Service,
                    Instance,
                    Gate,
                    Connection,
                    Secret,
                    NetworkPolicy,
                    Event,
                    Node,
                    Cluster,
                ],
                own(),
            )],
        },
    ]
}

/// Whether `name` is one of the built-in roles.
pub fn is_builtin(name: &str) -> bool {
    BUILTIN_ROLES.contains(&name)
}

/// Checks a custom role before it is stored or compiled: its name, and
/// that every rule says what it applies to. Rules are numbered from 1 in
/// errors, as `cca role` shows them.
pub fn check_role(role: &RoleRecord) -> Result<(), PolicyError> {
    access::check_name("role", &role.name)?;
    if is_builtin(&role.name) {
        return Err(PolicyError::BuiltinName {
            role: role.name.clone(),
        });
    }
    if role.rules.len() > MAX_RULES {
        return Err(PolicyError::TooManyRules {
            role: role.name.clone(),
            count: role.rules.len(),
        });
    }
    for (index, rule) in role.rules.iter().enumerate() {
        let at = || (role.name.clone(), index + 1);
        if rule.actions.is_empty() {
            let (role, rule) = at();
            return Err(PolicyError::NoActions { role, rule });
        }
        if rule.resources.is_empty() {
            let (role, rule) = at();
            return Err(PolicyError::NoResources { role, rule });
        }
        if let TenantCondition::In(tenants) = &rule.when.tenant {
            if tenants.is_empty() {
                let (role, rule) = at();
                return Err(PolicyError::NoTenants { role, rule });
            }
            for tenant in tenants {
                access::check_name("tenant", tenant)?;
            }
        }
        if let Some(key) = rule.when.tags.keys().find(|key| !is_valid_name(key)) {
            let (role, rule) = at();
            return Err(PolicyError::BadTag {
                role,
                rule,
                key: key.clone(),
            });
        }
    }
    Ok(())
}

/// Why a role or user cannot be taken as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    BadName(#[from] BadName),
    #[error("`{role}` is a built-in role: give the custom role another name")]
    BuiltinName { role: String },
    #[error("role `{role}` is given twice: each role has one definition")]
    DuplicateRole { role: String },
    #[error("rule {rule} of role `{role}` lists no actions: write `*` to mean every action")]
    NoActions { role: String, rule: usize },
    #[error(
        "rule {rule} of role `{role}` lists no resources: write `*` to mean every kind of object"
    )]
    NoResources { role: String, rule: usize },
    #[error(
        "rule {rule} of role `{role}` asks for a tenant `in` an empty list: name a tenant, \
         or use `own` or `any`"
    )]
    NoTenants { role: String, rule: usize },
    #[error(
        "rule {rule} of role `{role}` asks for the tag `{key}`, which is not a tag name: {NAME_HELP}"
    )]
    BadTag {
        role: String,
        rule: usize,
        key: String,
    },
    #[error("role `{role}` has {count} rules, more than the {MAX_RULES} a role may have: split it")]
    TooManyRules { role: String, count: usize },
    #[error(
        "there is no role `{role}` to give user `{user}`: the built-in roles are admin, \
         operator, developer and viewer; `cca role ls` lists the custom ones"
    )]
    UnknownRole { user: String, role: String },
}

/// The user a request is judged for, borrowed from their record (or a
/// token's claims) so that judging allocates nothing.
#[derive(Clone, Copy, Debug)]
pub struct Principal<'a> {
    pub name: &'a str,
    pub roles: &'a [String],
    /// `None` for a cluster-wide user.
    pub tenant: Option<&'a str>,
}

impl<'a> Principal<'a> {
    pub fn of(user: &'a UserRecord) -> Principal<'a> {
        Principal {
            name: &user.name,
            roles: &user.roles,
            tenant: user.tenant.as_deref(),
        }
    }
}

/// What a request does: one action on one kind of object, with the
/// object's tenant and tags (none for cluster-wide objects such as
/// nodes). A request for `*` is never allowed: the API names what it does.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub action: Action,
    pub resource: Resource,
    pub object_tenant: Option<&'a str>,
    pub object_tags: &'a BTreeMap<String, String>,
}

static NO_TAGS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> Request<'a> {
    /// A request on an object with no tenant and no tags.
    pub fn new(action: Action, resource: Resource) -> Request<'a> {
        Request {
            action,
            resource,
            object_tenant: None,
            object_tags: &NO_TAGS,
        }
    }

    pub fn in_tenant(mut self, tenant: Option<&'a str>) -> Request<'a> {
        self.object_tenant = tenant;
        self
    }

    pub fn tagged(mut self, tags: &'a BTreeMap<String, String>) -> Request<'a> {
        self.object_tags = tags;
        self
    }
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by `rules[rule_index]` (counted from 0) of `role`; no deny
    /// rule applied.
    Allow {
        role: Arc<str>,
        rule_index: usize,
    },
    Deny(Denial),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Why a request was denied, in words fit for the 403 the caller gets
/// (its `Display`). It names only what the caller knows already: their own
/// name, roles and tenant, and what the request itself named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub user: String,
    pub roles: Vec<String>,
    pub tenant: Option<String>,
    pub action: Action,
    pub resource: Resource,
    pub object_tenant: Option<String>,
    pub reason: DenyReason,
}

/// The rule, or the lack of one, behind a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// No allow rule of the user's roles applies.
    NoRuleAllows,
    /// `rules[rule_index]` (counted from 0) of `role`, a deny rule,
    /// applies.
    DeniedBy { role: String, rule_index: usize },
    /// The user holds a stored role that does not pass [`check_role`]:
    /// it denies its holders everything until it is fixed, since a deny
    /// rule it holds could not be read.
    InvalidRole { role: String },
    /// The request's action or resource was `*`: a server bug, not the
    /// user's.
    NotSpecific,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user `{}` (", self.user)?;
        if self.roles.is_empty() {
            f.write_str("no roles")?;
        } else {
            write!(f, "roles {}", self.roles.join(", "))?;
        }
        match &self.tenant {
            Some(tenant) => write!(f, ", tenant `{tenant}`)")?,
            None => f.write_str(", cluster-wide)")?,
        }
        let verb = match self.action {
            Action::Read => "read",
            Action::Write => "write",
            Action::Delete => "delete",
            Action::Logs => "read the logs of",
            Action::Exec => "exec into",
            Action::Any => "do anything to",
        };
        let object = match self.resource {
            Resource::Any => "any object",
            resource => resource.as_str(),
        };
        write!(f, " may not {verb} {object}")?;
        // Another tenant's name is not the user's to learn.
        match (&self.object_tenant, &self.tenant) {
            (Some(object), Some(own)) if object != own => f.write_str(" of another tenant")?,
            (Some(object), _) => write!(f, " in tenant `{object}`")?,
            (None, _) => {}
        }
        match &self.reason {
            DenyReason::NoRuleAllows => f.write_str(": no rule allows it"),
            DenyReason::DeniedBy { role, rule_index } => {
                write!(f, ": denied by rule {} of role `{role}`", rule_index + 1)
            }
            DenyReason::InvalidRole { role } => write!(
                f,
                ": role `{role}` is invalid, and denies everything until an administrator fixes it"
            ),
            DenyReason::NotSpecific => {
                f.write_str(": a request names one action and one kind of object, not `*`")
            }
        }
    }
}

/// The built-in roles and a cluster's custom roles, compiled for judging
/// requests. Cheap to share (`Arc` it) and cheap enough to rebuild when a
/// role changes (see `docs/authorization.md` for the figures).
#[derive(Clone, Debug)]
pub struct PolicySet {
    roles: HashMap<Box<str>, CompiledRole>,
}

impl PolicySet {
    /// The built-in roles and `custom`, every custom role checked with
    /// [`check_role`]; the first problem is the error. For roles about to
    /// be stored, and in tests.
    pub fn new<'r>(custom: impl IntoIterator<Item = &'r RoleRecord>) -> Result<Self, PolicyError> {
        let mut set = PolicySet::builtin();
        for record in custom {
            check_role(record)?;
            if set.roles.contains_key(record.name.as_str()) {
                return Err(PolicyError::DuplicateRole {
                    role: record.name.clone(),
                });
            }
            set.roles
                .insert(record.name.as_str().into(), CompiledRole::compile(record));
        }
        Ok(set)
    }

    /// Like [`new`](Self::new), but never fails, for roles read back from
    /// the store (where one bad fact must not stop every request): a role
    /// that fails [`check_role`] or comes twice denies its holders
    /// everything, fail-closed, and a stored role with a built-in name is
    /// ignored (the built-in one stays). The problems come back to be
    /// logged.
    pub fn from_stored<'r>(
        custom: impl IntoIterator<Item = &'r RoleRecord>,
    ) -> (Self, Vec<PolicyError>) {
        let mut set = PolicySet::builtin();
        let mut problems = Vec::new();
        for record in custom {
            let compiled = match check_role(record) {
                Ok(()) if set.roles.contains_key(record.name.as_str()) => {
                    problems.push(PolicyError::DuplicateRole {
                        role: record.name.clone(),
                    });
                    CompiledRole::invalid(&record.name)
                }
                Ok(()) => CompiledRole::compile(record),
                Err(problem @ PolicyError::BuiltinName { .. }) => {
                    problems.push(problem);
                    continue;
                }
                Err(problem) => {
                    problems.push(problem);
                    CompiledRole::invalid(&record.name)
                }
            };
            set.roles.insert(record.name.as_str().into(), compiled);
        }
        (set, problems)
    }

    fn builtin() -> PolicySet {
        let mut roles = HashMap::new();
        for record in builtin_roles() {
            roles.insert(record.name.as_str().into(), CompiledRole::compile(&record));
        }
        PolicySet { roles }
    }

    /// Whether a role of this name exists, built-in or custom.
    pub fn has_role(&self, name: &str) -> bool {
        self.roles.contains_key(name)
    }

    /// The roles `user` holds that do not exist (they grant nothing), for
    /// the API to warn about.
    pub fn unknown_roles<'u>(&self, user: &'u UserRecord) -> Vec<&'u str> {
        user.roles
            .iter()
            .map(String::as_str)
            .filter(|role| !self.has_role(role))
            .collect()
    }

    /// Checks a user record before it is stored: its name, its tenant's
    /// name, and that every role it holds exists.
    pub fn check_user(&self, user: &UserRecord) -> Result<(), PolicyError> {
        access::check_name("user", &user.name)?;
        if let Some(tenant) = &user.tenant {
            access::check_name("tenant", tenant)?;
        }
        match self.unknown_roles(user).first() {
            Some(role) => Err(PolicyError::UnknownRole {
                user: user.name.clone(),
                role: (*role).to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// Judges `request` for `principal`: allowed when an allow rule of one
    /// of its roles applies and no deny rule of any of them does. A role
    /// name no role has grants nothing.
    pub fn decide(&self, principal: &Principal<'_>, request: &Request<'_>) -> Decision {
        let reason = match self.evaluate(principal, request) {
            Verdict::Allow { role, rule } => {
                return Decision::Allow {
                    role: role.name.clone(),
                    rule_index: rule as usize,
                };
            }
            Verdict::NoRule => DenyReason::NoRuleAllows,
            Verdict::Denied { role, rule } => DenyReason::DeniedBy {
                role: role.name.to_string(),
                rule_index: rule as usize,
            },
            Verdict::Invalid { role } => DenyReason::InvalidRole {
                role: role.name.to_string(),
            },
            Verdict::NotSpecific => DenyReason::NotSpecific,
        };
        Decision::Deny(Denial {
            user: principal.name.to_owned(),
            roles: principal.roles.to_vec(),
            tenant: principal.tenant.map(str::to_owned),
            action: request.action,
            resource: request.resource,
            object_tenant: request.object_tenant.map(str::to_owned),
            reason,
        })
    }

    /// [`decide`](Self::decide) without the explanation (and its
    /// allocations).
    pub fn allows(&self, principal: &Principal<'_>, request: &Request<'_>) -> bool {
        matches!(self.evaluate(principal, request), Verdict::Allow { .. })
    }

    /// Which objects of `resource` `principal` may read, for filtering a
    /// list: the role look-ups are done once here, and each object is then
    /// judged only on its tenant and tags.
    pub fn visible<'a>(&'a self, principal: &Principal<'a>, resource: Resource) -> Visible<'a> {
        let mut visible = Visible {
            principal_tenant: principal.tenant,
            slots: Vec::new(),
            nothing: true,
            everything: false,
        };
        let Some(slot) = slot_of(Action::Read, resource) else {
            return visible;
        };
        let mut denies = false;
        for name in principal.roles {
            let Some(role) = self.roles.get(name.as_str()) else {
                continue;
            };
            if role.invalid {
                visible.slots.clear();
                visible.nothing = true;
                visible.everything = false;
                return visible;
            }
            let Some(found) = role.slot(slot) else {
                continue;
            };
            denies |= !found.deny.is_empty();
            visible.nothing &= found.allow.is_empty();
            // `plain` rules ask for no tags: one whose tenant condition
            // holds for every object shows everything.
            visible.everything |=
                found
                    .allow
                    .plain
                    .iter()
                    .any(|&rule| match role.conds[rule as usize].tenant {
                        TenantMatch::Any => true,
                        TenantMatch::Own => principal.tenant.is_none(),
                        TenantMatch::In(_) => false,
                    });
            visible.slots.push((role, found));
        }
        visible.everything &= !denies;
        visible
    }

    fn evaluate<'s>(&'s self, principal: &Principal<'_>, request: &Request<'_>) -> Verdict<'s> {
        let Some(slot) = slot_of(request.action, request.resource) else {
            return Verdict::NotSpecific;
        };
        let object = Object {
            principal_tenant: principal.tenant,
            tenant: request.object_tenant,
            tags: request.object_tags,
        };
        let mut allowed = None;
        for name in principal.roles {
            let Some(role) = self.roles.get(name.as_str()) else {
                continue;
            };
            if role.invalid {
                return Verdict::Invalid { role };
            }
            let Some(found) = role.slot(slot) else {
                continue;
            };
            if let Some(rule) = found.deny.first_match(&role.conds, &object) {
                return Verdict::Denied { role, rule };
            }
            if allowed.is_none() {
                allowed = found
                    .allow
                    .first_match(&role.conds, &object)
                    .map(|rule| Verdict::Allow { role, rule });
            }
        }
        allowed.unwrap_or(Verdict::NoRule)
    }
}

/// Which objects of one kind a principal may read: see
/// [`PolicySet::visible`].
#[derive(Debug)]
pub struct Visible<'a> {
    principal_tenant: Option<&'a str>,
    slots: Vec<(&'a CompiledRole, &'a Slot)>,
    nothing: bool,
    everything: bool,
}

impl Visible<'_> {
    /// No object of the kind is visible: the list can be skipped.
    pub fn nothing(&self) -> bool {
        self.nothing
    }

    /// Every object of the kind is visible: the list needs no filter.
    pub fn everything(&self) -> bool {
        self.everything
    }

    /// Whether an object with this tenant and these tags is visible.
    pub fn shows(
        &self,
        object_tenant: Option<&str>,
        object_tags: &BTreeMap<String, String>,
    ) -> bool {
        if self.everything {
            return true;
        }
        let object = Object {
            principal_tenant: self.principal_tenant,
            tenant: object_tenant,
            tags: object_tags,
        };
        let mut allowed = false;
        for (role, slot) in &self.slots {
            if slot.deny.first_match(&role.conds, &object).is_some() {
                return false;
            }
            allowed = allowed || slot.allow.first_match(&role.conds, &object).is_some();
        }
        allowed
    }
}

enum Verdict<'s> {
    Allow { role: &'s CompiledRole, rule: u32 },
    NoRule,
    Denied { role: &'s CompiledRole, rule: u32 },
    Invalid { role: &'s CompiledRole },
    NotSpecific,
}

const ACTIONS: usize = Action::CONCRETE.len();
const SLOTS: usize = ACTIONS * Resource::CONCRETE.len();

/// The slot number of a concrete (action, resource) pair.
fn slot_of(action: Action, resource: Resource) -> Option<usize> {
    let action = Action::CONCRETE.iter().position(|a| *a == action)?;
    let resource = Resource::CONCRETE.iter().position(|r| *r == resource)?;
    Some(resource * ACTIONS + action)
}

/// What a condition is checked against.
struct Object<'a> {
    principal_tenant: Option<&'a str>,
    tenant: Option<&'a str>,
    tags: &'a BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
struct CompiledRole {
    name: Arc<str>,
    /// Slot number → 1 + index in `slots`, or 0 when the role has no rule
    /// for that pair.
    index: [u8; SLOTS],
    slots: Vec<Slot>,
    /// Each rule's conditions, by rule index.
    conds: Vec<Cond>,
    /// A stored role that failed its checks: denies everything.
    invalid: bool,
}

impl CompiledRole {
    fn invalid(name: &str) -> CompiledRole {
        CompiledRole {
            name: name.into(),
            index: [0; SLOTS],
            slots: Vec::new(),
            conds: Vec::new(),
            invalid: true,
        }
    }

    fn compile(record: &RoleRecord) -> CompiledRole {
        let mut role = CompiledRole {
            invalid: false,
            ..CompiledRole::invalid(&record.name)
        };
        // Rules that ask for tags are filed under the tag fewest of the
        // role's rules ask for, so that a lookup finds few candidates.
        let mut tag_counts: HashMap<(&str, &str), u32> = HashMap::new();
        for rule in &record.rules {
            for (key, value) in &rule.when.tags {
                *tag_counts.entry((key, value)).or_default() += 1;
            }
        }
        for (index, rule) in record.rules.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            role.conds.push(Cond::new(&rule.when));
            let rarest = rule
                .when
                .tags
                .iter()
                .min_by_key(|(key, value)| tag_counts.get(&(key.as_str(), value.as_str())));
            let mut actions = [false; ACTIONS];
            for action in &rule.actions {
                match Action::CONCRETE.iter().position(|a| a == action) {
                    Some(at) => actions[at] = true,
                    None => actions = [true; ACTIONS],
                }
            }
            let mut resources = [false; Resource::CONCRETE.len()];
            for resource in &rule.resources {
                match Resource::CONCRETE.iter().position(|r| r == resource) {
                    Some(at) => resources[at] = true,
                    None => resources = [true; Resource::CONCRETE.len()],
                }
            }
            for (resource, _) in resources.iter().enumerate().filter(|(_, on)| **on) {
                for (action, _) in actions.iter().enumerate().filter(|(_, on)| **on) {
                    let slot = role.slot_mut(resource * ACTIONS + action);
                    let group = match rule.effect {
                        Effect::Allow => &mut slot.allow,
                        Effect::Deny => &mut slot.deny,
                    };
                    group.file(index, &rule.when.tenant, rarest);
                }
            }
        }
        role
    }

    fn slot(&self, slot: usize) -> Option<&Slot> {
        let at = usize::from(self.index[slot]).checked_sub(1)?;
        self.slots.get(at)
    }

    fn slot_mut(&mut self, slot: usize) -> &mut Slot {
        if self.index[slot] == 0 {
            self.slots.push(Slot::default());
            // At most SLOTS (65) entries: fits a u8.
            self.index[slot] = u8::try_from(self.slots.len()).unwrap_or(u8::MAX);
        }
        let at = usize::from(self.index[slot]) - 1;
        &mut self.slots[at]
    }
}

/// The rules of one role for one (action, resource) pair.
#[derive(Clone, Debug, Default)]
struct Slot {
    deny: Group,
    allow: Group,
}

/// Rules of one effect in a slot, by rule index, filed so a lookup
/// touches only candidates; each list is in rule order.
#[derive(Clone, Debug, Default)]
struct Group {
    /// No tags, tenant `own` or `any`: checked one by one.
    plain: Vec<u32>,
    /// No tags, tenant `in`: under each tenant named, and then they apply.
    by_tenant: HashMap<Box<str>, Vec<u32>>,
    /// With tags: under their rarest tag, then checked in full.
    by_tag: HashMap<Box<str>, HashMap<Box<str>, Vec<u32>>>,
}

impl Group {
    fn file(&mut self, rule: u32, tenant: &TenantCondition, rarest: Option<(&String, &String)>) {
        let push = |list: &mut Vec<u32>| {
            if list.last() != Some(&rule) {
                list.push(rule);
            }
        };
        match (rarest, tenant) {
            (Some((key, value)), _) => push(
                self.by_tag
                    .entry(key.as_str().into())
                    .or_default()
                    .entry(value.as_str().into())
                    .or_default(),
            ),
            (None, TenantCondition::In(tenants)) => {
                for tenant in tenants {
                    push(self.by_tenant.entry(tenant.as_str().into()).or_default());
                }
            }
            (None, TenantCondition::Own | TenantCondition::Any) => push(&mut self.plain),
        }
    }

    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.by_tenant.is_empty() && self.by_tag.is_empty()
    }

    /// The lowest-numbered rule of the group that applies to `object`.
    fn first_match(&self, conds: &[Cond], object: &Object<'_>) -> Option<u32> {
        let applies = |rule: &&u32| conds[**rule as usize].applies(object);
        let mut best = self.plain.iter().find(applies).copied();
        let mut consider = |rule: u32| {
            best = Some(best.map_or(rule, |best| best.min(rule)));
        };
        if let Some(tenant) = object.tenant
            && !self.by_tenant.is_empty()
            && let Some(rules) = self.by_tenant.get(tenant)
            && let Some(&rule) = rules.first()
        {
            consider(rule);
        }
        if !self.by_tag.is_empty() {
            for (key, value) in object.tags {
                if let Some(rules) = self
                    .by_tag
                    .get(key.as_str())
                    .and_then(|v| v.get(value.as_str()))
                    && let Some(&rule) = rules.iter().find(applies)
                {
                    consider(rule);
                }
            }
        }
        best
    }
}

/// A rule's conditions, compiled.
#[derive(Clone, Debug)]
struct Cond {
    tenant: TenantMatch,
    tags: Box<[(Box<str>, Box<str>)]>,
}

#[derive(Clone, Debug)]
enum TenantMatch {
    Own,
    Any,
    In(Box<[Box<str>]>),
}

impl Cond {
    fn new(conditions: &Conditions) -> Cond {
        Cond {
            tenant: match &conditions.tenant {
                TenantCondition::Own => TenantMatch::Own,
                TenantCondition::Any => TenantMatch::Any,
                TenantCondition::In(tenants) => {
                    TenantMatch::In(tenants.iter().map(|t| t.as_str().into()).collect())
                }
            },
            tags: conditions
                .tags
                .iter()
                .map(|(key, value)| (key.as_str().into(), value.as_str().into()))
                .collect(),
        }
    }

    fn applies(&self, object: &Object<'_>) -> bool {
        let tenant = match &self.tenant {
            TenantMatch::Any => true,
            TenantMatch::Own => match object.principal_tenant {
                None => true,
                own => object.tenant == own,
            },
            TenantMatch::In(tenants) => object
                .tenant
                .is_some_and(|tenant| tenants.iter().any(|t| **t == *tenant)),
        };
        tenant
            && self.tags.iter().all(|(key, value)| {
                object
                    .tags
                    .get(&**key)
                    .is_some_and(|found| found.as_str() == &**value)
            })
    }
}
