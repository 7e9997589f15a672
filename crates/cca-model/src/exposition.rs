//! The Prometheus text exposition format (0.0.4) every `/metrics` of
//! CCattler serves. `prometheus-client` writes OpenMetrics: a counter's
//! family is named without `_total` while its sample carries it, and the
//! text ends in `# EOF`. Served as `text/plain; version=0.0.4`, that is
//! neither format: Prometheus' text parser (and `promtool check metrics`)
//! reads `x_total` as a second family with no help text. So a registry's
//! output is converted the one way the two differ for the metric types
//! used here: a counter's `# HELP`/`# TYPE` name gains `_total`, and
//! `# UNIT`/`# EOF` lines, which 0.0.4 does not have, are left out.

/// Renames counter families to their sample name and drops the
/// OpenMetrics-only comment lines.
pub fn openmetrics_to_text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|kind| Some((kind, line.strip_prefix(kind)?)));
        match descriptor {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(kind);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
