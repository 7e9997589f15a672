//! An instance's OCI bundle: the rootfs as an overlay mount (image layers
//! below, the instance's own upper and work dirs above) and `config.json`
//! generated with `oci-spec` — mount, pid, ipc and uts namespaces, the
//! network namespace the node network made for the instance (or the host's
//! when the node has no pod subnet), cgroup cpu/memory limits,
//! environment, user, working directory, and the instance's bind mounts.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxResourcesBuilder, MountBuilder, Process, RootBuilder, Spec, UserBuilder,
};
use rustix::mount::{MountFlags, UnmountFlags};

/// CFS period for cpu limits: 100 ms, quota = millicores × 100.
const CPU_PERIOD_US: u64 = 100_000;

/// What the container process is, resolved from the spec and the image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ProcessPlan {
    pub(crate) args: Vec<String>,
    /// `NAME=value`, image variables first, the instance's on top.
    pub(crate) env: Vec<String>,
    pub(crate) cwd: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// The limits and placement of the container's cgroups.
#[derive(Clone, Debug)]
pub(crate) struct CgroupPlan {
    /// Absolute (`/cca-oci/{id}`): runc would nest a relative path under
    /// the agent's own cgroup, crun would not.
    pub(crate) path: PathBuf,
    pub(crate) memory_bytes: Option<u64>,
    /// Whether to set memory+swap too (v1 with swap accounting only; runc
    /// fails when asked without it).
    pub(crate) limit_swap: bool,
    pub(crate) cpu_millis: Option<u64>,
}

/// Builds `config.json` for one instance; `netns` is the network namespace
/// to join, `None` for the host's; `mounts` are bound after the defaults
/// (`/proc`, `/dev`, …) so that none of them hides one.
pub(crate) fn runtime_spec(
    hostname: &str,
    process: &ProcessPlan,
    cgroups: &CgroupPlan,
    netns: Option<&Path>,
    mounts: &[crate::Mount],
) -> Result<Spec, String> {
    let mut spec = Spec::default();
    spec.set_hostname(Some(hostname.to_owned()));
    spec.set_root(Some(
        RootBuilder::default()
            .path("rootfs")
            .readonly(false)
            .build()
            .map_err(|e| e.to_string())?,
    ));
    spec.set_process(Some(container_process(process)?));
    let mut all_mounts = spec.mounts().clone().unwrap_or_default();
    for mount in mounts {
        all_mounts.push(bind_mount(mount)?);
    }
    spec.set_mounts(Some(all_mounts));
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut namespaces: Vec<_> = linux
        .namespaces()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|ns| {
            ns.typ() != LinuxNamespaceType::Network && ns.typ() != LinuxNamespaceType::Cgroup
        })
        .collect();
    if let Some(path) = netns {
        // Joined, not created: the node network set the namespace up
        // (veth, address, route) before the container exists, and removes
        // it after the container is gone.
        namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .path(path)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    linux.set_namespaces(Some(namespaces));
    linux.set_cgroups_path(Some(cgroups.path.clone()));
    linux.set_resources(Some(resources(cgroups)?));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// A recursive bind (submounts of a volume stay visible), `ro` applied by
/// the runtime's remount so the workload cannot write through it.
fn bind_mount(mount: &crate::Mount) -> Result<oci_spec::runtime::Mount, String> {
    if let Some(problem) = mount.target_problem() {
        return Err(problem);
    }
    let access = if mount.read_only { "ro" } else { "rw" };
    MountBuilder::default()
        .destination(&mount.target)
        .typ("bind")
        .source(&mount.source)
        .options(vec!["rbind".to_owned(), access.to_owned()])
        .build()
        .map_err(|e| e.to_string())
}

fn container_process(plan: &ProcessPlan) -> Result<Process, String> {
    let mut process = Process::default();
    process.set_args(Some(plan.args.clone()));
    process.set_env(Some(plan.env.clone()));
    process.set_cwd(PathBuf::from(&plan.cwd));
    let user = UserBuilder::default()
        .uid(plan.uid)
        .gid(plan.gid)
        .build()
        .map_err(|e| e.to_string())?;
    process.set_user(user);
    Ok(process)
}

fn resources(cgroups: &CgroupPlan) -> Result<oci_spec::runtime::LinuxResources, String> {
    let mut builder = LinuxResourcesBuilder::default().devices(Vec::new());
    if let Some(bytes) = cgroups.memory_bytes {
        let limit =
            i64::try_from(bytes).map_err(|_| format!("memory limit {bytes} is too large"))?;
        let mut memory = LinuxMemoryBuilder::default().limit(limit);
        if cgroups.limit_swap {
            memory = memory.swap(limit);
        }
        builder = builder.memory(memory.build().map_err(|e| e.to_string())?);
    }
    if let Some(millis) = cgroups.cpu_millis {
        let quota = i64::try_from((millis * 100).max(1000))
            .map_err(|_| format!("cpu limit {millis} is too large"))?;
        let cpu = LinuxCpuBuilder::default()
            .quota(quota)
            .period(CPU_PERIOD_US);
        builder = builder.cpu(cpu.build().map_err(|e| e.to_string())?);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Mounts the overlay rootfs at `target`: `layers` base first (overlayfs
/// wants the topmost lowerdir first), `upper` and `work` the instance's.
pub(crate) fn mount_rootfs(
    layers: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> std::io::Result<()> {
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|dir| dir.display().to_string())
        .collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    let options = CString::new(options).map_err(std::io::Error::other)?;
    rustix::mount::mount(
        "overlay",
        target,
        "overlay",
        MountFlags::empty(),
        Some(options.as_c_str()),
    )?;
    Ok(())
}

/// Unmounts `target`, lazily when something still holds it.
pub(crate) fn unmount_rootfs(target: &Path) -> std::io::Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => Ok(rustix::mount::unmount(target, UnmountFlags::DETACH)?),
        Err(error) => Err(error.into()),
    }
}

/// Whether something is mounted at `target` (per `/proc/self/mountinfo`,
/// which lists absolute paths with symlinks resolved: `target` is resolved
/// the same way first, since a relative data dir such as `cca dev`'s
/// default `.cca-dev` gives relative bundle paths).
pub(crate) fn is_mounted(target: &Path) -> bool {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let Ok(target) = std::fs::canonicalize(target) else {
        return false;
    };
    let target = target.display().to_string();
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(target.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ProcessPlan {
        ProcessPlan {
            args: vec!["/bin/sh".into(), "-c".into(), "true".into()],
            env: vec!["PATH=/bin".into()],
            cwd: "/www".into(),
            uid: 1000,
            gid: 100,
        }
    }

    #[test]
    fn the_spec_has_the_process_limits_and_no_network_namespace() {
        let cgroups = CgroupPlan {
            path: "/cca-oci/web-1".into(),
            memory_bytes: Some(64 << 20),
            limit_swap: false,
            cpu_millis: Some(500),
        };
        let spec = runtime_spec("web-1", &plan(), &cgroups, None, &[]).expect("spec builds");
        let json = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(json["process"]["args"][2], "true");
        assert_eq!(json["process"]["cwd"], "/www");
        assert_eq!(json["process"]["user"]["uid"], 1000);
        assert_eq!(json["root"]["path"], "rootfs");
        assert_eq!(json["linux"]["cgroupsPath"], "/cca-oci/web-1");
        assert_eq!(json["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert!(json["linux"]["resources"]["memory"].get("swap").is_none());
        assert_eq!(json["linux"]["resources"]["cpu"]["quota"], 50_000);
        let namespaces: Vec<&str> = json["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .filter_map(|ns| ns["type"].as_str())
            .collect();
        assert_eq!(namespaces, ["pid", "ipc", "uts", "mount"]);
    }

    #[test]
    fn a_mount_point_is_found_by_any_path_that_resolves_to_it() {
        assert!(is_mounted(Path::new("/proc")));
        assert!(is_mounted(Path::new("/proc/self/../../proc")));
        let cwd = std::env::current_dir().expect("cwd");
        let up = cwd
            .components()
            .skip(1)
            .map(|_| "..")
            .collect::<Vec<_>>()
            .join("/");
        assert!(
            is_mounted(&Path::new(&up).join("proc")),
            "relative to {}",
            cwd.display()
        );
        assert!(!is_mounted(Path::new("/proc/self")));
        assert!(!is_mounted(Path::new("/no/such/dir")));
    }

    #[test]
    fn an_attached_instance_joins_its_network_namespace() {
        let cgroups = CgroupPlan {
            path: "/cca-oci/web-1".into(),
            memory_bytes: None,
            limit_swap: false,
            cpu_millis: None,
        };
        let netns = Path::new("/run/netns/cca-web-1");
        let spec = runtime_spec("web-1", &plan(), &cgroups, Some(netns), &[]).expect("spec builds");
        let json = serde_json::to_value(&spec).expect("serialises");
        let network: Vec<&serde_json::Value> = json["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .filter(|ns| ns["type"] == "network")
            .collect();
        assert_eq!(network.len(), 1);
        assert_eq!(network[0]["path"], "/run/netns/cca-web-1");
    }

    #[test]
    fn mounts_are_binds_after_the_defaults_read_only_when_asked() {
        let cgroups = CgroupPlan {
            path: "/cca-oci/db-0".into(),
            memory_bytes: None,
            limit_swap: false,
            cpu_millis: None,
        };
        let mounts = [
            crate::Mount {
                source: "/var/lib/cca/volumes/db/data-0".into(),
                target: "/data".into(),
                read_only: false,
                owned_by_workload: false,
            },
            crate::Mount {
                source: "/var/lib/cca/secrets/db-0/password".into(),
                target: "/run/secrets/password".into(),
                read_only: true,
                owned_by_workload: false,
            },
        ];
        let spec = runtime_spec("db-0", &plan(), &cgroups, None, &mounts).expect("spec builds");
        let json = serde_json::to_value(&spec).expect("serialises");
        let all = json["mounts"].as_array().expect("mounts");
        assert_eq!(all[0]["destination"], "/proc", "defaults first");
        let binds = &all[all.len() - 2..];
        assert_eq!(binds[0]["destination"], "/data");
        assert_eq!(binds[0]["source"], "/var/lib/cca/volumes/db/data-0");
        assert_eq!(binds[0]["type"], "bind");
        assert_eq!(binds[0]["options"], serde_json::json!(["rbind", "rw"]));
        assert_eq!(binds[1]["options"], serde_json::json!(["rbind", "ro"]));
        let escaping = [crate::Mount {
            source: "/tmp".into(),
            target: "/../etc".into(),
            read_only: false,
            owned_by_workload: false,
        }];
        let error = runtime_spec("db-0", &plan(), &cgroups, None, &escaping)
            .expect_err("an escaping target is refused");
        assert!(error.contains("contains '..'"), "{error}");
    }
}
