//! Server-side checks. The CLI compiles `.cca` files locally, so the
//! server cannot trust that what arrives came from the compiler: a program
//! is judged by the same rules the compiler applies, `cca_model::validity`
//! (names, references, ports, ranges, conflicts), and refused with every
//! problem listed. Names outside programs (nodes) follow [`check_name`]:
//! usable as one segment of a store key.

use cca_model::spec::Program;

use crate::error::{ApiError, ApiResult};

pub(crate) use cca_model::validity::MAX_REPLICAS;

/// Longest object name accepted (a DNS label is 63; keys allow more).
const MAX_NAME_LEN: usize = 253;

/// Checks a name that becomes one segment of a store key.
pub(crate) fn check_name(kind: &str, name: &str) -> ApiResult<()> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("is longer than 253 bytes")
    } else if name.contains('/') {
        Some("contains `/`")
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains whitespace or control characters")
    } else if name == "." || name == ".." {
        Some("is `.` or `..`")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ApiError::invalid(format!(
            "{kind} name `{}` {problem}",
            name.escape_debug()
        ))),
        None => Ok(()),
    }
}

/// Refuses (422) a program with any problem, listing every one.
pub(crate) fn check_program(program: &Program) -> ApiResult<()> {
    let problems = program.problems();
    match problems.len() {
        0 => Ok(()),
        count => {
            let noun = if count == 1 { "problem" } else { "problems" };
            let message = format!(
                "the program has {count} {noun} (the rules `cca lint` checks); nothing was written"
            );
            Err(ApiError::invalid(message).with_problems(problems))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_break_keys_are_refused() {
        assert!(check_name("service", "web-1").is_ok());
        for bad in ["", "a/b", "a b", "..", "x\n"] {
            let error = check_name("service", bad).expect_err(bad);
            assert_eq!(error.status, axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        }
        let error = check_name("node", "a/b").expect_err("slash");
        assert_eq!(error.message, "node name `a/b` contains `/`");
    }

    #[test]
    fn a_program_with_problems_is_refused_with_all_of_them() {
        let mut program = Program::default();
        program
            .tags
            .entry("ghost".into())
            .or_default()
            .insert("bad key".into(), "x".into());
        let error = check_program(&program).expect_err("no such service");
        assert_eq!(error.status, axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            error.message,
            "the program has 2 problems (the rules `cca lint` checks); nothing was written"
        );
        let subjects: Vec<String> = error
            .problems
            .iter()
            .map(|problem| problem.subject.to_string())
            .collect();
        assert_eq!(
            subjects,
            ["service `ghost` tags", "service `ghost` tags[\"bad key\"]"]
        );
        assert!(check_program(&Program::default()).is_ok());
    }
}
