//! What `/proc` says about processes: a process's state, group and start
//! time (to tell a live instance from a reused pid), the members of a
//! process group, the boot id (pids and start times mean nothing across a
//! reboot), and signals to a process group.

use rustix::process::{Pid, Signal};

/// The fields of `/proc/PID/stat` the runtime uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) pid: u32,
    /// `R`, `S`, `D`, `Z` (zombie: ended, not yet reaped), ...
    pub(crate) state: char,
    pub(crate) process_group: i32,
    /// Clock ticks after boot (field 22): with the pid, it names one process.
    pub(crate) start_time: u64,
    /// The wait status of an ended (zombie) process (field 52, Linux 3.5+).
    pub(crate) exit_status: Option<i32>,
}

impl ProcStat {
    pub(crate) fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Reads `/proc/PID/stat`; `None` when there is no such process.
pub(crate) fn stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses a stat line. The command name (field 2) is in parentheses and may
/// itself contain spaces and parentheses, so fields are counted from the last
/// `)`.
fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 of the man page.
    let field = |number: usize| fields.get(number - 3).copied();
    Some(ProcStat {
        pid,
        state: field(3)?.chars().next()?,
        process_group: field(5)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
        exit_status: field(52).and_then(|s| s.parse().ok()),
    })
}

/// The identity of the current boot: a pid and start time recorded before a
/// reboot must not match a process after it.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

/// Live (not zombie) processes whose process group is `group`.
pub(crate) fn live_group_members(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|stat| i64::from(stat.process_group) == i64::from(group) && !stat.is_zombie())
        .map(|stat| stat.pid)
        .collect()
}

/// Sends `signal` to every process of group `group`; a group that is already
/// gone is not an error.
pub(crate) fn signal_group(group: u32, signal: Signal) -> std::io::Result<()> {
    let Some(pid) = to_pid(group) else {
        return Ok(());
    };
    match rustix::process::kill_process_group(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// Sends `signal` to one process; a process that is already gone is not an
/// error.
pub(crate) fn signal_process(pid: u32, signal: Signal) -> std::io::Result<()> {
    let Some(pid) = to_pid(pid) else {
        return Ok(());
    };
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

fn to_pid(pid: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(pid).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (we(ird) n) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 \
                    0 0 0 0 0 0 0 0 0 0 256";
        let stat = parse_stat(4242, line).expect("parses");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.process_group, 4242);
        assert_eq!(stat.start_time, 987654);
        assert_eq!(stat.exit_status, Some(256));
    }

    #[test]
    fn our_own_process_is_found_and_alive() {
        let stat = stat(std::process::id()).expect("own stat");
        assert!(!stat.is_zombie());
        assert!(stat.start_time > 0);
        assert!(!boot_id().is_empty());
    }
}
