//! Fuzz target: any bytes, parsed and compiled, must never panic and the
//! tree must give back the input exactly (lossless).
#![no_main]

use cca_dsl::compile::compile_str;
use cca_dsl::template::Values;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = cca_dsl::parse(&text);
    assert_eq!(parsed.root.text(&text), text);
    let _ = compile_str(&text, &Values::default());
});
