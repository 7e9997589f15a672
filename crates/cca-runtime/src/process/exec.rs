//! `exec` for process instances: a command run with the instance's
//! environment and working directory, in its mount namespace when it has
//! one of its own (its own `/etc/resolv.conf`), in its cgroups (joined
//! right after spawn: best effort, the first instants are not charged), in
//! a process group of its own that is killed at the timeout and after the
//! command ends, so an exec never leaves processes behind.

use std::process::Stdio;

use rustix::process::Signal;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::records::RunRecord;
use super::{Inner, mountns, procfs};
use crate::{Error, ExecOutput, ExecRequest, InstanceState, Operation, Result};
use std::os::unix::process::ExitStatusExt;

pub(super) async fn exec(inner: &Inner, id: &str, request: ExecRequest) -> Result<ExecOutput> {
    inner
        .status(id, Operation::Exec)?
        .require_running(Operation::Exec)?;
    let Some((program, args)) = request.argv.split_first() else {
        return Err(Error::Failed {
            id: id.to_owned(),
            operation: Operation::Exec,
            message: "the command is empty".to_owned(),
        });
    };
    let dir = inner.dir(id);
    let record = dir.read_instance(Operation::Exec)?;
    let run = dir.read_run(Operation::Exec)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(&record.env)
        .current_dir(&record.working_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let namespace = match (&record.spec.dns, &run) {
        (Some(_), Some(run)) => Some(own_mount_namespace(inner, id, run)?),
        _ => None,
    };
    let mut child = match namespace {
        Some(namespace) => {
            mountns::spawn_in_namespace(id, command, program.clone(), namespace).await?
        }
        None => command
            .spawn()
            .map_err(|e| Error::io(id, Operation::Exec, format!("spawning {program}"), e))?,
    };
    let pid = child.id().unwrap_or_default();
    if let Some(cgroups) = run.and_then(|run| run.cgroups)
        && let Err(reason) = cgroups.join(pid)
    {
        tracing::debug!(instance = id, %reason, "exec runs outside the instance's cgroups");
    }
    let stdout = tokio::spawn(read_all(child.stdout.take()));
    let stderr = tokio::spawn(read_all(child.stderr.take()));
    let waited = tokio::time::timeout(request.timeout, child.wait()).await;
    // Whatever the command left running goes with it (and its pipes close).
    let _ = procfs::signal_group(pid, Signal::KILL);
    let (exit, timed_out) = match waited {
        Ok(exit) => (exit, false),
        Err(_elapsed) => (child.wait().await, true),
    };
    let exit =
        exit.map_err(|e| Error::io(id, Operation::Exec, format!("waiting for {program}"), e))?;
    Ok(ExecOutput {
        code: exit.code(),
        signal: exit.signal(),
        stdout: stdout.await.unwrap_or_default(),
        stderr: stderr.await.unwrap_or_default(),
        timed_out,
    })
}

/// The instance's mount namespace (its own `/etc/resolv.conf`), opened
/// from its main process and checked to still be that process afterwards:
/// the open descriptor holds the namespace, and a reused pid would have
/// another start time.
fn own_mount_namespace(inner: &Inner, id: &str, run: &RunRecord) -> Result<std::fs::File> {
    let path = format!("/proc/{}/ns/mnt", run.pid);
    let namespace = std::fs::File::open(&path)
        .map_err(|e| Error::io(id, Operation::Exec, format!("opening {path}"), e))?;
    if inner
        .find_run_process(run)
        .is_none_or(|stat| stat.is_zombie())
    {
        return Err(Error::InvalidState {
            id: id.to_owned(),
            operation: Operation::Exec,
            state: InstanceState::Exited,
        });
    }
    Ok(namespace)
}

async fn read_all(pipe: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes).await;
    }
    bytes
}
