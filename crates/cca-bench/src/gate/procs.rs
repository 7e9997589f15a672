//! The processes of the gate benchmark and what is read of them: each one
//! is held by a [`Process`] guard that stops it (SIGTERM, then SIGKILL
//! after a grace period) however the run ends; memory (RSS and PSS) and
//! CPU time come from `/proc`, for a process alone or with its children
//! (nginx's workers).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::BenchError;

/// How long a stopped process gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running child; stopped when dropped.
#[derive(Debug)]
pub(crate) struct Process {
    pub(crate) name: String,
    child: Child,
}

impl Process {
    pub(crate) fn spawn(name: &str, command: &mut Command) -> Result<Self, BenchError> {
        let child = command
            .spawn()
            .map_err(BenchError::io(format!("starting {name} ({command:?})")))?;
        Ok(Self {
            name: name.to_owned(),
            child,
        })
    }

    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// `Err` with what it said when the process has already exited.
    pub(crate) fn check_running(&mut self, log: Option<&Path>) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                let said = log
                    .and_then(|log| std::fs::read_to_string(log).ok())
                    .map(|text| format!("; its log says: {}", text.trim()))
                    .unwrap_or_default();
                Err(BenchError::Config(format!(
                    "{} exited at start ({status}){said}",
                    self.name
                )))
            }
            Err(error) => Err(BenchError::Io {
                what: format!("checking on {}", self.name),
                error,
            }),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Some(pid) = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(process = %self.name, "did not stop on SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A program on `PATH` (or in the sbin directories, where nginx lives and
/// which a non-root `PATH` may lack).
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Memory of one or more processes, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    pub(crate) rss: u64,
    /// Proportional set size (shared pages split among their users);
    /// `None` where `smaps_rollup` cannot be read.
    pub(crate) pss: Option<u64>,
}

/// The memory of `pids` together.
pub(crate) fn memory(pids: &[u32]) -> Memory {
    let mut total = Memory {
        rss: 0,
        pss: Some(0),
    };
    for pid in pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        total.rss += kib_field(&status, "VmRSS:").unwrap_or(0) * 1024;
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok();
        total.pss = match (
            total.pss,
            rollup.as_deref().and_then(|r| kib_field(r, "Pss:")),
        ) {
            (Some(sum), Some(kib)) => Some(sum + kib * 1024),
            _ => None,
        };
    }
    total
}

fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The children of `parent` (nginx's workers), from `/proc`.
pub(crate) fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat_fields(&stat).map(|fields| fields.parent))
                == Some(parent)
        })
        .collect()
}

/// CPU time `pids` have used (user and system), summed.
pub(crate) fn cpu(pids: &[u32]) -> Duration {
    let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| stat_fields(&stat))
        .map(|fields| Duration::from_secs_f64(fields.cpu_ticks as f64 / ticks))
        .sum()
}

struct StatFields {
    parent: u32,
    cpu_ticks: u64,
}

/// `PID (NAME) STATE PPID …`: the name may hold spaces and parentheses,
/// so fields are counted after its last `)`; utime and stime are the 12th
/// and 13th after it.
fn stat_fields(stat: &str) -> Option<StatFields> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(StatFields {
        parent: fields.get(1)?.parse().ok()?,
        cpu_ticks: fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?,
    })
}

/// Busy and total CPU time of the whole machine since boot, in ticks
/// (`/proc/stat`'s first line; idle and iowait are not busy).
pub(crate) fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let values: Vec<u64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4)?;
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_parent_and_cpu_ticks() {
        let stat = "4242 (nginx: worker (x)) S 4240 4242 4242 0 -1 4194368 912 0 0 0 \
                    150 25 0 0 20 0 1 0 1234 0 0";
        let fields = stat_fields(stat).expect("fields");
        assert_eq!((fields.parent, fields.cpu_ticks), (4240, 175));
        assert!(stat_fields("7 (short) R").is_none());
    }

    #[test]
    fn this_process_has_memory_and_cpu_and_is_its_parents_child() {
        let me = std::process::id();
        let memory = memory(&[me]);
        assert!(memory.rss > 0);
        assert!(memory.pss.is_none_or(|pss| pss > 0));
        let parent = std::fs::read_to_string(format!("/proc/{me}/stat"))
            .ok()
            .and_then(|stat| stat_fields(&stat))
            .expect("own stat")
            .parent;
        assert!(children(parent).contains(&me));
        let (busy, total) = machine_ticks().expect("/proc/stat");
        assert!(busy > 0 && total >= busy);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(started.elapsed());
        }
        assert!(cpu(&[me]) > Duration::ZERO);
    }
}
