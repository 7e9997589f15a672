//! The on-disk state of one process instance, `DIR/instances/{id}/`: what
//! survives an agent restart so a new agent process can adopt or report it.
//!
//! - `instance.json` — [`InstanceRecord`]: the spec and the resolved
//!   environment and working directory (written by `create`).
//! - `run.json` — [`RunRecord`]: pid, its start time and the boot id (so a
//!   reused pid is never mistaken for the instance), cgroups, limits, the
//!   OOM counter at start (written by `start` before the command may run).
//! - `exit.json` — [`ExitInfo`] of the last run (written when it ends).
//! - `stop-requested` — present while a stop is under way, so an exit it
//!   causes reads as `stopped`.
//! - `resolv.conf` — the resolver file a process with a DNS config sees at
//!   `/etc/resolv.conf` in its private mount namespace (written by
//!   `create`).
//! - `output.log*` — the instance's output (see `logs`), `work/` — the
//!   default working directory.
//!
//! Every JSON file is replaced atomically (write to a temporary, rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::cgroup::InstanceCgroups;
use crate::{Error, ExitInfo, InstanceSpec, LimitsEnforcement, Operation, Result};

const INSTANCE_FILE: &str = "instance.json";
const RUN_FILE: &str = "run.json";
const EXIT_FILE: &str = "exit.json";
const STOP_MARKER: &str = "stop-requested";

/// What `create` decided about an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InstanceRecord {
    pub(crate) spec: InstanceSpec,
    /// The complete environment the command (and every exec) gets.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) working_dir: PathBuf,
    pub(crate) created_at_ms: i64,
}

/// One run of an instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    /// The main process; also its process group and session id.
    pub(crate) pid: u32,
    /// `/proc/PID/stat` field 22 right after spawning.
    pub(crate) start_time: u64,
    pub(crate) boot_id: String,
    pub(crate) started_at_ms: i64,
    pub(crate) cgroups: Option<InstanceCgroups>,
    pub(crate) limits: LimitsEnforcement,
    /// The memory cgroup's OOM-kill counter before this run: a higher value
    /// at exit means this run was OOM-killed.
    pub(crate) oom_kills_before: u64,
}

/// One instance's directory.
#[derive(Clone, Debug)]
pub(crate) struct InstanceDir {
    pub(crate) id: String,
    pub(crate) path: PathBuf,
}

impl InstanceDir {
    pub(crate) fn new(instances: &Path, id: &str) -> Self {
        Self {
            id: id.to_owned(),
            path: instances.join(id),
        }
    }

    pub(crate) fn exists(&self) -> bool {
        self.path.join(INSTANCE_FILE).exists()
    }

    pub(crate) fn default_working_dir(&self) -> PathBuf {
        self.path.join("work")
    }

    pub(crate) fn resolv_conf(&self) -> PathBuf {
        self.path.join(crate::resolv::RESOLV_CONF_FILE)
    }

    pub(crate) fn read_instance(&self, operation: Operation) -> Result<InstanceRecord> {
        self.read(INSTANCE_FILE, operation)?
            .ok_or_else(|| Error::NotFound {
                id: self.id.clone(),
            })
    }

    pub(crate) fn write_instance(
        &self,
        record: &InstanceRecord,
        operation: Operation,
    ) -> Result<()> {
        self.write(INSTANCE_FILE, record, operation)
    }

    pub(crate) fn read_run(&self, operation: Operation) -> Result<Option<RunRecord>> {
        self.read(RUN_FILE, operation)
    }

    pub(crate) fn write_run(&self, record: &RunRecord, operation: Operation) -> Result<()> {
        self.write(RUN_FILE, record, operation)
    }

    pub(crate) fn read_exit(&self, operation: Operation) -> Result<Option<ExitInfo>> {
        self.read(EXIT_FILE, operation)
    }

    pub(crate) fn write_exit(&self, exit: &ExitInfo, operation: Operation) -> Result<()> {
        self.write(EXIT_FILE, exit, operation)
    }

    /// Forgets the previous run's end, before a new start.
    pub(crate) fn clear_exit(&self, operation: Operation) -> Result<()> {
        for name in [EXIT_FILE, STOP_MARKER] {
            remove_if_present(&self.path.join(name))
                .map_err(|e| Error::io(&self.id, operation, format!("removing {name}"), e))?;
        }
        Ok(())
    }

    pub(crate) fn mark_stop_requested(&self, operation: Operation) -> Result<()> {
        let path = self.path.join(STOP_MARKER);
        std::fs::write(&path, cca_model::clock::now_millis().to_string()).map_err(|e| {
            Error::io(
                &self.id,
                operation,
                format!("writing {}", path.display()),
                e,
            )
        })
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.path.join(STOP_MARKER).exists()
    }

    fn read<T: DeserializeOwned>(&self, name: &str, operation: Operation) -> Result<Option<T>> {
        crate::records::read_json(&self.id, &self.path, name, operation)
    }

    fn write<T: Serialize>(&self, name: &str, value: &T, operation: Operation) -> Result<()> {
        crate::records::write_json(&self.id, &self.path, name, value, operation)
    }
}

pub(crate) fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExitReason;

    #[test]
    fn records_round_trip_and_missing_ones_read_as_none() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = InstanceDir::new(root.path(), "a");
        std::fs::create_dir(&dir.path).expect("mkdir");
        assert!(matches!(
            dir.read_instance(Operation::Inspect),
            Err(Error::NotFound { .. })
        ));
        assert_eq!(dir.read_exit(Operation::Inspect).expect("read"), None);
        let exit = ExitInfo {
            code: Some(3),
            signal: None,
            reason: ExitReason::Exited,
            finished_at_ms: 5,
        };
        dir.write_exit(&exit, Operation::Stop).expect("write");
        assert_eq!(dir.read_exit(Operation::Inspect).expect("read"), Some(exit));
        dir.mark_stop_requested(Operation::Stop).expect("mark");
        assert!(dir.stop_requested());
        dir.clear_exit(Operation::Start).expect("clear");
        assert!(!dir.stop_requested());
        assert_eq!(dir.read_exit(Operation::Inspect).expect("read"), None);
    }

    #[test]
    fn a_corrupt_record_names_its_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = InstanceDir::new(root.path(), "a");
        std::fs::create_dir(&dir.path).expect("mkdir");
        std::fs::write(dir.path.join("run.json"), "{not json").expect("write");
        let error = dir
            .read_run(Operation::Inspect)
            .expect_err("corrupt")
            .to_string();
        assert!(error.starts_with("instance a: inspect: "), "{error}");
        assert!(error.contains("run.json is not valid"), "{error}");
    }
}
