//! Cgroups for process instances: detecting what the host offers (cgroup
//! v1 `memory`/`cpu`/`cpuacct` hierarchies, or a cgroup v2 root whose
//! `cgroup.controllers` lists `memory` and `cpu`), creating an instance's
//! cgroups under a parent (`cca/{id}`) with its limits written, moving a pid
//! in, reading the OOM-kill counter and the usage counters, killing leftover
//! members, and removing the directories. Every instance gets cgroups to
//! account its CPU and memory in, limits or not. Whatever limit cannot be
//! applied is reported as a reason, never dropped silently; an instance
//! whose usage the cgroups cannot account is read from `/proc` instead.
//!
//! On the hybrid hosts we run on, v2 is mounted at `/sys/fs/cgroup/unified`
//! with only `hugetlb`, so the v1 hierarchies are used.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::usage::{Usage, counter};
use crate::{InstanceSpec, Limits, LimitsEnforcement};

/// `cpu.cfs_period_us` / the period of `cpu.max`: 100 ms.
const CPU_PERIOD_US: u64 = 100_000;
/// The kernel refuses quotas below 1 ms.
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// What the host offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CgroupHost {
    /// Separate hierarchies; an `Err` says why one is missing.
    V1 {
        memory: Result<PathBuf, String>,
        cpu: Result<PathBuf, String>,
        cpuacct: Result<PathBuf, String>,
    },
    /// One unified hierarchy with memory and cpu controllers.
    V2 {
        root: PathBuf,
    },
    Unavailable {
        reason: String,
    },
}

impl CgroupHost {
    /// Looks at a cgroup mount point (normally `/sys/fs/cgroup`).
    pub(crate) fn detect(root: &Path) -> Self {
        if let Ok(controllers) = std::fs::read_to_string(root.join("cgroup.controllers")) {
            let listed: Vec<&str> = controllers.split_whitespace().collect();
            if listed.contains(&"memory") && listed.contains(&"cpu") {
                return Self::V2 {
                    root: root.to_owned(),
                };
            }
        }
        let hierarchy = |name: &str, probe: &str| {
            let dir = root.join(name);
            if dir.join(probe).exists() {
                Ok(dir)
            } else {
                Err(format!(
                    "no cgroup v1 {name} controller at {}",
                    dir.display()
                ))
            }
        };
        let memory = hierarchy("memory", "memory.limit_in_bytes");
        let cpu = hierarchy("cpu", "cpu.cfs_quota_us");
        // Where `cpu` and `cpuacct` share a mount, `cpuacct` is a link to it.
        let cpuacct = hierarchy("cpuacct", "cpuacct.usage");
        if memory.is_err() && cpu.is_err() {
            return Self::Unavailable {
                reason: format!(
                    "no cgroup v1 memory/cpu hierarchy and no cgroup v2 memory+cpu controllers under {}",
                    root.display()
                ),
            };
        }
        Self::V1 {
            memory,
            cpu,
            cpuacct,
        }
    }

    /// Creates the instance's cgroups under `parent` with the spec's limits.
    /// Returns the cgroups that exist (possibly only some) and whether every
    /// requested limit is enforced.
    pub(crate) fn prepare(
        &self,
        parent: &str,
        spec: &InstanceSpec,
    ) -> (Option<InstanceCgroups>, LimitsEnforcement) {
        let mut plan = Prepared::default();
        match self {
            Self::Unavailable { reason } => plan.failures.push(reason.clone()),
            Self::V1 {
                memory,
                cpu,
                cpuacct,
            } => plan.prepare_v1([memory, cpu, cpuacct], parent, spec),
            Self::V2 { root } => plan.prepare_v2(root, parent, spec),
        }
        plan.finish(self.version_name(), spec)
    }

    fn version_name(&self) -> &'static str {
        match self {
            Self::V2 { .. } => "cgroup v2",
            _ => "cgroup v1",
        }
    }
}

/// The accumulating result of `prepare`.
#[derive(Default)]
struct Prepared {
    dirs: Vec<PathBuf>,
    memory_dir: Option<PathBuf>,
    cpu_usage_dir: Option<PathBuf>,
    enforced: Vec<&'static str>,
    failures: Vec<String>,
}

impl Prepared {
    /// Memory and `cpuacct` cgroups for every instance (accounting), a
    /// `cpu` one for a CPU limit. Accounting that cannot be set up is not
    /// a failure: usage is then read from `/proc`.
    fn prepare_v1(
        &mut self,
        [memory, cpu, cpuacct]: [&Result<PathBuf, String>; 3],
        parent: &str,
        spec: &InstanceSpec,
    ) {
        let instance_dir = |hierarchy: &Result<PathBuf, String>| {
            hierarchy.clone().and_then(|hierarchy| {
                let dir = hierarchy.join(parent).join(&spec.id);
                create(&dir)?;
                Ok(dir)
            })
        };
        let memory_dir = instance_dir(memory);
        if let Ok(dir) = &memory_dir {
            self.place(dir);
            self.memory_dir = Some(dir.clone());
        }
        if let Some(limit) = spec.memory_bytes {
            let result = memory_dir.and_then(|dir| write_v1_memory_limit(&dir, limit));
            self.limit("memory", result);
        }
        if let Some(millis) = spec.cpu_millis {
            let result = instance_dir(cpu).and_then(|dir| {
                write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write(
                    &dir.join("cpu.cfs_quota_us"),
                    &cpu_quota_us(millis).to_string(),
                )?;
                self.place(&dir);
                Ok(())
            });
            self.limit("cpu", result);
        }
        if let Ok(dir) = instance_dir(cpuacct) {
            self.place(&dir);
            self.cpu_usage_dir = Some(dir);
        }
    }

    /// One directory with both controllers: `memory.current` needs the
    /// memory controller even without a limit.
    fn prepare_v2(&mut self, root: &Path, parent: &str, spec: &InstanceSpec) {
        let controllers = "+memory +cpu";
        let dir = root.join(parent).join(&spec.id);
        let created = (|| {
            // v2 only offers a controller to a child when every ancestor
            // enables it in cgroup.subtree_control.
            write(&root.join("cgroup.subtree_control"), controllers)?;
            create(&root.join(parent))?;
            write(
                &root.join(parent).join("cgroup.subtree_control"),
                controllers,
            )?;
            create(&dir)
        })();
        if let Err(reason) = created {
            self.failures.push(reason);
            return;
        }
        self.place(&dir);
        self.memory_dir = Some(dir.clone());
        self.cpu_usage_dir = Some(dir.clone());
        if let Some(limit) = spec.memory_bytes {
            let result = write(&dir.join("memory.max"), &limit.to_string()).map(|()| {
                // No swap beyond the limit; hosts without swap lack the file.
                let _ = write(&dir.join("memory.swap.max"), "0");
            });
            self.limit("memory", result);
        }
        if let Some(millis) = spec.cpu_millis {
            let value = format!("{} {CPU_PERIOD_US}", cpu_quota_us(millis));
            self.limit("cpu", write(&dir.join("cpu.max"), &value));
        }
    }

    fn place(&mut self, dir: &Path) {
        if !self.dirs.iter().any(|placed| placed == dir) {
            self.dirs.push(dir.to_owned());
        }
    }

    fn limit(&mut self, what: &'static str, result: Result<(), String>) {
        match result {
            Ok(()) => self.enforced.push(what),
            Err(reason) => self.failures.push(format!("{what}: {reason}")),
        }
    }

    fn finish(
        self,
        version: &str,
        spec: &InstanceSpec,
    ) -> (Option<InstanceCgroups>, LimitsEnforcement) {
        let cgroups = (!self.dirs.is_empty()).then_some(InstanceCgroups {
            dirs: self.dirs,
            memory_dir: self.memory_dir,
            cpu_usage_dir: self.cpu_usage_dir,
        });
        let limits = if spec.memory_bytes.is_none() && spec.cpu_millis.is_none() {
            LimitsEnforcement::NotRequested
        } else if self.failures.is_empty() {
            LimitsEnforcement::Enforced {
                by: format!("{version}: {}", self.enforced.join(", ")),
            }
        } else {
            let mut reason = self.failures.join("; ");
            if !self.enforced.is_empty() {
                reason.push_str(&format!("; enforced: {}", self.enforced.join(", ")));
            }
            LimitsEnforcement::Unenforced { reason }
        };
        (cgroups, limits)
    }
}

/// The cgroup directories of one instance, persisted with its run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InstanceCgroups {
    /// Every directory the instance's processes are placed in.
    pub(crate) dirs: Vec<PathBuf>,
    /// The one holding the memory controller's counters, if any.
    pub(crate) memory_dir: Option<PathBuf>,
    /// The one holding the CPU time counters (v1 `cpuacct`), if any;
    /// runs recorded before usage was accounted have none.
    #[serde(default)]
    pub(crate) cpu_usage_dir: Option<PathBuf>,
}

impl InstanceCgroups {
    /// Moves a process into every cgroup of the instance.
    pub(crate) fn join(&self, pid: u32) -> Result<(), String> {
        for dir in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// How many processes the kernel has OOM-killed in this cgroup so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory_dir else {
            return 0;
        };
        // v1 keeps the counter in memory.oom_control, v2 in memory.events.
        ["memory.oom_control", "memory.events"]
            .iter()
            .filter_map(|file| std::fs::read_to_string(dir.join(file)).ok())
            .find_map(|text| counter(&text, "oom_kill"))
            .unwrap_or(0)
    }

    /// The instance's usage as its cgroups account it: `None` when they
    /// do not account both CPU and memory (read `/proc` instead).
    pub(crate) fn usage(&self) -> Option<Result<Usage, String>> {
        let cpu = self.cpu_usage_dir.as_deref()?;
        let memory = self.memory_dir.as_deref()?;
        Some(crate::usage::from_cgroups(cpu, memory))
    }

    /// Stops reading usage from the cgroups (the instance's process could
    /// not be moved into them all).
    pub(crate) fn unaccounted(&mut self) {
        self.cpu_usage_dir = None;
    }

    /// Rewrites the limits of the running instance's cgroups (`None`:
    /// none). Checks first that every limit has a cgroup to go in, so a
    /// refusal changes nothing.
    pub(crate) fn set_limits(&self, limits: Limits) -> Result<(), String> {
        let cpu_dir = self
            .dirs
            .iter()
            .find(|dir| dir.join("cpu.cfs_quota_us").exists() || dir.join("cpu.max").exists());
        if limits.cpu_millis.is_some() && cpu_dir.is_none() {
            return Err(
                "the run has no cpu cgroup (it started without a CPU limit on \
                        cgroup v1): the CPU limit applies at its next start"
                    .to_owned(),
            );
        }
        let memory_dir = self.memory_dir.as_deref();
        if limits.memory_bytes.is_some() && memory_dir.is_none() {
            return Err(
                "the run has no memory cgroup: the memory limit applies at its \
                        next start"
                    .to_owned(),
            );
        }
        if let Some(dir) = memory_dir {
            if dir.join("memory.limit_in_bytes").exists() {
                match limits.memory_bytes {
                    Some(limit) => write_v1_memory_limit(dir, limit)?,
                    // Unlimited: memory+swap's first, as the memory limit
                    // may not exceed it.
                    None => {
                        let memsw = dir.join("memory.memsw.limit_in_bytes");
                        if memsw.exists() {
                            write(&memsw, "-1")?;
                        }
                        write(&dir.join("memory.limit_in_bytes"), "-1")?;
                    }
                }
            } else {
                let value = limits
                    .memory_bytes
                    .map_or_else(|| "max".to_owned(), |limit| limit.to_string());
                write(&dir.join("memory.max"), &value)?;
            }
        }
        if let Some(dir) = cpu_dir {
            if dir.join("cpu.cfs_quota_us").exists() {
                let quota = limits.cpu_millis.map_or_else(
                    || "-1".to_owned(),
                    |millis| cpu_quota_us(millis).to_string(),
                );
                write(&dir.join("cpu.cfs_quota_us"), &quota)?;
            } else {
                let quota = limits.cpu_millis.map_or_else(
                    || "max".to_owned(),
                    |millis| cpu_quota_us(millis).to_string(),
                );
                write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
            }
        }
        Ok(())
    }

    /// Live processes in any of the instance's cgroups.
    pub(crate) fn member_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .dirs
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|text| {
                text.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes the directories, waiting briefly for exiting members
    /// (`rmdir` fails with EBUSY until the last one is gone).
    pub(crate) async fn remove(&self) -> std::io::Result<()> {
        for dir in &self.dirs {
            let mut attempts = 0;
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => break,
                    Err(error) if attempts >= 50 => return Err(error),
                    Err(_) => {
                        attempts += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        Ok(())
    }
}

fn cpu_quota_us(millis: u64) -> u64 {
    (millis.saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_CPU_QUOTA_US)
}

/// v1 refuses `memory.limit_in_bytes` above `memory.memsw.limit_in_bytes`
/// and the reverse, so the order depends on whether the limit grows;
/// trying one order and then the other covers both. memsw equal to the limit
/// means no swapping past the limit (the file exists only with swap
/// accounting).
fn write_v1_memory_limit(dir: &Path, limit: u64) -> Result<(), String> {
    let memory = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let value = limit.to_string();
    if !memsw.exists() {
        return write(&memory, &value);
    }
    write(&memory, &value)
        .and_then(|()| write(&memsw, &value))
        .or_else(|_| write(&memsw, &value).and_then(|()| write(&memory, &value)))
}

/// The `oom_kill` counter in the text of a v1 `memory.oom_control` or a
/// v2 `memory.events` (the `oci` runtime reads the monitor's copy).
pub(crate) fn oom_kill_counter(text: &str) -> Option<u64> {
    counter(text, "oom_kill")
}

fn create(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value)
        .map_err(|error| format!("writing {value:?} to {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(memory: Option<u64>, cpu: Option<u64>) -> InstanceSpec {
        let mut spec = InstanceSpec::new("web-1", "web", "true");
        spec.memory_bytes = memory;
        spec.cpu_millis = cpu;
        spec
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn v1_limits_land_in_the_memory_and_cpu_hierarchies() {
        let root = tempfile::tempdir().expect("tempdir");
        for (dir, probe) in [
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
        ] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
            std::fs::write(root.path().join(dir).join(probe), "").expect("probe");
        }
        let host = CgroupHost::detect(root.path());
        let (cgroups, limits) = host.prepare("cca", &spec(Some(32 << 20), Some(250)));
        let cgroups = cgroups.expect("cgroups");
        assert_eq!(
            limits,
            LimitsEnforcement::Enforced {
                by: "cgroup v1: memory, cpu".into()
            }
        );
        let memory = root.path().join("memory/cca/web-1");
        let cpu = root.path().join("cpu/cca/web-1");
        assert_eq!(cgroups.dirs, [memory.clone(), cpu.clone()]);
        assert_eq!(read(memory.join("memory.limit_in_bytes")), "33554432");
        assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "25000");
        assert_eq!(read(cpu.join("cpu.cfs_period_us")), "100000");
        cgroups.join(77).expect("join");
        assert_eq!(read(memory.join("cgroup.procs")), "77");
    }

    #[test]
    fn v2_enables_controllers_down_the_tree_and_writes_max_files() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("controllers");
        let host = CgroupHost::detect(root.path());
        assert!(matches!(host, CgroupHost::V2 { .. }));
        let (cgroups, limits) = host.prepare("cca", &spec(Some(1 << 20), Some(1500)));
        assert_eq!(
            limits,
            LimitsEnforcement::Enforced {
                by: "cgroup v2: memory, cpu".into()
            }
        );
        let dir = root.path().join("cca/web-1");
        assert_eq!(cgroups.expect("cgroups").dirs, std::slice::from_ref(&dir));
        assert_eq!(
            read(root.path().join("cgroup.subtree_control")),
            "+memory +cpu"
        );
        assert_eq!(
            read(root.path().join("cca/cgroup.subtree_control")),
            "+memory +cpu"
        );
        assert_eq!(read(dir.join("memory.max")), "1048576");
        assert_eq!(read(dir.join("cpu.max")), "150000 100000");
    }

    #[test]
    fn missing_controllers_are_reported_not_ignored() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("memory")).expect("mkdir");
        std::fs::write(root.path().join("memory/memory.limit_in_bytes"), "").expect("probe");
        let host = CgroupHost::detect(root.path());
        let (cgroups, limits) = host.prepare("cca", &spec(Some(1 << 20), Some(100)));
        assert!(cgroups.is_some(), "memory is still enforced");
        let LimitsEnforcement::Unenforced { reason } = limits else {
            panic!("cpu cannot be enforced: {limits:?}");
        };
        assert!(
            reason.starts_with("cpu: no cgroup v1 cpu controller"),
            "{reason}"
        );
        assert!(reason.ends_with("enforced: memory"), "{reason}");

        let empty = tempfile::tempdir().expect("tempdir");
        let (none, limits) = CgroupHost::detect(empty.path()).prepare("cca", &spec(Some(1), None));
        assert!(none.is_none());
        assert!(matches!(limits, LimitsEnforcement::Unenforced { .. }));
        let (_, limits) = CgroupHost::detect(empty.path()).prepare("cca", &spec(None, None));
        assert_eq!(limits, LimitsEnforcement::NotRequested);
    }

    #[test]
    fn every_instance_is_accounted_limits_or_not() {
        let root = tempfile::tempdir().expect("tempdir");
        for (dir, probe) in [
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.cfs_quota_us"),
            ("cpuacct", "cpuacct.usage"),
        ] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
            std::fs::write(root.path().join(dir).join(probe), "").expect("probe");
        }
        let host = CgroupHost::detect(root.path());
        let (cgroups, limits) = host.prepare("cca", &spec(None, None));
        assert_eq!(limits, LimitsEnforcement::NotRequested);
        let cgroups = cgroups.expect("accounting cgroups");
        let memory = root.path().join("memory/cca/web-1");
        let cpuacct = root.path().join("cpuacct/cca/web-1");
        assert_eq!(cgroups.dirs, [memory.clone(), cpuacct.clone()]);
        assert!(
            !memory.join("memory.limit_in_bytes").exists(),
            "no limit written"
        );
        std::fs::write(cpuacct.join("cpuacct.usage"), "5000\n").expect("usage");
        std::fs::write(memory.join("memory.usage_in_bytes"), "4096\n").expect("charge");
        std::fs::write(memory.join("memory.stat"), "total_inactive_file 0\n").expect("stat");
        assert_eq!(
            cgroups.usage(),
            Some(Ok(Usage {
                cpu_nanos: 5000,
                memory_bytes: 4096,
            }))
        );
        let mut unjoined = cgroups.clone();
        unjoined.unaccounted();
        assert_eq!(unjoined.usage(), None, "read from /proc instead");

        let (cgroups, limits) = host.prepare("cca", &spec(Some(1 << 20), Some(100)));
        assert_eq!(
            limits,
            LimitsEnforcement::Enforced {
                by: "cgroup v1: memory, cpu".into()
            }
        );
        let cpu = root.path().join("cpu/cca/web-1");
        assert_eq!(cgroups.expect("cgroups").dirs, [memory, cpu, cpuacct]);
    }

    #[test]
    fn a_run_recorded_before_accounting_reads_usage_from_proc() {
        let old: InstanceCgroups =
            serde_json::from_str(r#"{"dirs":["/m/x"],"memory_dir":"/m/x"}"#).expect("old record");
        assert_eq!(old.cpu_usage_dir, None);
        assert_eq!(old.usage(), None);
    }

    #[test]
    fn oom_kills_are_read_from_either_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cgroups = InstanceCgroups {
            dirs: vec![dir.path().to_owned()],
            memory_dir: Some(dir.path().to_owned()),
            cpu_usage_dir: None,
        };
        assert_eq!(cgroups.oom_kills(), 0);
        std::fs::write(
            dir.path().join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n",
        )
        .expect("events");
        assert_eq!(cgroups.oom_kills(), 2);
        std::fs::write(
            dir.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
        )
        .expect("oom_control");
        assert_eq!(cgroups.oom_kills(), 5);
    }

    #[test]
    fn tiny_cpu_limits_round_up_to_the_kernel_minimum() {
        assert_eq!(cpu_quota_us(1), 1_000);
        assert_eq!(cpu_quota_us(2000), 200_000);
    }
}
