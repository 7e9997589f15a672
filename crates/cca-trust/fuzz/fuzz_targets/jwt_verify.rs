//! Arbitrary bytes as a bearer token against a fixed verifier (one ES256
//! and one RS256 key): `verify` must refuse without panicking, and a
//! refusal's message must never quote the token's signature.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use cca_trust::jwt::testing::TestIssuer;
use cca_trust::jwt::{Jwk, Verifier};
use libfuzzer_sys::fuzz_target;

fn verifier() -> &'static Verifier {
    static VERIFIER: OnceLock<Verifier> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let issuer = TestIssuer::new("https://cca.fuzz");
        let mut keys = issuer.keys();
        // RFC 7638's example RSA key, so RS256 headers reach a real key.
        keys.insert(Jwk {
            kty: "RSA".into(),
            kid: Some("rsa".into()),
            n: Some(RSA_N.into()),
            e: Some("AQAB".into()),
            ..Jwk::default()
        });
        Verifier::new(keys, issuer.issuer(), "cca")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_796_083_200);
    match verifier().verify(token, now) {
        Ok(claims) => panic!("accepted a token no key signed: {claims:?}"),
        Err(error) => {
            // A signature is at least 86 characters and the values a
            // message quotes are cut to 64, so a whole signature never
            // fits. (The whole token is no test: the fuzzer soon learns to
            // send words of the messages themselves.)
            let signature = token.rsplit('.').next().unwrap_or_default();
            if token.contains('.') && signature.len() >= 80 {
                assert!(
                    !error.to_string().contains(signature),
                    "the message quotes the signature"
                );
            }
        }
    }
});

const RSA_N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
