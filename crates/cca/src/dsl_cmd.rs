//! Arguments of `cca fmt`, `cca lint` and `cca render`, and the glue that
//! hands them to `cca_dsl::commands` with the real file system, stdout,
//! stderr and environment. All behaviour lives in `cca-dsl`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use cca_dsl::commands::{self, DiagnosticFormat, Io, Style, ValueOptions};
use cca_dsl::source::RealFs;
use clap::{Args, ValueEnum};

/// `cca fmt [--check] FILES…`
#[derive(Debug, Args)]
pub(crate) struct FmtArgs {
    /// Change nothing; list the files that are not formatted and exit 1.
    #[arg(long)]
    pub(crate) check: bool,
    /// The `.cca` files to format.
    #[arg(required = true, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
}

/// `cca lint [--format human|json] FILES…`
#[derive(Debug, Args)]
pub(crate) struct LintArgs {
    /// How to print diagnostics.
    #[arg(long, value_enum, default_value_t = LintFormat::Human)]
    pub(crate) format: LintFormat,
    /// The `.cca` files to check.
    #[arg(required = true, value_name = "FILE")]
    pub(crate) files: Vec<PathBuf>,
}

/// Output formats of `cca lint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LintFormat {
    /// Source excerpts with underlines, on stderr.
    Human,
    /// One JSON document on stdout, for editors and CI.
    Json,
}

/// `cca render [--values F] [--set k=v] [--set-from-env k=ENV] FILE`
#[derive(Debug, Args)]
pub(crate) struct RenderArgs {
    /// A `.ccv` values file; may repeat, later files win.
    #[arg(long = "values", value_name = "FILE")]
    pub(crate) values: Vec<PathBuf>,
    /// Set one value; overrides values files.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// Set one value from an environment variable; overrides `--set`.
    #[arg(long = "set-from-env", value_name = "KEY=ENV_VAR")]
    pub(crate) set_from_env: Vec<String>,
    /// The template to expand.
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
}

/// Runs `cca fmt`.
pub(crate) fn fmt(args: &FmtArgs) -> anyhow::Result<ExitCode> {
    run(|io| commands::fmt(&RealFs, &args.files, args.check, io)).context("cca fmt")
}

/// Runs `cca lint`.
pub(crate) fn lint(args: &LintArgs) -> anyhow::Result<ExitCode> {
    let format = match args.format {
        LintFormat::Human => DiagnosticFormat::Human,
        LintFormat::Json => DiagnosticFormat::Json,
    };
    run(|io| commands::lint(&RealFs, &args.files, format, io)).context("cca lint")
}

/// Runs `cca render`.
pub(crate) fn render(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let options = ValueOptions {
        files: args.values.clone(),
        set: args.set.clone(),
        set_from_env: args.set_from_env.clone(),
    };
    let env = |name: &str| std::env::var(name).ok();
    run(|io| commands::render(&RealFs, &args.file, &options, &env, io)).context("cca render")
}

/// Gives a command stdout and stderr (colour when stderr is a terminal)
/// and turns its exit code into an `ExitCode`.
fn run(command: impl FnOnce(&mut Io<'_>) -> std::io::Result<i32>) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    let style = Style {
        color: std::io::stderr().is_terminal(),
        ..Style::default()
    };
    let mut io = Io {
        out: &mut out,
        err: &mut err,
        style,
    };
    let code = command(&mut io)?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
