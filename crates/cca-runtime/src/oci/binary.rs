//! The OCI runtime binary the `oci` runtime drives — `runc` or `crun` —
//! found on `PATH` or given, checked against the host (crun 1.8 refuses
//! hybrid cgroups), and the argument lists of the subcommands used: `run`
//! (spawned by the instance monitor, see `mod`), `kill`, `delete`, `exec`.
//!
//! The two binaries take the same arguments for everything used here
//! (`--root`, `run --pid-file --bundle`, `kill ID SIGNAL`, `delete
//! --force`, `exec ID ARGV…`; checked against `crun --help` of 1.8.1)
//! except `run --keep`: runc keeps the container's cgroup past its end
//! with it, crun 1.8 has no such flag (it exits 64 with `unrecognized
//! option '--keep'`) and removes the cgroup when the container ends.

use std::ffi::OsString;
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
        "OCI runtime {path}: crun refuses hybrid cgroups (v1 controllers, and cgroup2 at \
         {unified} holding controllers): use runc (--oci-runtime runc, or runc on PATH), or run \
         on a host with unified cgroup v2 only"
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
            .args(self.global_args(subcommand))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// `--root STATE_ROOT SUBCOMMAND`: the same for runc and crun.
    fn global_args(&self, subcommand: &str) -> Vec<OsString> {
        vec![
            "--root".into(),
            self.state_root.clone().into(),
            subcommand.into(),
        ]
    }

    /// The whole command line of a foreground `run` (the monitor's):
    /// `BINARY --root ROOT run [--keep] --pid-file PID --bundle BUNDLE ID`.
    /// `--keep` only for runc: it keeps the container's cgroup (and its
    /// OOM counter) past the end; crun 1.8 refuses the flag.
    pub(crate) fn run_argv(&self, bundle: &Path, id: &str, pid_file: &Path) -> Vec<OsString> {
        let mut argv = vec![self.path.clone().into_os_string()];
        argv.extend(self.global_args("run"));
        if self.kind == OciBinaryKind::Runc {
            argv.push("--keep".into());
        }
        argv.extend([
            "--pid-file".into(),
            pid_file.as_os_str().to_owned(),
            "--bundle".into(),
            bundle.as_os_str().to_owned(),
            id.into(),
        ]);
        argv
    }

    /// Whether a run leaves the container's cgroup in place when it ends
    /// (runc `--keep`), so the memory cgroup's OOM counter can be read.
    pub fn keeps_cgroup_after_exit(&self) -> bool {
        self.kind == OciBinaryKind::Runc
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

/// Hybrid as crun 1.8 sees it: v1 controllers under `cgroup_root` and a
/// cgroup2 mount at `unified` that holds controllers (crun: "cgroups in
/// hybrid mode not supported, drop all controllers from cgroupv2"). A
/// unified host has `cgroup.controllers` at the root, not under `unified`.
fn is_hybrid(cgroup_root: &Path) -> bool {
    std::fs::read_to_string(cgroup_root.join("unified/cgroup.controllers"))
        .is_ok_and(|controllers| !controllers.trim().is_empty())
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(kind: OciBinaryKind) -> OciBinary {
        let path = match kind {
            OciBinaryKind::Runc => "/usr/sbin/runc",
            OciBinaryKind::Crun => "/usr/bin/crun",
        };
        OciBinary {
            path: path.into(),
            kind,
            state_root: "/var/lib/cca/oci/oci-state".into(),
        }
    }

    fn strings(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().expect("utf-8")).collect()
    }

    fn command_args(command: &Command) -> Vec<String> {
        command
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn run_keeps_the_cgroup_with_runc_only() {
        let (bundle, pid) = (
            Path::new("/d/web-1/bundle"),
            Path::new("/d/web-1/container.pid"),
        );
        let runc = binary(OciBinaryKind::Runc);
        assert_eq!(
            strings(&runc.run_argv(bundle, "web-1", pid)),
            [
                "/usr/sbin/runc",
                "--root",
                "/var/lib/cca/oci/oci-state",
                "run",
                "--keep",
                "--pid-file",
                "/d/web-1/container.pid",
                "--bundle",
                "/d/web-1/bundle",
                "web-1",
            ]
        );
        assert!(runc.keeps_cgroup_after_exit());
        let crun = binary(OciBinaryKind::Crun);
        assert_eq!(
            strings(&crun.run_argv(bundle, "web-1", pid)),
            [
                "/usr/bin/crun",
                "--root",
                "/var/lib/cca/oci/oci-state",
                "run",
                "--pid-file",
                "/d/web-1/container.pid",
                "--bundle",
                "/d/web-1/bundle",
                "web-1",
            ]
        );
        assert!(!crun.keeps_cgroup_after_exit());
    }

    #[test]
    fn other_subcommands_take_the_same_arguments_on_both() {
        for kind in [OciBinaryKind::Runc, OciBinaryKind::Crun] {
            let binary = binary(kind);
            let mut kill = binary.command("kill");
            kill.arg("web-1").arg("TERM");
            assert_eq!(
                command_args(&kill),
                [
                    "--root",
                    "/var/lib/cca/oci/oci-state",
                    "kill",
                    "web-1",
                    "TERM"
                ]
            );
            let mut delete = binary.command("delete");
            delete.arg("--force").arg("web-1");
            assert_eq!(
                command_args(&delete),
                [
                    "--root",
                    "/var/lib/cca/oci/oci-state",
                    "delete",
                    "--force",
                    "web-1"
                ]
            );
        }
    }

    #[test]
    fn crun_is_refused_on_hybrid_cgroups_only() {
        let root = tempfile::tempdir().expect("tempdir");
        let state = root.path().join("state");
        let crun = Some(Path::new("/usr/bin/crun"));
        std::fs::create_dir_all(root.path().join("unified")).expect("mkdir");
        std::fs::write(root.path().join("unified/cgroup.controllers"), "hugetlb\n").expect("w");
        let error = OciBinary::detect(crun, state.clone(), root.path()).expect_err("hybrid");
        let text = error.to_string();
        for part in [
            "/usr/bin/crun",
            "crun refuses hybrid cgroups",
            "use runc",
            "cgroup v2",
        ] {
            assert!(text.contains(part), "{text:?} lacks {part:?}");
        }
        let runc = OciBinary::detect(
            Some(Path::new("/usr/sbin/runc")),
            state.clone(),
            root.path(),
        );
        assert_eq!(runc.expect("runc is fine").kind, OciBinaryKind::Runc);
        // An empty cgroup2 beside v1 is what crun accepts.
        std::fs::write(root.path().join("unified/cgroup.controllers"), "\n").expect("w");
        let ok = OciBinary::detect(crun, state.clone(), root.path()).expect("empty cgroup2");
        assert_eq!(ok.kind, OciBinaryKind::Crun);
        // A unified host: the controllers are at the root.
        let unified = tempfile::tempdir().expect("tempdir");
        std::fs::write(unified.path().join("cgroup.controllers"), "cpu memory\n").expect("w");
        assert!(OciBinary::detect(crun, state.clone(), unified.path()).is_ok());
        let error = OciBinary::detect(Some(Path::new("/bin/youki")), state, unified.path());
        assert!(matches!(error, Err(BinaryError::Unknown { .. })));
    }
}
