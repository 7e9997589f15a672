//! The per-request cost of a bearer token: verifying one ES256 token
//! (decode, one ECDSA P-256 verification, claims and time checks), next
//! to the bare ECDSA verification of the same bytes, which shows what the
//! token handling around it costs.

use std::hint::black_box;
use std::time::{Duration, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _,
    ParsedPublicKey,
};
use cca_trust::jwt::{Claims, SigningKey, Verifier, sign};
use criterion::{Criterion, criterion_group, criterion_main};

fn verify_es256(c: &mut Criterion) {
    let raw = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("a key");
    let key = SigningKey::from_pkcs8_der(raw.to_pkcs8v1().expect("pkcs8").as_ref())
        .expect("the same key");
    // A fixed instant: the clock is an input, and reading it is not what is measured.
    let now = UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    let claims = Claims::new(
        "https://cca.example:7443",
        "alice",
        "cca",
        now,
        Duration::from_secs(3600),
    )
    .with_tenant("blue")
    .with_roles(["developer"]);
    let token = sign(&key, &claims);
    let verifier = Verifier::new(key.jwk_set(), "https://cca.example:7443", "cca");
    c.bench_function("jwt_verify_es256", |b| {
        b.iter(|| {
            verifier
                .verify(black_box(&token), now)
                .expect("the token verifies")
        })
    });

    let public = ParsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, raw.public_key().as_ref())
        .expect("a P-256 point");
    let message = token.as_bytes();
    let signature = raw.sign(&SystemRandom::new(), message).expect("sign");
    c.bench_function("p256_verify_only", |b| {
        b.iter(|| {
            public
                .verify_sig(black_box(message), signature.as_ref())
                .expect("verifies")
        })
    });
}

criterion_group!(benches, verify_es256);
criterion_main!(benches);
