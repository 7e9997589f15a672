//! A private mount namespace for a host process with its own resolver: the
//! process must see the instance's generated `resolv.conf` at
//! `/etc/resolv.conf` while the host's file, and every other process, stay
//! untouched — so the bind mount lives in a mount namespace only that
//! process (and what it starts, and `exec`s into it) is in.
//!
//! Without `pre_exec` (`unsafe` is forbidden in the workspace) the child
//! cannot set this up between fork and exec; a *fresh OS thread* of the
//! agent does it instead: it leaves the agent's mount namespace
//! (`unshare(CLONE_NEWNS)`, which affects the calling thread only), makes
//! every mount in its copy a slave (`MS_REC | MS_SLAVE`: nothing mounted in
//! it ever propagates back to the host, while host mounts and unmounts on
//! shared mounts still reach it), bind-mounts the generated file read-only
//! over the file `/etc/resolv.conf` resolves to (through any symlinks), and
//! spawns the child, which inherits the thread's namespace. The thread
//! then ends: a pooled thread (tokio's blocking pool) would carry the
//! namespace into unrelated work. The namespace lives as long as a process
//! is in it, so an agent restart changes nothing for the instance.
//!
//! `exec` joins the instance's namespace the same way: a fresh thread
//! stops sharing its filesystem attributes with the agent's other threads
//! (`unshare(CLONE_FS)`, which `setns` into a mount namespace requires),
//! `setns`es into `/proc/PID/ns/mnt` of the instance's main process and
//! spawns the command.
//!
//! All of it needs `CAP_SYS_ADMIN` (root): without it the first step fails
//! with `EPERM` and the error says the agent must run as root. Nothing on
//! the host is changed by any step, so a failure leaves nothing to undo.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};
use tokio::process::{Child, Command};

use crate::{Error, Operation, Result};

/// Checks at `create` that a process could start with `resolv` bound over
/// `target` (the host's `/etc/resolv.conf`): the whole setup runs in a
/// thread that then ends without spawning anything, so the reason a start
/// would fail (not root, no such file) surfaces before the instance exists.
pub(crate) fn check(id: &str, resolv: &Path, target: &Path) -> Result<()> {
    let (resolv, target) = (resolv.to_owned(), target.to_owned());
    let outcome = std::thread::Builder::new()
        .name("cca-mountns-check".to_owned())
        .spawn(move || enter_private_namespace(&resolv, &target))
        .map_err(|e| thread_error(id, Operation::Create, e))?
        .join();
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) => Err(failure.into_error(id, Operation::Create)),
        Err(_) => Err(thread_gone(id, Operation::Create)),
    }
}

/// Spawns `command` in a new private mount namespace in which `target`
/// (the host's `/etc/resolv.conf`, symlinks resolved) shows `resolv`;
/// `what` names the spawn in an error (`spawning {what}`).
pub(crate) async fn spawn_with_resolv_conf(
    id: &str,
    command: Command,
    what: String,
    resolv: PathBuf,
    target: PathBuf,
) -> Result<Child> {
    on_fresh_thread(id, Operation::Start, move || {
        enter_private_namespace(&resolv, &target)?;
        spawn(command, what)
    })
    .await
}

/// Spawns `command` in the mount namespace `namespace` (an open
/// `/proc/PID/ns/mnt` of the instance's main process).
pub(crate) async fn spawn_in_namespace(
    id: &str,
    command: Command,
    what: String,
    namespace: File,
) -> Result<Child> {
    on_fresh_thread(id, Operation::Exec, move || {
        unshare(UnshareFlags::FS)
            .map_err(|e| Failure::step("unsharing the thread's cwd and root", e))?;
        rustix::thread::move_into_link_name_space(
            namespace.as_fd(),
            Some(LinkNameSpaceType::Mount),
        )
        .map_err(|e| Failure::step("joining the instance's mount namespace", e))?;
        spawn(command, what)
    })
    .await
}

/// What failed in the thread, before it becomes an [`Error`] naming the
/// instance.
#[derive(Debug)]
enum Failure {
    /// A namespace or mount step the kernel refused.
    Step {
        what: String,
        errno: rustix::io::Errno,
    },
    /// The host's resolv.conf cannot be found (to bind over).
    Target {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Spawning the command itself.
    Spawn { what: String, error: std::io::Error },
}

impl Failure {
    fn step(what: &str, errno: rustix::io::Errno) -> Self {
        Self::Step {
            what: what.to_owned(),
            errno,
        }
    }

    fn into_error(self, id: &str, operation: Operation) -> Error {
        let failed = |message: String| Error::Failed {
            id: id.to_owned(),
            operation,
            message,
        };
        match self {
            Self::Step { what, errno } if errno == rustix::io::Errno::PERM => failed(format!(
                "{what} was refused ({}): a process with its own /etc/resolv.conf runs in a \
                 private mount namespace, which needs root (CAP_SYS_ADMIN); run the agent as \
                 root, or give the service no cluster DNS",
                std::io::Error::from(errno)
            )),
            Self::Step { what, errno } => failed(format!(
                "{what} for the instance's own /etc/resolv.conf: {}",
                std::io::Error::from(errno)
            )),
            Self::Target { path, error } => failed(format!(
                "the host's {} cannot be bound over ({error}): a process sees its generated \
                 resolv.conf in place of the host's, so the host needs one (create it)",
                path.display()
            )),
            Self::Spawn { what, error } => {
                Error::io(id, operation, format!("spawning {what}"), error)
            }
        }
    }
}

/// Leaves the agent's mount namespace (this thread only) and binds
/// `resolv` read-only over what `target` resolves to.
fn enter_private_namespace(resolv: &Path, target: &Path) -> Result<(), Failure> {
    unshare(UnshareFlags::NEWNS)
        .map_err(|e| Failure::step("creating a mount namespace (unshare)", e))?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )
    .map_err(|e| Failure::step("making the namespace's mounts slaves of the host's", e))?;
    // Bound over the file itself: a bind on a symlink's path would follow
    // it anyway, and the resolved path is what the error names.
    let target = std::fs::canonicalize(target).map_err(|error| Failure::Target {
        path: target.to_owned(),
        error,
    })?;
    rustix::mount::mount_bind(resolv, &target)
        .map_err(|e| Failure::step("binding the generated resolv.conf", e))?;
    rustix::mount::mount_remount(&target, MountFlags::BIND | MountFlags::RDONLY, "")
        .map_err(|e| Failure::step("making the bound resolv.conf read-only", e))?;
    Ok(())
}

fn spawn(mut command: Command, what: String) -> Result<Child, Failure> {
    command
        .spawn()
        .map_err(|error| Failure::Spawn { what, error })
}

/// `unshare(2)` for this thread. rustix deprecated its safe `unshare`
/// because `CLONE_FILES` could leave a thread unable to use descriptors
/// opened by others; only the namespace and filesystem flags are used
/// here, which change what this thread sees of mounts, root and cwd and
/// nothing about descriptors.
fn unshare(flags: UnshareFlags) -> rustix::io::Result<()> {
    if flags.contains(UnshareFlags::FILES) {
        return Err(rustix::io::Errno::INVAL);
    }
    #[allow(
        deprecated,
        reason = "unshare_unsafe needs `unsafe`, forbidden here; FILES is refused above"
    )]
    rustix::thread::unshare(flags)
}

/// Runs `work` on a new OS thread that ends with it, inside the current
/// tokio runtime (the child is reaped by it), and awaits its answer.
async fn on_fresh_thread(
    id: &str,
    operation: Operation,
    work: impl FnOnce() -> Result<Child, Failure> + Send + 'static,
) -> Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("cca-mountns".to_owned())
        .spawn(move || {
            let _context = runtime.enter();
            // A dropped receiver (the start was cancelled) drops the child:
            // it is not killed, and its gate reads end-of-file and exits.
            let _ = sender.send(work());
        })
        .map_err(|e| thread_error(id, operation, e))?;
    match receiver.await {
        Ok(outcome) => outcome.map_err(|failure| failure.into_error(id, operation)),
        Err(_) => Err(thread_gone(id, operation)),
    }
}

fn thread_error(id: &str, operation: Operation, error: std::io::Error) -> Error {
    Error::io(
        id,
        operation,
        "starting a thread to set up its mount namespace",
        error,
    )
}

fn thread_gone(id: &str, operation: Operation) -> Error {
    Error::Failed {
        id: id.to_owned(),
        operation,
        message: "the thread setting up its mount namespace ended without an answer".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_namespace_says_the_agent_must_be_root() {
        let error = Failure::step(
            "creating a mount namespace (unshare)",
            rustix::io::Errno::PERM,
        )
        .into_error("web-1", Operation::Start)
        .to_string();
        assert!(
            error.starts_with(
                "instance web-1: start failed: creating a mount namespace (unshare) was refused"
            ),
            "{error}"
        );
        assert!(error.contains("needs root (CAP_SYS_ADMIN)"), "{error}");
        let missing = Failure::Target {
            path: "/etc/resolv.conf".into(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
        .into_error("web-1", Operation::Create)
        .to_string();
        assert!(
            missing.contains("the host's /etc/resolv.conf cannot be bound over"),
            "{missing}"
        );
    }

    #[test]
    fn unsharing_the_descriptor_table_is_refused() {
        assert_eq!(
            unshare(UnshareFlags::FILES | UnshareFlags::FS),
            Err(rustix::io::Errno::INVAL)
        );
    }
}
