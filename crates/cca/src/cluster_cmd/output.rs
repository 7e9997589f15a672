//! How cluster commands print: kubectl-style aligned tables (upper-case
//! headers, no borders, an AGE column), JSON or YAML of the API's types for
//! `-o json|yaml`, and human formats for CPU and ages (memory's is `Memory::human`). The only
//! module of the cluster commands that writes to stdout.

#![allow(clippy::print_stdout, reason = "this module is the commands' output")]

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use cca_model::cluster::Millis;
use cca_model::spec::Cpu;
use clap::ValueEnum;
use comfy_table::{ColumnConstraint, Table, presets};
use serde::Serialize;

/// `-o`: how a read command prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// An aligned table or a text description.
    #[default]
    Table,
    Json,
    Yaml,
}

/// Prints `value` as JSON or YAML; returns false for `Format::Table`,
/// which the caller renders itself.
pub(crate) fn structured<T: Serialize>(format: Format, value: &T) -> Result<bool> {
    match format {
        Format::Table => Ok(false),
        Format::Json => {
            let text = serde_json::to_string_pretty(value).context("encoding JSON")?;
            println!("{text}");
            Ok(true)
        }
        Format::Yaml => {
            let text = serde_norway::to_string(value).context("encoding YAML")?;
            print!("{text}");
            Ok(true)
        }
    }
}

/// Prints `value` as one line of compact JSON (for streams).
pub(crate) fn json_line<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string(value).context("encoding JSON")?);
    Ok(())
}

/// Prints rows under upper-case headers, columns three spaces apart.
pub(crate) fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut table = Table::new();
    table.load_style(presets::NOTHING);
    table.set_header(headers.iter().map(|h| h.to_uppercase()));
    for row in rows {
        table.add_row(row);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 3));
        column.set_constraint(ColumnConstraint::ContentWidth);
    }
    for line in table.lines() {
        println!("{}", line.trim_end());
    }
}

/// Prints one line.
pub(crate) fn line(text: &str) {
    println!("{text}");
}

/// Prints text as it is (no newline added) and flushes it.
pub(crate) fn raw(text: &str) {
    print!("{text}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

/// Prints a `label: value` pair aligned for descriptions.
pub(crate) fn field(label: &str, value: &str) {
    println!("{:<14}{value}", format!("{label}:"));
}

/// Now, in milliseconds since the epoch.
pub(crate) fn now_millis() -> Millis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Millis::try_from(since.as_millis()).unwrap_or(Millis::MAX)
}

/// kubectl-style age: `42s`, `7m`, `5h`, `3d`; `<unknown>` without a time.
pub(crate) fn age(since: Option<Millis>, now: Millis) -> String {
    let Some(since) = since else {
        return "<unknown>".into();
    };
    let secs = (now - since).max(0) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `500m` below a core, `2` or `1.5` from there.
pub(crate) fn cpu(cpu: Cpu) -> String {
    match cpu.0 {
        m if m.is_multiple_of(1000) => format!("{}", m / 1000),
        m if m < 1000 => format!("{m}m"),
        m => format!("{:.1}", m as f64 / 1000.0),
    }
}

/// `-` for nothing, like kubectl's `<none>` but narrower.
pub(crate) fn or_dash(value: Option<String>) -> String {
    value
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(Some(0), 45_000), "45s");
        assert_eq!(age(Some(0), 600_000), "10m");
        assert_eq!(age(Some(0), 3 * 3_600_000), "3h");
        assert_eq!(age(Some(0), 3 * 86_400_000), "3d");
        assert_eq!(age(None, 0), "<unknown>");
        assert_eq!(age(Some(10), 0), "0s");
    }

    #[test]
    fn quantities_read_like_the_dsl() {
        assert_eq!(cpu(Cpu(500)), "500m");
        assert_eq!(cpu(Cpu(2000)), "2");
        assert_eq!(cpu(Cpu(1500)), "1.5");
    }
}
