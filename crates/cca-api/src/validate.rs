//! Server-side checks of a compiled program. The CLI compiles `.cca` files
//! locally, so the server cannot trust that what arrives came from the
//! compiler: it re-checks what it can without the sources — names usable
//! as key segments, map keys matching the names inside, and references
//! between parts of the program.

use cca_model::spec::Program;

use crate::error::{ApiError, ApiResult};

/// Longest object name accepted (a DNS label is 63; keys allow more).
const MAX_NAME_LEN: usize = 253;
/// More replicas than any cluster we target could run: a typo guard.
pub(crate) const MAX_REPLICAS: u32 = 100_000;

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

/// Checks everything in `program` the server can check alone.
pub(crate) fn check_program(program: &Program) -> ApiResult<()> {
    for (name, spec) in &program.services {
        check_name("service", name)?;
        if spec.name != *name {
            return Err(ApiError::invalid(format!(
                "service `{name}` holds a spec named `{}`",
                spec.name
            )));
        }
        if spec.replicas > MAX_REPLICAS {
            return Err(ApiError::invalid(format!(
                "service `{name}`: {} replicas is more than the limit of {MAX_REPLICAS}",
                spec.replicas
            )));
        }
    }
    for (service, tags) in &program.tags {
        check_defined(program, "tags", service)?;
        for key in tags.keys() {
            check_name("tag", key)?;
        }
    }
    for (service, grants) in &program.grants {
        check_defined(program, "secret grants", service)?;
        for secret in grants.keys() {
            check_name("secret", secret)?;
        }
    }
    check_names("gate", program.gates.keys())?;
    check_names("connection", program.connections.keys())?;
    check_names("secret", program.secrets.keys())?;
    check_names("network policy", program.networks.keys())?;
    check_names("group", program.groups.keys())?;
    for (name, gate) in &program.gates {
        if gate.name != *name {
            return Err(ApiError::invalid(format!(
                "gate `{name}` holds a spec named `{}`",
                gate.name
            )));
        }
    }
    Ok(())
}

fn check_names<'a>(kind: &str, names: impl Iterator<Item = &'a String>) -> ApiResult<()> {
    names
        .into_iter()
        .try_for_each(|name| check_name(kind, name))
}

/// Sub-facts (tags, grants) must belong to a service of the same program:
/// an apply writes a service and its sub-facts together.
fn check_defined(program: &Program, what: &str, service: &str) -> ApiResult<()> {
    if program.services.contains_key(service) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "{what} for service `{service}`, which the program does not define"
    )))
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
    fn tags_of_an_undefined_service_are_refused() {
        let mut program = Program::default();
        program
            .tags
            .entry("ghost".into())
            .or_default()
            .insert("team".into(), "x".into());
        let error = check_program(&program).expect_err("no such service");
        assert_eq!(
            error.message,
            "tags for service `ghost`, which the program does not define"
        );
    }
}
