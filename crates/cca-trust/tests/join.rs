//! Join tokens: they round-trip, every malformation is named without
//! echoing the secret, arbitrary text never panics the parser, and a
//! stored token admits exactly the node with the secret, in time, while
//! it has uses left and is not revoked.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cca_trust::join::{BadToken, DEFAULT_TTL, JoinToken, Refusal, StoredToken, TokenRules};
use cca_trust::pki::Fingerprint;
use proptest::prelude::*;

const FINGERPRINT: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const SECRET: &str = "0123456789abcdef";

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_900_000_000)
}

fn fingerprint() -> Fingerprint {
    FINGERPRINT.parse().expect("fingerprint")
}

fn token() -> JoinToken {
    format!("K10{FINGERPRINT}::abc123.{SECRET}")
        .parse()
        .expect("token")
}

#[test]
fn tokens_round_trip_and_hide_their_secret_from_debug() {
    let token = JoinToken::generate(&fingerprint()).expect("token");
    let text = token.to_string();
    assert_eq!(text.len(), 3 + 64 + 2 + 6 + 1 + 16);
    assert!(text.starts_with(&format!("K10{FINGERPRINT}::")), "{text}");
    let parsed: JoinToken = text.parse().expect("parses");
    assert_eq!(parsed, token);
    assert_eq!(parsed.ca(), &fingerprint());
    assert_eq!(
        format!("  {text}\n").parse::<JoinToken>(),
        Ok(token.clone())
    );
    let debug = format!("{token:?}");
    assert!(!debug.contains(token.secret()), "{debug}");
    assert!(debug.contains(token.id()), "{debug}");
    let other = JoinToken::generate(&fingerprint()).expect("token");
    assert_ne!(other.id(), token.id());
    assert_ne!(other.secret(), token.secret());
    for text in [token.id(), token.secret()] {
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{text}"
        );
    }
}

#[test]
fn every_malformation_has_its_message_and_none_echoes_the_secret() {
    let cases = [
        (
            format!("K11{FINGERPRINT}::abc123.{SECRET}"),
            BadToken::Prefix,
        ),
        (format!("{FINGERPRINT}::abc123.{SECRET}"), BadToken::Prefix),
        (
            format!("K10{}::abc123.{SECRET}", &FINGERPRINT[..60]),
            BadToken::FingerprintLength { len: 60 },
        ),
        (
            format!("K10{}zz::abc123.{SECRET}", &FINGERPRINT[..62]),
            BadToken::FingerprintHex,
        ),
        (
            format!("K10{FINGERPRINT}abc123.{SECRET}"),
            BadToken::Separator {
                missing: "`::` after the fingerprint",
            },
        ),
        (
            format!("K10{FINGERPRINT}::abc123{SECRET}"),
            BadToken::Separator {
                missing: "`.` between id and secret",
            },
        ),
        (format!("K10{FINGERPRINT}::abc12.{SECRET}"), BadToken::Id),
        (format!("K10{FINGERPRINT}::ABC123.{SECRET}"), BadToken::Id),
        (
            format!("K10{FINGERPRINT}::abc123.{}", &SECRET[..15]),
            BadToken::Secret,
        ),
        (
            format!("K10{FINGERPRINT}::abc123.{SECRET}x"),
            BadToken::Secret,
        ),
        (
            format!("K10{FINGERPRINT}::abc123.{}é", &SECRET[..14]),
            BadToken::Secret,
        ),
    ];
    for (text, expected) in cases {
        let error = text.parse::<JoinToken>().expect_err(&text);
        assert_eq!(error, expected, "{text}");
        let message = error.to_string();
        assert!(!message.contains(&SECRET[..8]), "{message}");
    }
    assert_eq!(
        BadToken::FingerprintLength { len: 60 }.to_string(),
        "the CA fingerprint in a join token has 64 hexadecimal digits, this one has 60: \
         the token was cut or altered"
    );
    assert_eq!(
        BadToken::Secret.to_string(),
        "a join token's secret has 16 characters of a-z and 0-9"
    );
}

proptest! {
    #[test]
    fn parsing_arbitrary_text_never_panics(text in ".{0,120}") {
        let _ = text.parse::<JoinToken>();
    }

    #[test]
    fn parsing_near_tokens_never_panics(
        head in "(K10)?[0-9a-fA-F:é]{0,70}",
        sep in "(::|:|\\.)?",
        tail in "[a-z0-9.é]{0,30}",
    ) {
        let text = format!("{head}{sep}{tail}");
        if let Ok(token) = text.parse::<JoinToken>() {
            prop_assert_eq!(token.to_string(), text);
        }
    }
}

fn stored() -> StoredToken {
    token().to_stored(now(), DEFAULT_TTL)
}

#[test]
fn a_stored_token_keeps_only_a_hash_and_round_trips_as_json() {
    let stored = stored();
    assert_eq!(stored.id, "abc123");
    assert_eq!(stored.secret_hash.len(), 64);
    let json = serde_json::to_string(&stored).expect("json");
    assert!(!json.contains(SECRET), "{json}");
    assert_eq!(
        serde_json::from_str::<StoredToken>(&json).expect("json"),
        stored
    );
    assert_eq!(stored.expires_at - stored.created_at, 3_600_000);
    assert!(stored.is_live(now()));
}

#[test]
fn admit_lets_in_the_right_node_with_the_secret_in_time() {
    let mut stored = stored();
    stored.node = Some("n1".into());
    stored.uses_left = Some(1);
    assert_eq!(stored.admit(SECRET, "n1", now()), Ok(()));
    assert_eq!(
        stored.admit(SECRET, "n1", now() + DEFAULT_TTL - Duration::from_millis(1)),
        Ok(())
    );
}

#[test]
fn admit_refuses_each_reason_by_name() {
    let base = stored();
    let refusal = |token: &StoredToken, secret: &str, node: &str, at: SystemTime| {
        token.admit(secret, node, at).expect_err("refused")
    };

    let wrong = refusal(&base, "0123456789abcdee", "n1", now());
    assert_eq!(
        wrong,
        Refusal::WrongSecret {
            id: "abc123".into()
        }
    );
    assert_eq!(wrong.to_string(), "wrong secret for join token `abc123`");
    assert!(matches!(
        refusal(&base, "", "n1", now()),
        Refusal::WrongSecret { .. }
    ));

    let expired = refusal(&base, SECRET, "n1", now() + DEFAULT_TTL);
    assert!(matches!(expired, Refusal::Expired { .. }), "{expired}");
    assert_eq!(
        expired.to_string(),
        "join token `abc123` expired at 2030-03-17T18:46:40Z"
    );

    let revoked = StoredToken {
        revoked: true,
        ..base.clone()
    };
    assert_eq!(
        refusal(&revoked, SECRET, "n1", now()),
        Refusal::Revoked {
            id: "abc123".into()
        }
    );
    assert!(!revoked.is_live(now()));
    // Without the secret, nobody learns that the token is revoked.
    assert!(matches!(
        refusal(&revoked, "x", "n1", now()),
        Refusal::WrongSecret { .. }
    ));

    let pinned = StoredToken {
        node: Some("n1".into()),
        ..base.clone()
    };
    let other = refusal(&pinned, SECRET, "n2", now());
    assert_eq!(
        other.to_string(),
        "join token `abc123` enrols node `n1` only, not `n2`"
    );

    let once = StoredToken {
        uses_left: Some(1),
        ..base.clone()
    };
    assert_eq!(once.admit(SECRET, "n1", now()), Ok(()));
    let spent = once.spend();
    assert_eq!(spent.uses_left, Some(0));
    assert_eq!(
        refusal(&spent, SECRET, "n2", now()),
        Refusal::UsedUp {
            id: "abc123".into()
        }
    );
    assert!(!spent.is_live(now()));
    assert_eq!(base.spend().uses_left, None, "unlimited stays unlimited");
}
