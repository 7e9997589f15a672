//! The `cca fmt`, `cca lint` and `cca render` commands. Each takes paths
//! and options, reads and writes files through a [`FileSystem`], prints to
//! the given writers and returns the process exit code, so the binary only
//! parses arguments and tests run without a terminal or a disk.

pub mod report;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::compile::compile_loaded;
use crate::diagnostic::Diagnostic;
use crate::format::format_tree;
use crate::source::{FileSystem, SourceMap, load};
use crate::template::{Values, parse_values_file, render as render_template};

pub use report::{DiagnosticFormat, Style};

/// Success.
pub const EXIT_OK: i32 = 0;
/// Errors found (lint, render) or files that would change (`fmt --check`).
pub const EXIT_FAILED: i32 = 1;
/// A file could not be read, parsed or written.
pub const EXIT_TROUBLE: i32 = 2;

/// Where a command prints.
pub struct Io<'a> {
    pub out: &'a mut dyn Write,
    pub err: &'a mut dyn Write,
    pub style: Style,
}

impl std::fmt::Debug for Io<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io").field("style", &self.style).finish()
    }
}

/// Template values given on the command line, lowest precedence first
/// after the auto-loaded `NAME/values.ccv`.
#[derive(Clone, Debug, Default)]
pub struct ValueOptions {
    /// `--values FILE.ccv`, in order (later files win).
    pub files: Vec<PathBuf>,
    /// `--set key=value`.
    pub set: Vec<String>,
    /// `--set-from-env key=ENV_VAR`.
    pub set_from_env: Vec<String>,
}

/// `cca fmt [--check] FILES…`: rewrites each file in canonical layout, or
/// with `check` lists the files that would change and exits 1.
pub fn fmt(
    fs: &dyn FileSystem,
    paths: &[PathBuf],
    check: bool,
    io: &mut Io<'_>,
) -> io::Result<i32> {
    let mut exit = EXIT_OK;
    for path in paths {
        let outcome = fmt_one(fs, path, check, io)?;
        exit = exit.max(outcome);
    }
    Ok(exit)
}

fn fmt_one(fs: &dyn FileSystem, path: &Path, check: bool, io: &mut Io<'_>) -> io::Result<i32> {
    let mut sources = SourceMap::default();
    let text = match fs.read(path).map(String::from_utf8) {
        Ok(Ok(text)) => text,
        Ok(Err(_)) => {
            writeln!(
                io.err,
                "error: {} is not valid UTF-8; not formatted",
                path.display()
            )?;
            return Ok(EXIT_TROUBLE);
        }
        Err(error) => {
            writeln!(io.err, "error: cannot read {}: {error}", path.display())?;
            return Ok(EXIT_TROUBLE);
        }
    };
    let id = sources.add(path.to_path_buf(), text);
    let Some(file) = sources.get(id) else {
        return Ok(EXIT_TROUBLE);
    };
    if !file.parse.errors.is_empty() {
        let report = report::render_human(&sources, &file.parse.errors, io.style);
        write!(io.err, "{report}")?;
        writeln!(
            io.err,
            "error: {} has syntax errors; not formatted",
            path.display()
        )?;
        return Ok(EXIT_TROUBLE);
    }
    let formatted = format_tree(&file.text, &file.parse.root);
    if formatted == file.text {
        return Ok(EXIT_OK);
    }
    if check {
        writeln!(io.out, "{}", path.display())?;
        return Ok(EXIT_FAILED);
    }
    if let Err(error) = fs.write(path, formatted.as_bytes()) {
        writeln!(io.err, "error: cannot write {}: {error}", path.display())?;
        return Ok(EXIT_TROUBLE);
    }
    Ok(EXIT_OK)
}

/// `cca lint [--format human|json] FILES…`: every syntax and semantic
/// diagnostic of each file (with its inclusions and auto-loaded values).
/// Exit 0 when no file has errors (warnings allowed), 1 otherwise.
pub fn lint(
    fs: &dyn FileSystem,
    paths: &[PathBuf],
    format: DiagnosticFormat,
    io: &mut Io<'_>,
) -> io::Result<i32> {
    let mut exit = EXIT_OK;
    let mut json = Vec::new();
    for path in paths {
        let values = match gather_values(fs, path, &ValueOptions::default(), &|_| None) {
            Ok(values) => values,
            Err(message) => {
                writeln!(io.err, "error: {message}")?;
                exit = EXIT_FAILED;
                continue;
            }
        };
        let loaded = match load(fs, path) {
            Ok(loaded) => loaded,
            Err(error) => {
                writeln!(io.err, "error: {error}")?;
                exit = EXIT_FAILED;
                continue;
            }
        };
        let compiled = compile_loaded(loaded, &values);
        if compiled.has_errors() {
            exit = EXIT_FAILED;
        }
        let sources = &compiled.loaded.sources;
        match format {
            DiagnosticFormat::Human => {
                let text = report::render_human(sources, &compiled.diagnostics, io.style);
                write!(io.err, "{text}")?;
            }
            DiagnosticFormat::Json => json.extend(report::to_json(sources, &compiled.diagnostics)),
        }
    }
    match format {
        DiagnosticFormat::Json => writeln!(io.out, "{}", report::render_json(&json))?,
        DiagnosticFormat::Human => {
            if exit == EXIT_OK {
                writeln!(io.err, "{} file(s) checked, no errors", paths.len())?;
            }
        }
    }
    Ok(exit)
}

/// `cca render [--values F] [--set k=v] [--set-from-env k=ENV] FILE`:
/// prints the file with every placeholder expanded.
pub fn render(
    fs: &dyn FileSystem,
    path: &Path,
    options: &ValueOptions,
    env: &dyn Fn(&str) -> Option<String>,
    io: &mut Io<'_>,
) -> io::Result<i32> {
    let values = match gather_values(fs, path, options, env) {
        Ok(values) => values,
        Err(message) => {
            writeln!(io.err, "error: {message}")?;
            return Ok(EXIT_FAILED);
        }
    };
    let text = match fs.read(path).map(String::from_utf8) {
        Ok(Ok(text)) => text,
        Ok(Err(_)) => {
            writeln!(io.err, "error: {} is not valid UTF-8", path.display())?;
            return Ok(EXIT_FAILED);
        }
        Err(error) => {
            writeln!(io.err, "error: cannot read {}: {error}", path.display())?;
            return Ok(EXIT_FAILED);
        }
    };
    match render_template(&text, &values) {
        Ok(rendered) => {
            write!(io.out, "{rendered}")?;
            Ok(EXIT_OK)
        }
        Err(errors) => {
            print_errors(path, text, &errors, io)?;
            Ok(EXIT_FAILED)
        }
    }
}

fn print_errors(
    path: &Path,
    text: String,
    errors: &[Diagnostic],
    io: &mut Io<'_>,
) -> io::Result<()> {
    let mut sources = SourceMap::default();
    let id = sources.add(path.to_path_buf(), text);
    let errors: Vec<Diagnostic> = errors.iter().cloned().map(|e| e.in_file(id)).collect();
    write!(
        io.err,
        "{}",
        report::render_human(&sources, &errors, io.style)
    )
}

/// The values for the template at `path`: `NAME/values.ccv` next to
/// `NAME.cca` when it exists, then `--values` files, `--set` and
/// `--set-from-env`, each layer overriding the one before.
pub fn gather_values(
    fs: &dyn FileSystem,
    path: &Path,
    options: &ValueOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Values, String> {
    let mut values = Values::default();
    let auto = path.with_extension("").join("values.ccv");
    match fs.read(&auto) {
        Ok(bytes) => read_values_file(&mut values, &auto, bytes)?,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(format!("cannot read {}: {error}", auto.display())),
    }
    for file in &options.files {
        let bytes = fs
            .read(file)
            .map_err(|error| format!("cannot read {}: {error}", file.display()))?;
        read_values_file(&mut values, file, bytes)?;
    }
    for assignment in &options.set {
        let (key, value) = split_assignment(assignment, "--set", "key=value")?;
        values.set(key, value, "--set");
    }
    for assignment in &options.set_from_env {
        let (key, variable) = split_assignment(assignment, "--set-from-env", "key=ENV_VAR")?;
        let value = env(variable).ok_or_else(|| {
            format!(
                "environment variable `{variable}` (for --set-from-env {assignment}) is not set"
            )
        })?;
        values.set(key, &value, &format!("${variable}"));
    }
    Ok(values)
}

fn read_values_file(values: &mut Values, path: &Path, bytes: Vec<u8>) -> Result<(), String> {
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not valid UTF-8", path.display()))?;
    let pairs = parse_values_file(&text).map_err(|error| format!("{}: {error}", path.display()))?;
    let origin = path.display().to_string();
    for (key, value) in pairs {
        values.set(&key, &value, &origin);
    }
    Ok(())
}

fn split_assignment<'a>(
    text: &'a str,
    flag: &str,
    shape: &str,
) -> Result<(&'a str, &'a str), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim(), value)),
        _ => Err(format!("{flag} expects {shape}, got `{text}`")),
    }
}
