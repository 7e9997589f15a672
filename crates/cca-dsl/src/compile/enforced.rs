//! Settings the language accepts and stores but nothing in this version
//! acts on. Each gets a `cca::W008` warning where it is written, so a
//! program does not silently rely on behaviour that does not happen. The
//! table is the one list of them: the issue that implements a setting
//! deletes its row (and the "Not enforced yet" notes in `docs/dsl.md`).

use super::Compiler;
use crate::diagnostic::{Diagnostic, Span, codes};
use crate::schema::Context;

/// One setting that is accepted but not enforced.
struct NotEnforced {
    /// The block the key is written in.
    context: Context,
    /// The key as written; `volume.size` names the optional size argument
    /// of a `volume` directive, which is not a key of its own.
    key: &'static str,
    /// How the warning names it.
    setting: &'static str,
    /// What happens instead.
    instead: &'static str,
}

const NOT_ENFORCED: &[NotEnforced] = &[NotEnforced {
    context: Context::Service,
    key: "volume.size",
    setting: "volume size",
    instead: "the volume is a directory on the node with no size limit",
}];

impl Compiler<'_> {
    /// Warns when `key` in `context` is a setting this version does not
    /// enforce; `span` is where it is written.
    pub(crate) fn check_enforced(&mut self, context: Context, key: &str, span: Span) {
        let Some(row) = NOT_ENFORCED
            .iter()
            .find(|row| row.context == context && row.key == key)
        else {
            return;
        };
        self.report(
            Diagnostic::warning(
                codes::NOT_ENFORCED,
                span,
                format!(
                    "`{}` is accepted but not enforced by this version",
                    row.setting
                ),
            )
            .with_label("not enforced yet")
            .with_help(row.instead),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    /// A row whose key the schema does not know would never warn.
    #[test]
    fn every_row_names_a_key_the_language_accepts() {
        for row in NOT_ENFORCED {
            let key = row.key.split('.').next().unwrap_or(row.key);
            assert!(
                schema::lookup(row.context, key).is_some(),
                "{:?}.{} is not in the schema",
                row.context,
                row.key
            );
        }
    }
}
