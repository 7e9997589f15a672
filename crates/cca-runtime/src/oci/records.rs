//! The on-disk state of one container instance, `DIR/instances/{id}/`,
//! which is all a restarted agent needs to adopt it:
//!
//! - `instance.json` — [`OciInstance`]: spec, image digest, layer dirs and
//!   the resolved process (written by `create`).
//! - `run.json` — [`OciRun`]: the monitor's pid, start time, boot id, and
//!   the limits in force (written by `start`).
//! - `exit-code` — written by the monitor when `runc run` returns: the
//!   container's exit code (128 + signal when killed).
//! - `memory-events` — the monitor's copy of the container's memory cgroup
//!   counter file (`memory.oom_control` on v1, `memory.events` on v2) taken
//!   when `runc run --keep` returns, before `exit-code`: its `oom_kill`
//!   says whether the run was OOM-killed, also after a reboot.
//! - `container.pid` — written by `runc run --pid-file` once the container
//!   runs: what `start` waits for.
//! - `stop-requested` — present once `stop` began, so the exit reads as
//!   `stopped`.
//! - `resolv.conf`, `hosts` — the resolver files bound into a container
//!   whose spec has a DNS config (written by `create`).
//! - `output.log*`, `bundle/` (`config.json`, `rootfs/`), `upper/`,
//!   `work/` — logs, the OCI bundle, the overlay's writable layer.
//!
//! JSON files are replaced atomically (write a temporary, rename).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::bundle::ProcessPlan;
use crate::{Error, InstanceSpec, LimitsEnforcement, Operation, Result};

const INSTANCE_FILE: &str = "instance.json";
const RUN_FILE: &str = "run.json";
pub(crate) const EXIT_CODE_FILE: &str = "exit-code";
const STOP_MARKER: &str = "stop-requested";
const MEMORY_EVENTS_FILE: &str = "memory-events";
const PID_FILE: &str = "container.pid";

/// What `create` decided about a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OciInstance {
    pub(crate) spec: InstanceSpec,
    /// The image's manifest digest: what garbage collection must keep.
    pub(crate) image_digest: String,
    /// Unpacked layers, base first.
    pub(crate) layers: Vec<PathBuf>,
    pub(crate) process: ProcessPlan,
    pub(crate) created_at_ms: i64,
}

/// One run of a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OciRun {
    /// The monitor shell that runs `runc run` and records its exit code.
    pub(crate) monitor_pid: u32,
    /// `/proc/PID/stat` start time of the monitor (a reused pid differs).
    pub(crate) monitor_start_time: u64,
    /// The container's init as the OCI runtime reported it once running
    /// (`None` for a container that ended before that).
    pub(crate) container_pid: Option<u32>,
    pub(crate) boot_id: String,
    pub(crate) started_at_ms: i64,
    pub(crate) limits: LimitsEnforcement,
}

/// One instance's directory.
#[derive(Clone, Debug)]
pub(crate) struct OciDir {
    pub(crate) id: String,
    pub(crate) path: PathBuf,
}

impl OciDir {
    pub(crate) fn new(instances: &Path, id: &str) -> Self {
        Self {
            id: id.to_owned(),
            path: instances.join(id),
        }
    }

    pub(crate) fn bundle(&self) -> PathBuf {
        self.path.join("bundle")
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.path.join("bundle/rootfs")
    }

    pub(crate) fn upper(&self) -> PathBuf {
        self.path.join("upper")
    }

    pub(crate) fn work(&self) -> PathBuf {
        self.path.join("work")
    }

    pub(crate) fn exit_code_path(&self) -> PathBuf {
        self.path.join(EXIT_CODE_FILE)
    }

    pub(crate) fn memory_events_path(&self) -> PathBuf {
        self.path.join(MEMORY_EVENTS_FILE)
    }

    pub(crate) fn pid_file_path(&self) -> PathBuf {
        self.path.join(PID_FILE)
    }

    /// The container's init pid once runc has written it (atomically).
    pub(crate) fn read_container_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file_path())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The `oom_kill` counter the monitor copied at exit, `None` when it
    /// copied none (no memory cgroup, or not written yet).
    pub(crate) fn read_oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.memory_events_path()).ok()?;
        crate::process::oom_kill_counter(&text)
    }

    pub(crate) fn read_instance(&self, operation: Operation) -> Result<OciInstance> {
        self.read_json(INSTANCE_FILE, operation)?
            .ok_or_else(|| Error::NotFound {
                id: self.id.clone(),
            })
    }

    pub(crate) fn write_instance(
        &self,
        instance: &OciInstance,
        operation: Operation,
    ) -> Result<()> {
        self.write_json(INSTANCE_FILE, instance, operation)
    }

    pub(crate) fn read_run(&self, operation: Operation) -> Result<Option<OciRun>> {
        self.read_json(RUN_FILE, operation)
    }

    pub(crate) fn write_run(&self, run: &OciRun, operation: Operation) -> Result<()> {
        self.write_json(RUN_FILE, run, operation)
    }

    /// The exit code the monitor recorded and when, `None` while running.
    pub(crate) fn read_exit_code(&self) -> Option<(i32, i64)> {
        let path = self.exit_code_path();
        let code = std::fs::read_to_string(&path).ok()?.trim().parse().ok()?;
        let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
        let since_epoch = modified
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Some((
            code,
            i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX),
        ))
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.path.join(STOP_MARKER).exists()
    }

    pub(crate) fn mark_stop_requested(&self, operation: Operation) -> Result<()> {
        let path = self.path.join(STOP_MARKER);
        std::fs::write(&path, b"").map_err(|e| self.io_error(operation, "writing", &path, e))
    }

    /// Forgets the last run's end before a new run.
    pub(crate) fn clear_exit(&self, operation: Operation) -> Result<()> {
        for path in [
            self.exit_code_path(),
            self.path.join(STOP_MARKER),
            self.memory_events_path(),
            self.pid_file_path(),
        ] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io_error(operation, "removing", &path, e)),
            }
        }
        Ok(())
    }

    pub(crate) fn io_error(
        &self,
        operation: Operation,
        what: &str,
        path: &Path,
        source: std::io::Error,
    ) -> Error {
        Error::io(
            &self.id,
            operation,
            format!("{what} {}", path.display()),
            source,
        )
    }

    fn read_json<T: DeserializeOwned>(
        &self,
        name: &str,
        operation: Operation,
    ) -> Result<Option<T>> {
        crate::records::read_json(&self.id, &self.path, name, operation)
    }

    fn write_json<T: Serialize>(&self, name: &str, value: &T, operation: Operation) -> Result<()> {
        crate::records::write_json(&self.id, &self.path, name, value, operation)
    }
}
