//! The per-request cost of a bearer token: verifying one ES256 token
//! (decode, one ECDSA P-256 verification, claims and time checks).

use std::hint::black_box;
use std::time::{Duration, UNIX_EPOCH};

use cca_trust::jwt::{Claims, SigningKey, Verifier, sign};
use criterion::{Criterion, criterion_group, criterion_main};

fn verify_es256(c: &mut Criterion) {
    let key = SigningKey::generate().expect("aws-lc generates a key");
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
}

criterion_group!(benches, verify_es256);
criterion_main!(benches);
