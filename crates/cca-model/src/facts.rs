//! The table of fact kinds: for every kind of fact the cluster keeps, its
//! key pattern, its owner (the one component that writes it), the type of
//! its value and whether `cca apply` manages it. Everything else is derived
//! from this table: the typed [`Key`] that parses and prints itself, the
//! decoded [`Value`], the ownership check, apply's program-managed kinds and
//! the control plane's cache. Adding a kind of fact is one row here plus its
//! consumer; no other crate spells a key string.
//!
//! A pattern is literal text with `{}` for one segment: a non-empty string
//! without `/`. So `desired/service/web` and `desired/service/web/tag/team`
//! never match each other's pattern, and the order of rows does not matter.

use std::fmt;
use std::sync::Arc;

use crate::access::{JoinTokenRecord, RevocationRecord, RoleRecord, UserRecord};
use crate::autoscale::Autoscaled;
use crate::cluster::{
    ApplyChunk, ApplyCommit, AuditRecord, DesiredGeneration, Disruption, Endpoints, Event,
    Heartbeat, HeldPorts, Instance, InstanceStatus, LeaderRecord, NodeControl, NodeInfo,
    NodeStatus, ReplacementResume, ServiceMeta, Unplaced,
};
use crate::net::{FlowHashSeed, NodeSubnet, ServiceVip};
use crate::ownership::Owner;
use crate::recovery::{StoreIdentity, Unclaimed};
use crate::rollout::{Rollout, RolloutControl};
use crate::scale::{GateActivity, ScaleState};
use crate::spec::{
    ConnectionSpec, GateSpec, NetworkPolicy, SealedSecret, SecretGrant, SecretSpec, ServiceSpec,
    ServiceVersion,
};
use crate::usage::NodeUsage;
use crate::vertical::VerticalScaled;

/// One row of the table, as data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindInfo {
    pub kind: Kind,
    /// The key with `{}` for each variable segment.
    pub pattern: &'static str,
    pub owner: Owner,
    /// True when programs (`cca apply`) create, change and prune it.
    pub applied: bool,
    /// What the fact is, for docs and errors.
    pub about: &'static str,
}

macro_rules! fact_kinds {
    ($(
        $(#[doc = $doc:literal])+
        $kind:ident { $($field:ident),* } = $pattern:literal,
            $value:ty, $owner:expr, applied: $applied:literal;
    )+) => {
        /// A kind of fact: one row of the table.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($(#[doc = $doc])+ $kind,)+
        }

        impl Kind {
            /// Every kind, in table order.
            pub const ALL: &'static [Kind] = &[$(Kind::$kind),+];

            /// The row of this kind.
            pub fn info(self) -> KindInfo {
                match self {
                    $(Kind::$kind => KindInfo {
                        kind: self,
                        pattern: $pattern,
                        owner: $owner,
                        applied: $applied,
                        about: concat!($($doc),+),
                    },)+
                }
            }

            /// The key pattern (`{}` per segment).
            pub fn pattern(self) -> &'static str {
                match self {
                    $(Kind::$kind => $pattern,)+
                }
            }
        }

        /// A typed key: which fact, with the names in it. Parses from and
        /// prints to the store's key string.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Key {
            $($(#[doc = $doc])+ $kind { $($field: String),* },)+
        }

        impl Key {
            /// The kind of fact this key names.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Key::$kind { .. } => Kind::$kind,)+
                }
            }

            /// The variable segments, in pattern order.
            fn segments(&self) -> Vec<&str> {
                match self {
                    $(Key::$kind { $($field),* } => vec![$($field.as_str()),*],)+
                }
            }

            /// Builds a key of `kind` from its segments (as many as the
            /// pattern has, checked by the caller).
            fn from_segments(kind: Kind, segments: Vec<&str>) -> Option<Key> {
                let mut segments = segments.into_iter();
                let key = match kind {
                    $(Kind::$kind => Key::$kind {
                        $($field: segments.next()?.to_owned(),)*
                    },)+
                };
                segments.next().is_none().then_some(key)
            }
        }

        /// A decoded fact value, shared: the cache hands the same value to
        /// its view and to every change subscriber.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Value {
            $($kind(Arc<$value>),)+
        }

        impl Value {
            /// Decodes the JSON `bytes` of a fact of `kind`.
            pub fn decode(kind: Kind, bytes: &[u8]) -> Result<Value, serde_json::Error> {
                Ok(match kind {
                    $(Kind::$kind => Value::$kind(Arc::new(serde_json::from_slice(bytes)?)),)+
                })
            }

            /// The kind of fact this value belongs to.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Value::$kind(_) => Kind::$kind,)+
                }
            }
        }
    };
}

fact_kinds! {
    /// A service's current spec, compiled from a program.
    Service { service } = "desired/service/{}",
        ServiceSpec, Owner::Api, applied: true;
    /// One user tag of a service.
    ServiceTag { service, tag } = "desired/service/{}/tag/{}",
        String, Owner::Api, applied: true;
    /// A service's grant to read a secret.
    ServiceGrant { service, secret } = "desired/service/{}/secret/{}",
        SecretGrant, Owner::Api, applied: true;
    /// One version of a service's spec, by its spec hash: kept while an
    /// instance runs it and for a bounded history after (apply writes and
    /// prunes it itself; a program never names it).
    ServiceVersion { service, version } = "desired/service/{}/version/{}",
        ServiceVersion, Owner::Api, applied: false;
    /// When a service was first and last applied.
    ServiceMeta { service } = "desired/service-meta/{}",
        ServiceMeta, Owner::Api, applied: false;
    /// External HTTP(S) entry to a service.
    Gate { gate } = "desired/gate/{}",
        GateSpec, Owner::Api, applied: true;
    /// The parts of a connection URL.
    Connection { connection } = "desired/connection/{}",
        ConnectionSpec, Owner::Api, applied: true;
    /// A secret a program declares (kept apart from its value, so that
    /// applying a program never overwrites a value).
    SecretDeclaration { secret } = "desired/secret-decl/{}",
        SecretSpec, Owner::Api, applied: true;
    /// A secret's value, sealed under the cluster's secret key; written only
    /// by `cca secret set|rm`.
    Secret { secret } = "desired/secret/{}",
        SealedSecret, Owner::Api, applied: false;
    /// Allow/deny rules between services.
    NetworkPolicy { policy } = "desired/network/policy/{}",
        NetworkPolicy, Owner::Api, applied: true;
    /// An operator's word on a service's rollout (`cca rollout
    /// pause|resume|undo`).
    RolloutControl { service } = "desired/rollout/{}",
        RolloutControl, Owner::Api, applied: false;
    /// An operator's drain/disable intent for a node.
    NodeControl { node } = "desired/node/{}",
        NodeControl, Owner::Api, applied: false;
    /// An operator's word that the nodes missing during a pause of
    /// lost-node replacement are gone: the pause ends.
    ReplacementResume {} = "desired/replacement-resume",
        ReplacementResume, Owner::Api, applied: false;
    /// One placed instance of a service.
    Instance { service, id } = "derived/instance/{}/{}",
        Instance, Owner::Controller("scheduler"), applied: false;
    /// Demand of a service the scheduler could not place, and why.
    Unplaced { service } = "derived/unplaced/{}",
        Unplaced, Owner::Controller("scheduler"), applied: false;
    /// A node's condition as the node controller sees it.
    NodeStatus { node } = "derived/node/{}",
        NodeStatus, Owner::Controller("node"), applied: false;
    /// Whether the node controller trusts lost leases: paused lost-node
    /// replacement when many nodes missed their leases at once.
    Disruption {} = "derived/disruption",
        Disruption, Owner::Controller("node"), applied: false;
    /// The ready backends of one service port.
    Endpoint { service, port } = "derived/endpoint/{}/{}",
        Endpoints, Owner::Controller("endpoint"), applied: false;
    /// Whether a service with `scale_to_zero` sleeps. The scale
    /// controller puts it to sleep; the API's wake route also writes it
    /// (compare-and-swap, like the controller), so a request held at a
    /// gate wakes it without waiting for a controller pass.
    Scale { service } = "derived/scale/{}",
        ScaleState, Owner::Controller("scale"), applied: false;
    /// The version a service's instances are rolled to, and why: an
    /// apply, an undo or an automatic rollback.
    Rollout { service } = "derived/rollout/{}",
        Rollout, Owner::Controller("lifecycle"), applied: false;
    /// The replica count an autoscaled service runs at, and why.
    Autoscale { service } = "derived/autoscale/{}",
        Autoscaled, Owner::Controller("lifecycle"), applied: false;
    /// The usage window of a service with vertical autoscaling and the
    /// sizes it recommends.
    Vertical { service } = "derived/vertical/{}",
        VerticalScaled, Owner::Controller("lifecycle"), applied: false;
    /// A node's slice of the cluster CIDR.
    Subnet { node } = "derived/subnet/{}",
        NodeSubnet, Owner::Controller("network"), applied: false;
    /// A service's virtual IP from the service CIDR.
    Vip { service } = "derived/vip/{}",
        ServiceVip, Owner::Controller("network"), applied: false;
    /// A node's registration: capacity, labels, addresses.
    Node { node } = "observed/node/{}",
        NodeInfo, Owner::Agent, applied: false;
    /// A node's liveness, attached to its agent's lease.
    Heartbeat { node } = "observed/heartbeat/{}",
        Heartbeat, Owner::Agent, applied: false;
    /// When a gate node last forwarded a request to each service.
    GateActivity { node } = "observed/gate-activity/{}",
        GateActivity, Owner::Agent, applied: false;
    /// Host ports something outside the cluster holds on a node.
    HeldPorts { node } = "observed/held-ports/{}",
        HeldPorts, Owner::Agent, applied: false;
    /// Instances a node runs that the store does not place there, offered
    /// for adoption after the node resynced with another store.
    Unclaimed { node } = "observed/unclaimed/{}",
        Unclaimed, Owner::Agent, applied: false;
    /// What a node and its running instances used over the last period.
    Usage { node } = "observed/usage/{}",
        NodeUsage, Owner::Agent, applied: false;
    /// An instance's state as its agent reports it.
    InstanceStatus { id } = "observed/instance/{}",
        InstanceStatus, Owner::Agent, applied: false;
    /// One entry of the event log (`{at:013}-{seq:010}-{origin:08x}`: sorts
    /// by time; see `keys::EventIds`).
    Event { id } = "events/{}",
        Event, Owner::Server, applied: false;
    /// One entry of the audit log (`{at:013}-{seq:010}-{origin:08x}`, as
    /// events): a request that changed something, or one refused.
    Audit { id } = "audit/{}",
        AuditRecord, Owner::Server, applied: false;
    /// A join token, with only the SHA-256 of its secret (`cca token
    /// create`; spent by `POST /v1/join`).
    JoinToken { id } = "trust/token/{}",
        JoinTokenRecord, Owner::Api, applied: false;
    /// A user and the roles they hold (`cca user create`).
    User { name } = "trust/user/{}",
        UserRecord, Owner::Api, applied: false;
    /// A custom role (`cca role create`); the built-in ones are not stored.
    Role { name } = "trust/role/{}",
        RoleRecord, Owner::Api, applied: false;
    /// Certificates taken back before they expire (`cca cert revoke`):
    /// refused from the next handshake on.
    Revocation { id } = "trust/revoked/{}",
        RevocationRecord, Owner::Api, applied: false;
    /// The leader lease; its mod revision is the fencing token.
    Leader {} = "meta/leader",
        LeaderRecord, Owner::Server, applied: false;
    /// The cluster's flow-hash seed (eBPF data plane): made once, sent to
    /// every node with the address ranges, so all nodes pick the same
    /// backend for a flow. Secret: who knows it can steer flows.
    FlowHashSeed {} = "meta/flow-hash-seed",
        FlowHashSeed, Owner::Server, applied: false;
    /// The store's identity: made with it, kept by backups, replaced by a
    /// restore.
    StoreIdentity {} = "meta/store",
        StoreIdentity, Owner::Server, applied: false;
    /// Bumped by every write of program-managed facts: an apply too large
    /// for one transaction guards its commit on this one key.
    DesiredGeneration {} = "meta/desired-generation",
        DesiredGeneration, Owner::Api, applied: false;
    /// Part of a staged apply: desired-fact writes, invisible until the
    /// apply's commit record names them.
    ApplyChunk { apply, chunk } = "meta/apply/{}/chunk/{}",
        ApplyChunk, Owner::Api, applied: false;
    /// The commit point of a staged apply: from this record on, readers see
    /// the whole program (the desired facts overlaid with the apply's
    /// remaining chunks); it goes once every chunk is copied into place.
    ApplyCommit {} = "meta/applying",
        ApplyCommit, Owner::Api, applied: false;
}

impl Kind {
    /// The literal start of every key of this kind: what a range over all
    /// of them asks for.
    pub fn prefix(self) -> &'static str {
        let pattern = self.pattern();
        pattern.split("{}").next().unwrap_or(pattern)
    }

    /// The kinds `cca apply` creates, changes and prunes.
    pub fn applied() -> impl Iterator<Item = Kind> {
        Kind::ALL.iter().copied().filter(|kind| kind.info().applied)
    }
}

impl Key {
    /// Parses a store key; `None` when it matches no row of the table.
    pub fn parse(text: &str) -> Option<Key> {
        Kind::ALL.iter().find_map(|&kind| {
            let segments = match_pattern(kind.pattern(), text)?;
            Key::from_segments(kind, segments)
        })
    }

    /// Who may write this key.
    pub fn owner(&self) -> Owner {
        self.kind().info().owner
    }

    /// The service a key is about, for the kinds keyed by service.
    pub fn service(&self) -> Option<&str> {
        match self {
            Key::Service { service }
            | Key::ServiceTag { service, .. }
            | Key::ServiceGrant { service, .. }
            | Key::ServiceVersion { service, .. }
            | Key::ServiceMeta { service }
            | Key::RolloutControl { service }
            | Key::Instance { service, .. }
            | Key::Unplaced { service }
            | Key::Endpoint { service, .. }
            | Key::Scale { service }
            | Key::Rollout { service }
            | Key::Autoscale { service }
            | Key::Vip { service } => Some(service),
            _ => None,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut segments = self.segments().into_iter();
        let mut literals = self.kind().pattern().split("{}");
        if let Some(first) = literals.next() {
            f.write_str(first)?;
        }
        for literal in literals {
            f.write_str(segments.next().unwrap_or_default())?;
            f.write_str(literal)?;
        }
        Ok(())
    }
}

impl From<Key> for String {
    fn from(key: Key) -> String {
        key.to_string()
    }
}

impl From<&Key> for String {
    fn from(key: &Key) -> String {
        key.to_string()
    }
}

/// The segments of `text` where `pattern` has `{}`, or `None` when it does
/// not match (a segment is non-empty and holds no `/`).
fn match_pattern<'a>(pattern: &str, text: &'a str) -> Option<Vec<&'a str>> {
    let mut literals = pattern.split("{}");
    let mut rest = text.strip_prefix(literals.next()?)?;
    let mut segments = Vec::new();
    for literal in literals {
        let end = if literal.is_empty() {
            rest.len()
        } else {
            rest.find(literal)?
        };
        let segment = &rest[..end];
        if segment.is_empty() || segment.contains('/') {
            return None;
        }
        segments.push(segment);
        rest = &rest[end..];
        rest = rest.strip_prefix(literal)?;
    }
    rest.is_empty().then_some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_print_their_pattern() {
        let key = Key::ServiceTag {
            service: "web".into(),
            tag: "team".into(),
        };
        assert_eq!(key.to_string(), "desired/service/web/tag/team");
        assert_eq!(Key::Leader {}.to_string(), "meta/leader");
        assert_eq!(Kind::Instance.prefix(), "derived/instance/");
        assert_eq!(Kind::Leader.prefix(), "meta/leader");
    }

    #[test]
    fn parsing_tells_nested_kinds_apart() {
        let parse = |text: &str| Key::parse(text).map(|key| key.kind());
        assert_eq!(parse("desired/service/web"), Some(Kind::Service));
        assert_eq!(parse("desired/service/web/tag/t"), Some(Kind::ServiceTag));
        assert_eq!(
            parse("desired/service/web/secret/s"),
            Some(Kind::ServiceGrant)
        );
        assert_eq!(
            parse("desired/service/web/version/0123abcd"),
            Some(Kind::ServiceVersion)
        );
        assert_eq!(parse("desired/secret/s"), Some(Kind::Secret));
        assert_eq!(
            parse("desired/secret-decl/s"),
            Some(Kind::SecretDeclaration)
        );
        assert_eq!(parse("derived/instance/web/web-1"), Some(Kind::Instance));
        assert_eq!(parse("meta/leader"), Some(Kind::Leader));
        for stray in [
            "desired/service/",
            "desired/service/web/",
            "desired/service/web/other/x",
            "derived/instance/web",
            "derived/instance/web/1/2",
            "derived/mystery/x",
            "meta/leader/x",
            "",
        ] {
            assert_eq!(parse(stray), None, "{stray}");
        }
    }

    #[test]
    fn keys_of_a_service_name_it() {
        for (text, service) in [
            ("desired/service/web", Some("web")),
            ("desired/service/web/version/0123", Some("web")),
            ("derived/instance/web/web-1", Some("web")),
            ("derived/rollout/web", Some("web")),
            ("desired/rollout/web", Some("web")),
            ("observed/instance/web-1", None),
            ("derived/node/n1", None),
        ] {
            let key = Key::parse(text).expect(text);
            assert_eq!(key.service(), service, "{text}");
        }
    }

    #[test]
    fn every_kind_has_one_row_and_distinct_patterns() {
        let mut patterns: Vec<&str> = Kind::ALL.iter().map(|kind| kind.pattern()).collect();
        patterns.sort_unstable();
        patterns.dedup();
        assert_eq!(patterns.len(), Kind::ALL.len());
        for &kind in Kind::ALL {
            assert_eq!(kind.info().kind, kind);
            assert!(!kind.info().about.is_empty());
            // Parsing finds a segment's end by the literal after it, which
            // works because segments hold no `/` and these literals start with one.
            let literals: Vec<&str> = kind.pattern().split("{}").skip(1).collect();
            for literal in literals.iter().filter(|literal| !literal.is_empty()) {
                assert!(literal.starts_with('/'), "{kind:?}: {literal}");
            }
        }
    }

    #[test]
    fn applied_kinds_are_the_program_facts() {
        let applied: Vec<Kind> = Kind::applied().collect();
        assert_eq!(
            applied,
            [
                Kind::Service,
                Kind::ServiceTag,
                Kind::ServiceGrant,
                Kind::Gate,
                Kind::Connection,
                Kind::SecretDeclaration,
                Kind::NetworkPolicy,
            ]
        );
        assert!(applied.iter().all(|kind| kind.info().owner == Owner::Api));
    }

    #[test]
    fn values_decode_by_kind() {
        let value = Value::decode(Kind::ServiceTag, br#""payments""#).expect("a string");
        assert_eq!(value, Value::ServiceTag(Arc::new("payments".to_owned())));
        assert_eq!(value.kind(), Kind::ServiceTag);
        let err = Value::decode(Kind::Heartbeat, b"{}").expect_err("fields missing");
        assert!(err.to_string().contains("missing field"), "{err}");
    }

    fn segment() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9._-]{0,12}"
    }

    proptest! {
        #[test]
        fn every_key_round_trips(kind in proptest::sample::select(Kind::ALL), names in proptest::collection::vec(segment(), 2)) {
            let count = kind.pattern().matches("{}").count();
            let segments: Vec<&str> = names.iter().take(count).map(String::as_str).collect();
            let key = Key::from_segments(kind, segments).expect("as many segments as the pattern");
            let text = key.to_string();
            prop_assert_eq!(Key::parse(&text), Some(key));
        }
    }
}
