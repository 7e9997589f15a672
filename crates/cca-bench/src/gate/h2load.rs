//! One load run with `h2load` (nghttp2-client): 64 keep-alive connections
//! (one request in flight on each), HTTP/1.1 (`--h1`) or HTTP/2 without
//! TLS (prior knowledge), for a duration after a warm-up or for a number
//! of requests. h2load prints no percentiles, so it writes every request's
//! status and latency to a log file (`--log-file`), from which the
//! percentiles are taken; its summary gives the rate and the counts. With
//! a warm-up, its `finished in` includes the warm-up while its rate and
//! counts are the measured part's.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::BenchError;

/// How much load a run applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Measure this long, after a warm-up.
    For {
        measured: Duration,
        warm_up: Duration,
    },
    /// Send this many requests (short runs, tests).
    Requests(u64),
}

/// HTTP/1.1 or HTTP/2 (cleartext, prior knowledge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

impl Protocol {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Protocol::Http1 => "http/1.1",
            Protocol::Http2 => "h2c",
        }
    }
}

/// What h2load said about one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) rps: f64,
    pub(crate) requests: u64,
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
    pub(crate) errored: u64,
    pub(crate) timeouts: u64,
    pub(crate) status_2xx: u64,
    /// Per request, from the log file, in microseconds (sorted).
    pub(crate) latencies_us: Vec<u64>,
    /// Requests in the log file whose status was not 2xx.
    pub(crate) logged_non_2xx: u64,
}

/// The h2load command line for one run.
pub(crate) fn command(
    h2load: &Path,
    protocol: Protocol,
    at: SocketAddr,
    connections: usize,
    load: Load,
    log: &Path,
) -> Command {
    let mut command = Command::new(h2load);
    if protocol == Protocol::Http1 {
        command.arg("--h1");
    }
    command
        .args(["-c", &connections.to_string(), "-m", "1", "-t", "1"])
        // `host:` would be sent beside h2load's own Host header (nginx
        // answers 400 to the pair); `:authority` replaces it, for HTTP/1.1 too.
        .args(["-H", &format!(":authority: {}", super::nginx::HOST)])
        .arg("--log-file")
        .arg(log);
    match load {
        Load::For { measured, warm_up } => {
            command
                .args(["-D", &format!("{}ms", measured.as_millis().max(1))])
                .args(["--warm-up-time", &format!("{}ms", warm_up.as_millis())]);
        }
        Load::Requests(requests) => {
            command.args(["-n", &requests.max(connections as u64).to_string()]);
        }
    }
    command
        .arg(format!("http://{at}/"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Reads h2load's summary (`stdout`) and its per-request log.
pub(crate) fn outcome(stdout: &str, log: &str) -> Result<Outcome, BenchError> {
    let unreadable = |what: &str| {
        BenchError::Config(format!(
            "h2load's output has no readable {what} line (is this nghttp2's h2load?):\n{stdout}"
        ))
    };
    let finished = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("finished in "))
        .ok_or_else(|| unreadable("`finished in`"))?;
    // `10.00s, 31234.50 req/s, 3.04MB/s`
    let mut parts = finished.split(',').map(str::trim);
    parts
        .next()
        .and_then(seconds_of)
        .ok_or_else(|| unreadable("`finished in`"))?;
    let rps = parts
        .next()
        .and_then(|part| part.strip_suffix(" req/s"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| unreadable("`req/s`"))?;
    // `requests: 100 total, 100 started, 100 done, 100 succeeded, 0 failed, 0 errored, 0 timeout`
    let counts = counted(stdout, "requests:").ok_or_else(|| unreadable("`requests:`"))?;
    let count = |name: &str| {
        counts
            .iter()
            .find(|(_, n)| n == name)
            .map_or(0, |(v, _)| *v)
    };
    let statuses = counted(stdout, "status codes:").ok_or_else(|| unreadable("`status codes:`"))?;
    let status_2xx = statuses
        .iter()
        .find(|(_, name)| name == "2xx")
        .map_or(0, |(v, _)| *v);
    let mut latencies_us = Vec::new();
    let mut logged_non_2xx = 0;
    for line in log.lines() {
        let mut fields = line.split('\t');
        let (_, status, micros) = (fields.next(), fields.next(), fields.next());
        let (Some(status), Some(micros)) = (
            status.and_then(|s| s.trim().parse::<u16>().ok()),
            micros.and_then(|m| m.trim().parse::<u64>().ok()),
        ) else {
            continue;
        };
        if !(200..300).contains(&status) {
            logged_non_2xx += 1;
        }
        latencies_us.push(micros);
    }
    latencies_us.sort_unstable();
    Ok(Outcome {
        rps,
        requests: count("total"),
        succeeded: count("succeeded"),
        failed: count("failed"),
        errored: count("errored"),
        timeouts: count("timeout"),
        status_2xx,
        latencies_us,
        logged_non_2xx,
    })
}

/// `NAME: 3 a, 4 b` → `[(3, "a"), (4, "b")]`.
fn counted(text: &str, name: &str) -> Option<Vec<(u64, String)>> {
    let line = text
        .lines()
        .find_map(|line| line.trim().strip_prefix(name))?;
    line.split(',')
        .map(|part| {
            let (value, what) = part.trim().split_once(' ')?;
            Some((value.parse().ok()?, what.trim().to_owned()))
        })
        .collect()
}

/// `10.00s`, `950.5ms`, `12us`.
fn seconds_of(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else {
        (text.strip_suffix('s')?, 1.0)
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// Nearest-rank percentile of sorted, non-empty values.
pub(crate) fn percentile(sorted: &[u64], percent: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (percent / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// h2load 1.52's summary, as Debian 12 prints it.
    const SUMMARY: &str = "starting benchmark...
spawning thread #0: 64 total client(s). 1000 total requests
Application protocol: http/1.1
progress: 10% done

finished in 95.43ms, 10478.87 req/s, 2.61MB/s
requests: 1000 total, 1000 started, 1000 done, 998 succeeded, 2 failed, 2 errored, 0 timeout
status codes: 998 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 255.86KB (262000) total, 155.27KB (159000) headers (space savings 0.00%), 36.13KB (37000) data
                     min         max         mean         sd        +/- sd
time for request:      227us      9.55ms      2.37ms      1.45ms    71.10%
";

    #[test]
    fn the_summary_and_the_log_give_the_figures() {
        let log = "1733130000000000\t200\t1200\n1733130000000100\t200\t800\n\
                   1733130000000200\t502\t3000\n1733130000000300\t-1\t50\n";
        let outcome = outcome(SUMMARY, log).expect("readable");
        assert!((outcome.rps - 10478.87).abs() < 1e-9);
        assert_eq!(
            (
                outcome.requests,
                outcome.succeeded,
                outcome.failed,
                outcome.errored,
                outcome.status_2xx
            ),
            (1000, 998, 2, 2, 998)
        );
        assert_eq!(outcome.latencies_us, vec![800, 1200, 3000]);
        assert_eq!(outcome.logged_non_2xx, 1);
        assert_eq!(percentile(&outcome.latencies_us, 50.0), 1200);
        assert_eq!(percentile(&outcome.latencies_us, 99.0), 3000);
        let error = super::outcome("no such thing", "").expect_err("unreadable");
        assert!(error.to_string().contains("finished in"), "{error}");
    }
}
