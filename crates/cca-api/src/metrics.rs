//! Request metrics of the API (counts by route, method and status; a
//! latency histogram by route) in Prometheus text format. `/metrics`
//! follows them with the admission lanes' gauges and counters (rendered
//! by `admission`) and whatever the plugged-in renderer adds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Counters of served requests.
#[derive(Debug, Default)]
pub(crate) struct RequestMetrics {
    inner: Mutex<Tallies>,
}

#[derive(Debug, Default)]
struct Tallies {
    /// (route, method, status) → count.
    counts: BTreeMap<(String, String, u16), u64>,
    /// route → latency histogram.
    latency: BTreeMap<String, Histogram>,
}

#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl RequestMetrics {
    /// Records one served request.
    pub(crate) fn record(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let Ok(mut tallies) = self.inner.lock() else {
            return;
        };
        *tallies
            .counts
            .entry((route.to_owned(), method.to_owned(), status))
            .or_default() += 1;
        let histogram = tallies.latency.entry(route.to_owned()).or_default();
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in histogram.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    /// The request metrics in Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let Ok(tallies) = self.inner.lock() else {
            return String::new();
        };
        let mut out = String::new();
        out.push_str("# HELP cca_api_requests_total API requests served.\n");
        out.push_str("# TYPE cca_api_requests_total counter\n");
        for ((route, method, status), count) in &tallies.counts {
            let _ = writeln!(
                out,
                "cca_api_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {count}",
                escape(route)
            );
        }
        out.push_str("# HELP cca_api_request_duration_seconds Time to answer API requests.\n");
        out.push_str("# TYPE cca_api_request_duration_seconds histogram\n");
        for (route, histogram) in &tallies.latency {
            render_histogram(&mut out, &escape(route), histogram);
        }
        out
    }
}

fn render_histogram(out: &mut String, route: &str, histogram: &Histogram) {
    let name = "cca_api_request_duration_seconds";
    for (bound, count) in BUCKETS.iter().zip(histogram.buckets) {
        let _ = writeln!(
            out,
            "{name}_bucket{{route=\"{route}\",le=\"{bound}\"}} {count}"
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
        histogram.count
    );
    let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", histogram.sum);
    let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {}", histogram.count);
}

/// Escapes a label value for the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_buckets_render_as_prometheus_text() {
        let metrics = RequestMetrics::default();
        metrics.record("/v1/status", "GET", 200, Duration::from_millis(3));
        metrics.record("/v1/status", "GET", 200, Duration::from_millis(30));
        let text = metrics.render();
        assert!(text.contains(
            "cca_api_requests_total{route=\"/v1/status\",method=\"GET\",status=\"200\"} 2"
        ));
        assert!(text.contains(
            "cca_api_request_duration_seconds_bucket{route=\"/v1/status\",le=\"0.005\"} 1"
        ));
        assert!(text.contains("cca_api_request_duration_seconds_count{route=\"/v1/status\"} 2"));
    }
}
