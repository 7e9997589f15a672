//! Pre-flight checks (`cca readiness`): what a node or a server needs
//! before it starts, each probe giving one [`Check`] with a verdict and a
//! sentence an operator acts on. The node's own checks (its server, its
//! certificate, its runtimes, its clock) live here with the probes both
//! roles share (free disk, free ports, a certificate's validity); the
//! server's checks of its store are wired from these in the binary.
//! Probes only look: they bind a port and let it go, read a file system's
//! counters, find a binary; they create and change nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use cca_trust::pki::CertInfo;
use cca_wire::client::ServerClock;
use serde::{Deserialize, Serialize};

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    /// It works, but not for long or not well: look at it.
    Warn,
    /// Starting now would fail or misbehave.
    Fail,
}

/// One pre-flight check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
}

impl Check {
    pub fn new(name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verdict,
            detail: detail.into(),
        }
    }
}

/// Free space below this fails: a store or a container's layers fill it
/// within minutes.
pub const DISK_FAIL_BYTES: u64 = 512 << 20;
/// Free space below this share of the file system warns.
pub const DISK_WARN_PERCENT: u64 = 10;

/// The free space of the file system `path` is on (its nearest existing
/// ancestor when it does not exist yet).
pub fn disk_space(name: &str, path: &Path) -> Check {
    let existing = path.ancestors().find(|dir| dir.exists()).unwrap_or(path);
    match rustix::fs::statvfs(existing) {
        Ok(stats) => {
            let total = stats.f_blocks.saturating_mul(stats.f_frsize);
            let free = stats.f_bavail.saturating_mul(stats.f_frsize);
            disk_verdict(name, path, free, total)
        }
        Err(error) => Check::new(
            name,
            Verdict::Fail,
            format!(
                "cannot read the file system of {}: {error}",
                existing.display()
            ),
        ),
    }
}

/// The verdict on `free` of `total` bytes at `path`.
pub fn disk_verdict(name: &str, path: &Path, free: u64, total: u64) -> Check {
    let percent = free.saturating_mul(100).checked_div(total).unwrap_or(0);
    let amount = format!(
        "{} free of {} ({percent}%) at {}",
        gib(free),
        gib(total),
        path.display()
    );
    if free < DISK_FAIL_BYTES {
        Check::new(
            name,
            Verdict::Fail,
            format!(
                "{amount}: less than {}; free some space",
                gib(DISK_FAIL_BYTES)
            ),
        )
    } else if percent < DISK_WARN_PERCENT {
        Check::new(
            name,
            Verdict::Warn,
            format!("{amount}: under {DISK_WARN_PERCENT}%"),
        )
    } else {
        Check::new(name, Verdict::Pass, amount)
    }
}

fn gib(bytes: u64) -> String {
    // Display only: the precision of f64 is plenty for a byte count shown
    // with one decimal.
    #[allow(clippy::cast_precision_loss, reason = "shown with one decimal")]
    let gib = bytes as f64 / f64::from(1u32 << 30);
    format!("{gib:.1} GiB")
}

/// Whether a TCP listener can bind `address` now (port 0: any port, so
/// only the address is checked).
pub fn tcp_port_free(name: &str, address: SocketAddr) -> Check {
    bound(
        name,
        address,
        "TCP",
        std::net::TcpListener::bind(address).map(drop),
    )
}

/// Whether a UDP socket can bind `address` now.
pub fn udp_port_free(name: &str, address: SocketAddr) -> Check {
    bound(
        name,
        address,
        "UDP",
        std::net::UdpSocket::bind(address).map(drop),
    )
}

fn bound(name: &str, address: SocketAddr, protocol: &str, outcome: std::io::Result<()>) -> Check {
    match outcome {
        Ok(()) => Check::new(name, Verdict::Pass, format!("{protocol} {address} is free")),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => Check::new(
            name,
            Verdict::Fail,
            format!(
                "{protocol} {address} is in use: another process holds it (`ss -lntup` names \
                 it); stop it or choose another address"
            ),
        ),
        Err(error) => Check::new(
            name,
            Verdict::Fail,
            format!("{protocol} {address} cannot be bound: {error}"),
        ),
    }
}

/// A certificate's life left below this share warns: renewal (at two
/// thirds of it) should have replaced it by then.
const CERT_WARN_LEFT_PERCENT: u128 = 20;

/// Whether the certificate `info` (named `what`) is valid at `now`, and
/// for how long.
pub fn certificate(name: &str, what: &str, info: &CertInfo, now: SystemTime) -> Check {
    if let Err(error) = info.check_valid_at(now) {
        return Check::new(name, Verdict::Fail, format!("{what}: {error}"));
    }
    let left = info.not_after.duration_since(now).unwrap_or_default();
    let life = info
        .not_after
        .duration_since(info.not_before)
        .unwrap_or_default();
    let detail = format!(
        "{what} ({}) valid for {} more",
        info.subject,
        humantime::format_duration(Duration::from_secs(left.as_secs()))
    );
    if left.as_millis() * 100 < life.as_millis() * CERT_WARN_LEFT_PERCENT {
        Check::new(
            name,
            Verdict::Warn,
            format!("{detail}: less than a fifth of its life, and renewal has not replaced it"),
        )
    } else {
        Check::new(name, Verdict::Pass, detail)
    }
}

/// Skew beyond this warns; beyond [`SKEW_FAIL`] fails: certificates
/// issued by the server are not valid yet on a node behind it, and
/// timestamps across nodes stop lining up.
pub const SKEW_WARN: Duration = Duration::from_secs(2);
pub const SKEW_FAIL: Duration = Duration::from_secs(30);

/// This host's clock against the server's. The `Date` header has whole
/// seconds and the answer took a round trip, so the skew counted is what
/// lies beyond that uncertainty.
pub fn clock_skew(clock: &ServerClock) -> Check {
    const NAME: &str = "clock";
    let Some(date) = clock.date else {
        return Check::new(
            NAME,
            Verdict::Warn,
            "the server sent no Date header: skew not measured",
        );
    };
    let round_trip = clock
        .received
        .duration_since(clock.sent)
        .unwrap_or_default();
    // The server stamped its answer between `sent` and `received`, and
    // truncated it to the second.
    let earliest = clock.sent;
    let latest = clock.received;
    let date_latest = date + Duration::from_secs(1);
    let (skew, direction) = if date_latest < earliest {
        (
            earliest.duration_since(date_latest).unwrap_or_default(),
            "behind",
        )
    } else if date > latest {
        (date.duration_since(latest).unwrap_or_default(), "ahead of")
    } else {
        (Duration::ZERO, "")
    };
    let detail = if skew.is_zero() {
        format!(
            "within 1 s of the server's (round trip {} ms)",
            round_trip.as_millis()
        )
    } else {
        format!(
            "the server's clock is at least {:.1} s {direction} this host's (round trip {} ms)",
            skew.as_secs_f64(),
            round_trip.as_millis()
        )
    };
    let verdict = if skew > SKEW_FAIL {
        Verdict::Fail
    } else if skew > SKEW_WARN {
        Verdict::Warn
    } else {
        Verdict::Pass
    };
    Check::new(NAME, verdict, detail)
}

/// Whether containers can run here: root, and an OCI runtime binary
/// (`preferred`, else runc, else crun) that works with this host's
/// cgroups.
pub fn container_runtime(preferred: Option<&Path>) -> Check {
    const NAME: &str = "container runtime";
    let uid = rustix::process::geteuid();
    if !uid.is_root() {
        return Check::new(
            NAME,
            Verdict::Warn,
            format!(
                "the agent would run as uid {}: containers need root, so image workloads would \
                 fail here (process workloads run)",
                uid.as_raw()
            ),
        );
    }
    let cgroups = Path::new("/sys/fs/cgroup");
    match cca_runtime::oci::OciBinary::detect(preferred, std::env::temp_dir(), cgroups) {
        Ok(binary) => Check::new(
            NAME,
            Verdict::Pass,
            format!("{} ({:?})", binary.path.display(), binary.kind),
        ),
        Err(error) => Check::new(
            NAME,
            Verdict::Warn,
            format!("{error}: image workloads would fail here (process workloads run)"),
        ),
    }
}

/// Whether `dir` can hold the agent's or the store's data: it exists and
/// is a writable directory, or can be created (its nearest existing
/// ancestor is writable).
pub fn data_dir(name: &str, dir: &Path) -> Check {
    let existing = dir.ancestors().find(|dir| dir.exists()).unwrap_or(dir);
    if existing == dir && !dir.is_dir() {
        return Check::new(
            name,
            Verdict::Fail,
            format!("{} exists and is not a directory", dir.display()),
        );
    }
    match rustix::fs::access(existing, rustix::fs::Access::WRITE_OK) {
        Ok(()) if existing == dir => Check::new(
            name,
            Verdict::Pass,
            format!("{} is writable", dir.display()),
        ),
        Ok(()) => Check::new(
            name,
            Verdict::Pass,
            format!(
                "{} will be created (in {})",
                dir.display(),
                existing.display()
            ),
        ),
        Err(error) => Check::new(
            name,
            Verdict::Fail,
            format!("{} is not writable: {error}", existing.display()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn disk_space_fails_when_nearly_full_and_warns_under_a_tenth() {
        let path = Path::new("/data");
        let gib = 1u64 << 30;
        assert_eq!(
            disk_verdict("d", path, 100 << 20, 100 * gib).verdict,
            Verdict::Fail
        );
        assert_eq!(
            disk_verdict("d", path, 5 * gib, 100 * gib).verdict,
            Verdict::Warn
        );
        let roomy = disk_verdict("d", path, 40 * gib, 100 * gib);
        assert_eq!(roomy.verdict, Verdict::Pass);
        assert_eq!(roomy.detail, "40.0 GiB free of 100.0 GiB (40%) at /data");
    }

    #[test]
    fn clock_skew_counts_only_what_lies_beyond_the_date_headers_second() {
        let clock = |date: u64, sent_ms: u64, received_ms: u64| ServerClock {
            date: Some(at(date)),
            sent: SystemTime::UNIX_EPOCH + Duration::from_millis(sent_ms),
            received: SystemTime::UNIX_EPOCH + Duration::from_millis(received_ms),
        };
        // Stamped 1000 (truncated) for an answer seen at 1000.9: in sync.
        assert_eq!(
            clock_skew(&clock(1000, 1_000_800, 1_000_900)).verdict,
            Verdict::Pass
        );
        // The server says 1010 while this host is at 1000.1: 9.9 s ahead.
        let ahead = clock_skew(&clock(1010, 1_000_000, 1_000_100));
        assert_eq!(ahead.verdict, Verdict::Warn, "{}", ahead.detail);
        assert!(ahead.detail.contains("9.9 s ahead of"), "{}", ahead.detail);
        // The server says 900 while this host is at 1000: far behind.
        let behind = clock_skew(&clock(900, 1_000_000, 1_000_100));
        assert_eq!(behind.verdict, Verdict::Fail);
        assert!(behind.detail.contains("99.0 s behind"), "{}", behind.detail);
        let undated = ServerClock {
            date: None,
            ..clock(0, 0, 0)
        };
        assert_eq!(clock_skew(&undated).verdict, Verdict::Warn);
    }

    #[test]
    fn a_held_port_fails_and_names_the_protocol_and_address() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let address = held.local_addr().expect("address");
        let check = tcp_port_free("listen", address);
        assert_eq!(check.verdict, Verdict::Fail);
        assert!(check.detail.contains(&format!("TCP {address} is in use")));
        let any = "127.0.0.1:0".parse().expect("an address");
        assert_eq!(tcp_port_free("listen", any).verdict, Verdict::Pass);
    }

    #[test]
    fn a_data_dir_that_is_a_file_fails_and_a_missing_one_will_be_created() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").expect("writes");
        assert_eq!(data_dir("data", &file).verdict, Verdict::Fail);
        let missing = data_dir("data", &dir.path().join("a/b"));
        assert_eq!(missing.verdict, Verdict::Pass);
        assert!(
            missing.detail.contains("will be created"),
            "{}",
            missing.detail
        );
    }
}
