//! The compiler the server hands its web console's diff page: the
//! language lives in `cca-dsl`, which the API does not link.

use cca_model::spec::Program;

/// Compiles a pasted program with `cca-dsl`, as `cca apply` would a file
/// of its own (no inclusions, no template values).
#[derive(Debug)]
pub(crate) struct DslCompiler;

impl cca_api::console::Compiler for DslCompiler {
    fn compile(&self, source: &str) -> Result<Program, String> {
        cca_dsl::compile::compile_text(source)
    }
}
