//! Errors of the eBPF data plane: each names what failed on what (the
//! object, the program, the map and its pin, the cgroup) and what to do.

use std::io;
use std::path::PathBuf;

/// `Result` with the eBPF data plane's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel cannot run the programs here (no BPF file system, no
    /// cgroup v2, a verifier refusal): `--dataplane nftables` works.
    #[error("the eBPF data plane cannot run here: {0}; use --dataplane nftables")]
    Unsupported(String),
    #[error("{what} {path}: {error}")]
    Io {
        what: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    #[error("loading the eBPF object: {0}")]
    Load(String),
    #[error("program {program}: {error}")]
    Program {
        program: &'static str,
        error: String,
    },
    #[error("map {map}: {error}")]
    Map { map: &'static str, error: String },
    #[error(
        "the programs did not see the loader's probe connect from this network namespace; \
         is {cgroup} the root of the cgroup v2 hierarchy this node's processes are in?"
    )]
    NotLearned { cgroup: PathBuf },
}
