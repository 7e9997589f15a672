//! Who may reach the cluster, as facts: join tokens (only a hash of their
//! secret), users and the roles they hold, custom roles and their rules —
//! and, as the trust work grows, revoked credentials. Plain data with no
//! logic but words and names: `cca-trust` decides what a record admits
//! (`cca_trust::policy` judges requests against roles), `cca-api` writes
//! and reads them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cluster::Millis;

/// `trust/revoked/{id}`: certificates taken back before they expire. The
/// id is `serial-{hex}` for one certificate, `{kind}-{name}` (`node-n1`,
/// `user-alice`) for an identity; revoking an identity again moves its
/// cutoff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationRecord {
    pub target: RevokedTarget,
    /// When it was revoked; for an identity, its certificates issued
    /// before this instant are refused, later ones (a node that joined
    /// again) are not.
    pub at: Millis,
    /// Who revoked it (`user:admin`).
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub reason: String,
}

/// What a revocation covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevokedTarget {
    /// The one certificate with this serial (lower-case hex).
    Serial { serial: String },
    /// Every certificate of `kind:name` (`node`, `user` or `server`).
    Identity { kind: String, name: String },
    /// One user token, by its `jti`, until it expires anyway.
    Token { jti: String, expires_at: Millis },
}

impl RevokedTarget {
    /// The record's id: its key's last segment.
    pub fn id(&self) -> String {
        match self {
            RevokedTarget::Serial { serial } => format!("serial-{serial}"),
            RevokedTarget::Identity { kind, name } => format!("{kind}-{name}"),
            RevokedTarget::Token { jti, .. } => format!("token-{jti}"),
        }
    }
}

/// `trust/token/{id}`: a join token as the server keeps it. The secret is
/// kept only as its SHA-256, so reading the store does not let anyone
/// join.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub id: String,
    /// SHA-256 of the secret, lower-case hex.
    pub secret_hash: String,
    pub created_at: Millis,
    /// The token admits no one from this instant on.
    pub expires_at: Millis,
    /// The only node this token may enrol, if any.
    #[serde(default)]
    pub node: Option<String>,
    /// How many more enrolments it allows; `None` for any number.
    #[serde(default)]
    pub uses_left: Option<u32>,
    #[serde(default)]
    pub revoked: bool,
    /// What the operator said it is for.
    #[serde(default)]
    pub description: String,
    /// Who made it (an identity such as `user:admin`), for `cca token ls`.
    #[serde(default)]
    pub created_by: String,
}

/// `trust/user/{name}`: a user and the roles they hold. Who they are is
/// proved elsewhere (a certificate or a token); this record says what
/// they may do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub name: String,
    /// Names of built-in or custom roles; a name no role has grants
    /// nothing.
    pub roles: Vec<String>,
    /// The tenant the user belongs to; `None` is cluster-wide: the
    /// `own` tenant condition then matches every object.
    #[serde(default)]
    pub tenant: Option<String>,
    pub created_at: Millis,
    /// Who made it (an identity such as `user:admin`).
    #[serde(default)]
    pub created_by: String,
}

/// `trust/role/{name}`: a custom role. The built-in roles (`admin`,
/// `operator`, `developer`, `viewer`) are not stored: `cca-trust` holds
/// them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRecord {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub rules: Vec<Rule>,
}

/// One rule of a role: it applies to a request whose action and resource
/// it lists and whose object meets its conditions. A deny rule that
/// applies wins over every allow rule; a request no allow rule applies to
/// is denied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub effect: Effect,
    /// Never empty: `*` (`Action::Any`) is written out, so a forgotten
    /// list is an error rather than a grant of everything.
    pub actions: Vec<Action>,
    /// Never empty, like `actions`.
    pub resources: Vec<Resource>,
    #[serde(default)]
    pub when: Conditions,
}

/// Whether a rule grants or refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    Allow,
    Deny,
}

/// What a request does to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Get, list, watch, describe.
    Read,
    /// Create or change: apply, scale, set a secret, drain a node, …
    Write,
    Delete,
    /// Read an instance's or service's output.
    Logs,
    /// Run a command in a workload.
    Exec,
    /// Every action, now and to come.
    #[serde(rename = "*")]
    Any,
}

/// The kind of object a request touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    Service,
    Instance,
    Gate,
    Connection,
    Secret,
    NetworkPolicy,
    Node,
    Event,
    Audit,
    User,
    Role,
    /// Join tokens.
    Token,
    /// The cluster as a whole: status, secret-key rotation,
    /// resume-replacement, …
    Cluster,
    /// Every kind of object, now and to come.
    #[serde(rename = "*")]
    Any,
}

/// When a rule applies, besides its actions and resources: every
/// condition must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conditions {
    #[serde(default)]
    pub tenant: TenantCondition,
    /// Every tag listed must be on the object with this value; an object
    /// without tags fails a non-empty list.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// Which tenants' objects a rule applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TenantCondition {
    /// Objects of the user's own tenant; for a user with no tenant
    /// (cluster-wide), every object.
    #[default]
    Own,
    /// Every object, of any tenant or none.
    Any,
    /// Objects of one of these tenants (never an object without one).
    In(Vec<String>),
}

impl Action {
    /// Every action but `*`, in the order they are listed to users.
    pub const CONCRETE: [Action; 5] = [
        Action::Read,
        Action::Write,
        Action::Delete,
        Action::Logs,
        Action::Exec,
    ];

    /// The word users write: `read`, …, `*`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
            Action::Delete => "delete",
            Action::Logs => "logs",
            Action::Exec => "exec",
            Action::Any => "*",
        }
    }
}

impl Resource {
    /// Every resource but `*`, in the order they are listed to users.
    pub const CONCRETE: [Resource; 13] = [
        Resource::Service,
        Resource::Instance,
        Resource::Gate,
        Resource::Connection,
        Resource::Secret,
        Resource::NetworkPolicy,
        Resource::Node,
        Resource::Event,
        Resource::Audit,
        Resource::User,
        Resource::Role,
        Resource::Token,
        Resource::Cluster,
    ];

    /// The word users write: `service`, `network-policy`, …, `*`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Service => "service",
            Resource::Instance => "instance",
            Resource::Gate => "gate",
            Resource::Connection => "connection",
            Resource::Secret => "secret",
            Resource::NetworkPolicy => "network-policy",
            Resource::Node => "node",
            Resource::Event => "event",
            Resource::Audit => "audit",
            Resource::User => "user",
            Resource::Role => "role",
            Resource::Token => "token",
            Resource::Cluster => "cluster",
            Resource::Any => "*",
        }
    }
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that names no action, resource or effect.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{word}` is not {what}: use one of {valid}")]
pub struct UnknownWord {
    pub word: String,
    /// "an action", "a resource", "an effect".
    pub what: &'static str,
    /// The valid words, comma-separated.
    pub valid: String,
}

fn parse_word<T: Copy>(
    word: &str,
    what: &'static str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, UnknownWord> {
    all.iter()
        .copied()
        .find(|candidate| name(*candidate) == word)
        .ok_or_else(|| UnknownWord {
            word: word.to_owned(),
            what,
            valid: all
                .iter()
                .map(|candidate| name(*candidate))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl FromStr for Action {
    type Err = UnknownWord;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        let mut all = Action::CONCRETE.to_vec();
        all.push(Action::Any);
        parse_word(word, "an action", &all, Action::as_str)
    }
}

impl FromStr for Resource {
    type Err = UnknownWord;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        let mut all = Resource::CONCRETE.to_vec();
        all.push(Resource::Any);
        parse_word(word, "a resource", &all, Resource::as_str)
    }
}

impl FromStr for Effect {
    type Err = UnknownWord;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        parse_word(
            word,
            "an effect",
            &[Effect::Allow, Effect::Deny],
            Effect::as_str,
        )
    }
}

impl fmt::Display for TenantCondition {
    /// `own`, `any`, `in a,b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantCondition::Own => f.write_str("own"),
            TenantCondition::Any => f.write_str("any"),
            TenantCondition::In(tenants) => write!(f, "in {}", tenants.join(",")),
        }
    }
}

impl fmt::Display for Rule {
    /// One line: `deny exec,logs on instance where tenant own, tag team=a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words = |words: Vec<&str>| words.join(",");
        write!(
            f,
            "{} {} on {} where tenant {}",
            self.effect,
            words(self.actions.iter().map(|a| a.as_str()).collect()),
            words(self.resources.iter().map(|r| r.as_str()).collect()),
            self.when.tenant,
        )?;
        for (key, value) in &self.when.tags {
            write!(f, ", tag {key}={value}")?;
        }
        Ok(())
    }
}

/// Why a name cannot be a user's, role's or tenant's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` cannot name a {kind}: {why}")]
pub struct BadName {
    pub name: String,
    /// "user", "role", "tenant".
    pub kind: &'static str,
    pub why: &'static str,
}

/// The name rule of users, roles and tenants: 1–63 characters of
/// lower-case letters, digits, `-`, `_` and `.`, starting with a letter
/// or digit. `cca_trust::identity::check_name` is this rule too, since a
/// user's name is also in their certificate's URI, and a role's or
/// tenant's in fact keys: nothing in them may need escaping.
pub fn check_name(kind: &'static str, name: &str) -> Result<(), BadName> {
    let bad = |why| {
        Err(BadName {
            name: name.to_owned(),
            kind,
            why,
        })
    };
    if name.is_empty() || name.len() > 63 {
        return bad("a name has 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("use lower-case letters, digits, `-`, `_` and `.` only");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("a name starts with a letter or a digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_unknown_words_list_the_valid_ones() {
        for action in Action::CONCRETE.into_iter().chain([Action::Any]) {
            assert_eq!(action.to_string().parse::<Action>(), Ok(action));
            let json = serde_json::to_string(&action).expect("serializes");
            assert_eq!(json, format!("\"{action}\""));
        }
        for resource in Resource::CONCRETE.into_iter().chain([Resource::Any]) {
            assert_eq!(resource.to_string().parse::<Resource>(), Ok(resource));
            let json = serde_json::to_string(&resource).expect("serializes");
            assert_eq!(json, format!("\"{resource}\""));
        }
        assert_eq!("network-policy".parse(), Ok(Resource::NetworkPolicy));
        let error = "reed".parse::<Action>().expect_err("a typo");
        assert_eq!(
            error.to_string(),
            "`reed` is not an action: use one of read, write, delete, logs, exec, *"
        );
        let error = "services".parse::<Resource>().expect_err("a plural");
        assert!(error.to_string().contains("service, instance"), "{error}");
        assert!("permit".parse::<Effect>().is_err());
    }

    #[test]
    fn a_rule_reads_back_from_its_json_with_defaults() {
        let rule: Rule = serde_json::from_str(
            r#"{"effect":"deny","actions":["exec","*"],"resources":["instance"],
                "when":{"tenant":{"in":["a","b"]},"tags":{"team":"red"}}}"#,
        )
        .expect("a rule");
        assert_eq!(rule.effect, Effect::Deny);
        assert_eq!(rule.actions, [Action::Exec, Action::Any]);
        assert_eq!(
            rule.when.tenant,
            TenantCondition::In(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            rule.to_string(),
            "deny exec,* on instance where tenant in a,b, tag team=red"
        );
        let bare: Rule =
            serde_json::from_str(r#"{"effect":"allow","actions":["read"],"resources":["*"]}"#)
                .expect("conditions default");
        assert_eq!(bare.when, Conditions::default());
        assert_eq!(bare.when.tenant, TenantCondition::Own);
        let json = serde_json::to_value(&bare).expect("serializes");
        assert_eq!(json["when"]["tenant"], "own");
    }

    #[test]
    fn names_follow_the_identity_rule() {
        assert_eq!(check_name("role", "ops-team.2"), Ok(()));
        for (name, why) in [
            ("", "1 to 63"),
            ("Ops", "lower-case"),
            ("a/b", "lower-case"),
            ("-x", "starts with"),
        ] {
            let error = check_name("tenant", name).expect_err(name);
            assert!(error.to_string().contains(why), "{error}");
            assert!(error.to_string().contains("a tenant"), "{error}");
        }
        assert!(check_name("user", &"a".repeat(64)).is_err());
    }
}
