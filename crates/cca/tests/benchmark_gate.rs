//! `cca benchmark gate` end to end with tiny numbers: the backends' nginx,
//! the gate process (`--serve-gate`) and the peer nginx start, h2load runs
//! against each, idle connections are held, and the report has every
//! figure with every request answered 2xx. Skips, saying why, without
//! nginx or h2load (scripts/test installs both).

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::CCA;

fn installed(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(Into::into))
        .any(|dir| Path::new(&dir).join(program).is_file())
}

#[test]
fn a_tiny_gate_benchmark_reports_every_figure_and_only_2xx() {
    for (program, package) in [("nginx", "nginx"), ("h2load", "nghttp2-client")] {
        if !installed(program) {
            eprintln!("skipped: `{program}` is not installed (Debian package {package})");
            return;
        }
    }
    let output = Command::new(CCA)
        .args([
            "benchmark",
            "gate",
            "--json",
            "--requests",
            "300",
            "--rounds",
            "1",
        ])
        .args([
            "--idle-connections",
            "100",
            "--connections",
            "8",
            "--workers",
            "2",
        ])
        .output()
        .expect("cca benchmark gate runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert!(
        report["nginx"]
            .as_str()
            .is_some_and(|v| v.contains("nginx/")),
        "{report}"
    );
    assert!(
        report["h2load"]
            .as_str()
            .is_some_and(|v| v.contains("nghttp2/")),
        "{report}"
    );
    assert_eq!(report["access_log"], false);
    assert_eq!(report["gate_pinned"], true, "the gate's default");

    let load = report["load"].as_array().expect("load figures");
    let measured: Vec<(&str, &str)> = load
        .iter()
        .map(|f| {
            (
                f["protocol"].as_str().expect("protocol"),
                f["target"].as_str().expect("target"),
            )
        })
        .collect();
    assert_eq!(
        measured,
        vec![
            ("http/1.1", "gate"),
            ("http/1.1", "nginx"),
            ("http/1.1", "nginx-tuned"),
            ("http/1.1", "direct"),
            ("h2c", "gate"),
            ("h2c", "nginx"),
            ("h2c", "nginx-tuned"),
        ]
    );
    for figures in load {
        let runs = figures["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 1, "{figures}");
        assert_eq!(
            figures["counted"], 1,
            "one run, disturbed or not: {figures}"
        );
        for run in runs {
            assert_eq!(run["requests"], 300, "{figures}");
            assert_eq!(run["succeeded"], 300, "{figures}");
            assert_eq!(run["non_2xx"], 0, "{figures}");
            assert_eq!(run["failed"], 0, "{figures}");
            assert!(run["disturbed"].is_boolean(), "{figures}");
            assert!(
                run["rps"].as_f64().is_some_and(|rps| rps > 0.0),
                "{figures}"
            );
            let p99 = run["p99_ms"].as_f64().expect("p99");
            let p50 = run["p50_ms"].as_f64().expect("p50");
            assert!(p99 > 0.0 && p99 >= p50, "{figures}");
        }
        assert!(figures["rps"]["median"].as_f64().is_some_and(|v| v > 0.0));
    }

    let idle = report["idle"].as_array().expect("idle figures");
    let targets: Vec<&str> = idle
        .iter()
        .map(|f| f["target"].as_str().expect("target"))
        .collect();
    assert_eq!(targets, vec!["gate", "nginx"]);
    for figures in idle {
        assert_eq!(figures["connections"], 100, "{figures}");
        assert_eq!(figures["answered_2xx"], 100, "{figures}");
        let (before, after) = (
            figures["rss_before"].as_u64().expect("rss"),
            figures["rss_after"].as_u64().expect("rss"),
        );
        assert!(before > 0 && after > 0, "{figures}");
    }
    let compared = report["compared"].as_array().expect("comparisons");
    let peers: Vec<(&str, &str)> = compared
        .iter()
        .map(|c| {
            (
                c["protocol"].as_str().expect("protocol"),
                c["peer"].as_str().expect("peer"),
            )
        })
        .collect();
    assert_eq!(
        peers,
        [
            ("http/1.1", "nginx"),
            ("http/1.1", "nginx-tuned"),
            ("h2c", "nginx"),
            ("h2c", "nginx-tuned")
        ],
        "{report}"
    );
    for c in compared {
        assert!(c["rps_ratio"].as_f64().is_some_and(|r| r > 0.0), "{c}");
        let paired = &c["paired"];
        let rounds = paired["rounds"].as_u64().expect("paired rounds");
        assert_eq!(rounds, 1, "one round, each run counted: {c}");
        assert!(
            paired["rps"]["median"].as_f64().is_some_and(|r| r > 0.0),
            "{c}"
        );
        assert!(
            paired["rps_at_least_nginx"]
                .as_u64()
                .is_some_and(|n| n <= rounds),
            "{c}"
        );
        // 300 requests take less CPU than /proc counts (10 ms ticks).
        for proxy in ["gate_cpu_us_per_request", "nginx_cpu_us_per_request"] {
            assert!(
                paired[proxy]
                    .as_f64()
                    .is_some_and(|us| us.is_finite() && us >= 0.0),
                "{c}"
            );
        }
    }
}
