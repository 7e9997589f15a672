//! The skip rules every root-only and tool-using test relies on: not root,
//! a missing tool or root itself skips (saying why); as root, a missing
//! tool fails the test instead of letting it pass without running.

use cca_image::testing::{commands_available, is_root, root_test};

const MISSING: &str = "cca-no-such-command-7f3a";

#[test]
fn a_missing_tool_fails_as_root_and_skips_otherwise() {
    let outcome = std::panic::catch_unwind(|| commands_available("probe", &[MISSING]));
    if is_root() {
        let panic = outcome.expect_err("as root a missing tool must fail");
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        assert!(
            message.contains(MISSING) && message.contains("runs as root"),
            "{message}"
        );
    } else {
        assert_eq!(outcome.ok(), Some(false));
    }
}

#[test]
fn a_root_test_runs_exactly_when_root() {
    assert_eq!(root_test("probe", "nothing", &[]), is_root());
    assert!(commands_available("probe", &["sh"]));
}
