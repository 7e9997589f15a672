//! [`PacketFilter`]: the narrow trait for the data plane's kernel side
//! effects — apply one nftables batch atomically, list or delete the
//! table, delete conntrack entries — and [`Nft`], the real one: the `nft`
//! binary reading the batch's JSON (`nft -j -f -`, one transaction) and a
//! netlink socket for conntrack.
//!
//! Why the `nft` binary and not the `nftables` crate's applier: the crate
//! leaves `nft`'s stderr on ours, so its errors cannot say why a batch was
//! refused; running the binary here keeps the reason in the error. Every
//! call works in the calling thread's network namespace (the child process
//! and the netlink socket inherit it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use super::batch::Batch;
use super::conntrack;
use super::error::{Error, Result};

/// The kernel side effects of the data plane.
///
/// Synchronous on purpose, like [`crate::HostNetwork`]: each call is one
/// short command or netlink exchange; the agent calls from its blocking pool.
pub trait PacketFilter: Send + Sync + fmt::Debug {
    /// Applies every command of `batch` or none (one nftables transaction).
    fn apply(&self, batch: &Batch) -> Result<()>;
    /// The table as `nft -j list table ip TABLE` prints it; `None` when
    /// there is no such table.
    fn list_table(&self, table: &str) -> Result<Option<String>>;
    /// Deletes the `ip` table `table`; gone already is fine.
    fn delete_table(&self, table: &str) -> Result<()>;
    /// Deletes the UDP conntrack entries `cleanup` names; returns how many
    /// went.
    fn delete_conntrack(&self, cleanup: &UdpCleanup) -> Result<usize>;
}

/// A shared filter is the filter (a test keeps a handle on the fake it
/// gave away).
impl<F: PacketFilter> PacketFilter for std::sync::Arc<F> {
    fn apply(&self, batch: &Batch) -> Result<()> {
        F::apply(self, batch)
    }
    fn list_table(&self, table: &str) -> Result<Option<String>> {
        F::list_table(self, table)
    }
    fn delete_table(&self, table: &str) -> Result<()> {
        F::delete_table(self, table)
    }
    fn delete_conntrack(&self, cleanup: &UdpCleanup) -> Result<usize> {
        F::delete_conntrack(self, cleanup)
    }
}

/// UDP flows through VIP ports whose backend no longer serves them: an
/// entry whose original destination is one of `ports` and whose reply
/// source is not among that port's allowed backends goes, so the flow's
/// next datagram is balanced afresh instead of following a dead binding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpCleanup {
    /// `(VIP, port)` → the backends (`address`, `port`) flows may keep.
    pub ports: BTreeMap<(Ipv4Addr, u16), BTreeSet<(Ipv4Addr, u16)>>,
}

impl UdpCleanup {
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Whether a UDP entry from `original_destination` replied from
    /// `reply_source` is stale.
    pub fn is_stale(
        &self,
        original_destination: (Ipv4Addr, u16),
        reply_source: (Ipv4Addr, u16),
    ) -> bool {
        self.ports
            .get(&original_destination)
            .is_some_and(|allowed| !allowed.contains(&reply_source))
    }
}

/// The real packet filter: `nft` and conntrack over netlink, in the calling
/// thread's network namespace.
#[derive(Clone, Debug)]
pub struct Nft {
    program: String,
}

impl Default for Nft {
    fn default() -> Self {
        Nft {
            program: "nft".to_owned(),
        }
    }
}

impl Nft {
    /// `nft` from `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<std::process::Output> {
        let command = format!("{} {}", self.program, args.join(" "));
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| Error::Spawn {
                command: command.clone(),
                error,
            })?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|error| Error::Spawn {
                    command: command.clone(),
                    error,
                })?;
        }
        child
            .wait_with_output()
            .map_err(|error| Error::Spawn { command, error })
    }
}

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

impl PacketFilter for Nft {
    fn apply(&self, batch: &Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let output = self.run(&["-j", "-f", "-"], Some(&batch.to_json()))?;
        if output.status.success() {
            return Ok(());
        }
        Err(Error::Apply {
            table: batch.table().to_owned(),
            commands: batch.len(),
            status: output.status.to_string(),
            stderr: stderr_of(&output),
        })
    }

    fn list_table(&self, table: &str) -> Result<Option<String>> {
        let output = self.run(&["-j", "list", "table", "ip", table], None)?;
        if output.status.success() {
            return Ok(Some(String::from_utf8_lossy(&output.stdout).into_owned()));
        }
        let stderr = stderr_of(&output);
        if stderr.contains("No such file or directory") {
            return Ok(None);
        }
        Err(Error::Command {
            command: format!("{} -j list table ip {table}", self.program),
            status: output.status.to_string(),
            stderr,
        })
    }

    fn delete_table(&self, table: &str) -> Result<()> {
        // `add` first makes the delete succeed whether or not the table
        // was there (nft 1.0.6 has no `destroy`), in one transaction.
        let mut batch = Batch::new(table);
        batch.add_table();
        batch.delete_table();
        self.apply(&batch)
    }

    fn delete_conntrack(&self, cleanup: &UdpCleanup) -> Result<usize> {
        if cleanup.is_empty() {
            return Ok(0);
        }
        conntrack::delete_stale_udp(cleanup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleanup_keeps_allowed_backends_and_other_ports() {
        let vip = Ipv4Addr::new(10, 43, 0, 1);
        let live = (Ipv4Addr::new(10, 42, 0, 2), 5353);
        let gone = (Ipv4Addr::new(10, 42, 0, 3), 5353);
        let mut cleanup = UdpCleanup::default();
        cleanup
            .ports
            .insert((vip, 53), [live].into_iter().collect());
        assert!(!cleanup.is_stale((vip, 53), live));
        assert!(cleanup.is_stale((vip, 53), gone));
        // Not DNATed at all (replied by the VIP itself): stale too.
        assert!(cleanup.is_stale((vip, 53), (vip, 53)));
        assert!(!cleanup.is_stale((vip, 54), gone), "another port");
    }
}
