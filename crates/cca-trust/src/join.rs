//! Join tokens: how a new node proves it may enrol, and how it knows it
//! talks to the right cluster before it sends anything. A token reads
//! `K10<CA fingerprint>::<id>.<secret>` (the shape k3s and Swarm use): the
//! node checks the CA certificate the server shows against the
//! fingerprint, then presents the id and secret with its CSR. The server
//! keeps a [`StoredToken`] per id with only a hash of the secret, and
//! [`StoredToken::admit`] decides; its [`Refusal`] names the reason for
//! the audit log, while the node is told only "invalid join token" so a
//! guesser learns nothing about which tokens exist. Nothing here echoes a
//! secret: not `Debug`, not parse errors.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::pki::Fingerprint;

/// What every token starts with (k3s's version marker for "carries the
/// CA's hash").
pub const PREFIX: &str = "K10";
/// Characters of a token's id.
pub const ID_LEN: usize = 6;
/// Characters of a token's secret: 16 of 36 symbols, about 82 bits, out of
/// reach of guessing online and of brute force against its SHA-256 hash.
pub const SECRET_LEN: usize = 16;
/// How long a token is valid unless `cca token create --ttl` says.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A join token as the operator copies it to a new node. `Display` gives
/// the whole token (to print it once); `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    ca: Fingerprint,
    id: String,
    secret: String,
}

impl JoinToken {
    /// A new token for the cluster whose CA has fingerprint `ca`, with a
    /// random id and secret.
    pub fn generate(ca: &Fingerprint) -> Result<JoinToken, Unrandom> {
        Ok(JoinToken {
            ca: *ca,
            id: random_text(ID_LEN)?,
            secret: random_text(SECRET_LEN)?,
        })
    }

    /// The fingerprint of the CA the node must find at the server.
    pub fn ca(&self) -> &Fingerprint {
        &self.ca
    }

    /// The token's public name: the key it is stored under, what `cca
    /// token ls` shows and `cca token revoke` takes.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The secret, to send to the server over TLS once the CA checked out.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// What the server stores for this token: valid from `now` for `ttl`,
    /// for any node, any number of times, until revoked. Set `node` and
    /// `uses_left` on the result to restrict it.
    pub fn to_stored(&self, now: SystemTime, ttl: Duration) -> StoredToken {
        let created_at = millis(now);
        StoredToken {
            id: self.id.clone(),
            secret_hash: sha256_hex(&self.secret),
            created_at,
            expires_at: created_at
                .saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
            node: None,
            uses_left: None,
            revoked: false,
            description: String::new(),
            created_by: String::new(),
        }
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}::{}.{}", self.ca, self.id, self.secret)
    }
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("ca", &self.ca)
            .field("id", &self.id)
            .field("secret", &"[hidden]")
            .finish()
    }
}

/// The system's random source failed: nothing to do but retry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("could not draw random bytes for a join token: retry")]
pub struct Unrandom;

/// Uniform over [`ALPHABET`]: bytes at or above 252 (7 × 36) are drawn
/// again, so no character is likelier than another.
fn random_text(len: usize) -> Result<String, Unrandom> {
    let mut text = String::with_capacity(len);
    let mut bytes = [0u8; 32];
    while text.len() < len {
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| Unrandom)?;
        for &byte in bytes.iter().filter(|&&b| b < 252) {
            if text.len() == len {
                break;
            }
            text.push(char::from(ALPHABET[usize::from(byte % 36)]));
        }
    }
    Ok(text)
}

/// Why text is not a join token. The messages never quote the text: it
/// may hold a real secret with one character wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadToken {
    #[error("a join token starts with `K10`: copy the whole line `cca token create` printed")]
    Prefix,
    #[error(
        "the CA fingerprint in a join token has 64 hexadecimal digits, this one has {len}: the token was cut or altered"
    )]
    FingerprintLength { len: usize },
    #[error("the CA fingerprint in a join token is hexadecimal (0-9, a-f): the token was altered")]
    FingerprintHex,
    #[error("a join token reads K10<fingerprint>::<id>.<secret>: {missing} is missing")]
    Separator { missing: &'static str },
    #[error("a join token's id has 6 characters of a-z and 0-9")]
    Id,
    #[error("a join token's secret has 16 characters of a-z and 0-9")]
    Secret,
}

impl FromStr for JoinToken {
    type Err = BadToken;

    /// Surrounding white space (a pasted newline) is ignored.
    fn from_str(text: &str) -> Result<JoinToken, BadToken> {
        let text = text.trim();
        let rest = text.strip_prefix(PREFIX).ok_or(BadToken::Prefix)?;
        let (fingerprint, credentials) = rest.split_once("::").ok_or(BadToken::Separator {
            missing: "`::` after the fingerprint",
        })?;
        if fingerprint.len() != 64 {
            return Err(BadToken::FingerprintLength {
                len: fingerprint.chars().count(),
            });
        }
        if !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadToken::FingerprintHex);
        }
        let ca = fingerprint
            .parse::<Fingerprint>()
            .map_err(|_| BadToken::FingerprintHex)?;
        let (id, secret) = credentials.split_once('.').ok_or(BadToken::Separator {
            missing: "`.` between id and secret",
        })?;
        if !is_token_text(id, ID_LEN) {
            return Err(BadToken::Id);
        }
        if !is_token_text(secret, SECRET_LEN) {
            return Err(BadToken::Secret);
        }
        Ok(JoinToken {
            ca,
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }
}

fn is_token_text(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| ALPHABET.contains(&b))
}

/// Milliseconds since the Unix epoch, the instants facts carry
/// (`cca_model::clock::Millis`).
fn millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map(|since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn sha256_hex(secret: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, secret.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A join token as the server keeps it: the fact `trust/token/{id}`.
pub use cca_model::access::JoinTokenRecord as StoredToken;

/// Why a token admitted no one: for the audit log and the server's own
/// log. The node itself is answered "invalid join token" whatever the
/// reason, so a guesser cannot tell a wrong secret from a used-up token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("wrong secret for join token `{id}`")]
    WrongSecret { id: String },
    #[error("join token `{id}` is revoked")]
    Revoked { id: String },
    #[error("join token `{id}` expired at {at}")]
    Expired { id: String, at: String },
    #[error("join token `{id}` enrols node `{allowed}` only, not `{asked}`")]
    WrongNode {
        id: String,
        allowed: String,
        asked: String,
    },
    #[error("join token `{id}` is used up")]
    UsedUp { id: String },
}

/// What a stored token allows: admitting a node, counting a use, and
/// whether it is still usable. A trait because the record is plain data of
/// `cca-model`.
pub trait TokenRules {
    /// Whether the token admits `node` presenting `secret` at `now`. The
    /// secret is checked first, in constant time, so the other reasons
    /// are only ever told to the audit log about someone who held the
    /// secret. Admitting does not count a use: the caller writes
    /// [`TokenRules::spend`]'s result with a compare-and-swap on the
    /// revision it read, so two nodes racing for a token's last use
    /// cannot both win.
    fn admit(&self, secret: &str, node: &str, now: SystemTime) -> Result<(), Refusal>;
    /// The token after one more enrolment.
    fn spend(&self) -> StoredToken;
    /// Whether `cca token ls` should show it as usable at `now`.
    fn is_live(&self, now: SystemTime) -> bool;
}

impl TokenRules for StoredToken {
    fn admit(&self, secret: &str, node: &str, now: SystemTime) -> Result<(), Refusal> {
        let id = || self.id.clone();
        let presented = sha256_hex(secret);
        if aws_lc_rs::constant_time::verify_slices_are_equal(
            presented.as_bytes(),
            self.secret_hash.as_bytes(),
        )
        .is_err()
        {
            return Err(Refusal::WrongSecret { id: id() });
        }
        if self.revoked {
            return Err(Refusal::Revoked { id: id() });
        }
        if millis(now) >= self.expires_at {
            let at =
                UNIX_EPOCH + Duration::from_millis(u64::try_from(self.expires_at).unwrap_or(0));
            return Err(Refusal::Expired {
                id: id(),
                at: humantime::format_rfc3339_seconds(at).to_string(),
            });
        }
        if let Some(allowed) = &self.node
            && allowed != node
        {
            return Err(Refusal::WrongNode {
                id: id(),
                allowed: allowed.clone(),
                asked: node.to_owned(),
            });
        }
        if self.uses_left == Some(0) {
            return Err(Refusal::UsedUp { id: id() });
        }
        Ok(())
    }

    fn spend(&self) -> StoredToken {
        StoredToken {
            uses_left: self.uses_left.map(|uses| uses.saturating_sub(1)),
            ..self.clone()
        }
    }

    fn is_live(&self, now: SystemTime) -> bool {
        !self.revoked && millis(now) < self.expires_at && self.uses_left != Some(0)
    }
}
