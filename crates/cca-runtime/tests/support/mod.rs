//! Helpers for the process runtime tests: a runtime in a temporary
//! directory with its own cgroup parent, and a guard that kills every
//! process it started and removes its cgroups when the test ends — also
//! when it fails.

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cca_runtime::{
    InstanceSpec, InstanceState, InstanceStatus, ProcessConfig, ProcessRuntime, Runtime,
};

/// A process runtime for one test, cleaned up on drop.
pub(crate) struct TestRuntime {
    pub(crate) runtime: ProcessRuntime,
    pub(crate) config: ProcessConfig,
    /// Kept for the drop order: cleanup reads it before it is deleted.
    pub(crate) dir: tempfile::TempDir,
}

impl TestRuntime {
    pub(crate) async fn new() -> Self {
        Self::with_config(|_| {}).await
    }

    /// A runtime whose config `adjust` changes first.
    pub(crate) async fn with_config(adjust: impl FnOnce(&mut ProcessConfig)) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = ProcessConfig::new(dir.path());
        config.cgroup_parent = format!(
            "cca-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        config.rotate_interval = Duration::from_millis(50);
        adjust(&mut config);
        let runtime = ProcessRuntime::new(config.clone()).await.expect("runtime");
        Self {
            runtime,
            config,
            dir,
        }
    }

    /// A second runtime object on the same directory: a restarted agent.
    pub(crate) async fn reopen(&self) -> ProcessRuntime {
        ProcessRuntime::new(self.config.clone())
            .await
            .expect("second runtime")
    }

    pub(crate) async fn run(&self, spec: InstanceSpec) -> InstanceStatus {
        let id = self.runtime.create(spec).await.expect("create");
        self.runtime.start(&id).await.expect("start");
        self.runtime.inspect(&id).await.expect("inspect")
    }

    /// Polls until the instance is in `state` (10 s at most).
    pub(crate) async fn wait_for(&self, id: &str, state: InstanceState) -> InstanceStatus {
        wait_for(&self.runtime, id, state).await
    }

    /// Polls until the instance's logs contain `text` (10 s at most).
    pub(crate) async fn wait_for_log(&self, id: &str, text: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self
                .runtime
                .logs(id, Default::default())
                .await
                .expect("logs")
                .collect()
                .await
                .expect("lines");
            if lines.iter().any(|line| line.contains(text)) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} never logged: {lines:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn cgroup_dir(&self, controller: &str, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(&self.config.cgroup_parent)
            .join(id)
    }
}

pub(crate) async fn wait_for(
    runtime: &dyn Runtime,
    id: &str,
    state: InstanceState,
) -> InstanceStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = runtime.inspect(id).await.expect("inspect");
        if status.state == state {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never became {state}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a pid names a live (not zombie) process.
pub(crate) fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        let instances = self.dir.path().join("instances");
        let Ok(entries) = std::fs::read_dir(&instances) else {
            return;
        };
        for entry in entries.flatten() {
            kill_run(&entry.path());
        }
        for controller in ["memory", "cpu", "cpuacct"] {
            let parent = Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(&self.config.cgroup_parent);
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Kills a recorded run's process group and cgroup members, then removes
/// its cgroups.
fn kill_run(instance_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(instance_dir.join("run.json")) else {
        return;
    };
    let Ok(run) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let dirs: Vec<PathBuf> = run["cgroups"]["dirs"]
        .as_array()
        .map(|dirs| {
            dirs.iter()
                .filter_map(|d| d.as_str().map(PathBuf::from))
                .collect()
        })
        .unwrap_or_default();
    let mut pids: Vec<i32> = dirs
        .iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    if let Some(pid) = run["pid"].as_i64().and_then(|pid| i32::try_from(pid).ok())
        && let Some(group) = rustix::process::Pid::from_raw(pid)
    {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        pids.push(pid);
    }
    for pid in pids
        .iter()
        .filter_map(|&pid| rustix::process::Pid::from_raw(pid))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    for dir in dirs {
        for _ in 0..100 {
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
