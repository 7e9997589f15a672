//! How cluster commands print: kubectl-style aligned tables (upper-case
//! headers, no borders, an AGE column), JSON or YAML of the API's types for
//! `-o json|yaml` (with times as RFC 3339, see [`TIME_FIELDS`]), and human
//! formats for CPU and ages (memory's is `Memory::human`). The only module
//! of the cluster commands that writes to stdout.

use anyhow::{Context, Result};
use cca_model::cluster::Millis;
use cca_model::net::{Allocation, NodeSubnet, ServiceVip};
use cca_model::spec::Cpu;
use clap::ValueEnum;
use comfy_table::{ColumnConstraint, Table, presets};
use serde::Serialize;
use std::time::UNIX_EPOCH;

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
    if format == Format::Table {
        return Ok(false);
    }
    let mut value = serde_json::to_value(value).context("encoding the answer")?;
    times_as_rfc3339(&mut value);
    match format {
        Format::Table => Ok(false),
        Format::Json => {
            let text = serde_json::to_string_pretty(&value).context("encoding JSON")?;
            emit(&format!("{text}\n"));
            Ok(true)
        }
        Format::Yaml => {
            let text = serde_norway::to_string(&value).context("encoding YAML")?;
            emit(&text);
            Ok(true)
        }
    }
}

/// Prints `value` as one line of compact JSON (for streams), times as
/// RFC 3339.
pub(crate) fn json_line<T: Serialize>(value: &T) -> Result<()> {
    let mut value = serde_json::to_value(value).context("encoding the answer")?;
    times_as_rfc3339(&mut value);
    emit(&format!(
        "{}\n",
        serde_json::to_string(&value).context("encoding JSON")?
    ));
    Ok(())
}

/// The fields of the API's types that hold a time, as epoch milliseconds
/// on the wire (agents and the API keep millis). People and scripts
/// reading `-o json|yaml` get RFC 3339 instead, in UTC with milliseconds
/// (`2026-12-01T14:05:03.120Z`). A new time field of the API's types is
/// added here (checked against every `Millis` field of `cca_wire::types`
/// and `cca_model::cluster`).
const TIME_FIELDS: [&str; 10] = [
    "at",
    "since",
    "created_at",
    "applied_at",
    "registered_at",
    "started_at",
    "ended_at",
    "updated_at",
    "set_at",
    "undo_at",
];

/// Rewrites every [`TIME_FIELDS`] member holding an integer, at any depth.
fn times_as_rfc3339(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if TIME_FIELDS.contains(&name.as_str())
                    && let Some(millis) = field.as_i64()
                {
                    *field = serde_json::Value::String(rfc3339(millis));
                } else {
                    times_as_rfc3339(field);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(times_as_rfc3339),
        _ => {}
    }
}

/// Epoch milliseconds as RFC 3339 in UTC (before 1970 clamps to the epoch).
pub(crate) fn rfc3339(millis: Millis) -> String {
    let since = std::time::Duration::from_millis(u64::try_from(millis).unwrap_or(0));
    humantime::format_rfc3339_millis(UNIX_EPOCH + since).to_string()
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
        emit(&format!("{}\n", line.trim_end()));
    }
}

/// Prints one line.
pub(crate) fn line(text: &str) {
    emit(&format!("{text}\n"));
}

/// Prints text as it is (no newline added) and flushes it.
pub(crate) fn raw(text: &str) {
    emit(text);
}

/// Prints a `label: value` pair aligned for descriptions.
pub(crate) fn field(label: &str, value: &str) {
    emit(&format!("{:<14}{value}\n", format!("{label}:")));
}

/// Writes `text` to stdout and flushes it. A reader that went away
/// (`cca get instances -o json | head`) ends the command quietly, as it
/// ends `ls` or `cat`, instead of a panic about a broken pipe.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
        && error.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

pub(crate) use cca_model::clock::now_millis;

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

/// How `get services` shows the running count: `1/2`, or for a service
/// asleep with `scale_to_zero`, `0/2 (asleep 5m, idle 1m)`.
pub(crate) fn running(summary: &cca_wire::types::ServiceSummary, now: Millis) -> String {
    let count = format!("{}/{}", summary.running, summary.replicas);
    match &summary.scale {
        Some(state) if state.asleep => {
            let idle = match &state.cause {
                cca_model::scale::ScaleCause::Idle { window, .. } => {
                    format!(", idle {}", age(Some(0), *window))
                }
                _ => String::new(),
            };
            format!("{count} (asleep {}{idle})", age(Some(state.since), now))
        }
        _ => count,
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

/// An address allocation as a cell: the address, `released …`, or
/// `none (POOL full)`.
fn allocation<A: std::fmt::Display>(allocation: Option<&Allocation<A>>) -> String {
    match allocation {
        None => "-".into(),
        Some(Allocation::Held { address }) => address.to_string(),
        Some(Allocation::Released { address, .. }) => format!("{address} (released)"),
        Some(Allocation::Exhausted { pool, .. }) => format!("none ({pool} full)"),
    }
}

/// A service's VIP as a cell.
pub(crate) fn vip(vip: Option<&ServiceVip>) -> String {
    allocation(vip)
}

/// A node's subnet as a cell.
pub(crate) fn subnet(subnet: Option<&NodeSubnet>) -> String {
    allocation(subnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_read_as_cells() {
        let held: ServiceVip = Allocation::Held {
            address: [10, 43, 0, 1].into(),
        };
        assert_eq!(vip(Some(&held)), "10.43.0.1");
        let full: ServiceVip = Allocation::Exhausted {
            pool: "10.43.0.0/30".parse().expect("a prefix"),
            since: 0,
        };
        assert_eq!(vip(Some(&full)), "none (10.43.0.0/30 full)");
        assert_eq!(vip(None), "-");
    }

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
    fn times_print_as_rfc3339_at_any_depth_and_nothing_else_changes() {
        let mut value = serde_json::json!({
            "name": "n1",
            "registered_at": 1_796_133_903_120_i64,
            "instances": [{"status": {"since": 0, "started_at": 1_000}, "restarts": 3}],
            "events": [{"at": 1_796_133_903_120_i64, "revision": 7}],
            "created_at": null,
        });
        times_as_rfc3339(&mut value);
        assert_eq!(
            value,
            serde_json::json!({
                "name": "n1",
                "registered_at": "2026-12-01T14:05:03.120Z",
                "instances": [{
                    "status": {"since": "1970-01-01T00:00:00.000Z", "started_at": "1970-01-01T00:00:01.000Z"},
                    "restarts": 3
                }],
                "events": [{"at": "2026-12-01T14:05:03.120Z", "revision": 7}],
                "created_at": null,
            })
        );
    }

    #[test]
    fn quantities_read_like_the_dsl() {
        assert_eq!(cpu(Cpu(500)), "500m");
        assert_eq!(cpu(Cpu(2000)), "2");
        assert_eq!(cpu(Cpu(1500)), "1.5");
    }

    #[test]
    fn an_asleep_service_says_so_in_its_running_count() {
        use cca_model::scale::{ScaleCause, ScaleState};
        let mut summary: cca_wire::types::ServiceSummary =
            serde_json::from_value(serde_json::json!({
                "name": "web", "workload": "process", "replicas": 2, "instances": 0,
                "running": 0, "unplaced": 0, "tags": {}, "created_at": null
            }))
            .expect("a summary");
        assert_eq!(running(&summary, 0), "0/2");
        summary.scale = Some(ScaleState {
            asleep: true,
            since: 0,
            cause: ScaleCause::Idle {
                window: 300_000,
                last_activity: 0,
            },
        });
        assert_eq!(running(&summary, 600_000), "0/2 (asleep 10m, idle 5m)");
    }
}
