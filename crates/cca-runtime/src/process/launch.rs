//! Launching an instance's command: a new session and process group, the
//! resolved environment and working directory, output appended to
//! `output.log`, and a start gate so the command runs only once it is inside
//! its cgroups.
//!
//! The gate: the child first runs a tiny `sh` script that blocks reading one
//! line from its stdin (a pipe from the agent), then `exec`s `sh -c COMMAND`
//! with stdin from `/dev/null`. The agent writes the pid into the cgroups
//! between spawn and releasing the gate, so nothing of the workload runs or
//! allocates outside its limits — without `pre_exec` (which needs `unsafe`,
//! forbidden in this workspace). If the agent dies before releasing the
//! gate, the read sees end-of-file and the script exits with 125 without
//! running the command. Every step `exec`s, so the pid the agent records is
//! the pid of the command's shell.
//!
//! The session: `setsid(1)` (util-linux) is the program spawned; it calls
//! setsid() in the spawned process — not a group leader, so no fork and the
//! pid stays the same — making pid = process group = session. Without
//! `setsid(1)` the child still gets its own process group.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::cgroup::InstanceCgroups;
use super::records::{InstanceDir, InstanceRecord};
use crate::logs::LOG_FILE;
use crate::{Error, ExitInfo, ExitReason, Operation, Result};

/// Waits for one line on stdin, then becomes the command. `$1` is the
/// command (`$0` names the script in `ps`).
const GATE_SCRIPT: &str = "read -r _ || exit 125\nexec /bin/sh -c \"$1\" </dev/null";

/// Where `setsid(1)` may be.
const SETSID_PATHS: [&str; 2] = ["/usr/bin/setsid", "/bin/setsid"];

pub(crate) fn find_setsid() -> Option<PathBuf> {
    SETSID_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
}

/// Spawns the gated command; it waits at the gate until [`open_gate`].
/// With a DNS config it starts in a private mount namespace showing the
/// instance's `resolv.conf` at `resolv_target` (see `mountns`).
pub(crate) async fn spawn_gated(
    dir: &InstanceDir,
    record: &InstanceRecord,
    setsid: Option<&Path>,
    resolv_target: &Path,
) -> Result<Child> {
    let mut command = gated_command(dir, record, setsid)?;
    let what = format!("sh in {}", record.working_dir.display());
    if record.spec.dns.is_some() {
        return super::mountns::spawn_with_resolv_conf(
            &dir.id,
            command,
            what,
            dir.resolv_conf(),
            resolv_target.to_owned(),
        )
        .await;
    }
    command
        .spawn()
        .map_err(|e| Error::io(&dir.id, Operation::Start, format!("spawning {what}"), e))
}

fn gated_command(
    dir: &InstanceDir,
    record: &InstanceRecord,
    setsid: Option<&Path>,
) -> Result<Command> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path.join(LOG_FILE))
        .map_err(|e| Error::io(&dir.id, Operation::Start, "opening output.log", e))?;
    let log_for_stderr = log.try_clone().map_err(|e| {
        Error::io(
            &dir.id,
            Operation::Start,
            "duplicating the output.log descriptor",
            e,
        )
    })?;
    let mut command = match setsid {
        Some(setsid) => {
            let mut command = Command::new(setsid);
            command.arg("/bin/sh");
            command
        }
        None => {
            let mut command = Command::new("/bin/sh");
            command.process_group(0);
            command
        }
    };
    command
        .args(["-c", GATE_SCRIPT, "cca-instance", &record.spec.command])
        .env_clear()
        .envs(&record.env)
        .current_dir(&record.working_dir)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log_for_stderr)
        // The instance must outlive this runtime object and the agent.
        .kill_on_drop(false);
    Ok(command)
}

/// Waits (briefly) until the spawned process leads its own process group:
/// `setsid(1)` makes it one a moment after spawn, and a stop must be able to
/// signal the group from the first instant. False when it never happened
/// (the child died, or a very loaded host).
pub(crate) async fn wait_for_own_group(pid: u32) -> bool {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match super::procfs::stat(pid) {
            Some(stat) if i64::from(stat.process_group) == i64::from(pid) => return true,
            Some(stat) if !stat.is_zombie() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            _ => return false,
        }
    }
}

/// Lets the gated command run. A child that already died is not an error:
/// its exit is collected like any other.
pub(crate) async fn open_gate(child: &mut Child) {
    if let Some(mut gate) = child.stdin.take() {
        let _ = gate.write_all(b"go\n").await;
    }
}

/// What the waiter needs to describe a run's end.
#[derive(Debug)]
pub(crate) struct ExitWatch {
    pub(crate) dir: InstanceDir,
    pub(crate) cgroups: Option<InstanceCgroups>,
    pub(crate) oom_kills_before: u64,
    pub(crate) memory_limit: Option<u64>,
}

/// Reaps the child (no zombie is left behind), records how it ended in
/// `exit.json`, then publishes it.
pub(crate) async fn reap(
    mut child: Child,
    watch: ExitWatch,
    exits: watch::Sender<Option<ExitInfo>>,
) {
    let group = child.id();
    let waited = child.wait().await;
    // The instance is its main process: when that ends, whatever it left
    // behind in its group or cgroup (a shell's children) goes too, so no
    // stray process keeps the instance's ports or files after its end.
    kill_leftovers(group, watch.cgroups.as_ref());
    let exit = match waited {
        Ok(status) => describe_exit(&watch, Some(status)),
        Err(error) => {
            tracing::warn!(instance = %watch.dir.id, %error, "waiting for the instance failed");
            describe_exit(&watch, None)
        }
    };
    if let Err(error) = watch.dir.write_exit(&exit, Operation::Start) {
        tracing::warn!(instance = %watch.dir.id, %error, "recording the exit failed");
    }
    tracing::info!(instance = %watch.dir.id, %exit, "instance ended");
    exits.send_replace(Some(exit));
}

/// SIGKILLs what remains of an ended instance: its process group (the main
/// pid leads it) and the members of its cgroups.
pub(crate) fn kill_leftovers(group: Option<u32>, cgroups: Option<&InstanceCgroups>) {
    if let Some(group) = group
        && let Err(error) = super::procfs::signal_group(group, rustix::process::Signal::KILL)
    {
        tracing::warn!(group, %error, "killing what an instance left behind failed");
    }
    for pid in cgroups
        .map(InstanceCgroups::member_pids)
        .unwrap_or_default()
    {
        let _ = super::procfs::signal_process(pid, rustix::process::Signal::KILL);
    }
}

/// Turns a wait status (or none, when it is unknown) into an [`ExitInfo`]:
/// an OOM kill counted during the run wins, then a requested stop.
pub(crate) fn describe_exit(watch: &ExitWatch, status: Option<ExitStatus>) -> ExitInfo {
    let oom_killed = watch
        .cgroups
        .as_ref()
        .is_some_and(|cgroups| cgroups.oom_kills() > watch.oom_kills_before);
    let reason = if oom_killed {
        ExitReason::OutOfMemory {
            limit_bytes: watch.memory_limit,
        }
    } else if watch.dir.stop_requested() {
        ExitReason::Stopped
    } else if status.is_none() {
        ExitReason::AgentAway
    } else {
        ExitReason::Exited
    };
    ExitInfo {
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        reason,
        finished_at_ms: cca_model::clock::now_millis(),
    }
}

/// A raw wait status (as in `/proc/PID/stat` field 52) as an [`ExitStatus`].
pub(crate) fn exit_status_from_raw(raw: i32) -> ExitStatus {
    ExitStatus::from_raw(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_wait_statuses_decode_to_code_or_signal() {
        assert_eq!(exit_status_from_raw(3 << 8).code(), Some(3));
        assert_eq!(exit_status_from_raw(9).signal(), Some(9));
    }
}
