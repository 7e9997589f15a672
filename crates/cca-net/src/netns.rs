//! Named network namespaces without `ip netns`, the way iproute2 makes
//! them: `/run/netns` is a shared mount (bind-mounted onto itself first if
//! it is not a mount point), and a namespace is kept alive by bind-mounting
//! `/proc/thread-self/ns/net` of a throwaway thread that unshared a new one
//! onto `/run/netns/NAME`. Deleting detaches that mount and removes the
//! file. [`enter`] runs code on a thread inside a namespace: `setns(2)`
//! changes only the calling thread, and every socket (netlink ones
//! included) stays bound to the namespace it was created in, so work done
//! there — and processes forked there — is the namespace's.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where named network namespaces are bind-mounted (iproute2's place, so
/// `ip netns` and `nsenter --net=` see ours and we see theirs).
pub const NETNS_DIR: &str = "/run/netns";

/// `statfs(2)`'s magic of nsfs, the filesystem of `/proc/*/ns/*` and of
/// their bind mounts.
const NSFS_MAGIC: i128 = 0x6e73_6673;

/// The path of the named namespace `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

fn netns_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |error| Error::Netns {
        action,
        path: path.to_owned(),
        error,
    }
}

/// Whether `path` is a namespace's bind mount (not just a file left by a
/// crash between creating the file and mounting onto it).
fn is_namespace(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|stat| i128::from(stat.f_type) == NSFS_MAGIC)
}

/// Makes `/run/netns` exist and be a shared mount, so a namespace mounted
/// there shows in every mount namespace that has it (as `ip netns add`
/// does).
fn prepare_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(netns_error("create the directory of", dir))?;
    let shared =
        rustix::mount::MountPropagationFlags::SHARED | rustix::mount::MountPropagationFlags::REC;
    match rustix::mount::mount_change(dir, shared) {
        Ok(()) => return Ok(()),
        // EINVAL: not a mount point yet.
        Err(rustix::io::Errno::INVAL) => {}
        Err(error) => return Err(netns_error("share the mount of", dir)(error.into())),
    }
    rustix::mount::mount_bind_recursive(dir, dir)
        .map_err(|e| netns_error("bind-mount onto itself the directory of", dir)(e.into()))?;
    rustix::mount::mount_change(dir, shared)
        .map_err(|e| netns_error("share the mount of", dir)(e.into()))
}

/// Creates the named namespace `name` (existing is fine) and returns its
/// path.
pub fn create(name: &str) -> Result<PathBuf> {
    let path = path(name);
    if is_namespace(&path) {
        return Ok(path);
    }
    prepare_dir(Path::new(NETNS_DIR))?;
    // The mount point: a file, created without truncating a leftover one.
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(netns_error("create the mount point of", &path))?;
    let target = path.clone();
    let mounted = std::thread::spawn(move || -> io::Result<()> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        rustix::mount::mount_bind("/proc/thread-self/ns/net", &target)?;
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")));
    if let Err(error) = mounted {
        let _ = fs::remove_file(&path);
        return Err(netns_error("create", &path)(error));
    }
    Ok(path)
}

/// Deletes the named namespace `name`; gone already is fine. The namespace
/// itself lives on while a process or socket still holds it.
pub fn delete(name: &str) -> Result<()> {
    let path = path(name);
    match rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH) {
        // EINVAL: not a mount point (a leftover file); ENOENT: gone.
        Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
        Err(error) => return Err(netns_error("unmount", &path)(error.into())),
    }
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(netns_error("remove the mount point of", &path)(error)),
    }
}

/// The names of the named namespaces.
pub fn list() -> Result<Vec<String>> {
    let dir = Path::new(NETNS_DIR);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(netns_error("list the directory of", dir)(error)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(netns_error("list the directory of", dir))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Runs `work` on a new thread that has joined the network namespace at
/// `path` (a named one, or any `/proc/PID/ns/net`), and returns its result.
/// Sockets it opens stay in that namespace; commands it spawns run there;
/// `/proc/sys/net` reads and writes that namespace's settings.
pub fn enter<T: Send>(path: &Path, work: impl FnOnce() -> T + Send) -> Result<T> {
    let file = fs::File::open(path).map_err(netns_error("open", path))?;
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| netns_error("enter", path)(e.into()))?;
            Ok(work())
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
