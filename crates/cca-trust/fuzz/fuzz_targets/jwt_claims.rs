//! Arbitrary bytes as a token's payload, correctly signed: the fuzzer
//! cannot forge signatures, so this is how it reaches the claims parser
//! and the time, issuer and audience checks behind the signature.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cca_trust::jwt::{SigningKey, Verifier};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    raw: EcdsaKeyPair,
    header: String,
    verifier: Verifier,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let raw = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("key");
        let der = raw.to_pkcs8v1().expect("pkcs8");
        let key = SigningKey::from_pkcs8_der(der.as_ref()).expect("our key");
        let header = serde_json::json!({"alg": "ES256", "kid": key.key_id()}).to_string();
        Fixture {
            raw,
            header: URL_SAFE_NO_PAD.encode(header),
            verifier: Verifier::new(key.jwk_set(), "https://cca.fuzz", "cca"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let input = format!("{}.{}", fixture.header, URL_SAFE_NO_PAD.encode(data));
    let signature = fixture
        .raw
        .sign(&SystemRandom::new(), input.as_bytes())
        .expect("sign");
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()));
    let now = UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    if let Ok(claims) = fixture.verifier.verify(&token, now) {
        // Whatever it accepts passed every check.
        assert_eq!(claims.iss, "https://cca.fuzz");
        assert!(claims.aud.iter().any(|aud| aud == "cca"));
    }
});
