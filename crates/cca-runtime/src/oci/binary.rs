//! The OCI runtime binary the `oci` runtime drives — `runc` or `crun` —
//! found on `PATH` or given, checked against the host (crun 1.8 refuses
//! hybrid cgroups), and the few subcommands used: `kill`, `delete`,
//! `exec`. `run` is spawned by the instance monitor (see `mod`).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

/// Which OCI runtime a binary is; they differ in host support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OciBinaryKind {
    Runc,
    Crun,
}

/// Why no usable OCI runtime binary was found.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error("no OCI runtime found: neither runc nor crun is on PATH (Debian packages runc, crun)")]
    NotFound,
    #[error("OCI runtime {path}: the name must be runc or crun (or end in -runc / -crun)")]
    Unknown { path: PathBuf },
    #[error(
        "OCI runtime {path}: crun refuses hybrid cgroups (v1 controllers with an empty cgroup2 at \
         {unified}): use runc, or run the agent in a mount namespace where {unified} is unmounted"
    )]
    CrunOnHybridCgroups { path: PathBuf, unified: PathBuf },
}

/// The binary plus the state directory it keeps its containers in.
#[derive(Clone, Debug)]
pub struct OciBinary {
    pub path: PathBuf,
    pub kind: OciBinaryKind,
    /// `--root`: the binary's own container state, private to this runtime.
    pub state_root: PathBuf,
}

impl OciBinary {
    /// `preferred` when given, else runc, else crun from `PATH`; refused
    /// when it cannot run containers on this host.
    pub fn detect(
        preferred: Option<&Path>,
        state_root: PathBuf,
        cgroup_root: &Path,
    ) -> Result<Self, BinaryError> {
        let path = match preferred {
            Some(path) => path.to_owned(),
            None => find_on_path("runc")
                .or_else(|| find_on_path("crun"))
                .ok_or(BinaryError::NotFound)?,
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let kind = if name == "runc" || name.ends_with("-runc") {
            OciBinaryKind::Runc
        } else if name == "crun" || name.ends_with("-crun") {
            OciBinaryKind::Crun
        } else {
            return Err(BinaryError::Unknown { path });
        };
        let unified = cgroup_root.join("unified");
        if kind == OciBinaryKind::Crun && is_hybrid(cgroup_root) {
            return Err(BinaryError::CrunOnHybridCgroups { path, unified });
        }
        Ok(Self {
            path,
            kind,
            state_root,
        })
    }

    /// A command for `SUBCOMMAND ARGS` with this runtime's state root.
    pub(crate) fn command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(&self.path);
        command
            .arg("--root")
            .arg(&self.state_root)
            .arg(subcommand)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Sends `signal` (e.g. `TERM`) to the container's init; errors (it
    /// already ended) are ignored, callers check the state.
    pub(crate) async fn kill(&self, id: &str, signal: &str) {
        let result = self.command("kill").arg(id).arg(signal).output().await;
        if let Ok(output) = result
            && !output.status.success()
        {
            tracing::debug!(id, signal, stderr = %String::from_utf8_lossy(&output.stderr), "kill refused");
        }
    }

    /// Forgets the container (its state and cgroups), ignoring "not found".
    pub(crate) async fn delete(&self, id: &str) {
        let _ = self.command("delete").arg("--force").arg(id).output().await;
    }
}

/// v1 controllers and a cgroup2 mount at `unified` side by side.
fn is_hybrid(cgroup_root: &Path) -> bool {
    cgroup_root.join("unified/cgroup.controllers").exists() && cgroup_root.join("memory").is_dir()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
