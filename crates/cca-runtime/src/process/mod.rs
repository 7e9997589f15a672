//! The `process` runtime: each instance is a host process tree in its own
//! session and process group, run through `sh -c` with the resolved
//! environment and working directory, its output in rotated log files, its
//! cpu/memory limits in cgroups where the host allows, and its state on
//! disk under `DIR/instances/{id}/` so that a new agent process adopts what
//! an earlier one started (see `records`).
//!
//! Processes this runtime object spawned are reaped by a task per run; the
//! others (adopted) are watched through `/proc`, identified by pid, start
//! time and boot id.
//!
//! Mounts are refused: a host process sees the host's filesystem, so there
//! is nothing to bind into. The agent hands a process workload its volume
//! directories as `CCA_VOLUME_{NAME}` variables instead.
//!
//! The one exception is the resolver: a spec with a DNS config runs in a
//! private mount namespace in which `/etc/resolv.conf` is the instance's
//! generated file (see `mountns`), and `exec` joins that namespace; the
//! host's file and every other process are untouched. It needs root.

mod cgroup;
mod exec;
mod launch;
mod mountns;
pub(crate) mod procfs;
mod records;
mod stop;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

pub(crate) use self::cgroup::oom_kill_counter;
use self::cgroup::{CgroupHost, InstanceCgroups};
use self::records::{InstanceDir, InstanceRecord, RunRecord};
use crate::logs::{self, LogOptions, LogStream};
use crate::{
    Error, ExecOutput, ExecRequest, ExitInfo, InstanceSpec, InstanceState, InstanceStatus, Limits,
    LimitsEnforcement, Operation, Result, Runtime, Usage,
};

/// Variables passed on from the agent's own environment to every instance
/// (everything else of the agent's environment stays private).
const INHERITED_ENV: [&str; 8] = [
    "PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR",
];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where and how the process runtime keeps its instances.
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// The runtime directory; instances live in `DIR/instances/{id}/`.
    /// Keep it across agent restarts: it is what adoption reads.
    pub dir: PathBuf,
    /// The cgroup mount point, normally `/sys/fs/cgroup`.
    pub cgroup_root: PathBuf,
    /// Instance cgroups are `{cgroup_root}/{controller}/{cgroup_parent}/{id}`
    /// (v1) or `{cgroup_root}/{cgroup_parent}/{id}` (v2).
    pub cgroup_parent: String,
    /// How often log files are checked against their size limit.
    pub rotate_interval: Duration,
    /// The base environment of every instance (the spec's variables and the
    /// runtime's `CCA_*`/`PORT` come on top).
    pub base_env: BTreeMap<String, String>,
    /// The host's resolver file, normally `/etc/resolv.conf`: an instance
    /// with a DNS config sees its own file there (bound over the file
    /// this path resolves to, in the instance's own mount namespace).
    pub resolv_conf: PathBuf,
}

impl ProcessConfig {
    /// Defaults: cgroups under `/sys/fs/cgroup/.../cca`, logs checked every
    /// second, `PATH`, `HOME`, locale and `TZ` inherited from the agent.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let mut base_env: BTreeMap<String, String> = INHERITED_ENV
            .iter()
            .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
            .collect();
        base_env
            .entry("PATH".to_owned())
            .or_insert_with(|| DEFAULT_PATH.to_owned());
        Self {
            dir: dir.into(),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "cca".to_owned(),
            rotate_interval: Duration::from_secs(1),
            base_env,
            resolv_conf: PathBuf::from(crate::resolv::ETC_RESOLV_CONF),
        }
    }
}

/// The `process` runtime. Cheap to share (`Arc` it); dropping it stops log
/// rotation but never the instances.
#[derive(Debug)]
pub struct ProcessRuntime {
    inner: Arc<Inner>,
    rotator: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    config: ProcessConfig,
    instances_dir: PathBuf,
    cgroups: CgroupHost,
    setsid: Option<PathBuf>,
    boot_id: String,
    /// Runs this object spawned: their exits arrive through the reaper.
    children: Mutex<HashMap<String, watch::Receiver<Option<ExitInfo>>>>,
    /// Serialises create/start/stop/remove per instance.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ProcessRuntime {
    /// Opens (creating if needed) the runtime directory and starts the log
    /// rotation task. Instances already in the directory are adopted as
    /// they are: nothing is started or stopped.
    pub async fn new(config: ProcessConfig) -> Result<Self> {
        let instances_dir = config.dir.join("instances");
        std::fs::create_dir_all(&instances_dir).map_err(|source| Error::RuntimeDir {
            path: instances_dir.clone(),
            error: source,
        })?;
        let cgroups = CgroupHost::detect(&config.cgroup_root);
        tracing::debug!(?cgroups, "process runtime cgroup support");
        let inner = Arc::new(Inner {
            instances_dir,
            cgroups,
            setsid: launch::find_setsid(),
            boot_id: procfs::boot_id(),
            children: Mutex::default(),
            locks: Mutex::default(),
            config,
        });
        let rotator = tokio::spawn(rotate_logs(Arc::downgrade(&inner)));
        Ok(Self { inner, rotator })
    }

    /// The runtime directory.
    pub fn dir(&self) -> &Path {
        &self.inner.config.dir
    }

    /// The directory of one instance (its logs are `output.log*` there).
    pub fn instance_dir(&self, id: &str) -> PathBuf {
        self.inner.instances_dir.join(id)
    }
}

impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        self.rotator.abort();
    }
}

#[async_trait]
impl Runtime for ProcessRuntime {
    fn kind(&self) -> &'static str {
        "process"
    }

    async fn create(&self, spec: InstanceSpec) -> Result<String> {
        spec.validate()?;
        let _guard = self.inner.lock(&spec.id).await;
        self.inner.create(spec)
    }

    async fn start(&self, id: &str) -> Result<()> {
        let _guard = self.inner.lock(id).await;
        self.inner.start(id).await
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<InstanceStatus> {
        let _guard = self.inner.lock(id).await;
        stop::stop(&self.inner, id, grace).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let _guard = self.inner.lock(id).await;
        self.inner.remove(id).await
    }

    async fn inspect(&self, id: &str) -> Result<InstanceStatus> {
        self.inner.status(id, Operation::Inspect)
    }

    async fn list(&self) -> Result<Vec<InstanceStatus>> {
        self.inner.list()
    }

    async fn logs(&self, id: &str, options: LogOptions) -> Result<LogStream> {
        logs_of(&self.inner, id, options).await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecOutput> {
        exec::exec(&self.inner, id, request).await
    }

    async fn usage(&self, id: &str) -> Result<Usage> {
        self.inner.usage(id)
    }

    async fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let _guard = self.inner.lock(id).await;
        self.inner.resize(id, limits)
    }
}

impl Inner {
    fn dir(&self, id: &str) -> InstanceDir {
        InstanceDir::new(&self.instances_dir, id)
    }

    async fn lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    fn create(&self, spec: InstanceSpec) -> Result<String> {
        if let Some(image) = &spec.image {
            return Err(Error::InvalidSpec {
                id: spec.id,
                reason: format!(
                    "the process runtime does not run images ({image}): use the oci runtime"
                ),
            });
        }
        if let Some(mount) = spec.mounts.first() {
            // Refused rather than ignored: a workload told its secret sits at
            // a path that does not exist would fail later and obscurely.
            return Err(Error::InvalidSpec {
                id: spec.id.clone(),
                reason: format!(
                    "the process runtime cannot mount {} at {}: host processes see the host's \
                     filesystem (use the path itself, or the oci runtime)",
                    mount.source.display(),
                    mount.target
                ),
            });
        }
        let dir = self.dir(&spec.id);
        if dir.exists() {
            return Err(Error::AlreadyExists { id: spec.id });
        }
        let working_dir = match &spec.working_dir {
            Some(path) if !path.is_dir() => {
                return Err(Error::InvalidSpec {
                    id: spec.id.clone(),
                    reason: format!("working directory {} is not a directory", path.display()),
                });
            }
            Some(path) => path.clone(),
            None => dir.default_working_dir(),
        };
        std::fs::create_dir_all(dir.default_working_dir()).map_err(|e| {
            Error::io(
                &spec.id,
                Operation::Create,
                format!("creating {}", dir.path.display()),
                e,
            )
        })?;
        if let Some(dns) = &spec.dns {
            let prepared = self.prepare_resolv_conf(&dir, &spec.id, dns);
            if prepared.is_err() {
                let _ = std::fs::remove_dir_all(&dir.path);
            }
            prepared?;
        }
        let mut env = self.config.base_env.clone();
        env.extend(spec.full_env());
        let record = InstanceRecord {
            spec,
            env,
            working_dir,
            created_at_ms: cca_model::clock::now_millis(),
        };
        dir.write_instance(&record, Operation::Create)?;
        Ok(dir.id)
    }

    /// Writes the instance's `resolv.conf` and checks that a start could
    /// bind it (root, a host file to bind over), so `create` fails with the
    /// reason rather than every start.
    fn prepare_resolv_conf(
        &self,
        dir: &InstanceDir,
        id: &str,
        dns: &crate::DnsConfig,
    ) -> Result<()> {
        let path = dir.resolv_conf();
        crate::resolv::write(&path, &crate::resolv::resolv_conf(dns)).map_err(|e| {
            Error::io(
                id,
                Operation::Create,
                format!("writing {}", path.display()),
                e,
            )
        })?;
        mountns::check(id, &path, &self.config.resolv_conf)
    }

    async fn start(&self, id: &str) -> Result<()> {
        let status = self.status(id, Operation::Start)?;
        if status.state == InstanceState::Running {
            return Err(Error::InvalidState {
                id: id.to_owned(),
                operation: Operation::Start,
                state: status.state,
            });
        }
        let dir = self.dir(id);
        let record = dir.read_instance(Operation::Start)?;
        dir.clear_exit(Operation::Start)?;
        let (mut cgroups, mut limits) = self
            .cgroups
            .prepare(&self.config.cgroup_parent, &record.spec);
        let spawned = launch::spawn_gated(
            &dir,
            &record,
            self.setsid.as_deref(),
            &self.config.resolv_conf,
        )
        .await;
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                if let Some(cgroups) = &cgroups {
                    let _ = cgroups.remove().await;
                }
                return Err(error);
            }
        };
        let pid = child.id().unwrap_or_default();
        if !launch::wait_for_own_group(pid).await {
            tracing::warn!(
                instance = id,
                pid,
                "the instance did not get its own process group"
            );
        }
        if let Some(cgroups) = &mut cgroups
            && let Err(reason) = cgroups.join(pid)
        {
            cgroups.unaccounted();
            if limits != LimitsEnforcement::NotRequested {
                limits = LimitsEnforcement::Unenforced {
                    reason: format!("moving pid {pid} into its cgroup: {reason}"),
                };
            }
        }
        if let LimitsEnforcement::Unenforced { reason } = &limits {
            tracing::warn!(instance = id, %reason, "limits are not enforced");
        }
        let run = RunRecord {
            pid,
            start_time: procfs::stat(pid).map_or(0, |stat| stat.start_time),
            boot_id: self.boot_id.clone(),
            started_at_ms: cca_model::clock::now_millis(),
            oom_kills_before: cgroups
                .as_ref()
                .map_or(0, cgroup::InstanceCgroups::oom_kills),
            cgroups,
            limits,
        };
        // Recorded before the gate opens: if the agent dies now, the gate
        // reads end-of-file and the command never runs unrecorded.
        let recorded = dir.write_run(&run, Operation::Start);
        if let Err(error) = recorded {
            let _ = child.start_kill();
            return Err(error);
        }
        launch::open_gate(&mut child).await;
        self.watch_child(child, dir, run, record.spec.memory_bytes);
        tracing::info!(instance = id, pid, "instance started");
        Ok(())
    }

    fn watch_child(
        &self,
        child: tokio::process::Child,
        dir: InstanceDir,
        run: RunRecord,
        memory_limit: Option<u64>,
    ) {
        let (sender, receiver) = watch::channel(None);
        self.children
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(dir.id.clone(), receiver);
        let exit_watch = launch::ExitWatch {
            dir,
            cgroups: run.cgroups,
            oom_kills_before: run.oom_kills_before,
            memory_limit,
        };
        tokio::spawn(launch::reap(child, exit_watch, sender));
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let status = self.status(id, Operation::Remove)?;
        if status.state == InstanceState::Running {
            return Err(Error::InvalidState {
                id: id.to_owned(),
                operation: Operation::Remove,
                state: status.state,
            });
        }
        let dir = self.dir(id);
        if let Some(cgroups) = dir.read_run(Operation::Remove)?.and_then(|run| run.cgroups) {
            // Stragglers that left the process group (their own setsid) are
            // still in the cgroup.
            for pid in cgroups.member_pids() {
                let _ = procfs::signal_process(pid, rustix::process::Signal::KILL);
            }
            cgroups
                .remove()
                .await
                .map_err(|e| Error::io(id, Operation::Remove, "removing its cgroups", e))?;
        }
        std::fs::remove_dir_all(&dir.path).map_err(|e| {
            Error::io(
                id,
                Operation::Remove,
                format!("removing {}", dir.path.display()),
                e,
            )
        })?;
        self.children
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        Ok(())
    }

    fn list(&self) -> Result<Vec<InstanceStatus>> {
        crate::records::list_instances(&self.instances_dir, |id| self.status(id, Operation::List))
    }

    /// What a running instance uses: from its cgroups, or from its
    /// process group in `/proc` where they do not account it.
    fn usage(&self, id: &str) -> Result<Usage> {
        self.status(id, Operation::Usage)?
            .require_running(Operation::Usage)?;
        let Some(run) = self.dir(id).read_run(Operation::Usage)? else {
            return Err(Error::NotFound { id: id.to_owned() });
        };
        match run.cgroups.as_ref().and_then(InstanceCgroups::usage) {
            Some(read) => read.map_err(|message| Error::Failed {
                id: id.to_owned(),
                operation: Operation::Usage,
                message,
            }),
            None => Ok(crate::usage::of_processes(&procfs::live_group_members(
                run.pid,
            ))),
        }
    }

    /// New limits in the instance's record (the next start's cgroups get
    /// them) and, while it runs, in its cgroups.
    fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let operation = Operation::Resize;
        let running = self.status(id, operation)?.state == InstanceState::Running;
        let dir = self.dir(id);
        if running {
            let Some(mut run) = dir.read_run(operation)? else {
                return Err(Error::NotFound { id: id.to_owned() });
            };
            let failed = |message: String| Error::Failed {
                id: id.to_owned(),
                operation,
                message,
            };
            let cgroups = run.cgroups.as_ref().ok_or_else(|| {
                failed("the run has no cgroups: the limits apply at its next start".to_owned())
            })?;
            cgroups.set_limits(limits).map_err(failed)?;
            if limits.cpu_millis.is_some() || limits.memory_bytes.is_some() {
                run.limits = LimitsEnforcement::Enforced {
                    by: "resized in place".to_owned(),
                };
                dir.write_run(&run, operation)?;
            }
        }
        let mut record = dir.read_instance(operation)?;
        limits.set_on(&mut record.spec);
        dir.write_instance(&record, operation)
    }

    /// The status, from disk plus what this object knows of its children.
    /// An adopted run found ended is recorded in `exit.json` on the way.
    fn status(&self, id: &str, operation: Operation) -> Result<InstanceStatus> {
        let dir = self.dir(id);
        let record = dir.read_instance(operation)?;
        let run = dir.read_run(operation)?;
        let mut status = InstanceStatus {
            id: id.to_owned(),
            spec: record.spec.into(),
            state: InstanceState::Created,
            pid: None,
            started_at_ms: None,
            exit: None,
            limits: LimitsEnforcement::NotRequested,
            adopted: false,
        };
        let Some(run) = run else {
            return Ok(status);
        };
        status.pid = Some(run.pid);
        status.started_at_ms = Some(run.started_at_ms);
        status.limits = run.limits.clone();
        status.adopted = !self.is_own_child(id);
        status.exit = match self.own_child_exit(id) {
            Some(exit) => exit,
            None => self.exit_of_adopted(&dir, &run, status.spec.memory_bytes, operation)?,
        };
        status.state = if status.exit.is_some() {
            InstanceState::Exited
        } else {
            InstanceState::Running
        };
        Ok(status)
    }

    fn is_own_child(&self, id: &str) -> bool {
        self.children
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }

    /// `Some(exit)` for a run this object spawned (`None` inside: running).
    fn own_child_exit(&self, id: &str) -> Option<Option<ExitInfo>> {
        let children = self.children.lock().unwrap_or_else(PoisonError::into_inner);
        children.get(id).map(|exits| exits.borrow().clone())
    }

    /// The end of a run another process started, or `None` while it runs.
    fn exit_of_adopted(
        &self,
        dir: &InstanceDir,
        run: &RunRecord,
        memory_limit: Option<u64>,
        operation: Operation,
    ) -> Result<Option<ExitInfo>> {
        if let Some(exit) = dir.read_exit(operation)? {
            return Ok(Some(exit));
        }
        let wait_status = match self.find_run_process(run) {
            Some(stat) if !stat.is_zombie() => return Ok(None),
            // Ended but unreaped (its new parent does not reap): the kernel
            // still holds the wait status.
            Some(stat) => stat.exit_status.map(launch::exit_status_from_raw),
            None => None,
        };
        let exit_watch = launch::ExitWatch {
            dir: dir.clone(),
            cgroups: run.cgroups.clone(),
            oom_kills_before: run.oom_kills_before,
            memory_limit,
        };
        let exit = launch::describe_exit(&exit_watch, wait_status);
        dir.write_exit(&exit, operation)?;
        Ok(Some(exit))
    }

    /// The run's main process if it still exists (perhaps as a zombie) —
    /// the same pid, start time and boot, not a reused pid.
    fn find_run_process(&self, run: &RunRecord) -> Option<procfs::ProcStat> {
        if run.boot_id != self.boot_id {
            return None;
        }
        procfs::stat(run.pid).filter(|stat| stat.start_time == run.start_time)
    }

    fn is_running(&self, id: &str) -> bool {
        self.status(id, Operation::Logs)
            .is_ok_and(|status| status.state == InstanceState::Running)
    }
}

async fn logs_of(inner: &Arc<Inner>, id: &str, options: LogOptions) -> Result<LogStream> {
    let dir = inner.dir(id);
    inner.status(id, Operation::Logs)?;
    let weak = Arc::downgrade(inner);
    let owner = id.to_owned();
    let is_running = move || weak.upgrade().is_some_and(|inner| inner.is_running(&owner));
    logs::stream(id, dir.path, options, is_running).await
}

/// Rotates every instance's log past its limit, until the runtime is gone.
async fn rotate_logs(inner: Weak<Inner>) {
    loop {
        let Some(interval) = inner.upgrade().map(|inner| inner.config.rotate_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || rotate_all(&strong)).await;
    }
}

fn rotate_all(inner: &Inner) {
    let Ok(entries) = std::fs::read_dir(&inner.instances_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(record) = inner.dir(&id).read_instance(Operation::Logs) else {
            continue;
        };
        if let Err(error) = logs::rotate_if_needed(&entry.path(), record.spec.log_limit_bytes) {
            tracing::warn!(instance = id, %error, "rotating output.log failed");
        }
    }
}
