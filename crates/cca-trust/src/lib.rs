//! Trust: who is who in a cluster, and what they may do. The cluster CA
//! and the certificates it issues ([`pki`]), the identities certificates
//! carry ([`identity`]), the join tokens nodes enrol with ([`join`]), and
//! the signed tokens users present ([`jwt`]). No IO and no async: callers
//! read and write the files and serve the handshakes; everything here is
//! a function of its inputs and the time it is given, so expiry is tested
//! on a fake clock.

pub mod identity;
pub mod join;
pub mod jwt;
pub mod pki;
