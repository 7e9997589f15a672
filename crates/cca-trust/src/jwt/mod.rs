//! Signed user tokens: ES256 JSON Web Tokens (RFC 7519, compact form) that
//! the server issues to users, and their verification — also of tokens an
//! OIDC issuer signed (ES256 or RS256) against the issuer's published keys.
//! Written by hand on aws-lc-rs and base64url, because a JWT library would
//! bring a second crypto stack. Verification trusts nothing in a token
//! before its signature: the algorithm is the one of the key the `kid`
//! names (never the token's word alone, so neither `none` nor HMAC with a
//! public key as secret get through), and errors name what failed without
//! quoting the token or its signature. Revocation is the caller's: every
//! token we issue has a random `jti`, and the caller keeps the set of
//! revoked ones until they expire. (A token's bytes are no identifier:
//! ECDSA signatures are malleable, so anyone holding a token can spell it
//! with another valid signature; its `jti` stays the same.)

mod jwk;
#[cfg(feature = "testing")]
pub mod testing;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{self, SystemRandom};
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject as _;
use serde_json::{Map, Value};

pub use jwk::{DiscoveryError, Jwk, JwkError, JwkSet, OidcDiscovery, SkippedKey};

/// How far clocks may disagree before `exp`, `nbf` and `iat` count.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// Longer tokens are refused before any parsing: ours are under 1 KiB,
/// OIDC ID tokens a few KiB, and this bounds the work a request can cause.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The signature algorithms verified. Each key type has exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alg {
    /// ECDSA P-256 with SHA-256: the tokens we issue.
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256: what most OIDC issuers sign with.
    Rs256,
}

impl Alg {
    /// The name as JOSE spells it.
    pub fn name(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Rs256 => "RS256",
        }
    }
}

impl fmt::Display for Alg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The server's ES256 key for the tokens it issues. Its `kid` is its
/// RFC 7638 thumbprint, so the same key always has the same id.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    jwk: Jwk,
    kid: String,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the private key.
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// Why a signing key could not be made or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("generating an ECDSA P-256 key failed in aws-lc: {0}")]
    Generate(String),
    #[error(
        "the token signing key is not PEM with one PRIVATE KEY section ({0}): restore the file or generate a new key (tokens signed with the old one stop working)"
    )]
    Pem(String),
    #[error(
        "the token signing key is not a PKCS#8 ECDSA P-256 private key ({0}): generate a new key (tokens signed with the old one stop working)"
    )]
    NotP256(String),
}

impl SigningKey {
    /// A new random key.
    pub fn generate() -> Result<SigningKey, KeyError> {
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING)
            .map_err(|error| KeyError::Generate(error.to_string()))?;
        let pkcs8 = pair
            .to_pkcs8v1()
            .map_err(|error| KeyError::Generate(error.to_string()))?;
        Ok(SigningKey::new(pair, pkcs8.as_ref().to_vec()))
    }

    /// Reads a key written by [`SigningKey::to_pkcs8_pem`].
    pub fn from_pkcs8_pem(pem: &str) -> Result<SigningKey, KeyError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|error| KeyError::Pem(error.to_string()))?;
        SigningKey::from_pkcs8_der(der.secret_pkcs8_der())
    }

    /// Reads a PKCS#8 DER key.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<SigningKey, KeyError> {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der)
            .map_err(|error| KeyError::NotP256(error.to_string()))?;
        Ok(SigningKey::new(pair, der.to_vec()))
    }

    fn new(pair: EcdsaKeyPair, pkcs8: Vec<u8>) -> SigningKey {
        // An uncompressed point: 0x04, then x and y of 32 bytes each.
        let point = pair.public_key().as_ref();
        let (x, y) = point[1..].split_at(32);
        let mut jwk = Jwk {
            kty: "EC".into(),
            crv: Some("P-256".into()),
            x: Some(URL_SAFE_NO_PAD.encode(x)),
            y: Some(URL_SAFE_NO_PAD.encode(y)),
            ..Jwk::default()
        };
        let kid = jwk.thumbprint().unwrap_or_default();
        jwk.kid = Some(kid.clone());
        jwk.use_ = Some("sig".into());
        jwk.alg = Some(Alg::Es256.name().into());
        SigningKey {
            pair,
            pkcs8,
            jwk,
            kid,
        }
    }

    /// The key as PKCS#8 PEM, for the server's config directory (the
    /// caller writes it with mode 0600).
    pub fn to_pkcs8_pem(&self) -> String {
        let body = STANDARD.encode(&self.pkcs8);
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        pem
    }

    /// The RFC 7638 thumbprint, the `kid` of every token this key signs.
    pub fn key_id(&self) -> &str {
        &self.kid
    }

    /// The public half as a JWK (`kty` EC, `crv` P-256, `kid`, `use`, `alg`).
    pub fn public_jwk(&self) -> Jwk {
        self.jwk.clone()
    }

    /// A set holding only this key's public half.
    pub fn jwk_set(&self) -> JwkSet {
        JwkSet::from_keys([self.public_jwk()])
    }
}

/// What a token says: who it is for and until when. Claims other than
/// these are tolerated when reading a token and dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// Who issued the token: our server's URL or the OIDC issuer's.
    pub iss: String,
    /// The user name.
    pub sub: String,
    /// Who the token is for (one or more audiences).
    pub aud: Vec<String>,
    /// Seconds since 1970 (UTC) it was issued at.
    pub iat: u64,
    /// Not valid before, seconds since 1970; OIDC tokens may have none.
    pub nbf: Option<u64>,
    /// Not valid from, seconds since 1970.
    pub exp: u64,
    /// A random id to revoke the token by; every token we issue has one.
    pub jti: Option<String>,
    pub tenant: Option<String>,
    pub roles: Vec<String>,
}

impl Claims {
    /// Claims for a token valid from `now` for `ttl`, with a fresh `jti`.
    pub fn new(
        issuer: impl Into<String>,
        subject: impl Into<String>,
        audience: impl Into<String>,
        now: SystemTime,
        ttl: Duration,
    ) -> Claims {
        let now = unix_seconds(now);
        Claims {
            iss: issuer.into(),
            sub: subject.into(),
            aud: vec![audience.into()],
            iat: now,
            nbf: Some(now),
            exp: now.saturating_add(ttl.as_secs()),
            jti: Some(random_id()),
            tenant: None,
            roles: Vec::new(),
        }
    }

    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Claims {
        self.tenant = Some(tenant.into());
        self
    }

    pub fn with_roles(mut self, roles: impl IntoIterator<Item = impl Into<String>>) -> Claims {
        self.roles = roles.into_iter().map(Into::into).collect();
        self
    }

    /// When the token stops being valid (leeway aside).
    pub fn expires_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.exp)
    }

    fn to_json(&self) -> String {
        let mut claims = Map::new();
        claims.insert("iss".into(), self.iss.clone().into());
        claims.insert("sub".into(), self.sub.clone().into());
        claims.insert(
            "aud".into(),
            match self.aud.as_slice() {
                [one] => one.clone().into(),
                many => many.to_vec().into(),
            },
        );
        claims.insert("iat".into(), self.iat.into());
        if let Some(nbf) = self.nbf {
            claims.insert("nbf".into(), nbf.into());
        }
        claims.insert("exp".into(), self.exp.into());
        if let Some(jti) = &self.jti {
            claims.insert("jti".into(), jti.clone().into());
        }
        if let Some(tenant) = &self.tenant {
            claims.insert("tenant".into(), tenant.clone().into());
        }
        if !self.roles.is_empty() {
            claims.insert("roles".into(), self.roles.clone().into());
        }
        Value::Object(claims).to_string()
    }

    fn from_json(payload: &[u8]) -> Result<Claims, TokenError> {
        let claims: Map<String, Value> =
            serde_json::from_slice(payload).map_err(|error| TokenError::Json {
                part: Part::Payload,
                reason: json_reason(&error),
            })?;
        let aud = match claims.get("aud") {
            None | Some(Value::Null) => return Err(TokenError::MissingClaim { claim: "aud" }),
            Some(Value::String(one)) => vec![one.clone()],
            Some(Value::Array(many)) => many
                .iter()
                .map(|one| one.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenError::ClaimType {
                    claim: "aud",
                    expected: "a string or an array of strings",
                })?,
            Some(_) => {
                return Err(TokenError::ClaimType {
                    claim: "aud",
                    expected: "a string or an array of strings",
                });
            }
        };
        let roles = match claims.get("roles") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(roles)) => roles
                .iter()
                .map(|role| role.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenError::ClaimType {
                    claim: "roles",
                    expected: "an array of strings",
                })?,
            Some(_) => {
                return Err(TokenError::ClaimType {
                    claim: "roles",
                    expected: "an array of strings",
                });
            }
        };
        Ok(Claims {
            iss: required(&claims, "iss", string_claim)?,
            sub: required(&claims, "sub", string_claim)?,
            aud,
            iat: required(&claims, "iat", date_claim)?,
            nbf: optional(&claims, "nbf", date_claim)?,
            exp: required(&claims, "exp", date_claim)?,
            jti: optional(&claims, "jti", string_claim)?,
            tenant: optional(&claims, "tenant", string_claim)?,
            roles,
        })
    }
}

fn required<T>(
    claims: &Map<String, Value>,
    claim: &'static str,
    read: fn(&'static str, &Value) -> Result<T, TokenError>,
) -> Result<T, TokenError> {
    optional(claims, claim, read)?.ok_or(TokenError::MissingClaim { claim })
}

fn optional<T>(
    claims: &Map<String, Value>,
    claim: &'static str,
    read: fn(&'static str, &Value) -> Result<T, TokenError>,
) -> Result<Option<T>, TokenError> {
    match claims.get(claim) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => read(claim, value).map(Some),
    }
}

fn string_claim(claim: &'static str, value: &Value) -> Result<String, TokenError> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or(TokenError::ClaimType {
            claim,
            expected: "a string",
        })
}

/// A NumericDate: seconds since 1970, which RFC 7519 allows to have a
/// fraction (dropped here).
fn date_claim(claim: &'static str, value: &Value) -> Result<u64, TokenError> {
    let bad = TokenError::ClaimType {
        claim,
        expected: "a number of seconds since 1970",
    };
    let Value::Number(number) = value else {
        return Err(bad);
    };
    if let Some(seconds) = number.as_u64() {
        return Ok(seconds);
    }
    match number.as_f64() {
        // The cast saturates; beyond u64 is "never" either way.
        Some(seconds) if seconds.is_finite() && seconds >= 0.0 => Ok(seconds as u64),
        _ => Err(bad),
    }
}

/// Signs `claims` into a compact JWT with `key` (ES256, `kid` = the key's
/// thumbprint).
///
/// # Panics
/// Only if aws-lc fails to sign with a valid key, which it does only when
/// memory allocation fails.
pub fn sign(key: &SigningKey, claims: &Claims) -> String {
    let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": key.kid}).to_string();
    let mut token = URL_SAFE_NO_PAD.encode(header);
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(claims.to_json()));
    let signature = key
        .pair
        .sign(&SystemRandom::new(), token.as_bytes())
        .expect("aws-lc signs with a valid P-256 key");
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
    token
}

/// A part of a compact JWT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Header,
    Payload,
    Signature,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Header => "header",
            Part::Payload => "payload",
            Part::Signature => "signature",
        })
    }
}

/// Why a token is refused. Every one means 401; the messages say what
/// failed and never quote the token or its signature (values an attacker
/// chose, like `alg` or `kid`, are cut short and escaped).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is {len} bytes long, more than the {max} accepted")]
    TooLong { len: usize, max: usize },
    #[error("not a JWT: a token is three base64url parts separated by dots, this one has {parts}")]
    Shape { parts: usize },
    #[error("not a JWT: its {part} is not base64url without padding")]
    Base64 { part: Part },
    #[error("not a JWT: its {part} is not a JSON object ({reason})")]
    Json { part: Part, reason: String },
    #[error("the token's header has no `{member}`")]
    MissingHeader { member: &'static str },
    #[error("the token is unsigned (alg `none`): tokens must be signed with ES256 or RS256")]
    AlgNone,
    #[error("the token's algorithm {alg:?} is not accepted: only ES256 and RS256 are")]
    UnsupportedAlg { alg: String },
    #[error(
        "the token's header says algorithm {alg}, but its key `{kid}` is for {key_alg}: refused (algorithm confusion)"
    )]
    AlgMismatch { alg: Alg, kid: String, key_alg: Alg },
    #[error(
        "the token's header marks extensions critical (`crit`), which this server does not understand"
    )]
    Critical,
    #[error(
        "the token was signed by key {kid:?}, which is not trusted here: it was issued by another server or with a retired key (log in again), or the issuer rotated its keys (refresh its JWKS)"
    )]
    UnknownKid { kid: String },
    #[error(
        "the token's signature does not verify with key `{kid}`: it was altered or signed by another key"
    )]
    BadSignature { kid: String },
    #[error("the token lacks the claim `{claim}`, which is required")]
    MissingClaim { claim: &'static str },
    #[error("the token's claim `{claim}` is not {expected}")]
    ClaimType {
        claim: &'static str,
        expected: &'static str,
    },
    #[error(
        "the token was issued by {found:?}, not by `{expected}`, the issuer this server trusts"
    )]
    WrongIssuer { found: String, expected: String },
    #[error("the token is for audience {found:?}, not for `{expected}`")]
    WrongAudience {
        found: Vec<String>,
        expected: String,
    },
    #[error(
        "the token expired at {} ({} s ago, more than the {leeway} s leeway): log in again",
        rfc3339(*exp), now.saturating_sub(*exp)
    )]
    Expired { exp: u64, now: u64, leeway: u64 },
    #[error(
        "the token is not valid before {} (its `{claim}`), {} s from now, more than the {leeway} s leeway: check the clocks of the issuer and of this server",
        rfc3339(*at), at.saturating_sub(*now)
    )]
    NotYetValid {
        claim: &'static str,
        at: u64,
        now: u64,
        leeway: u64,
    },
}

/// Checks tokens against a set of keys, one issuer and one audience.
#[derive(Clone, Debug)]
pub struct Verifier {
    keys: JwkSet,
    issuer: String,
    audience: String,
    leeway: Duration,
}

impl Verifier {
    /// A verifier with the [`DEFAULT_LEEWAY`].
    pub fn new(keys: JwkSet, issuer: impl Into<String>, audience: impl Into<String>) -> Verifier {
        Verifier {
            keys,
            issuer: issuer.into(),
            audience: audience.into(),
            leeway: DEFAULT_LEEWAY,
        }
    }

    pub fn with_leeway(mut self, leeway: Duration) -> Verifier {
        self.leeway = leeway;
        self
    }

    pub fn keys(&self) -> &JwkSet {
        &self.keys
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Replaces the keys, e.g. after refreshing an issuer's JWKS.
    pub fn set_keys(&mut self, keys: JwkSet) {
        self.keys = keys;
    }

    /// The claims of `token` if it is signed by one of the keys, by the
    /// expected issuer, for the expected audience, and valid at `now`
    /// give or take the leeway. Revocation (by `jti`) is the caller's.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong {
                len: token.len(),
                max: MAX_TOKEN_LEN,
            });
        }
        let parts: Vec<&str> = token.splitn(4, '.').collect();
        let [header, payload, signature] = parts[..] else {
            return Err(TokenError::Shape {
                parts: token.split('.').count(),
            });
        };
        let signing_input = &token[..header.len() + 1 + payload.len()];

        let header: Map<String, Value> = serde_json::from_slice(&decode(Part::Header, header)?)
            .map_err(|error| TokenError::Json {
                part: Part::Header,
                reason: json_reason(&error),
            })?;
        let alg = match header.get("alg") {
            None | Some(Value::Null) => return Err(TokenError::MissingHeader { member: "alg" }),
            Some(Value::String(alg)) if alg == "ES256" => Alg::Es256,
            Some(Value::String(alg)) if alg == "RS256" => Alg::Rs256,
            Some(Value::String(alg)) if alg.eq_ignore_ascii_case("none") => {
                return Err(TokenError::AlgNone);
            }
            Some(Value::String(alg)) => {
                return Err(TokenError::UnsupportedAlg { alg: clip(alg) });
            }
            Some(_) => {
                return Err(TokenError::UnsupportedAlg {
                    alg: "(not a string)".into(),
                });
            }
        };
        if header.contains_key("crit") {
            return Err(TokenError::Critical);
        }
        let kid = match header.get("kid") {
            Some(Value::String(kid)) => kid,
            _ => return Err(TokenError::MissingHeader { member: "kid" }),
        };
        let key = self
            .keys
            .find(kid)
            .ok_or_else(|| TokenError::UnknownKid { kid: clip(kid) })?;
        if key.alg != alg {
            return Err(TokenError::AlgMismatch {
                alg,
                kid: key.kid.clone(),
                key_alg: key.alg,
            });
        }
        let signature = decode(Part::Signature, signature)?;
        key.key
            .verify_sig(signing_input.as_bytes(), &signature)
            .map_err(|_| TokenError::BadSignature {
                kid: key.kid.clone(),
            })?;

        let claims = Claims::from_json(&decode(Part::Payload, payload)?)?;
        if claims.iss != self.issuer {
            return Err(TokenError::WrongIssuer {
                found: clip(&claims.iss),
                expected: self.issuer.clone(),
            });
        }
        if !claims.aud.contains(&self.audience) {
            return Err(TokenError::WrongAudience {
                found: claims.aud.iter().take(4).map(|aud| clip(aud)).collect(),
                expected: self.audience.clone(),
            });
        }
        let now = unix_seconds(now);
        let leeway = self.leeway.as_secs();
        if now >= claims.exp.saturating_add(leeway) {
            return Err(TokenError::Expired {
                exp: claims.exp,
                now,
                leeway,
            });
        }
        for (claim, at) in [("nbf", claims.nbf), ("iat", Some(claims.iat))] {
            if let Some(at) = at
                && at > now.saturating_add(leeway)
            {
                return Err(TokenError::NotYetValid {
                    claim,
                    at,
                    now,
                    leeway,
                });
            }
        }
        Ok(claims)
    }
}

fn decode(part: Part, text: &str) -> Result<Vec<u8>, TokenError> {
    // The engine refuses padding and non-zero trailing bits, so each byte
    // string has one spelling and a changed character is a changed value.
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| TokenError::Base64 { part })
}

/// A value from a token, cut to a length fit for a message.
fn clip(text: &str) -> String {
    const MAX: usize = 64;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A serde_json error as a reason that quotes nothing of the input: its
/// category and position only.
fn json_reason(error: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match error.classify() {
        Category::Io => "read error",
        Category::Syntax => "syntax error",
        Category::Data => "not an object",
        Category::Eof => "unexpected end",
    };
    format!("{what} at column {}", error.column())
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

fn rfc3339(seconds: u64) -> String {
    UNIX_EPOCH
        .checked_add(Duration::from_secs(seconds))
        .map_or_else(
            || format!("{seconds} s after 1970"),
            |time| humantime::format_rfc3339_seconds(time).to_string(),
        )
}

/// 128 random bits, base64url: a `jti`.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    rand::fill(&mut bytes).expect("the system's random source works");
    URL_SAFE_NO_PAD.encode(bytes)
}
