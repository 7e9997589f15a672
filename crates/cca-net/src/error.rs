//! Errors of the network layer. Each names what failed on what: a host
//! command with its exit status and stderr, the state file with its path,
//! the subnet or instance the allocation was for.

use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::host::Proto;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while wiring instances into the node network.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// A host command could not be started (binary missing, no permission).
    #[error("could not run `{command}`: {error}")]
    Spawn { command: String, error: io::Error },
    /// A host command printed something we could not parse.
    #[error("could not parse the output of `{command}`: {reason}")]
    Output { command: String, reason: String },
    /// A netlink request to the kernel failed. `action` names the request,
    /// its link and, outside the caller's own, the network namespace.
    #[error("could not {action}: {reason}")]
    Netlink { action: String, reason: String },
    /// A link an operation needs does not exist.
    #[error("no link named {name}{place}: {hint}")]
    NoLink {
        name: String,
        place: String,
        hint: String,
    },
    /// No link holds the address the overlay should tunnel from.
    #[error(
        "no link{place} holds the underlay address {address}: the node's overlay address must be one of this host's own addresses"
    )]
    NoUnderlay { address: Ipv4Addr, place: String },
    /// Creating, entering or removing a network namespace failed.
    #[error("could not {action} network namespace {path}: {error}")]
    Netns {
        action: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    /// Writing a kernel setting under /proc/sys failed.
    #[error("could not set {path} to {value}: {error}")]
    Sysctl {
        path: PathBuf,
        value: String,
        error: io::Error,
    },
    /// Reading or writing the persisted network state failed.
    #[error("could not {action} network state {path}: {error}")]
    StateIo {
        action: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    /// The persisted network state is not valid JSON of the expected shape.
    #[error("network state {path} is not valid: {error}")]
    StateParse {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// The persisted leases are for another subnet than the node was given.
    #[error(
        "network state {path} holds leases in {persisted}, but the node subnet is {configured}; detach the instances or remove the file"
    )]
    SubnetChanged {
        path: PathBuf,
        persisted: String,
        configured: String,
    },
    /// A subnet string or prefix that cannot be a node subnet.
    #[error("invalid node subnet {subnet:?}: {reason}")]
    InvalidSubnet { subnet: String, reason: String },
    /// Every host address of the subnet is leased.
    #[error("subnet {subnet} has no free address for instance {instance}")]
    Exhausted { subnet: String, instance: String },
    /// An instance id that cannot name a network namespace.
    #[error(
        "instance id {id:?} cannot name a network namespace: it must be 1-128 letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    InvalidInstanceId { id: String },
    /// A configured name the kernel would reject.
    #[error("invalid network config: {0}")]
    InvalidConfig(String),
    /// Publishing on a host port another instance already holds.
    #[error("host port {proto}/{host_port} is already published by instance {owner}")]
    PortInUse {
        proto: Proto,
        host_port: u16,
        owner: String,
    },
    /// Publishing a port for an instance without an address.
    #[error("eBPF data plane: {0}")]
    Ebpf(#[from] crate::ebpf::Error),

    #[error("instance {0} is not attached to the node network")]
    NotAttached(String),
    /// A failure the recording fake was told to inject.
    #[error("injected failure in {operation}")]
    Injected { operation: String },
    /// An address in the state file outside the node subnet.
    #[error("address {address} of instance {instance} is outside subnet {subnet}")]
    OutsideSubnet {
        address: Ipv4Addr,
        instance: String,
        subnet: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_error_names_command_and_stderr() {
        let error = Error::Command {
            command: "ip link add cca0 type bridge".into(),
            status: "exit status: 2".into(),
            stderr: "RTNETLINK answers: Operation not permitted".into(),
        };
        assert_eq!(
            error.to_string(),
            "`ip link add cca0 type bridge` failed (exit status: 2): RTNETLINK answers: Operation not permitted"
        );
    }

    #[test]
    fn port_in_use_names_owner() {
        let error = Error::PortInUse {
            proto: Proto::Tcp,
            host_port: 8080,
            owner: "web-1".into(),
        };
        assert_eq!(
            error.to_string(),
            "host port tcp/8080 is already published by instance web-1"
        );
    }
}
