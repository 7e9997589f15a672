//! Trust: who is who in a cluster, and what they may do. The cluster CA
//! and the certificates it issues ([`pki`]; gates' for their hosts in
//! [`gate`]), the identities certificates
//! carry ([`identity`]), the join tokens nodes enrol with ([`join`]),
//! the signed tokens users present ([`jwt`]), what users may do
//! ([`policy`]), the certificates the cluster took back ([`revocation`]),
//! and the config directory that holds a cluster's trust on disk
//! ([`config_dir`]). No async, and no
//! IO but `config_dir`'s few files: callers serve the handshakes, and
//! everything here is a function of its inputs and the time it is given,
//! so expiry is tested on a fake clock.

pub mod config_dir;
pub mod gate;
pub mod identity;
pub mod join;
pub mod jwt;
pub mod pki;
pub mod policy;
pub mod revocation;
