//! Container images on one node. [`ImageRef`] parses and validates
//! references with Docker's defaults; [`ImageStore`] keeps verified blobs,
//! unpacked layers (overlayfs form, ready to stack as lowerdirs) and image
//! records under one directory, writes atomically and collects garbage;
//! [`Puller`] fetches images through the registry distribution API (per
//! registry settings, also read from a file by [`RegistrySettings::load`]),
//! [`ImageStore::import`] reads them from OCI layouts and `docker save` archives.
//!
//! Architecture invariant: this crate knows registries and files, never
//! runtimes or instances; the `oci` runtime asks it for layer directories
//! and image configs. It spawns no processes (the `testing` feature's
//! loopback registry and the tools it builds test images with aside).

mod config;
mod digest;
mod error;
mod import;
mod pull;
mod reference;
mod registry_file;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod unpack;

pub use config::ImageConfig;
pub use digest::Digest;
pub use error::{Error, Result};
pub use pull::{PullProgress, Puller, RegistryConfig, RegistrySettings, node_architecture};
pub use reference::{DEFAULT_REGISTRY, ImageRef};
pub use registry_file::{LoadedRegistrySettings, RegistryFileError};
pub use store::{GcReport, ImageRecord, ImageStore, PullLock};
