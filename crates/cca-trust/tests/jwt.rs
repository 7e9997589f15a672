//! User tokens end to end: signing and verifying, each refusal with its
//! message, the attacks of issue 14 item 8 (alg `none`, HMAC with our
//! public key as secret, another key under our kid, tampering), RS256
//! against an OIDC-style JWKS, expiry on a fake clock, and a proptest that
//! throws random and mutated tokens at `verify`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _, RSA_PKCS1_SHA256,
};
use aws_lc_rs::{hmac, signature};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cca_trust::jwt::testing::TestIssuer;
use cca_trust::jwt::{
    Alg, Claims, DiscoveryError, Jwk, JwkError, JwkSet, KeyError, OidcDiscovery, Part, SigningKey,
    TokenError, Verifier, sign,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const ISSUER: &str = "https://cca.test:7443";
const AUDIENCE: &str = "cca";
const HOUR: Duration = Duration::from_secs(3600);

/// A fixed "now" for the fake clock: 2026-12-01T00:00:00Z.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_796_083_200)
}

/// Our signing key twice: as the crate's type, and as a raw aws-lc key
/// to sign headers and payloads `sign` would never produce.
struct Server {
    key: SigningKey,
    raw: EcdsaKeyPair,
}

impl Server {
    fn new() -> Server {
        let raw = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("key");
        let key = SigningKey::from_pkcs8_der(raw.to_pkcs8v1().expect("pkcs8").as_ref())
            .expect("our own key reads back");
        Server { key, raw }
    }

    fn verifier(&self) -> Verifier {
        Verifier::new(self.key.jwk_set(), ISSUER, AUDIENCE)
    }

    fn claims(&self) -> Claims {
        Claims::new(ISSUER, "alice", AUDIENCE, now(), HOUR)
    }

    fn header(&self) -> Value {
        json!({"alg": "ES256", "typ": "JWT", "kid": self.key.key_id()})
    }

    /// A token of any header and payload bytes, signed by `raw`.
    fn sign_raw(raw: &EcdsaKeyPair, header: &Value, payload: &[u8]) -> String {
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let signature = raw
            .sign(&SystemRandom::new(), input.as_bytes())
            .expect("sign");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }

    fn sign_payload(&self, payload: &Value) -> String {
        Server::sign_raw(&self.raw, &self.header(), payload.to_string().as_bytes())
    }

    fn payload(&self) -> Value {
        json!({
            "iss": ISSUER, "sub": "alice", "aud": AUDIENCE,
            "iat": unix(now()), "nbf": unix(now()), "exp": unix(now() + HOUR), "jti": "j1",
        })
    }
}

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The one way refusals are checked: `verify` refuses, the message names
/// the problem, and it quotes neither the token nor its signature.
fn refused(verifier: &Verifier, token: &str, at: SystemTime, needle: &str) -> TokenError {
    let error = match verifier.verify(token, at) {
        Ok(claims) => panic!("accepted a token it should refuse: {claims:?}"),
        Err(error) => error,
    };
    let message = error.to_string();
    assert!(
        message.contains(needle),
        "`{message}` does not mention `{needle}`"
    );
    if token.len() > 8 {
        assert!(!message.contains(token), "`{message}` quotes the token");
    }
    if let Some(signature) = token.rsplit('.').next().filter(|s| s.len() > 8) {
        assert!(
            !message.contains(signature),
            "`{message}` quotes the signature"
        );
    }
    error
}

fn replace_part(token: &str, index: usize, text: &str) -> String {
    let mut parts: Vec<&str> = token.split('.').collect();
    parts[index] = text;
    parts.join(".")
}

#[test]
fn a_signed_token_verifies_to_its_claims() {
    let server = Server::new();
    let claims = server
        .claims()
        .with_tenant("blue")
        .with_roles(["developer", "viewer"]);
    let token = sign(&server.key, &claims);
    assert_eq!(server.verifier().verify(&token, now()), Ok(claims.clone()));
    assert!(claims.jti.as_deref().is_some_and(|jti| jti.len() >= 22));
    assert_ne!(claims.jti, server.claims().jti, "jti is random");
    assert_eq!(claims.expires_at(), now() + HOUR);
}

#[test]
fn the_signing_key_survives_pem_and_its_kid_is_its_thumbprint() {
    let key = SigningKey::generate().expect("generate");
    let pem = key.to_pkcs8_pem();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
    assert!(!format!("{key:?}").contains(pem.lines().nth(1).expect("body")));
    let again = SigningKey::from_pkcs8_pem(&pem).expect("reads back");
    assert_eq!(again.key_id(), key.key_id());
    assert_eq!(again.public_jwk(), key.public_jwk());
    assert_eq!(key.public_jwk().thumbprint().as_deref(), Some(key.key_id()));
    let claims = Claims::new(ISSUER, "alice", AUDIENCE, now(), HOUR);
    let verifier = Verifier::new(key.jwk_set(), ISSUER, AUDIENCE);
    assert!(verifier.verify(&sign(&again, &claims), now()).is_ok());

    let error = SigningKey::from_pkcs8_pem("not a key").expect_err("not PEM");
    assert!(matches!(error, KeyError::Pem(_)), "{error}");
    let garbage = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    let error = SigningKey::from_pkcs8_pem(garbage).expect_err("not a key");
    assert!(error.to_string().contains("P-256"), "{error}");
}

#[test]
fn rfc_7638_thumbprint_example() {
    let jwk = Jwk {
        kty: "RSA".into(),
        n: Some(RFC7638_N.into()),
        e: Some("AQAB".into()),
        alg: Some("RS256".into()),
        kid: Some("2011-04-29".into()),
        ..Jwk::default()
    };
    assert_eq!(
        jwk.thumbprint().as_deref(),
        Some("NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
    );
}

#[test]
fn too_long() {
    let token = "a".repeat(20_000);
    let error = refused(&Server::new().verifier(), &token, now(), "20000 bytes");
    assert!(matches!(error, TokenError::TooLong { len: 20000, .. }));
}

#[test]
fn not_three_parts() {
    let verifier = Server::new().verifier();
    for (token, parts) in [("", 1), ("abc", 1), ("a.b", 2), ("a.b.c.d", 4)] {
        let error = refused(&verifier, token, now(), &format!("has {parts}"));
        assert_eq!(error, TokenError::Shape { parts });
    }
}

#[test]
fn header_not_base64() {
    let server = Server::new();
    let token = replace_part(&sign(&server.key, &server.claims()), 0, "e*J");
    let error = refused(&server.verifier(), &token, now(), "header is not base64url");
    assert_eq!(error, TokenError::Base64 { part: Part::Header });
}

#[test]
fn signature_not_base64() {
    let server = Server::new();
    let token = sign(&server.key, &server.claims());
    // Padding is refused too: one spelling per signature.
    let token = format!("{token}==");
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "signature is not base64url",
    );
    assert_eq!(
        error,
        TokenError::Base64 {
            part: Part::Signature
        }
    );
}

#[test]
fn payload_not_base64_under_a_good_signature() {
    let server = Server::new();
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(server.header().to_string()),
        "not*base64"
    );
    let signature = server
        .raw
        .sign(&SystemRandom::new(), input.as_bytes())
        .expect("sign");
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()));
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "payload is not base64url",
    );
    assert_eq!(
        error,
        TokenError::Base64 {
            part: Part::Payload
        }
    );
}

#[test]
fn header_not_json() {
    let server = Server::new();
    let token = replace_part(
        &sign(&server.key, &server.claims()),
        0,
        &URL_SAFE_NO_PAD.encode("{\"alg\": "),
    );
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "header is not a JSON object",
    );
    assert!(matches!(
        error,
        TokenError::Json {
            part: Part::Header,
            ..
        }
    ));
}

#[test]
fn payload_not_json_under_a_good_signature() {
    let server = Server::new();
    let token = Server::sign_raw(&server.raw, &server.header(), b"[\"alice\"]");
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "payload is not a JSON object",
    );
    assert!(matches!(
        error,
        TokenError::Json {
            part: Part::Payload,
            ..
        }
    ));
}

#[test]
fn alg_none_with_an_empty_signature() {
    let server = Server::new();
    let header = json!({"alg": "none", "typ": "JWT", "kid": server.key.key_id()});
    let token = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(server.payload().to_string())
    );
    let error = refused(&server.verifier(), &token, now(), "alg `none`");
    assert_eq!(error, TokenError::AlgNone);
    // Case games do not help.
    let header = json!({"alg": "nOnE", "kid": server.key.key_id()});
    let token = replace_part(&token, 0, &URL_SAFE_NO_PAD.encode(header.to_string()));
    assert_eq!(
        server.verifier().verify(&token, now()),
        Err(TokenError::AlgNone)
    );
}

#[test]
fn hs256_with_our_public_key_as_the_secret() {
    let server = Server::new();
    let header = json!({"alg": "HS256", "typ": "JWT", "kid": server.key.key_id()});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(server.payload().to_string())
    );
    // Both spellings of "the public key" a confused verifier might use.
    let jwk = serde_json::to_string(&server.key.public_jwk()).expect("json");
    for secret in [server.raw.public_key().as_ref(), jwk.as_bytes()] {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), input.as_bytes());
        let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        let error = refused(
            &server.verifier(),
            &token,
            now(),
            "\"HS256\" is not accepted",
        );
        assert_eq!(
            error,
            TokenError::UnsupportedAlg {
                alg: "HS256".into()
            }
        );
    }
}

#[test]
fn alg_not_matching_the_keys_type() {
    let server = Server::new();
    // RS256 claimed under our EC key's kid.
    let header = json!({"alg": "RS256", "kid": server.key.key_id()});
    let token = Server::sign_raw(
        &server.raw,
        &header,
        server.payload().to_string().as_bytes(),
    );
    let error = refused(&server.verifier(), &token, now(), "algorithm confusion");
    assert_eq!(
        error,
        TokenError::AlgMismatch {
            alg: Alg::Rs256,
            kid: server.key.key_id().into(),
            key_alg: Alg::Es256
        }
    );
}

#[test]
fn no_kid() {
    let server = Server::new();
    let header = json!({"alg": "ES256", "typ": "JWT"});
    let token = Server::sign_raw(
        &server.raw,
        &header,
        server.payload().to_string().as_bytes(),
    );
    let error = refused(&server.verifier(), &token, now(), "no `kid`");
    assert_eq!(error, TokenError::MissingHeader { member: "kid" });
}

#[test]
fn unknown_kid() {
    let server = Server::new();
    let other = Server::new();
    let token = sign(&other.key, &other.claims());
    let error = refused(&server.verifier(), &token, now(), other.key.key_id());
    assert!(error.to_string().contains("not trusted"), "{error}");
    assert!(matches!(error, TokenError::UnknownKid { .. }));
}

#[test]
fn critical_header_extensions() {
    let server = Server::new();
    let mut header = server.header();
    header["crit"] = json!(["exp"]);
    let token = Server::sign_raw(
        &server.raw,
        &header,
        server.payload().to_string().as_bytes(),
    );
    let error = refused(&server.verifier(), &token, now(), "`crit`");
    assert_eq!(error, TokenError::Critical);
}

#[test]
fn another_es256_key_under_our_kid() {
    let server = Server::new();
    let forger = Server::new();
    let token = Server::sign_raw(
        &forger.raw,
        &server.header(),
        server.payload().to_string().as_bytes(),
    );
    let error = refused(&server.verifier(), &token, now(), "does not verify");
    assert_eq!(
        error,
        TokenError::BadSignature {
            kid: server.key.key_id().into()
        }
    );
}

#[test]
fn a_tampered_payload() {
    let server = Server::new();
    let token = sign(&server.key, &server.claims());
    let mut payload = server.payload();
    payload["sub"] = json!("root");
    payload["roles"] = json!(["admin"]);
    let tampered = replace_part(&token, 1, &URL_SAFE_NO_PAD.encode(payload.to_string()));
    let error = refused(&server.verifier(), &tampered, now(), "altered");
    assert!(matches!(error, TokenError::BadSignature { .. }));
}

#[test]
fn expired_says_when() {
    let server = Server::new();
    let token = sign(&server.key, &server.claims());
    let late = now() + HOUR + Duration::from_secs(3600);
    let error = refused(
        &server.verifier(),
        &token,
        late,
        "expired at 2026-12-01T01:00:00Z",
    );
    assert!(error.to_string().contains("3600 s ago"), "{error}");
    assert!(matches!(error, TokenError::Expired { .. }));
}

#[test]
fn not_yet_valid() {
    let server = Server::new();
    let mut payload = server.payload();
    payload["nbf"] = json!(unix(now()) + 600);
    let token = server.sign_payload(&payload);
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "not valid before 2026-12-01T00:10:00Z",
    );
    assert!(matches!(
        error,
        TokenError::NotYetValid { claim: "nbf", .. }
    ));
    // Issued in the future is as suspect.
    let mut payload = server.payload();
    payload["iat"] = json!(unix(now()) + 600);
    let token = server.sign_payload(&payload);
    let error = refused(&server.verifier(), &token, now(), "its `iat`");
    assert!(matches!(
        error,
        TokenError::NotYetValid { claim: "iat", .. }
    ));
}

#[test]
fn wrong_issuer() {
    let server = Server::new();
    let claims = Claims::new("https://evil.test", "alice", AUDIENCE, now(), HOUR);
    let token = sign(&server.key, &claims);
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "issued by \"https://evil.test\"",
    );
    assert!(matches!(error, TokenError::WrongIssuer { .. }));
}

#[test]
fn wrong_audience() {
    let server = Server::new();
    let claims = Claims::new(ISSUER, "alice", "grafana", now(), HOUR);
    let token = sign(&server.key, &claims);
    let error = refused(
        &server.verifier(),
        &token,
        now(),
        "audience [\"grafana\"], not for `cca`",
    );
    assert!(matches!(error, TokenError::WrongAudience { .. }));
    // One of several audiences is enough.
    let mut payload = server.payload();
    payload["aud"] = json!(["grafana", AUDIENCE]);
    let claims = server
        .verifier()
        .verify(&server.sign_payload(&payload), now())
        .expect("cca is one of the audiences");
    assert_eq!(claims.aud, ["grafana", AUDIENCE]);
}

#[test]
fn missing_required_claims() {
    let server = Server::new();
    for claim in ["iss", "sub", "aud", "iat", "exp"] {
        let mut payload = server.payload();
        payload.as_object_mut().expect("object").remove(claim);
        let token = server.sign_payload(&payload);
        let error = refused(
            &server.verifier(),
            &token,
            now(),
            &format!("claim `{claim}`"),
        );
        assert_eq!(error, TokenError::MissingClaim { claim });
    }
    // nbf and jti are optional (OIDC ID tokens often lack them).
    let mut payload = server.payload();
    payload.as_object_mut().expect("object").remove("nbf");
    payload.as_object_mut().expect("object").remove("jti");
    let claims = server
        .verifier()
        .verify(&server.sign_payload(&payload), now())
        .expect("nbf and jti optional");
    assert_eq!((claims.nbf, claims.jti), (None, None));
}

#[test]
fn claims_of_the_wrong_type_and_unknown_claims() {
    let server = Server::new();
    let mut payload = server.payload();
    payload["exp"] = json!("tomorrow");
    let error = refused(
        &server.verifier(),
        &server.sign_payload(&payload),
        now(),
        "`exp` is not a number",
    );
    assert!(matches!(error, TokenError::ClaimType { claim: "exp", .. }));
    let mut payload = server.payload();
    payload["roles"] = json!("admin");
    let error = refused(
        &server.verifier(),
        &server.sign_payload(&payload),
        now(),
        "`roles`",
    );
    assert!(matches!(
        error,
        TokenError::ClaimType { claim: "roles", .. }
    ));

    // Unknown claims are tolerated and dropped; fractional dates allowed.
    let mut payload = server.payload();
    payload["email"] = json!("alice@example.com");
    payload["exp"] = json!(unix(now() + HOUR) as f64 + 0.5);
    payload["tenant"] = json!("blue");
    let claims = server
        .verifier()
        .verify(&server.sign_payload(&payload), now())
        .expect("unknown claims tolerated");
    assert_eq!(claims.exp, unix(now() + HOUR));
    assert_eq!(claims.tenant.as_deref(), Some("blue"));
}

#[test]
fn expiry_on_a_fake_clock_with_leeway_on_both_sides() {
    let server = Server::new();
    let token = sign(&server.key, &server.claims());
    let verifier = server.verifier();
    let exp = now() + HOUR;
    let nbf = now();
    let second = Duration::from_secs(1);
    // Default leeway of 60 s past exp and before nbf.
    assert!(verifier.verify(&token, exp + 59 * second).is_ok());
    assert!(matches!(
        verifier.verify(&token, exp + 60 * second),
        Err(TokenError::Expired { leeway: 60, .. })
    ));
    assert!(verifier.verify(&token, nbf - 60 * second).is_ok());
    assert!(matches!(
        verifier.verify(&token, nbf - 61 * second),
        Err(TokenError::NotYetValid {
            claim: "nbf",
            leeway: 60,
            ..
        })
    ));
    // Without leeway the token is valid on [nbf, exp).
    let strict = server.verifier().with_leeway(Duration::ZERO);
    assert!(strict.verify(&token, nbf).is_ok());
    assert!(strict.verify(&token, exp - second).is_ok());
    assert!(strict.verify(&token, exp).is_err());
    assert!(strict.verify(&token, nbf - second).is_err());
}

/// An OIDC issuer signing with RSA, as most do.
struct RsaIssuer {
    pair: RsaKeyPair,
    jwk: Jwk,
}

impl RsaIssuer {
    fn new(kid: &str) -> RsaIssuer {
        let pair = RsaKeyPair::generate(KeySize::Rsa2048).expect("rsa key");
        let public = pair.public_key();
        let jwk = Jwk {
            kty: "RSA".into(),
            kid: Some(kid.into()),
            use_: Some("sig".into()),
            alg: Some("RS256".into()),
            n: Some(URL_SAFE_NO_PAD.encode(public.modulus().big_endian_without_leading_zero())),
            e: Some(URL_SAFE_NO_PAD.encode(public.exponent().big_endian_without_leading_zero())),
            ..Jwk::default()
        };
        RsaIssuer { pair, jwk }
    }

    fn sign(&self, header: &Value, payload: &Value) -> String {
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload.to_string())
        );
        let mut signature = vec![0; self.pair.public_modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                input.as_bytes(),
                &mut signature,
            )
            .expect("rsa sign");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

#[test]
fn rs256_against_a_jwks_with_an_rsa_key() {
    let issuer = RsaIssuer::new("rsa-1");
    let ours = Server::new();
    let jwks = json!({"keys": [issuer.jwk, ours.key.public_jwk()]}).to_string();
    let keys = JwkSet::from_json(&jwks).expect("jwks");
    assert_eq!(keys.key_ids().count(), 2);
    let verifier = Verifier::new(keys, ISSUER, AUDIENCE);
    let payload = ours.payload();
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": "rsa-1"});
    let claims = verifier
        .verify(&issuer.sign(&header, &payload), now())
        .expect("RS256 verifies");
    assert_eq!(claims.sub, "alice");

    // The other way round: ES256 claimed under the RSA key's kid.
    let header = json!({"alg": "ES256", "kid": "rsa-1"});
    let token = Server::sign_raw(&ours.raw, &header, payload.to_string().as_bytes());
    let error = refused(&verifier, &token, now(), "is for RS256");
    assert!(matches!(error, TokenError::AlgMismatch { .. }));
    // And a forged RSA signature.
    let forger = RsaIssuer::new("rsa-1");
    let header = json!({"alg": "RS256", "kid": "rsa-1"});
    let error = refused(
        &verifier,
        &forger.sign(&header, &payload),
        now(),
        "does not verify",
    );
    assert!(matches!(error, TokenError::BadSignature { .. }));
}

#[test]
fn jwks_skips_keys_it_cannot_use_and_says_why() {
    let ours = Server::new();
    let ec = ours.key.public_jwk();
    let jwks = json!({"keys": [
        ec,
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        {"kty": "EC", "crv": "P-384", "kid": "p384", "x": "AA", "y": "AA"},
        {"kty": "RSA", "kid": "small", "n": URL_SAFE_NO_PAD.encode([0xc1; 128]), "e": "AQAB"},
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": RFC7638_N, "e": "AQAB"},
        {"kty": "RSA", "kid": "ps", "alg": "PS256", "n": RFC7638_N, "e": "AQAB"},
        {"kty": "RSA", "n": RFC7638_N, "e": "AQAB"},
        {"kty": "EC", "crv": "P-256", "kid": "offcurve",
         "x": URL_SAFE_NO_PAD.encode([1; 32]), "y": URL_SAFE_NO_PAD.encode([2; 32])},
        {"kty": 7, "kid": "weird"},
        ec,
        {"kty": "RSA", "kid": "2011-04-29", "alg": "RS256", "n": RFC7638_N, "e": "AQAB"},
    ]})
    .to_string();
    let keys = JwkSet::from_json(&jwks).expect("jwks");
    assert_eq!(
        keys.key_ids().collect::<Vec<_>>(),
        [ours.key.key_id(), "2011-04-29"]
    );
    let reasons: Vec<String> = keys.skipped().iter().map(ToString::to_string).collect();
    let expected = [
        "key `ed` skipped: key type `OKP` is not supported",
        "key `p384` skipped: curve `P-384` is not supported",
        "key `small` skipped: an RSA modulus of 1024 bits",
        "key `enc` skipped: its use is `enc`",
        "key `ps` skipped: its alg is `PS256`",
        "key without kid skipped",
        "key `offcurve` skipped: its point is not on the P-256 curve",
        "key `weird` skipped: not a JSON Web Key",
        "the same kid",
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:#?}");
    for (reason, expected) in reasons.iter().zip(expected) {
        assert!(reason.contains(expected), "`{reason}` is not `{expected}`");
    }

    // Our own set serves and reads back.
    let served = JwkSet::from_json(&ours.key.jwk_set().to_json()).expect("ours");
    assert_eq!(served.key_ids().collect::<Vec<_>>(), [ours.key.key_id()]);
    assert!(served.skipped().is_empty());

    for bad in ["", "[]", "{\"keys\": 3}", "{}"] {
        let error = JwkSet::from_json(bad).expect_err("not a JWKS");
        assert!(matches!(error, JwkError::NotJwks(_)));
        assert!(error.to_string().contains("`keys` array"), "{error}");
    }
}

#[test]
fn oidc_discovery_documents() {
    let issuer = TestIssuer::new("http://127.0.0.1:8099");
    assert_eq!(
        issuer.discovery_url(),
        "http://127.0.0.1:8099/.well-known/openid-configuration"
    );
    let discovery =
        OidcDiscovery::from_json(&issuer.discovery_document(), issuer.issuer()).expect("ok");
    assert_eq!(discovery.jwks_uri, "http://127.0.0.1:8099/jwks.json");
    assert_eq!(
        discovery.token_endpoint.as_deref(),
        Some("http://127.0.0.1:8099/token")
    );

    let error = OidcDiscovery::from_json(&issuer.discovery_document(), "https://login.test")
        .expect_err("another issuer");
    assert!(matches!(error, DiscoveryError::IssuerMismatch { .. }));
    assert!(
        error.to_string().contains("http://127.0.0.1:8099"),
        "{error}"
    );

    let plain = json!({"issuer": "https://login.test", "jwks_uri": "http://login.test/keys"});
    let error =
        OidcDiscovery::from_json(&plain.to_string(), "https://login.test").expect_err("plain HTTP");
    assert!(
        matches!(error, DiscoveryError::InsecureJwksUri(_)),
        "{error}"
    );
    for loopback in [
        "http://localhost:1/k",
        "http://[::1]:8080/k",
        "https://login.test/k",
    ] {
        let doc = json!({"issuer": "https://login.test", "jwks_uri": loopback});
        assert!(
            OidcDiscovery::from_json(&doc.to_string(), "https://login.test").is_ok(),
            "{loopback}"
        );
    }
    let error = OidcDiscovery::from_json("{\"issuer\": \"x\"}", "x").expect_err("no jwks_uri");
    assert!(error.to_string().contains("jwks_uri"), "{error}");
}

#[test]
fn the_test_issuer_serves_what_a_verifier_needs() {
    let issuer = TestIssuer::new("http://127.0.0.1:8099/");
    let discovery = OidcDiscovery::from_json(&issuer.discovery_document(), "http://127.0.0.1:8099")
        .expect("discovery");
    let keys = JwkSet::from_json(&issuer.jwks_document()).expect("jwks");
    let verifier = Verifier::new(keys, discovery.issuer, AUDIENCE);
    let token = issuer.token("bob", AUDIENCE, now(), HOUR);
    assert_eq!(verifier.verify(&token, now()).expect("verifies").sub, "bob");
    assert!(issuer.verifier("other").verify(&token, now()).is_err());
}

/// The RSA modulus of RFC 7638 §3.1 (2048 bits).
const RFC7638_N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";

/// One key and one token for all proptest cases (key generation is the
/// slow part).
fn fixture() -> &'static (Verifier, String) {
    static FIXTURE: std::sync::OnceLock<(Verifier, String)> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let server = Server::new();
        let claims = server.claims().with_tenant("blue").with_roles(["viewer"]);
        (server.verifier(), sign(&server.key, &claims))
    })
}

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_strings_are_refused(token in ".{0,400}") {
        let (verifier, _) = fixture();
        prop_assert!(verifier.verify(&token, now()).is_err());
    }

    #[test]
    fn random_three_part_base64_is_refused(
        a in "[A-Za-z0-9_-]{0,120}",
        b in "[A-Za-z0-9_-]{0,200}",
        c in "[A-Za-z0-9_-]{0,100}",
    ) {
        let (verifier, _) = fixture();
        let token = format!("{a}.{b}.{c}");
        prop_assert!(verifier.verify(&token, now()).is_err());
    }

    #[test]
    fn mutated_tokens_are_refused(
        position in any::<prop::sample::Index>(),
        replacement in prop::sample::select(ALPHABET),
        kind in 0..3u8,
    ) {
        let (verifier, token) = fixture();
        prop_assert!(verifier.verify(token, now()).is_ok());
        let mut bytes = token.as_bytes().to_vec();
        let at = position.index(bytes.len());
        match kind {
            0 => bytes[at] = replacement,
            1 => bytes.insert(at, replacement),
            _ => { bytes.remove(at); }
        }
        let mutated = String::from_utf8(bytes).expect("ascii");
        prop_assume!(mutated != *token);
        let result = verifier.verify(&mutated, now());
        prop_assert!(result.is_err(), "accepted a mutation at {} ({}): {:?}", at, kind, result);
    }
}

#[test]
fn the_signature_checks_use_aws_lc_fixed_encoding() {
    // ES256 signatures in JWTs are r||s (64 bytes), not DER: a DER-encoded
    // signature of the same input is refused.
    let server = Server::new();
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(server.header().to_string()),
        URL_SAFE_NO_PAD.encode(server.payload().to_string())
    );
    let der = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        server.raw.to_pkcs8v1().expect("pkcs8").as_ref(),
    )
    .expect("same key")
    .sign(&SystemRandom::new(), input.as_bytes())
    .expect("sign");
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(der.as_ref()));
    let error = refused(&server.verifier(), &token, now(), "does not verify");
    assert!(matches!(error, TokenError::BadSignature { .. }));
}
