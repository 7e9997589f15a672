//! What an instance uses of its node, read from the kernel: the CPU time
//! it has used so far and the memory it holds now. Both runtimes read an
//! instance's cgroups here (v1's `cpuacct` and `memory` hierarchies or a
//! v2 directory, told apart by the files they hold), and the process
//! runtime sums an instance's processes in `/proc` where it has no
//! cgroups. Rates are the caller's: two readings and the time between.
//!
//! Memory is the working set, as the kernel would have to find room for
//! it: what the cgroup charges less the file cache it can drop at once
//! (`inactive_file`). Counting that cache would make every instance that
//! reads files look as if it were about to hit its limit.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One reading of an instance's use of its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// CPU time used since the instance started, in nanoseconds (user and
    /// system, every process of the instance).
    pub cpu_nanos: u64,
    /// Memory in use now, in bytes (the working set).
    pub memory_bytes: u64,
}

/// Reads the usage counters of an instance's cgroups: `cpu_dir` holds
/// its CPU accounting (v1 `cpuacct.usage`, v2 `cpu.stat`), `memory_dir`
/// its memory charge (v1 `memory.usage_in_bytes`, v2 `memory.current`).
/// An error names the file that could not be read.
pub(crate) fn from_cgroups(cpu_dir: &Path, memory_dir: &Path) -> Result<Usage, String> {
    Ok(Usage {
        cpu_nanos: cgroup_cpu_nanos(cpu_dir)?,
        memory_bytes: cgroup_working_set(memory_dir)?,
    })
}

fn cgroup_cpu_nanos(dir: &Path) -> Result<u64, String> {
    let v1 = dir.join("cpuacct.usage");
    if v1.exists() {
        return read_number(&v1);
    }
    let v2 = dir.join("cpu.stat");
    let text = read(&v2)?;
    let micros = counter(&text, "usage_usec")
        .ok_or_else(|| format!("{} has no usage_usec", v2.display()))?;
    Ok(micros.saturating_mul(1_000))
}

fn cgroup_working_set(dir: &Path) -> Result<u64, String> {
    let v2 = dir.join("memory.current");
    let (charged, inactive_key) = if v2.exists() {
        (read_number(&v2)?, "inactive_file")
    } else {
        (
            read_number(&dir.join("memory.usage_in_bytes"))?,
            // v1 counts the cgroup and its children under `total_`.
            "total_inactive_file",
        )
    };
    let stat = read(&dir.join("memory.stat"))?;
    let inactive = counter(&stat, inactive_key).unwrap_or(0);
    Ok(charged.saturating_sub(inactive))
}

/// Sums the usage of processes from their `/proc/PID/stat` and
/// `/proc/PID/statm` texts: user and system time, their waited-for
/// children's, and resident pages. Texts that do not parse count nothing
/// (the process ended while it was read).
pub(crate) fn from_processes<'a>(
    processes: impl IntoIterator<Item = (&'a str, &'a str)>,
    ticks_per_second: u64,
    page_size: u64,
) -> Usage {
    let mut ticks = 0u64;
    let mut pages = 0u64;
    for (stat, statm) in processes {
        ticks = ticks.saturating_add(cpu_ticks(stat).unwrap_or(0));
        pages = pages.saturating_add(resident_pages(statm).unwrap_or(0));
    }
    Usage {
        cpu_nanos: ticks.saturating_mul(1_000_000_000) / ticks_per_second.max(1),
        memory_bytes: pages.saturating_mul(page_size),
    }
}

/// `utime + stime + cutime + cstime` (fields 14–17), counted after the
/// command name's closing parenthesis, which may itself hold spaces.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // The first field after the name is field 3.
    after_name
        .split_whitespace()
        .skip(14 - 3)
        .take(4)
        .map(|field| field.parse::<u64>().ok())
        .sum()
}

/// The second field of `statm`: resident pages.
fn resident_pages(statm: &str) -> Option<u64> {
    statm.split_whitespace().nth(1)?.parse().ok()
}

/// The usage of the processes `pids`, read from `/proc` now.
pub(crate) fn of_processes(pids: &[u32]) -> Usage {
    let texts: Vec<(String, String)> = pids
        .iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
            Some((stat, statm))
        })
        .collect();
    from_processes(
        texts
            .iter()
            .map(|(stat, statm)| (stat.as_str(), statm.as_str())),
        rustix::param::clock_ticks_per_second(),
        rustix::param::page_size() as u64,
    )
}

/// The value of `name` in a cgroup file of `key value` lines
/// (`memory.stat`, `cpu.stat`, `memory.events`, `memory.oom_control`).
pub(crate) fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok()).flatten()
    })
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|error| format!("reading {}: {error}", path.display()))
}

fn read_number(path: &Path) -> Result<u64, String> {
    read(path)?
        .trim()
        .parse()
        .map_err(|error| format!("{} does not hold a number: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::write(dir.join(file), text).expect("write");
    }

    #[test]
    fn v1_usage_is_cpuacct_and_the_charge_less_inactive_file_cache() {
        let cpu = tempfile::tempdir().expect("tempdir");
        let memory = tempfile::tempdir().expect("tempdir");
        write(cpu.path(), "cpuacct.usage", "1234567890\n");
        write(memory.path(), "memory.usage_in_bytes", "10485760\n");
        write(
            memory.path(),
            "memory.stat",
            "cache 4194304\ninactive_file 1\ntotal_inactive_file 2097152\n",
        );
        assert_eq!(
            from_cgroups(cpu.path(), memory.path()),
            Ok(Usage {
                cpu_nanos: 1_234_567_890,
                memory_bytes: 8 << 20,
            })
        );
    }

    #[test]
    fn v2_usage_is_cpu_stat_and_memory_current_less_inactive_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "cpu.stat",
            "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n",
        );
        write(dir.path(), "memory.current", "3145728\n");
        write(dir.path(), "memory.stat", "anon 1\ninactive_file 1048576\n");
        assert_eq!(
            from_cgroups(dir.path(), dir.path()),
            Ok(Usage {
                cpu_nanos: 2_500_000,
                memory_bytes: 2 << 20,
            })
        );
    }

    #[test]
    fn an_unreadable_counter_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "cpuacct.usage", "lots\n");
        let error = from_cgroups(dir.path(), dir.path()).expect_err("not a number");
        assert!(
            error.contains("cpuacct.usage does not hold a number"),
            "{error}"
        );
        write(dir.path(), "cpuacct.usage", "1\n");
        let error = from_cgroups(dir.path(), dir.path()).expect_err("no memory files");
        assert!(error.contains("memory.usage_in_bytes"), "{error}");
    }

    #[test]
    fn processes_add_up_their_own_and_their_childrens_time_and_resident_pages() {
        // Fields 14–17 are 10, 5, 3, 2 ticks; the name holds ") (".
        let stat = "42 (odd ) (name) S 1 42 42 0 -1 4194304 100 0 0 0 10 5 3 2 20 0 1 0 500 0 0";
        let other = "43 (sh) S 42 42 42 0 -1 4194304 100 0 0 0 100 0 0 0 20 0 1 0 510 0 0";
        let usage = from_processes(
            [(stat, "900 256 10 1 0 50 0"), (other, "10 4 1 1 0 1 0")],
            100,
            4096,
        );
        assert_eq!(
            usage,
            Usage {
                cpu_nanos: 1_200_000_000,
                memory_bytes: 260 * 4096,
            }
        );
        assert_eq!(from_processes([("gone", "")], 100, 4096), Usage::default());
    }

    #[test]
    fn our_own_process_uses_some_cpu_and_memory() {
        let burn: u64 = (0..2_000_000u64).map(|n| n.wrapping_mul(n) % 7).sum();
        assert!(burn > 0);
        let usage = of_processes(&[std::process::id()]);
        assert!(usage.cpu_nanos > 0, "{usage:?}");
        assert!(usage.memory_bytes > 1 << 20, "{usage:?}");
    }
}
