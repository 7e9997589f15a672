//! Pulling images through the registry distribution API (`oci-client`):
//! per-registry settings (plain HTTP only where configured, credentials
//! for token or basic auth, anonymous otherwise), manifest lists resolved
//! to this node's platform, every blob's digest checked by the store, and
//! layers downloaded and unpacked in parallel, their byte progress
//! reported to a [`PullProgress`] (the CLI draws one bar per layer).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::{Digest, Error, ImageConfig, ImageRecord, ImageRef, ImageStore, Result};

/// Layers fetched at once per pull.
const PARALLEL_LAYERS: usize = 4;

/// How to talk to each registry; registries not listed get HTTPS and
/// anonymous access.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RegistrySettings {
    /// Keyed by registry host as written in references (`127.0.0.1:5000`).
    pub registries: BTreeMap<String, RegistryConfig>,
}

/// One registry's settings. `Debug` never shows the password.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct RegistryConfig {
    /// Speak plain HTTP instead of HTTPS (local or test registries only).
    #[serde(default)]
    pub plain_http: bool,
    /// Credentials: used for basic auth, or exchanged for a bearer token
    /// when the registry asks for one.
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("plain_http", &self.plain_http)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl RegistrySettings {
    /// Settings allowing plain HTTP to `registry`, anonymous access.
    pub fn plain_http(registry: impl Into<String>) -> Self {
        let config = RegistryConfig {
            plain_http: true,
            ..RegistryConfig::default()
        };
        Self {
            registries: BTreeMap::from([(registry.into(), config)]),
        }
    }

    /// Settings allowing plain HTTP to each of `registries` (`HOST[:PORT]`
    /// as written in references: `--insecure-registry`), anonymous access;
    /// anything else is refused with the reason.
    pub fn insecure(registries: &[String]) -> Result<Self> {
        let mut settings = Self::default();
        for registry in registries {
            crate::reference::validate_registry(registry).map_err(|reason| {
                Error::InvalidRegistry {
                    registry: registry.clone(),
                    reason,
                }
            })?;
            settings.registries.insert(
                registry.clone(),
                RegistryConfig {
                    plain_http: true,
                    ..RegistryConfig::default()
                },
            );
        }
        Ok(settings)
    }

    fn auth_for(&self, registry: &str) -> RegistryAuth {
        match self.registries.get(registry) {
            Some(RegistryConfig {
                username: Some(user),
                password: Some(password),
                ..
            }) => RegistryAuth::Basic(user.clone(), password.clone()),
            _ => RegistryAuth::Anonymous,
        }
    }
}

/// Told how a pull's layers progress, from the pull's tasks (the CLI draws
/// bars). Every method has a default doing nothing.
pub trait PullProgress: Send + Sync {
    /// A layer is needed: its compressed size from the manifest, and
    /// whether its blob is already in the store (nothing to download).
    fn layer_started(&self, _digest: &Digest, _size: u64, _cached: bool) {}
    /// `bytes` more of the layer were downloaded.
    fn layer_bytes(&self, _digest: &Digest, _bytes: u64) {}
    /// The layer is verified, stored and unpacked.
    fn layer_done(&self, _digest: &Digest) {}
}

/// Reports nothing: [`Puller::pull`].
struct NoProgress;

impl PullProgress for NoProgress {}

/// Pulls images into a store.
pub struct Puller {
    client: oci_client::Client,
    settings: RegistrySettings,
    store: ImageStore,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("settings", &self.settings)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Puller {
    pub fn new(store: ImageStore, settings: RegistrySettings) -> Self {
        let plain_http = settings
            .registries
            .iter()
            .filter(|(_, config)| config.plain_http)
            .map(|(registry, _)| registry.clone())
            .collect();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(plain_http),
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            ..ClientConfig::default()
        };
        Self {
            client: oci_client::Client::new(config),
            settings,
            store,
        }
    }

    /// Pulls `reference` (its digest when it has one, else its tag) and
    /// records it under its name and under `name@digest`. Blobs and layers
    /// already in the store are not fetched again. Holds the store's pull
    /// lock throughout, so no garbage collection runs meanwhile.
    pub async fn pull(&self, reference: &ImageRef) -> Result<ImageRecord> {
        self.pull_with_progress(reference, &NoProgress).await
    }

    /// [`Puller::pull`], telling `progress` how each layer goes.
    pub async fn pull_with_progress(
        &self,
        reference: &ImageRef,
        progress: &dyn PullProgress,
    ) -> Result<ImageRecord> {
        let store = self.store.clone();
        let lock = blocking(move || store.lock_for_pull()).await?;
        let mut stored = Vec::new();
        let pulled = self.pull_locked(reference, progress, &mut stored).await;
        drop(lock);
        if pulled.is_err() && !stored.is_empty() {
            self.discard(reference, stored).await;
        }
        pulled
    }

    /// The pull itself, under the store's pull lock; `stored` collects the
    /// digests of the blobs it may have added (config and layers).
    async fn pull_locked(
        &self,
        reference: &ImageRef,
        progress: &dyn PullProgress,
        stored: &mut Vec<Digest>,
    ) -> Result<ImageRecord> {
        let oci_ref = reference.to_oci();
        let auth = self.settings.auth_for(&reference.registry);
        let (manifest, manifest_digest, config_json) = self
            .client
            .pull_manifest_and_config(&oci_ref, &auth)
            .await
            .map_err(|e| self.registry_error(reference, e))?;
        let digest = manifest_digest.parse::<Digest>()?;
        let config_digest = manifest.config.digest.parse::<Digest>()?;
        let config =
            ImageConfig::from_json(config_json.as_bytes()).map_err(|source| Error::Config {
                image: reference.to_string(),
                digest: config_digest.to_string(),
                error: source,
            })?;
        check_platform(&reference.to_string(), &config)?;
        stored.push(config_digest.clone());
        stored.extend(
            manifest
                .layers
                .iter()
                .filter_map(|layer| layer.digest.parse::<Digest>().ok()),
        );
        let what = format!("image {reference}: config");
        self.store
            .put_blob(&config_digest, config_json.as_bytes(), &what)?;
        let layers = self
            .fetch_layers(reference, &oci_ref, &manifest.layers, progress)
            .await?;
        let names = [reference.clone(), reference.with_digest(digest.clone())];
        let record = ImageRecord {
            digest,
            names: names.iter().map(ToString::to_string).collect(),
            config_digest,
            layers,
            config,
            size_bytes: manifest
                .layers
                .iter()
                .map(|l| u64::try_from(l.size).unwrap_or(0))
                .sum(),
            pulled_at_ms: cca_model::clock::now_millis(),
        };
        tracing::info!(image = %reference, digest = %record.digest, "pulled image");
        self.store.save_image(record)
    }

    async fn fetch_layers(
        &self,
        reference: &ImageRef,
        oci_ref: &oci_client::Reference,
        layers: &[OciDescriptor],
        progress: &dyn PullProgress,
    ) -> Result<Vec<Digest>> {
        // The first failure cancels the downloads under way and keeps the
        // rest from starting, but every layer task runs to its end before
        // this returns: none is left storing a blob or unpacking a layer
        // after the pull has failed and its leftovers are discarded.
        let (cancel, _) = tokio::sync::watch::channel(false);
        let cancel = &cancel;
        // Owned descriptors: a closure over borrowed ones makes the future
        // not provably `Send` (rustc's higher-ranked lifetime limitation),
        // and the agent pulls inside `Send` tasks.
        let outcomes: Vec<Result<Option<Digest>>> = futures_util::stream::iter(layers.to_vec())
            .map(|layer| async move {
                if *cancel.borrow() {
                    return Ok(None);
                }
                let fetched = self
                    .fetch_layer(reference, oci_ref, &layer, progress, cancel.subscribe())
                    .await;
                if fetched.is_err() {
                    cancel.send_replace(true);
                }
                fetched
            })
            .buffered(PARALLEL_LAYERS)
            .collect()
            .await;
        let mut digests = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            if let Some(digest) = outcome? {
                digests.push(digest);
            }
        }
        if digests.len() != layers.len() {
            // Only a failure cancels, and its error was returned above.
            return Err(Error::Registry {
                image: reference.to_string(),
                registry: reference.registry.clone(),
                message: "the pull was cancelled".into(),
            });
        }
        Ok(digests)
    }

    /// Downloads one layer blob into a temporary file, moves it into the
    /// store once its digest checks out, and unpacks it. `None` when
    /// `cancel` turned true (another layer failed) during the download.
    async fn fetch_layer(
        &self,
        reference: &ImageRef,
        oci_ref: &oci_client::Reference,
        layer: &OciDescriptor,
        progress: &dyn PullProgress,
        mut cancel: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<Digest>> {
        let digest = layer.digest.parse::<Digest>()?;
        let cached = self.store.blob_path(&digest).exists();
        progress.layer_started(&digest, u64::try_from(layer.size).unwrap_or(0), cached);
        if !cached {
            let temp = self.store.temp_file()?;
            let file = temp.reopen().on("opening", temp.path())?;
            let out = Counting {
                inner: tokio::fs::File::from_std(file),
                digest: &digest,
                progress,
            };
            tokio::select! {
                downloaded = self.client.pull_blob(oci_ref, layer, out) => {
                    downloaded.map_err(|e| self.layer_error(reference, &digest, e))?;
                }
                // The temporary file goes with the dropped download.
                Ok(_) = cancel.wait_for(|cancelled| *cancelled) => return Ok(None),
            }
            let store = self.store.clone();
            let (what, expected) = (format!("image {reference}: layer"), digest.clone());
            blocking(move || store.commit_blob(temp, &expected, &what)).await?;
        }
        let store = self.store.clone();
        let unpacked = digest.clone();
        blocking(move || store.unpack_layer(&unpacked)).await?;
        progress.layer_done(&digest);
        Ok(Some(digest))
    }

    /// Removes what a failed pull stored and no image references; left to
    /// garbage collection when another pull holds the store.
    async fn discard(&self, reference: &ImageRef, stored: Vec<Digest>) {
        let store = self.store.clone();
        match blocking(move || store.discard_unreferenced(&stored)).await {
            Ok(removed) if !removed.is_empty() => {
                let removed = removed.len();
                tracing::debug!(image = %reference, removed, "discarded what a failed pull stored");
            }
            Ok(_) => {}
            Err(Error::Busy { .. }) => {
                tracing::debug!(image = %reference, "a failed pull's blobs are left to gc");
            }
            Err(error) => {
                tracing::warn!(image = %reference, %error, "discarding what a failed pull stored");
            }
        }
    }

    fn layer_error(
        &self,
        reference: &ImageRef,
        digest: &Digest,
        error: OciDistributionError,
    ) -> Error {
        match error {
            OciDistributionError::DigestError(DigestError::VerificationError {
                actual, ..
            }) => Error::DigestMismatch {
                what: format!("image {reference}: layer"),
                expected: digest.to_string(),
                actual,
            },
            other => self.registry_error(reference, other),
        }
    }

    fn registry_error(&self, reference: &ImageRef, error: OciDistributionError) -> Error {
        let mut message = crate::error::error_chain(&error);
        if let Some(hint) = self.hint(reference, &error) {
            message = format!("{message} ({hint})");
        }
        Error::Registry {
            image: reference.to_string(),
            registry: reference.registry.clone(),
            message,
        }
    }

    /// What to do about a registry failure, when it is clear.
    fn hint(&self, reference: &ImageRef, error: &OciDistributionError) -> Option<String> {
        use oci_client::errors::OciErrorCode as Code;
        let codes: Vec<&Code> = match error {
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().map(|e| &e.code).collect()
            }
            _ => Vec::new(),
        };
        let unknown = matches!(error, OciDistributionError::ImageManifestNotFoundError(_))
            || codes
                .iter()
                .any(|code| matches!(code, Code::ManifestUnknown | Code::NameUnknown));
        let refused = matches!(
            error,
            OciDistributionError::UnauthorizedError { .. }
                | OciDistributionError::AuthenticationFailure(_)
        ) || codes
            .iter()
            .any(|code| matches!(code, Code::Unauthorized | Code::Denied));
        let what = match (&reference.digest, &reference.tag) {
            (Some(digest), _) => format!("digest {digest}"),
            (None, Some(tag)) => format!("tag {tag}"),
            (None, None) => "such image".to_owned(),
        };
        if unknown {
            return Some(format!(
                "the registry has no {} with {what}: check the reference, or push the image",
                reference.repository
            ));
        }
        if refused {
            let user = self
                .settings
                .registries
                .get(&reference.registry)
                .filter(|config| config.password.is_some())
                .and_then(|config| config.username.as_deref());
            return Some(match user {
                Some(user) => format!(
                    "the registry refused the credentials configured for it (user {user}): \
                     check the username and password"
                ),
                None => "the registry refused access: it needs credentials this node does not \
                         have"
                    .to_owned(),
            });
        }
        if let OciDistributionError::RequestError(request) = error
            && (request.is_connect() || request.is_timeout())
        {
            let plain_http = self
                .settings
                .registries
                .get(&reference.registry)
                .is_some_and(|config| config.plain_http);
            return Some(if plain_http {
                "is the registry running and reachable from this node?".to_owned()
            } else {
                format!(
                    "is the registry running and reachable from this node? It is spoken to \
                     over HTTPS: a plain-HTTP registry must be allowed with \
                     --insecure-registry {0} (or \"insecure\": true for {0} in the \
                     --registry-config file)",
                    reference.registry
                )
            });
        }
        None
    }
}

/// Refuses an image built for another OS or architecture than this node's.
pub(crate) fn check_platform(image: &str, config: &ImageConfig) -> Result<()> {
    let arch = node_architecture();
    let os_ok = config.os.is_empty() || config.os == "linux";
    let arch_ok = config.architecture.is_empty() || config.architecture == arch;
    if os_ok && arch_ok {
        return Ok(());
    }
    Err(Error::Unsupported {
        image: image.to_owned(),
        reason: format!(
            "built for {}/{}, this node is linux/{arch}",
            config.os, config.architecture
        ),
    })
}

/// A download's file, counting what is written into it for the progress.
struct Counting<'a, W> {
    inner: W,
    digest: &'a Digest,
    progress: &'a dyn PullProgress,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counting<'_, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.progress.layer_bytes(self.digest, *written as u64);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// This node's architecture in OCI's (Go's) spelling.
pub fn node_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join_error| std::panic::resume_unwind(join_error.into_panic()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_password() {
        let mut settings = RegistrySettings::default();
        settings.registries.insert(
            "registry.example:5000".to_owned(),
            RegistryConfig {
                plain_http: false,
                username: Some("deploy".to_owned()),
                password: Some("hunter2-s3cret".to_owned()),
            },
        );
        let shown = format!("{settings:?} {settings:#?}");
        assert!(!shown.contains("hunter2-s3cret"), "{shown}");
        assert!(
            shown.contains("deploy") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
