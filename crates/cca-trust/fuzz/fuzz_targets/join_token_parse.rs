//! Arbitrary strings as join tokens: parsing must refuse without
//! panicking, and what it accepts must print back to a token that parses
//! to the same value.
#![no_main]

use cca_trust::join::JoinToken;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(token) = text.parse::<JoinToken>() {
        let again = token.to_string().parse::<JoinToken>().ok();
        assert!(
            again == Some(token),
            "a parsed join token does not print back"
        );
    }
});
