//! Fuzz target: whenever a file formats, formatting again changes nothing
//! and the tree (without layout) is the same as the input's.
#![no_main]

use cca_dsl::format::format_source;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(formatted) = format_source(text) else {
        return;
    };
    let again = format_source(&formatted).expect("formatted output parses");
    assert_eq!(again, formatted, "fmt is not idempotent");
    let before = cca_dsl::parse(text).root.shape(text);
    let after = cca_dsl::parse(&formatted).root.shape(&formatted);
    assert_eq!(before, after, "fmt changed the tree");
});
