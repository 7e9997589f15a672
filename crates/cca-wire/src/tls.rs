//! HTTPS for the API's clients: the cluster CA as the only root, the
//! peer's identity checked, a client certificate replaceable while in use.
//! The code is `cca-tls`'s (the agent's API and the server calling it use
//! the same); these are its names as the API's clients have known them.

pub use cca_tls::client::{ClientTls, ExpectedPeer};
pub use cca_tls::{Certificate as ClientCertificate, TlsError as ClientTlsError};
