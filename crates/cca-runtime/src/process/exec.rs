//! `exec` for process instances: a command run with the instance's
//! environment and working directory, in its cgroups (joined right after
//! spawn: best effort, the first instants are not charged), in a process
//! group of its own that is killed at the timeout and after the command
//! ends, so an exec never leaves processes behind.

use std::process::Stdio;

use rustix::process::Signal;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::Inner;
use super::procfs;
use crate::{Error, ExecOutput, ExecRequest, InstanceState, Operation, Result};
use std::os::unix::process::ExitStatusExt;

pub(super) async fn exec(inner: &Inner, id: &str, request: ExecRequest) -> Result<ExecOutput> {
    let status = inner.status(id, Operation::Exec)?;
    if status.state != InstanceState::Running {
        return Err(Error::InvalidState {
            id: id.to_owned(),
            operation: Operation::Exec,
            state: status.state,
        });
    }
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
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .envs(&record.env)
        .current_dir(&record.working_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io(id, Operation::Exec, format!("spawning {program}"), e))?;
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

async fn read_all(pipe: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes).await;
    }
    bytes
}
