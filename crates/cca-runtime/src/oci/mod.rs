//! The `oci` runtime: each instance is a container run by an OCI runtime
//! binary (`runc`, or `crun` where the host allows it) from an image in
//! the node's [`cca_image::ImageStore`]: an overlay rootfs (image layers
//! below, the instance's upper dir above), a generated `config.json`, and
//! logs and exit code on disk under `DIR/instances/{id}/` (see `records`).
//!
//! No daemon and no shim binary: `start` spawns a small *monitor* shell in
//! its own process group that runs `runc run` in the foreground with the
//! instance's `output.log` as stdout and stderr, and writes runc's exit
//! status to `exit-code` when it returns. The monitor outlives the agent,
//! so a restarted agent adopts the container from `run.json` (monitor pid,
//! start time, boot id) and still learns its exit code. Known limits of
//! this shape, for the shim that replaces it: runc copies the container's
//! stdout and stderr through two pipes (their relative order is lost, and
//! output stops if runc dies).
//!
//! OOM kills: the monitor runs `runc run --keep`, so the container's
//! cgroup outlives its init (runc otherwise removes it on exit, and with it
//! the memory cgroup's `oom_kill` counter), and copies the counter file to
//! `memory-events` before it writes `exit-code`. An OOM-killed run reads as
//! [`ExitReason::OutOfMemory`] whatever its exit code. A limit on an
//! agent-owned parent cgroup would not do on cgroup v1: there the kernel
//! counts the kill in the victim's own memory cgroup only, not in the
//! ancestor whose limit was hit. `start` and `remove` delete the kept
//! container and its cgroups. crun 1.8 has no `--keep` and removes the
//! cgroup when the container ends, so under crun an OOM kill reads as its
//! signal (see [`OciBinary::keeps_cgroup_after_exit`]).
//!
//! Networking: a spec with a `network` attachment joins that namespace
//! (the agent's node network creates and removes it around the container);
//! without one the container shares the host's network namespace.
//!
//! Resolver: a spec with a [`crate::DnsConfig`] gets a `resolv.conf`
//! naming the node's cluster DNS and an `/etc/hosts` naming `localhost`
//! and the container itself, written into its directory at create and
//! bound read-only over the image's (see `crate::resolv`); without one
//! the container sees what its image has.
//!
//! Mounts: each [`crate::Mount`] becomes a recursive bind mount, `ro` when
//! read-only. Sources must exist at create (checked before anything is
//! written): the runtime never creates them, and a volume's directory is
//! owned by whoever made it (the agent), so removing a container leaves it.

mod binary;
mod bundle;
mod records;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cca_image::{ImageRecord, ImageRef, ImageStore};

pub use self::binary::{BinaryError, OciBinary, OciBinaryKind};
use self::bundle::{CgroupPlan, ProcessPlan};
use self::records::{OciDir, OciInstance, OciRun};
use crate::logs::{self, LogOptions, LogStream};
use crate::process::procfs;
use crate::resolv;
use crate::{
    Error, ExecOutput, ExecRequest, ExitInfo, ExitReason, InstanceSpec, InstanceState,
    InstanceStatus, Limits, LimitsEnforcement, Operation, Result, Runtime, Usage,
};

/// The monitor: `$4…` is the OCI runtime's foreground `run` command line
/// (see [`OciBinary::run_argv`]: runc writes the pid file once the
/// container runs), then a copy of the memory cgroup's counter file `$2`
/// into `$3` (empty when there is none), then its exit status into `$1`
/// (atomically, last: `exit-code` present means the copy is complete), so
/// both survive the agent.
const MONITOR_SCRIPT: &str = r#"exit_code="$1"; events_src="$2"; events="$3"; shift 3; "$@"; code=$?; cat "$events_src" > "$events" 2>/dev/null; echo "$code" > "$exit_code.tmp" && mv "$exit_code.tmp" "$exit_code""#;
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long `start` waits for the container to run, `stop` for it to die
/// after SIGKILL.
const STATE_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);
/// How often `start` looks for the pid file: a file check, so often (it
/// bounds start-to-running latency).
const START_POLL: Duration = Duration::from_millis(2);

/// Where and how the `oci` runtime keeps its containers.
#[derive(Clone, Debug)]
pub struct OciConfig {
    /// The runtime directory; keep it across agent restarts (adoption).
    pub dir: PathBuf,
    /// Images are looked up here; `create` does not pull.
    pub images: ImageStore,
    /// The OCI runtime binary; `None`: runc, else crun, from `PATH`.
    pub binary: Option<PathBuf>,
    /// The cgroup mount point, normally `/sys/fs/cgroup`.
    pub cgroup_root: PathBuf,
    /// Containers' cgroups are `/{cgroup_parent}/{id}` in every hierarchy.
    pub cgroup_parent: String,
    /// How often log files are checked against their size limit.
    pub rotate_interval: Duration,
}

impl OciConfig {
    pub fn new(dir: impl Into<PathBuf>, images: ImageStore) -> Self {
        Self {
            dir: dir.into(),
            images,
            binary: None,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "cca-oci".to_owned(),
            rotate_interval: Duration::from_secs(1),
        }
    }
}

/// The `oci` runtime; share it as `Arc<dyn Runtime>`. Dropping it stops
/// log rotation, never the containers.
#[derive(Debug)]
pub struct OciRuntime {
    inner: Arc<Inner>,
    rotator: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Inner {
    config: OciConfig,
    instances_dir: PathBuf,
    binary: OciBinary,
    boot_id: String,
    /// Instances whose monitor this object spawned (the rest are adopted).
    own_runs: Mutex<HashSet<String>>,
    /// Serialises create/start/stop/remove per instance.
    locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl OciRuntime {
    /// Opens the runtime directory and finds the OCI runtime binary;
    /// containers already there are adopted as they are.
    pub async fn new(config: OciConfig) -> Result<Self> {
        // The binary first: a host that cannot run containers gets the
        // reason and nothing created.
        let state_root = config.dir.join("oci-state");
        let binary = OciBinary::detect(config.binary.as_deref(), state_root, &config.cgroup_root)?;
        let instances_dir = config.dir.join("instances");
        std::fs::create_dir_all(&instances_dir).map_err(|source| Error::RuntimeDir {
            path: instances_dir.clone(),
            error: source,
        })?;
        tracing::debug!(binary = %binary.path.display(), "oci runtime binary");
        let inner = Arc::new(Inner {
            instances_dir,
            binary,
            boot_id: procfs::boot_id(),
            own_runs: Mutex::default(),
            locks: Mutex::default(),
            config,
        });
        let rotator = tokio::spawn(rotate_logs(Arc::downgrade(&inner)));
        Ok(Self { inner, rotator })
    }

    /// The OCI runtime binary in use.
    pub fn binary(&self) -> &OciBinary {
        &self.inner.binary
    }

    /// The directory of one instance (logs, bundle, upper dir).
    pub fn instance_dir(&self, id: &str) -> PathBuf {
        self.inner.instances_dir.join(id)
    }

    /// The cgroup directories a container of `id` would have, for checks
    /// that removal left none.
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        self.inner.cgroup_dirs(id)
    }
}

/// The manifest digests of the images the containers under the runtime
/// directory `dir` were created from, running or not: what an image
/// garbage collection must keep. Reads the records only (no OCI runtime
/// binary needed), so `cca image gc` can ask it of a node's directory.
pub fn images_in_use(dir: &Path) -> Result<HashSet<cca_image::Digest>> {
    let instances = dir.join("instances");
    let entries = match std::fs::read_dir(&instances) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(source) => {
            return Err(Error::RuntimeDir {
                path: instances,
                error: source,
            });
        }
    };
    let mut digests = HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::RuntimeDir {
            path: instances.clone(),
            error: source,
        })?;
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let instance = match OciDir::new(&instances, &id).read_instance(Operation::List) {
            Ok(instance) => instance,
            Err(Error::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        };
        let digest = instance
            .image_digest
            .parse()
            .map_err(|e: cca_image::Error| Error::Failed {
                id: id.clone(),
                operation: Operation::List,
                message: format!("the recorded image digest: {e}"),
            })?;
        digests.insert(digest);
    }
    Ok(digests)
}

impl Drop for OciRuntime {
    fn drop(&mut self) {
        self.rotator.abort();
    }
}

#[async_trait]
impl Runtime for OciRuntime {
    fn kind(&self) -> &'static str {
        "oci"
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
        self.inner.stop(id, grace).await
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
        self.inner.exec(id, request).await
    }

    async fn usage(&self, id: &str) -> Result<Usage> {
        self.inner.usage(id)
    }

    async fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let _guard = self.inner.lock(id).await;
        self.inner.resize(id, limits).await
    }
}

impl Inner {
    fn dir(&self, id: &str) -> OciDir {
        OciDir::new(&self.instances_dir, id)
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
        let dir = self.dir(&spec.id);
        if dir.path.exists() {
            return Err(Error::AlreadyExists { id: spec.id });
        }
        check_mount_sources(&spec)?;
        let image = self.resolve_image(&spec)?;
        let process = process_plan(&spec, &image)?;
        hand_over_mounts(&spec, process.uid, process.gid)?;
        let instance = OciInstance {
            layers: self.config.images.layer_dirs(&image),
            image_digest: image.digest.to_string(),
            process,
            spec,
            created_at_ms: cca_model::clock::now_millis(),
        };
        let written = self.write_bundle(&dir, &instance);
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&dir.path);
        }
        written.map(|()| dir.id)
    }

    fn resolve_image(&self, spec: &InstanceSpec) -> Result<ImageRecord> {
        let failed = |message: String| Error::Failed {
            id: spec.id.clone(),
            operation: Operation::Create,
            message,
        };
        let Some(text) = &spec.image else {
            return Err(Error::InvalidSpec {
                id: spec.id.clone(),
                reason: "the oci runtime needs an image".into(),
            });
        };
        let reference: ImageRef = text
            .parse()
            .map_err(|e: cca_image::Error| failed(e.to_string()))?;
        self.config
            .images
            .image(&reference)
            .map_err(|e| failed(e.to_string()))
    }

    /// The instance directory, `instance.json` and the bundle's
    /// `config.json`; the rootfs is mounted by `start`.
    fn write_bundle(&self, dir: &OciDir, instance: &OciInstance) -> Result<()> {
        let id = &instance.spec.id;
        for path in [dir.rootfs(), dir.upper(), dir.work()] {
            std::fs::create_dir_all(&path)
                .map_err(|e| dir.io_error(Operation::Create, "creating", &path, e))?;
        }
        let netns = instance
            .spec
            .network
            .as_ref()
            .map(|network| network.netns_path.as_path());
        // The resolver files first: a service's own mount at the same
        // target comes later and wins.
        let mut mounts = resolver_mounts(dir, &instance.spec)?;
        mounts.extend(instance.spec.mounts.iter().cloned());
        let spec = bundle::runtime_spec(
            id,
            &instance.process,
            &self.cgroup_plan(&instance.spec),
            netns,
            &mounts,
        )
        .map_err(|reason| Error::InvalidSpec {
            id: id.clone(),
            reason,
        })?;
        let config = dir.bundle().join("config.json");
        spec.save(&config).map_err(|e| Error::Failed {
            id: id.clone(),
            operation: Operation::Create,
            message: format!("writing {}: {e}", config.display()),
        })?;
        dir.write_instance(instance, Operation::Create)
    }

    /// Whether the host accounts memory+swap (v1 `memsw`): then a memory
    /// limit bounds swap too.
    fn limits_swap(&self) -> bool {
        self.config
            .cgroup_root
            .join("memory/memory.memsw.limit_in_bytes")
            .exists()
    }

    fn cgroup_plan(&self, spec: &InstanceSpec) -> CgroupPlan {
        CgroupPlan {
            path: PathBuf::from(format!("/{}/{}", self.config.cgroup_parent, spec.id)),
            memory_bytes: spec.memory_bytes,
            limit_swap: self.limits_swap(),
            cpu_millis: spec.cpu_millis,
        }
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
        let instance = dir.read_instance(Operation::Start)?;
        self.ensure_rootfs(&dir, &instance)?;
        // The container of the last run is kept (`run --keep`) or may
        // linger (killed with its monitor): delete it and its cgroups, so
        // this run's OOM counter starts from zero.
        // No state directory: runc knows no such container, and a `delete`
        // would only cost a process spawn on every start.
        if self.binary.state_root.join(id).exists() {
            self.binary.delete(id).await;
        }
        self.remove_cgroups(&dir, Operation::Start)?;
        dir.clear_exit(Operation::Start)?;
        let log_offset = std::fs::metadata(dir.path.join(logs::LOG_FILE)).map_or(0, |m| m.len());
        let child = self.spawn_monitor(&dir)?;
        let monitor_pid = child.id().unwrap_or_default();
        let mut run = OciRun {
            monitor_pid,
            container_pid: None,
            monitor_start_time: procfs::stat(monitor_pid).map_or(0, |stat| stat.start_time),
            boot_id: self.boot_id.clone(),
            started_at_ms: cca_model::clock::now_millis(),
            limits: self.limits(&instance.spec),
        };
        dir.write_run(&run, Operation::Start)?;
        self.own_runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned());
        tokio::spawn(async move {
            let mut child = child;
            let _ = child.wait().await;
        });
        run.container_pid = self.wait_until_running(&dir, log_offset).await?;
        dir.write_run(&run, Operation::Start)?;
        tracing::info!(instance = id, monitor_pid, "container started");
        Ok(())
    }

    fn ensure_rootfs(&self, dir: &OciDir, instance: &OciInstance) -> Result<()> {
        let rootfs = dir.rootfs();
        if bundle::is_mounted(&rootfs) {
            return Ok(());
        }
        if let Some(missing) = instance.layers.iter().find(|layer| !layer.is_dir()) {
            return Err(Error::Failed {
                id: dir.id.clone(),
                operation: Operation::Start,
                message: format!(
                    "image layer {} is gone (garbage-collected?)",
                    missing.display()
                ),
            });
        }
        bundle::mount_rootfs(&instance.layers, &dir.upper(), &dir.work(), &rootfs).map_err(|e| {
            dir.io_error(
                Operation::Start,
                "mounting the overlay rootfs at",
                &rootfs,
                e,
            )
        })
    }

    fn spawn_monitor(&self, dir: &OciDir) -> Result<tokio::process::Child> {
        let log_path = dir.path.join(logs::LOG_FILE);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| dir.io_error(Operation::Start, "opening", &log_path, e))?;
        let log_for_stderr = log
            .try_clone()
            .map_err(|e| dir.io_error(Operation::Start, "opening", &log_path, e))?;
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(MONITOR_SCRIPT)
            .arg("cca-oci-monitor")
            .arg(dir.exit_code_path())
            .arg(self.oom_counter_file(&dir.id))
            .arg(dir.memory_events_path())
            .args(
                self.binary
                    .run_argv(&dir.bundle(), &dir.id, &dir.pid_file_path()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_for_stderr)
            // Its own group: a signal to the agent's group must not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io(&dir.id, Operation::Start, "spawning the monitor shell", e))
    }

    /// Waits until the OCI runtime reports the container running (writes
    /// its pid file: a file check per poll, where `runc state` would spawn
    /// a process each time). When the
    /// monitor ends first, the log written since `log_offset` tells a
    /// container that ran and ended at once (started) from one the OCI
    /// runtime could not create (failed, with its message).
    async fn wait_until_running(&self, dir: &OciDir, log_offset: u64) -> Result<Option<u32>> {
        let deadline = Instant::now() + STATE_CHANGE_TIMEOUT;
        loop {
            if let Some(pid) = dir.read_container_pid() {
                return Ok(Some(pid));
            }
            let failed = |message: String| Error::Failed {
                id: dir.id.clone(),
                operation: Operation::Start,
                message,
            };
            if dir.read_exit_code().is_some() {
                return match runtime_error(&dir.path, log_offset) {
                    Some(message) => {
                        Err(failed(format!("{}: {message}", self.binary.path.display())))
                    }
                    None => Ok(None),
                };
            }
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "not running after {STATE_CHANGE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(START_POLL).await;
        }
    }

    fn limits(&self, spec: &InstanceSpec) -> LimitsEnforcement {
        if spec.memory_bytes.is_none() && spec.cpu_millis.is_none() {
            return LimitsEnforcement::NotRequested;
        }
        let version = if self.config.cgroup_root.join("memory").is_dir() {
            "v1"
        } else {
            "v2"
        };
        let name = self
            .binary
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("oci runtime");
        LimitsEnforcement::Enforced {
            by: format!("{name} (cgroup {version})"),
        }
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<InstanceStatus> {
        let status = self.status(id, Operation::Stop)?;
        if status.state != InstanceState::Running {
            return Ok(status);
        }
        let dir = self.dir(id);
        dir.mark_stop_requested(Operation::Stop)?;
        if !grace.is_zero() {
            self.binary.kill(id, "TERM").await;
            if let Some(status) = self.wait_for_exit(id, grace).await? {
                return Ok(status);
            }
        }
        self.binary.kill(id, "KILL").await;
        match self.wait_for_exit(id, STATE_CHANGE_TIMEOUT).await? {
            Some(status) => Ok(status),
            None => Err(Error::Failed {
                id: id.to_owned(),
                operation: Operation::Stop,
                message: format!("still running {STATE_CHANGE_TIMEOUT:?} after SIGKILL"),
            }),
        }
    }

    async fn wait_for_exit(&self, id: &str, within: Duration) -> Result<Option<InstanceStatus>> {
        let deadline = Instant::now() + within;
        loop {
            let status = self.status(id, Operation::Stop)?;
            if status.state != InstanceState::Running {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
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
        self.binary.delete(id).await;
        let rootfs = dir.rootfs();
        if bundle::is_mounted(&rootfs) {
            bundle::unmount_rootfs(&rootfs)
                .map_err(|e| dir.io_error(Operation::Remove, "unmounting", &rootfs, e))?;
        }
        self.remove_cgroups(&dir, Operation::Remove)?;
        std::fs::remove_dir_all(&dir.path)
            .map_err(|e| dir.io_error(Operation::Remove, "removing", &dir.path, e))?;
        self.own_runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        Ok(())
    }

    /// Removes the container's cgroup directories `runc delete` left (the
    /// shared parents stay).
    fn remove_cgroups(&self, dir: &OciDir, operation: Operation) -> Result<()> {
        for cgroup in self.cgroup_dirs(&dir.id) {
            match std::fs::remove_dir(&cgroup) {
                Ok(()) => {}
                // Not created, or already removed through a symlinked
                // hierarchy (`cpu` -> `cpu,cpuacct`).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(dir.io_error(operation, "removing", &cgroup, e)),
            }
        }
        Ok(())
    }

    /// The file holding the container's `oom_kill` counter: v1
    /// `memory.oom_control` in the memory hierarchy, else v2
    /// `memory.events`.
    fn oom_counter_file(&self, id: &str) -> PathBuf {
        let root = &self.config.cgroup_root;
        let memory = root.join("memory");
        if memory.is_dir() {
            memory
                .join(&self.config.cgroup_parent)
                .join(id)
                .join("memory.oom_control")
        } else {
            root.join(&self.config.cgroup_parent)
                .join(id)
                .join("memory.events")
        }
    }

    /// New limits in the container's bundle (the next start's cgroups get
    /// them) and, while it runs, in its cgroups (`runc update`).
    async fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let operation = Operation::Resize;
        if self.status(id, operation)?.state == InstanceState::Running {
            self.update_running(id, limits).await?;
        }
        let dir = self.dir(id);
        let mut instance = dir.read_instance(operation)?;
        limits.set_on(&mut instance.spec);
        self.write_bundle(&dir, &instance)
    }

    async fn update_running(&self, id: &str, limits: Limits) -> Result<()> {
        let operation = Operation::Resize;
        let mut command = self.binary.command("update");
        // -1: no limit, to runc and crun alike.
        let memory = limits
            .memory_bytes
            .map_or_else(|| "-1".to_owned(), |bytes| bytes.to_string());
        command.arg("--memory").arg(&memory);
        if self.limits_swap() {
            command.arg("--memory-swap").arg(&memory);
        }
        // As the bundle writes it: a tenth of a millicore per period's µs.
        let quota = limits.cpu_millis.map_or(-1, |millis| {
            i64::try_from(millis.saturating_mul(100).max(1_000)).unwrap_or(i64::MAX)
        });
        command.arg("--cpu-period").arg("100000");
        command.arg("--cpu-quota").arg(quota.to_string());
        let binary = self.binary.path.display().to_string();
        let output = command
            .arg(id)
            .output()
            .await
            .map_err(|error| Error::Failed {
                id: id.to_owned(),
                operation,
                message: format!("running {binary} update: {error}"),
            })?;
        if !output.status.success() {
            return Err(Error::Failed {
                id: id.to_owned(),
                operation,
                message: format!(
                    "{binary} update refused: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// What a running container uses, from the cgroups runc made for it:
    /// v1's `cpuacct` and `memory` hierarchies, else the v2 directory.
    fn usage(&self, id: &str) -> Result<Usage> {
        let status = self.status(id, Operation::Usage)?;
        status.require_running(Operation::Usage)?;
        let root = &self.config.cgroup_root;
        let parent = &self.config.cgroup_parent;
        let read = if root.join("memory").is_dir() {
            crate::usage::from_cgroups(
                &root.join("cpuacct").join(parent).join(id),
                &root.join("memory").join(parent).join(id),
            )
        } else {
            let dir = root.join(parent).join(id);
            crate::usage::from_cgroups(&dir, &dir)
        };
        read.map_err(|message| Error::Failed {
            id: id.to_owned(),
            operation: Operation::Usage,
            message,
        })
    }

    /// `{cgroup_root}/{hierarchy}/{parent}/{id}` for every hierarchy.
    fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.config.cgroup_root) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path().join(&self.config.cgroup_parent).join(id))
            .collect();
        dirs.push(
            self.config
                .cgroup_root
                .join(&self.config.cgroup_parent)
                .join(id),
        );
        dirs.sort();
        dirs
    }

    fn list(&self) -> Result<Vec<InstanceStatus>> {
        crate::records::list_instances(&self.instances_dir, |id| self.status(id, Operation::List))
    }

    /// The status from disk: `exit-code` written means exited; else a live
    /// monitor means running; else it ended unrecorded (reboot, killed
    /// monitor).
    fn status(&self, id: &str, operation: Operation) -> Result<InstanceStatus> {
        let dir = self.dir(id);
        let instance = dir.read_instance(operation)?;
        let mut status = InstanceStatus {
            id: id.to_owned(),
            spec: instance.spec.into(),
            state: InstanceState::Created,
            pid: None,
            started_at_ms: None,
            exit: None,
            limits: LimitsEnforcement::NotRequested,
            adopted: false,
        };
        let Some(run) = dir.read_run(operation)? else {
            return Ok(status);
        };
        status.started_at_ms = Some(run.started_at_ms);
        status.limits = run.limits.clone();
        status.adopted = !self
            .own_runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(id);
        status.pid = Some(run.container_pid.unwrap_or(run.monitor_pid));
        let end = |recorded| RunEnd {
            recorded,
            stop_requested: dir.stop_requested(),
            oom_kills: dir.read_oom_kills(),
            limit_bytes: status.spec.memory_bytes,
        };
        let exit = match dir.read_exit_code() {
            Some(recorded) => Some(exit_info(end(Some(recorded)))),
            None if self.monitor_alive(&run) => None,
            // The monitor may have written the code just now.
            None => Some(exit_info(end(dir.read_exit_code()))),
        };
        status.state = if exit.is_some() {
            InstanceState::Exited
        } else {
            InstanceState::Running
        };
        status.exit = exit;
        Ok(status)
    }

    fn monitor_alive(&self, run: &OciRun) -> bool {
        run.boot_id == self.boot_id
            && procfs::stat(run.monitor_pid)
                .is_some_and(|stat| stat.start_time == run.monitor_start_time && !stat.is_zombie())
    }

    fn is_running(&self, id: &str) -> bool {
        self.status(id, Operation::Logs)
            .is_ok_and(|status| status.state == InstanceState::Running)
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecOutput> {
        let status = self.status(id, Operation::Exec)?;
        status.require_running(Operation::Exec)?;
        let output = self
            .binary
            .command("exec")
            .arg(id)
            .args(&request.argv)
            .output();
        match tokio::time::timeout(request.timeout, output).await {
            Ok(Ok(output)) => Ok(ExecOutput {
                code: output.status.code(),
                signal: std::os::unix::process::ExitStatusExt::signal(&output.status),
                stdout: output.stdout,
                stderr: output.stderr,
                timed_out: false,
            }),
            Ok(Err(error)) => Err(Error::io(
                id,
                Operation::Exec,
                "spawning the OCI runtime's exec",
                error,
            )),
            // Dropping the future killed the runtime's exec process.
            Err(_) => Ok(ExecOutput {
                timed_out: true,
                ..ExecOutput::default()
            }),
        }
    }
}

/// With a [`crate::DnsConfig`]: writes the container's `resolv.conf` and
/// `hosts` into its directory and returns their read-only binds over
/// `/etc/resolv.conf` and `/etc/hosts`, whatever the image has there (the
/// OCI runtime creates the targets, and `/etc`, when the image lacks
/// them). Without one, none: the image's files stay.
fn resolver_mounts(dir: &OciDir, spec: &InstanceSpec) -> Result<Vec<crate::Mount>> {
    let Some(dns) = &spec.dns else {
        return Ok(Vec::new());
    };
    let address = spec.network.as_ref().map(|network| network.address);
    let files = [
        (
            resolv::RESOLV_CONF_FILE,
            resolv::resolv_conf(dns),
            resolv::ETC_RESOLV_CONF,
        ),
        (
            resolv::HOSTS_FILE,
            resolv::hosts(&spec.id, address),
            resolv::ETC_HOSTS,
        ),
    ];
    let mut mounts = Vec::new();
    for (name, content, target) in files {
        let source = dir.path.join(name);
        resolv::write(&source, &content)
            .map_err(|e| dir.io_error(Operation::Create, "writing", &source, e))?;
        mounts.push(crate::Mount {
            source,
            target: target.to_owned(),
            read_only: true,
            owned_by_workload: false,
        });
    }
    Ok(mounts)
}

/// The process of an instance: `sh -c COMMAND` when the spec gives a
/// command, else the image's entrypoint and cmd; the image's environment
/// under the instance's; the spec's or the image's working directory.
/// Refuses mounts whose source is missing, naming the instance and the
/// mount: runc would fail at start with a bare ENOENT, after the bundle
/// exists.
fn check_mount_sources(spec: &InstanceSpec) -> Result<()> {
    for mount in &spec.mounts {
        if !mount.source.exists() {
            return Err(Error::InvalidSpec {
                id: spec.id.clone(),
                reason: format!(
                    "mount source {} (for {}) does not exist",
                    mount.source.display(),
                    mount.target
                ),
            });
        }
    }
    Ok(())
}

/// Chowns the sources of the mounts marked `owned_by_workload`, and
/// everything in them, to the user the container runs as, so a workload
/// that is not root can read files kept private on the host (secrets:
/// dirs 0700, files 0400). Symlinks are changed themselves, never
/// followed. No user namespace: the container's uid is the host's.
fn hand_over_mounts(spec: &InstanceSpec, uid: u32, gid: u32) -> Result<()> {
    for mount in spec.mounts.iter().filter(|mount| mount.owned_by_workload) {
        chown_tree(&mount.source, uid, gid).map_err(|(path, source)| Error::Io {
            id: spec.id.clone(),
            operation: Operation::Create,
            what: format!(
                "handing {} (mounted at {}) to the workload's user {uid}:{gid} \
                 (the agent runs as root to do this)",
                path.display(),
                mount.target
            ),
            error: source,
        })?;
    }
    Ok(())
}

fn chown_tree(
    path: &Path,
    uid: u32,
    gid: u32,
) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    let failed = |path: &Path| {
        let path = path.to_owned();
        move |error| (path, error)
    };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(failed(path))?;
    if std::fs::symlink_metadata(path)
        .map_err(failed(path))?
        .is_dir()
    {
        for entry in std::fs::read_dir(path).map_err(failed(path))? {
            chown_tree(&entry.map_err(failed(path))?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn process_plan(spec: &InstanceSpec, image: &ImageRecord) -> Result<ProcessPlan> {
    let invalid = |reason: String| Error::InvalidSpec {
        id: spec.id.clone(),
        reason,
    };
    let args = if spec.command.trim().is_empty() {
        image.config.default_args()
    } else {
        vec!["/bin/sh".to_owned(), "-c".to_owned(), spec.command.clone()]
    };
    if args.is_empty() {
        return Err(invalid(
            "the image has no entrypoint or cmd and the service gives no command".into(),
        ));
    }
    let (uid, gid) = parse_user(image.config.user.as_deref()).map_err(invalid)?;
    let cwd = match &spec.working_dir {
        Some(dir) => dir.display().to_string(),
        None => image
            .config
            .working_dir
            .clone()
            .unwrap_or_else(|| "/".to_owned()),
    };
    Ok(ProcessPlan {
        args,
        env: merged_env(&image.config.env, spec),
        cwd,
        uid,
        gid,
    })
}

fn merged_env(image_env: &[String], spec: &InstanceSpec) -> Vec<String> {
    let mut env: Vec<String> = image_env.to_vec();
    if !env.iter().any(|line| line.starts_with("PATH=")) {
        env.insert(0, DEFAULT_PATH.to_owned());
    }
    for (name, value) in spec.full_env() {
        let prefix = format!("{name}=");
        env.retain(|line| !line.starts_with(&prefix));
        env.push(format!("{name}={value}"));
    }
    env
}

/// `uid` or `uid:gid`, numeric; names would need the image's
/// `/etc/passwd` and are refused for now.
fn parse_user(user: Option<&str>) -> Result<(u32, u32), String> {
    let Some(user) = user else {
        return Ok((0, 0));
    };
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let number = |text: &str| {
        text.parse::<u32>()
            .map_err(|_| format!("image user {user:?}: only numeric uid[:gid] is supported"))
    };
    let uid = if uid == "root" { 0 } else { number(uid)? };
    let gid = if gid == "root" {
        0
    } else if gid == user {
        uid
    } else {
        number(gid)?
    };
    Ok((uid, gid))
}

/// The OCI runtime's own error lines in the log after `offset` (runc logs
/// `level=error msg=...`, crun `crun: ...`), `None` when there are none.
fn runtime_error(dir: &Path, offset: u64) -> Option<String> {
    let bytes = std::fs::read(dir.join(logs::LOG_FILE)).ok()?;
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    let errors: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("level=error") || line.starts_with("crun:"))
        .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// What the monitor and `stop` recorded about the end of a run.
struct RunEnd {
    /// The exit code and when it was written, `None`: never recorded.
    recorded: Option<(i32, i64)>,
    stop_requested: bool,
    /// The memory cgroup's `oom_kill` counter at exit (the cgroup is new
    /// each run), `None` when the monitor could not read it.
    oom_kills: Option<u64>,
    limit_bytes: Option<u64>,
}

/// How a run ended from the monitor's record: runc exits 128 + N when
/// the container's init was killed by signal N; an OOM kill counted
/// during the run wins (even one of a child process the shell reported as
/// an exit code), then a requested stop.
fn exit_info(end: RunEnd) -> ExitInfo {
    let Some((code, finished_at_ms)) = end.recorded else {
        return ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::AgentAway,
            finished_at_ms: cca_model::clock::now_millis(),
        };
    };
    let (code, signal) = if (129..=128 + 64).contains(&code) {
        (None, Some(code - 128))
    } else {
        (Some(code), None)
    };
    ExitInfo {
        code,
        signal,
        reason: if end.oom_kills.is_some_and(|kills| kills > 0) {
            ExitReason::OutOfMemory {
                limit_bytes: end.limit_bytes,
            }
        } else if end.stop_requested {
            ExitReason::Stopped
        } else {
            ExitReason::Exited
        },
        finished_at_ms,
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

/// Rotates every container's log past its limit (copy, then truncate: the
/// container keeps its `O_APPEND` descriptor), until the runtime is gone.
async fn rotate_logs(inner: std::sync::Weak<Inner>) {
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
        let Ok(instance) = inner.dir(&id).read_instance(Operation::Logs) else {
            continue;
        };
        if let Err(error) = logs::rotate_if_needed(&entry.path(), instance.spec.log_limit_bytes) {
            tracing::warn!(instance = id, %error, "rotating output.log failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_numeric_and_default_to_root() {
        assert_eq!(parse_user(None), Ok((0, 0)));
        assert_eq!(parse_user(Some("1000")), Ok((1000, 1000)));
        assert_eq!(parse_user(Some("1000:100")), Ok((1000, 100)));
        assert_eq!(parse_user(Some("root")), Ok((0, 0)));
        let error = parse_user(Some("www-data")).expect_err("names are refused");
        assert!(error.contains("only numeric"), "{error}");
    }

    fn end(recorded: Option<(i32, i64)>, stop_requested: bool, oom_kills: u64) -> RunEnd {
        RunEnd {
            recorded,
            stop_requested,
            oom_kills: Some(oom_kills),
            limit_bytes: Some(32 << 20),
        }
    }

    #[test]
    fn signals_read_from_runc_exit_codes_and_stops_are_stopped() {
        let killed = exit_info(end(Some((137, 5)), true, 0));
        assert_eq!(
            (killed.code, killed.signal, killed.reason),
            (None, Some(9), ExitReason::Stopped)
        );
        let exited = exit_info(end(Some((3, 5)), false, 0));
        assert_eq!((exited.code, exited.reason), (Some(3), ExitReason::Exited));
        assert_eq!(exit_info(end(None, false, 0)).reason, ExitReason::AgentAway);
    }

    #[test]
    fn an_oom_kill_in_the_run_wins_over_the_code_and_a_stop() {
        let oom = ExitReason::OutOfMemory {
            limit_bytes: Some(32 << 20),
        };
        let killed = exit_info(end(Some((137, 5)), false, 1));
        assert_eq!(
            (killed.signal, killed.reason.clone()),
            (Some(9), oom.clone())
        );
        // A child was killed; the shell went on and exited 0.
        assert_eq!(exit_info(end(Some((0, 5)), true, 2)).reason, oom);
        let unread = RunEnd {
            oom_kills: None,
            ..end(Some((137, 5)), false, 0)
        };
        assert_eq!(exit_info(unread).reason, ExitReason::Exited);
    }

    #[test]
    fn the_instance_environment_overrides_the_image_and_path_defaults() {
        let mut spec = InstanceSpec::new("a", "svc", "true");
        spec.env.insert("MODE".into(), "prod".into());
        let env = merged_env(&["MODE=dev".into(), "KEEP=1".into()], &spec);
        assert_eq!(env[0], DEFAULT_PATH);
        assert!(env.contains(&"KEEP=1".to_owned()) && env.contains(&"MODE=prod".to_owned()));
        assert!(!env.contains(&"MODE=dev".to_owned()));
        assert!(env.contains(&"CCA_INSTANCE=a".to_owned()));
    }
}
