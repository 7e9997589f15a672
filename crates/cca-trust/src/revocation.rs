//! Revocation: which certificates the cluster no longer accepts although
//! they chain to its CA and have not expired. Two kinds of entry: one
//! certificate by its serial (a leaked key), and every certificate of an
//! identity issued before a cutoff (a node or a user removed: node
//! certificates are renewed every 16 hours, so their serials change, and
//! a cutoff also covers certificates nobody wrote down). A certificate
//! issued after the cutoff, to an identity added again, is accepted.
//!
//! [`Revocations`] is plain data built from [`RevokedEntry`]s (the caller
//! keeps them, as facts, and converts); [`Revocations::check`] is two hash
//! lookups, cheap enough for every handshake. Entries are only needed
//! while a certificate they refuse could still be valid:
//! [`Revocations::prunable`] names those whose certificates have all
//! expired anyway, for the caller to delete.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cca_model::access::{RevocationRecord, RevokedTarget};

use crate::identity::{Identity, URI_SCHEME};
use crate::pki::{
    CLOCK_SKEW, CertInfo, NODE_CERT_VALIDITY, SERVER_CERT_VALIDITY, USER_CERT_VALIDITY,
};

/// The longest life of a certificate issued with the default lifetimes:
/// a revocation older than this (and the clock skew certificates are
/// back-dated by) refuses only certificates that have expired anyway.
pub const LONGEST_LIFE: Duration = max(
    max(NODE_CERT_VALIDITY, SERVER_CERT_VALIDITY),
    USER_CERT_VALIDITY,
);

const fn max(a: Duration, b: Duration) -> Duration {
    if a.as_nanos() > b.as_nanos() { a } else { b }
}

/// A certificate serial number, kept as lower-case hex without leading
/// zeros (so [`CertInfo::serial`]'s `0a1b` and `a1b` are one serial). Read
/// from hex in either case, with or without the colons browsers print.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Serial(String);

impl Serial {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a text is not a serial number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a certificate serial number: {why}")]
pub struct BadSerial {
    pub text: String,
    pub why: &'static str,
}

impl FromStr for Serial {
    type Err = BadSerial;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadSerial {
            text: text.to_owned(),
            why,
        };
        let digits: String = text
            .trim()
            .chars()
            .filter(|&c| c != ':')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if digits.is_empty() {
            return Err(bad("it is empty"));
        }
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(
                "write it in hexadecimal, as `cca` and `openssl x509 -serial` print it",
            ));
        }
        // X.509 serials are at most 20 octets.
        let significant = digits.trim_start_matches('0');
        if significant.len() > 40 {
            return Err(bad("X.509 serials have at most 20 bytes"));
        }
        if significant.is_empty() {
            return Err(bad("no certificate has serial zero"));
        }
        Ok(Serial(significant.to_owned()))
    }
}

/// One revocation, as the caller stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RevokedEntry {
    /// The one certificate with this serial, from `since` on.
    Serial { serial: Serial, since: SystemTime },
    /// Every certificate of `identity` issued before `issued_before`
    /// (the instant the node or user was removed).
    Identity {
        identity: Identity,
        issued_before: SystemTime,
    },
}

impl RevokedEntry {
    /// What a stored record means to the TLS check; `None` for a user
    /// token's (not a certificate's) and for one that names nothing
    /// revocable (a hand-written fact). One reading for every follower of
    /// the records: the API's listeners and the agents' alike.
    pub fn from_record(record: &RevocationRecord) -> Option<RevokedEntry> {
        let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(record.at).unwrap_or(0));
        match &record.target {
            RevokedTarget::Serial { serial } => Some(RevokedEntry::Serial {
                serial: serial.parse().ok()?,
                since: at,
            }),
            RevokedTarget::Token { .. } => None,
            RevokedTarget::Identity { kind, name } => {
                Identity::from_uri(&format!("{URI_SCHEME}{kind}/{name}")).map(|identity| {
                    RevokedEntry::Identity {
                        identity,
                        issued_before: at,
                    }
                })
            }
        }
    }

    /// The instant the revocation took effect.
    pub fn since(&self) -> SystemTime {
        match self {
            RevokedEntry::Serial { since, .. } => *since,
            RevokedEntry::Identity { issued_before, .. } => *issued_before,
        }
    }
}

/// Why a certificate is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Revoked {
    #[error("certificate {serial} was revoked at {}", rfc3339(*since))]
    Serial { serial: Serial, since: SystemTime },
    #[error(
        "certificate {serial} of {identity} was issued at {}, and every certificate of {identity} issued before {} is revoked",
        rfc3339(*issued_at),
        rfc3339(*issued_before)
    )]
    Identity {
        identity: Identity,
        serial: String,
        issued_at: SystemTime,
        issued_before: SystemTime,
    },
}

fn rfc3339(at: SystemTime) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_seconds(at)
}

/// The revocations in force: look-ups by serial and by identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocations {
    serials: HashMap<Serial, SystemTime>,
    identities: HashMap<Identity, SystemTime>,
    longest_life: Option<Duration>,
}

impl Revocations {
    /// The revocations of `entries`. A serial revoked twice counts from
    /// the earlier instant; an identity cut off twice, at the later
    /// cutoff (it refuses more).
    pub fn new(entries: impl IntoIterator<Item = RevokedEntry>) -> Revocations {
        let mut revocations = Revocations::default();
        for entry in entries {
            match entry {
                RevokedEntry::Serial { serial, since } => {
                    let at = revocations.serials.entry(serial).or_insert(since);
                    *at = (*at).min(since);
                }
                RevokedEntry::Identity {
                    identity,
                    issued_before,
                } => {
                    let at = revocations
                        .identities
                        .entry(identity)
                        .or_insert(issued_before);
                    *at = (*at).max(issued_before);
                }
            }
        }
        revocations
    }

    /// For a cluster that issues certificates living longer than the
    /// default lifetimes ([`LONGEST_LIFE`]): `life` is then the longest,
    /// and entries are prunable only once it has passed.
    pub fn with_longest_life(mut self, life: Duration) -> Revocations {
        self.longest_life = Some(life);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.serials.is_empty() && self.identities.is_empty()
    }

    pub fn len(&self) -> usize {
        self.serials.len() + self.identities.len()
    }

    /// The entries in force (duplicates merged), in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = RevokedEntry> + '_ {
        let serials = self
            .serials
            .iter()
            .map(|(serial, &since)| RevokedEntry::Serial {
                serial: serial.clone(),
                since,
            });
        let identities =
            self.identities
                .iter()
                .map(|(identity, &issued_before)| RevokedEntry::Identity {
                    identity: identity.clone(),
                    issued_before,
                });
        serials.chain(identities)
    }

    /// Whether `certificate` may still be accepted. Its chain and
    /// validity are the TLS library's to check; this says only whether
    /// the cluster took it back. An identity's cutoff is compared with
    /// the instant the certificate was issued, which the CA records as
    /// its `not_before` plus [`CLOCK_SKEW`] (certificates are back-dated
    /// by that much): a certificate issued a minute after a node was
    /// removed, to the node added again, must not fall under the cutoff.
    pub fn check(&self, certificate: &CertInfo) -> Result<(), Revoked> {
        if self.is_empty() {
            return Ok(());
        }
        if let Ok(serial) = certificate.serial.parse::<Serial>()
            && let Some(&since) = self.serials.get(&serial)
        {
            return Err(Revoked::Serial { serial, since });
        }
        if let Some(identity) = &certificate.identity
            && let Some(&issued_before) = self.identities.get(identity)
        {
            let issued_at = issued_at(certificate);
            if issued_at < issued_before {
                return Err(Revoked::Identity {
                    identity: identity.clone(),
                    serial: certificate.serial.clone(),
                    issued_at,
                    issued_before,
                });
            }
        }
        Ok(())
    }

    /// The entries that refuse nothing any more at `now`: every
    /// certificate they could refuse was issued before the entry's
    /// instant and has expired since, whatever its life (up to the
    /// longest) and allowing for the clock skew between the servers.
    /// The caller deletes them; keeping them is harmless.
    pub fn prunable(&self, now: SystemTime) -> Vec<RevokedEntry> {
        let life = self.longest_life.unwrap_or(LONGEST_LIFE) + CLOCK_SKEW;
        self.entries()
            .filter(|entry| {
                entry
                    .since()
                    .checked_add(life)
                    .is_some_and(|expired| expired <= now)
            })
            .collect()
    }
}

/// The instant `certificate` was issued: see [`Revocations::check`].
fn issued_at(certificate: &CertInfo) -> SystemTime {
    certificate
        .not_before
        .checked_add(CLOCK_SKEW)
        .unwrap_or(certificate.not_before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{ClusterCa, Issue, Names};

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(hours: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000) + HOUR * hours as u32
    }

    fn ca() -> ClusterCa {
        ClusterCa::generate("test", at(0), Duration::from_secs(20 * 365 * 24 * 3600)).expect("ca")
    }

    fn issued(ca: &ClusterCa, identity: &str, hours: u64) -> CertInfo {
        let identity: Identity = identity.parse().expect("identity");
        let issue = Issue::new(identity, Names::none());
        let pair = ca.issue(&issue, at(hours)).expect("issues");
        CertInfo::parse(&pair.cert_pem).expect("parses")
    }

    fn serial(text: &str) -> Serial {
        text.parse().expect("serial")
    }

    #[test]
    fn stored_records_read_as_entries_and_tokens_as_nothing() {
        let record = |target| RevocationRecord {
            target,
            at: 1_750_000_000_000,
            by: "user:admin".into(),
            reason: String::new(),
        };
        let at = UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        assert_eq!(
            RevokedEntry::from_record(&record(RevokedTarget::Serial {
                serial: "0A1B".into()
            })),
            Some(RevokedEntry::Serial {
                serial: serial("a1b"),
                since: at
            })
        );
        assert_eq!(
            RevokedEntry::from_record(&record(RevokedTarget::Identity {
                kind: "node".into(),
                name: "n1".into()
            })),
            Some(RevokedEntry::Identity {
                identity: Identity::Node("n1".into()),
                issued_before: at
            })
        );
        for nothing in [
            RevokedTarget::Token {
                jti: "j".into(),
                expires_at: 0,
            },
            RevokedTarget::Serial {
                serial: "not hex".into(),
            },
            RevokedTarget::Identity {
                kind: "planet".into(),
                name: "n1".into(),
            },
        ] {
            assert_eq!(RevokedEntry::from_record(&record(nothing)), None);
        }
    }

    #[test]
    fn a_revoked_serial_refuses_that_certificate_only() {
        let ca = ca();
        let first = issued(&ca, "node:n1", 1);
        let second = issued(&ca, "node:n1", 17);
        let revocations = Revocations::new([RevokedEntry::Serial {
            serial: serial(&first.serial.to_uppercase()),
            since: at(2),
        }]);
        let refused = revocations.check(&first).expect_err("revoked");
        assert_eq!(
            refused,
            Revoked::Serial {
                serial: serial(&first.serial),
                since: at(2)
            }
        );
        // Named as `Serial` spells it: without leading zeros.
        assert!(
            refused.to_string().contains(serial(&first.serial).as_str()),
            "{refused}: names the serial"
        );
        revocations
            .check(&second)
            .expect("the node's renewed certificate has another serial");
    }

    #[test]
    fn an_identity_cutoff_refuses_what_was_issued_before_it() {
        let ca = ca();
        let old = issued(&ca, "node:n1", 1);
        let renewed = issued(&ca, "node:n1", 17);
        let other = issued(&ca, "node:n2", 1);
        let removed_at = at(20);
        let revocations = Revocations::new([RevokedEntry::Identity {
            identity: Identity::Node("n1".into()),
            issued_before: removed_at,
        }]);
        for certificate in [&old, &renewed] {
            let refused = revocations.check(certificate).expect_err("cut off");
            let text = refused.to_string();
            assert!(text.contains("node `n1`"), "{text}");
            assert!(text.contains(&certificate.serial), "{text}");
        }
        revocations.check(&other).expect("another node");

        // Added again a minute after its removal: the new certificate's
        // `not_before` is back-dated before the cutoff, its issue is not.
        let readded = ca
            .issue(
                &Issue::new(Identity::Node("n1".into()), Names::none()),
                removed_at + Duration::from_secs(60),
            )
            .expect("issues");
        let readded = CertInfo::parse(&readded.cert_pem).expect("parses");
        assert!(readded.not_before < removed_at);
        revocations
            .check(&readded)
            .expect("issued after the cutoff");
        let just_before = ca
            .issue(
                &Issue::new(Identity::Node("n1".into()), Names::none()),
                removed_at - Duration::from_secs(1),
            )
            .expect("issues");
        let just_before = CertInfo::parse(&just_before.cert_pem).expect("parses");
        revocations
            .check(&just_before)
            .expect_err("issued a second before the cutoff");
    }

    #[test]
    fn kinds_of_identity_do_not_mix() {
        let ca = ca();
        let user = issued(&ca, "user:n1", 1);
        let revocations = Revocations::new([RevokedEntry::Identity {
            identity: Identity::Node("n1".into()),
            issued_before: at(20),
        }]);
        revocations.check(&user).expect("user n1 is not node n1");
    }

    #[test]
    fn repeated_entries_keep_what_refuses_most() {
        let entries = [
            RevokedEntry::Serial {
                serial: serial("0a:0B"),
                since: at(5),
            },
            RevokedEntry::Serial {
                serial: serial("A0b"),
                since: at(3),
            },
            RevokedEntry::Identity {
                identity: Identity::User("al".into()),
                issued_before: at(1),
            },
            RevokedEntry::Identity {
                identity: Identity::User("al".into()),
                issued_before: at(9),
            },
        ];
        let revocations = Revocations::new(entries);
        assert_eq!(revocations.len(), 2);
        let mut kept: Vec<_> = revocations.entries().map(|e| e.since()).collect();
        kept.sort();
        assert_eq!(kept, vec![at(3), at(9)]);
    }

    #[test]
    fn entries_are_prunable_once_every_certificate_they_refuse_has_expired() {
        let revocations = Revocations::new([
            RevokedEntry::Serial {
                serial: serial("01"),
                since: at(0),
            },
            RevokedEntry::Identity {
                identity: Identity::Node("n1".into()),
                issued_before: at(10),
            },
        ]);
        let serial_expires = at(0) + LONGEST_LIFE + CLOCK_SKEW;
        assert_eq!(
            revocations.prunable(serial_expires - Duration::from_secs(1)),
            vec![]
        );
        assert_eq!(
            revocations.prunable(serial_expires),
            vec![RevokedEntry::Serial {
                serial: serial("1"),
                since: at(0)
            }]
        );
        assert_eq!(revocations.prunable(at(10) + LONGEST_LIFE + HOUR).len(), 2);

        // A cluster that issues longer certificates keeps entries longer.
        let longer = revocations.with_longest_life(LONGEST_LIFE * 2);
        assert_eq!(longer.prunable(at(10) + LONGEST_LIFE + HOUR), vec![]);
        assert_eq!(LONGEST_LIFE, SERVER_CERT_VALIDITY);
    }

    #[test]
    fn serials_read_as_openssl_and_cca_print_them() {
        assert_eq!(serial("00:1A:2b").as_str(), "1a2b");
        assert_eq!(serial(" 1a2b "), serial("1A2B"));
        for (text, why) in [
            ("", "empty"),
            ("xyz", "hexadecimal"),
            ("00:00", "zero"),
            (&"f".repeat(41), "20 bytes"),
        ] {
            let error = text.parse::<Serial>().expect_err(text);
            assert!(error.to_string().contains(why), "{error}");
        }
        assert!(serial(&"f".repeat(40)).as_str().len() == 40);
    }

    #[test]
    fn nothing_revoked_accepts_everything() {
        let ca = ca();
        let revocations = Revocations::new([]);
        assert!(revocations.is_empty());
        revocations
            .check(&issued(&ca, "server:s1", 0))
            .expect("nothing is revoked");
    }
}
