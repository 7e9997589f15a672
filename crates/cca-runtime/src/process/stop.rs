//! Stopping a process instance: SIGTERM to its whole process group (and to
//! any process left in its cgroups), a grace period, then SIGKILL, and
//! waiting until nothing of it is alive — for runs this object spawned and
//! for adopted ones alike.

use std::time::Duration;

use rustix::process::Signal;
use tokio::time::Instant;

use super::Inner;
use super::procfs;
use super::records::RunRecord;
use crate::{Error, InstanceState, InstanceStatus, Operation, Result};

/// How long processes may take to vanish after SIGKILL (D-state sleepers,
/// huge address spaces being torn down).
const KILL_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

pub(super) async fn stop(inner: &Inner, id: &str, grace: Duration) -> Result<InstanceStatus> {
    let status = inner.status(id, Operation::Stop)?;
    if status.state != InstanceState::Running {
        return Ok(status);
    }
    let dir = inner.dir(id);
    let run = dir
        .read_run(Operation::Stop)?
        .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
    dir.mark_stop_requested(Operation::Stop)?;
    signal_everything(inner, id, &run, Signal::TERM);
    if !wait_until_gone(inner, id, &run, Instant::now() + grace).await {
        tracing::info!(
            instance = id,
            ?grace,
            "still alive after the grace period: SIGKILL"
        );
        signal_everything(inner, id, &run, Signal::KILL);
        if !wait_until_gone(inner, id, &run, Instant::now() + KILL_WAIT).await {
            return Err(Error::Failed {
                id: id.to_owned(),
                operation: Operation::Stop,
                message: format!(
                    "processes {:?} still alive {KILL_WAIT:?} after SIGKILL",
                    survivors(&run)
                ),
            });
        }
    }
    inner.status(id, Operation::Stop)
}

/// Signals the main process, its process group and every process in the
/// instance's cgroups (which catches descendants that started their own
/// group or session).
fn signal_everything(inner: &Inner, id: &str, run: &RunRecord, signal: Signal) {
    if !main_ended(inner, id, run) {
        let _ = procfs::signal_process(run.pid, signal);
    }
    if !procfs::live_group_members(run.pid).is_empty()
        && let Err(error) = procfs::signal_group(run.pid, signal)
    {
        tracing::warn!(pid = run.pid, %error, "signalling the process group failed");
    }
    for pid in cgroup_members(run) {
        let _ = procfs::signal_process(pid, signal);
    }
}

/// Waits until the main process has ended (and, for our own child, its exit
/// is recorded) and no process of the group or cgroups is left. False at
/// the deadline.
async fn wait_until_gone(inner: &Inner, id: &str, run: &RunRecord, deadline: Instant) -> bool {
    loop {
        if main_ended(inner, id, run) && survivors(run).is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether the run's main process has ended (for our own child: and its
/// exit is recorded).
fn main_ended(inner: &Inner, id: &str, run: &RunRecord) -> bool {
    match inner.own_child_exit(id) {
        Some(exit) => exit.is_some(),
        None => inner
            .find_run_process(run)
            .is_none_or(|stat| stat.is_zombie()),
    }
}

/// Live processes still belonging to the run.
fn survivors(run: &RunRecord) -> Vec<u32> {
    let mut pids = procfs::live_group_members(run.pid);
    pids.extend(cgroup_members(run));
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn cgroup_members(run: &RunRecord) -> Vec<u32> {
    run.cgroups
        .as_ref()
        .map(|cgroups| {
            cgroups
                .member_pids()
                .into_iter()
                .filter(|&pid| procfs::stat(pid).is_some_and(|stat| !stat.is_zombie()))
                .collect()
        })
        .unwrap_or_default()
}
