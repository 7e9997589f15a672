//! The content-addressed image store on one node:
//!
//! ```text
//! DIR/blobs/sha256/{hex}         verified blobs (layers, configs)
//! DIR/layers/sha256/{hex}/       each layer unpacked, overlayfs form
//! DIR/images/{hex}.json          one record per image (manifest digest)
//! DIR/tmp/                       writes in progress; emptied on open
//! DIR/lock                       flock: shared by pulls, exclusive by gc
//! ```
//!
//! Everything is written under `tmp/` first and renamed into place only
//! once complete and verified, so a crash or a failed pull never leaves a
//! half-written blob, layer or record where a reader would find it. A pull's
//! blobs are unreferenced until its record is saved, so pulls hold `DIR/lock`
//! shared and garbage collection takes it exclusively (without waiting): the
//! agent and `cca image gc` in another process never collect a pull under way.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::{Digest, Error, ImageConfig, ImageRef, Result};

/// What the store knows of one pulled image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The manifest's digest: the image's identity.
    pub digest: Digest,
    /// References that name it (`registry/repo:tag`, `registry/repo@digest`).
    pub names: BTreeSet<String>,
    pub config_digest: Digest,
    /// Layer blobs, base first.
    pub layers: Vec<Digest>,
    pub config: ImageConfig,
    /// Compressed size of the layers.
    pub size_bytes: u64,
    pub pulled_at_ms: i64,
}

/// What a garbage collection removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub images: Vec<Digest>,
    pub blobs: Vec<Digest>,
    pub layers: Vec<Digest>,
}

/// Held for the duration of a pull ([`ImageStore::lock_for_pull`]); the
/// flock goes with the file.
#[derive(Debug)]
pub struct PullLock {
    _file: std::fs::File,
}

/// A handle on the store; cheap to clone, shared by pulls.
#[derive(Clone, Debug)]
pub struct ImageStore {
    root: Arc<PathBuf>,
    /// Serialises record updates (a tag moving between images).
    records: Arc<Mutex<()>>,
}

impl ImageStore {
    /// Opens (creating) the store at `root` and discards writes a previous
    /// process left unfinished.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let store = Self {
            root: Arc::new(root.into()),
            records: Arc::new(Mutex::new(())),
        };
        let tmp = store.tmp_dir();
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).on("clearing", &tmp)?;
        }
        for dir in [
            tmp,
            store.root.join("blobs/sha256"),
            store.root.join("layers/sha256"),
            store.images_dir(),
        ] {
            std::fs::create_dir_all(&dir).on("creating", &dir)?;
        }
        Ok(store)
    }

    /// Takes the store's lock shared, waiting while a garbage collection
    /// runs (they are short); blocking, call it off the async threads.
    pub fn lock_for_pull(&self) -> Result<PullLock> {
        let file = self.lock_file()?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| Error::io("locking", self.lock_path(), e.into()))?;
        Ok(PullLock { _file: file })
    }

    fn lock_file(&self) -> Result<std::fs::File> {
        let path = self.lock_path();
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .on("opening", &path)
    }

    fn lock_path(&self) -> PathBuf {
        self.root.join("lock")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    pub fn layer_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(digest.hex())
    }

    /// The unpacked layers of an image, base first: overlayfs lowerdirs
    /// (which it wants topmost first, so reverse them).
    pub fn layer_dirs(&self, image: &ImageRecord) -> Vec<PathBuf> {
        image
            .layers
            .iter()
            .map(|layer| self.layer_path(layer))
            .collect()
    }

    /// A file under `tmp/` that disappears when dropped unless committed.
    pub fn temp_file(&self) -> Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.tmp_dir()).on("creating a file in", self.tmp_dir())
    }

    /// Stores `bytes` as the blob `expected` after checking its digest.
    pub fn put_blob(&self, expected: &Digest, bytes: &[u8], what: &str) -> Result<PathBuf> {
        let mut file = self.temp_file()?;
        file.write_all(bytes).on("writing", file.path())?;
        self.commit_blob(file, expected, what)
    }

    /// Hashes a complete temporary file and moves it to the blob `expected`;
    /// a mismatch deletes it. `what` names the blob in the error.
    pub fn commit_blob(
        &self,
        file: tempfile::NamedTempFile,
        expected: &Digest,
        what: &str,
    ) -> Result<PathBuf> {
        file.as_file().sync_all().on("syncing", file.path())?;
        let actual = Digest::of_file(file.path())?;
        if &actual != expected {
            return Err(Error::DigestMismatch {
                what: what.to_owned(),
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        let path = self.blob_path(expected);
        file.persist(&path)
            .map_err(|e| Error::io("storing", &path, e.error))?;
        Ok(path)
    }

    /// Unpacks the stored layer blob `digest` (once: an existing layer is
    /// kept) and returns its directory.
    pub fn unpack_layer(&self, digest: &Digest) -> Result<PathBuf> {
        let target = self.layer_path(digest);
        if target.is_dir() {
            return Ok(target);
        }
        let staging = tempfile::TempDir::new_in(self.tmp_dir())
            .on("creating a directory in", self.tmp_dir())?;
        crate::unpack::unpack_layer(digest, &self.blob_path(digest), staging.path())?;
        match std::fs::rename(staging.path(), &target) {
            Ok(()) => {
                let _ = staging.keep();
                Ok(target)
            }
            // Another pull unpacked the same layer meanwhile.
            Err(_) if target.is_dir() => Ok(target),
            Err(e) => Err(Error::io("storing", &target, e)),
        }
    }

    /// Records an image, merging names with an existing record of the same
    /// digest; a tag now naming this image is taken from any other.
    pub fn save_image(&self, mut image: ImageRecord) -> Result<ImageRecord> {
        let _guard = self
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for mut other in self.images()? {
            if other.digest == image.digest {
                image.names.extend(other.names);
                continue;
            }
            let before = other.names.len();
            other.names.retain(|name| !image.names.contains(name));
            if other.names.len() != before {
                self.write_record(&other)?;
            }
        }
        self.write_record(&image)?;
        Ok(image)
    }

    /// The image a reference names: by digest when it has one, else by its
    /// `registry/repo:tag` name.
    pub fn image(&self, reference: &ImageRef) -> Result<ImageRecord> {
        let not_found = || Error::NotFound {
            image: reference.to_string(),
        };
        if let Some(digest) = &reference.digest {
            let path = self.record_path(digest);
            return if path.exists() {
                self.read_record(&path)
            } else {
                Err(not_found())
            };
        }
        let name = reference.to_string();
        self.images()?
            .into_iter()
            .find(|image| image.names.contains(&name))
            .ok_or_else(not_found)
    }

    /// Every image record, sorted by digest.
    pub fn images(&self) -> Result<Vec<ImageRecord>> {
        let dir = self.images_dir();
        let mut images = Vec::new();
        for entry in std::fs::read_dir(&dir).on("listing", &dir)? {
            let path = entry.on("listing", &dir)?.path();
            if path.extension().is_some_and(|ext| ext == "json") {
                images.push(self.read_record(&path)?);
            }
        }
        images.sort_by(|a, b| a.digest.cmp(&b.digest));
        Ok(images)
    }

    /// Removes one name of an image (`cca image rm`); the record goes with
    /// its last name, or at once when named by digest. Blobs and layers
    /// stay until [`ImageStore::gc`].
    pub fn remove(&self, reference: &ImageRef) -> Result<()> {
        let _guard = self
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut image = self.image(reference)?;
        image.names.remove(&reference.to_string());
        if image.names.is_empty() || reference.digest.is_some() {
            let path = self.record_path(&image.digest);
            std::fs::remove_file(&path).on("removing", &path)
        } else {
            self.write_record(&image)
        }
    }

    /// Deletes images without a name unless `in_use` (manifest digests of
    /// images instances run), then every blob and layer no remaining image
    /// references. Refused with [`Error::Busy`] while a pull (in any
    /// process) holds the store's lock: a pull's blobs are unreferenced
    /// until its record is saved.
    pub fn gc(&self, in_use: &HashSet<Digest>) -> Result<GcReport> {
        let _lock = self.lock_exclusive("collect garbage once it is done")?;
        let _guard = self
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut report = GcReport::default();
        let mut referenced = HashSet::new();
        for image in self.images()? {
            if image.names.is_empty() && !in_use.contains(&image.digest) {
                let path = self.record_path(&image.digest);
                std::fs::remove_file(&path).on("removing", &path)?;
                report.images.push(image.digest);
                continue;
            }
            referenced.insert(image.config_digest.clone());
            referenced.extend(image.layers.iter().cloned());
        }
        report.blobs = self.sweep(&self.root.join("blobs/sha256"), &referenced)?;
        report.layers = self.sweep(&self.root.join("layers/sha256"), &referenced)?;
        Ok(report)
    }

    /// Removes the blobs and unpacked layers among `digests` that no image
    /// record references — what a failed pull stored — and returns them.
    /// Refused with [`Error::Busy`] while a pull (in any process) holds the
    /// store's lock, since that pull may be about to reference one of them;
    /// [`ImageStore::gc`] collects them later.
    pub fn discard_unreferenced(&self, digests: &[Digest]) -> Result<Vec<Digest>> {
        let _lock = self.lock_exclusive("its leftovers go with the next garbage collection")?;
        let _guard = self
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut referenced = HashSet::new();
        for image in self.images()? {
            referenced.insert(image.config_digest);
            referenced.extend(image.layers);
        }
        let mut removed = Vec::new();
        for digest in digests {
            if referenced.contains(digest) || removed.contains(digest) {
                continue;
            }
            let (blob, layer) = (self.blob_path(digest), self.layer_path(digest));
            let mut found = false;
            if blob.exists() {
                std::fs::remove_file(&blob).on("removing", &blob)?;
                found = true;
            }
            if layer.exists() {
                std::fs::remove_dir_all(&layer).on("removing", &layer)?;
                found = true;
            }
            if found {
                removed.push(digest.clone());
            }
        }
        Ok(removed)
    }

    /// Takes the store's lock exclusively without waiting; `Busy` (saying
    /// `then`) while a pull holds it.
    fn lock_exclusive(&self, then: &str) -> Result<std::fs::File> {
        let lock = self.lock_file()?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(lock),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(Error::Busy {
                store: self.root.to_path_buf(),
                reason: format!("a pull is under way; {then}"),
            }),
            Err(e) => Err(Error::io("locking", self.lock_path(), e.into())),
        }
    }

    /// Removes every entry of `dir` whose name is not a referenced digest.
    fn sweep(&self, dir: &Path, referenced: &HashSet<Digest>) -> Result<Vec<Digest>> {
        let mut removed = Vec::new();
        for entry in std::fs::read_dir(dir).on("listing", dir)? {
            let path = entry.on("listing", dir)?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let digest = format!("sha256:{name}").parse::<Digest>().ok();
            if digest.as_ref().is_some_and(|d| referenced.contains(d)) {
                continue;
            }
            if path.is_dir() {
                std::fs::remove_dir_all(&path).on("removing", &path)?;
            } else {
                std::fs::remove_file(&path).on("removing", &path)?;
            }
            removed.extend(digest);
        }
        removed.sort();
        Ok(removed)
    }

    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    fn record_path(&self, digest: &Digest) -> PathBuf {
        self.images_dir().join(format!("{}.json", digest.hex()))
    }

    fn read_record(&self, path: &Path) -> Result<ImageRecord> {
        let bytes = std::fs::read(path).on("reading", path)?;
        serde_json::from_slice(&bytes).map_err(|source| Error::CorruptRecord {
            path: path.to_owned(),
            error: source,
        })
    }

    fn write_record(&self, image: &ImageRecord) -> Result<()> {
        let mut file = self.temp_file()?;
        let json = serde_json::to_vec_pretty(image).map_err(|source| Error::CorruptRecord {
            path: file.path().to_owned(),
            error: source,
        })?;
        file.write_all(&json).on("writing", file.path())?;
        let path = self.record_path(&image.digest);
        file.persist(&path)
            .map_err(|e| Error::io("storing", &path, e.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_is_refused_while_a_pull_holds_the_lock_and_runs_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path()).expect("store");
        let orphan = Digest::of_bytes(b"left by a pull");
        store
            .put_blob(&orphan, b"left by a pull", "a blob")
            .expect("blob");
        let pull = store.lock_for_pull().expect("lock");
        let error = store.gc(&HashSet::new()).expect_err("busy");
        assert!(matches!(error, Error::Busy { .. }), "{error}");
        assert!(error.to_string().contains("a pull is under way"), "{error}");
        assert!(store.blob_path(&orphan).exists(), "nothing collected");
        let second = store.lock_for_pull().expect("pulls share the lock");
        drop((pull, second));
        let report = store.gc(&HashSet::new()).expect("gc runs");
        assert_eq!(report.blobs, [orphan]);
    }

    #[test]
    fn a_failed_pulls_blobs_and_layers_are_discarded_unless_an_image_uses_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path()).expect("store");
        let blob = |bytes: &[u8]| {
            let digest = Digest::of_bytes(bytes);
            store.put_blob(&digest, bytes, "a blob").expect("blob");
            digest
        };
        let (config, kept, left) = (blob(b"config"), blob(b"kept layer"), blob(b"left layer"));
        let unpacked = store.layer_path(&left);
        std::fs::create_dir_all(unpacked.join("bin")).expect("a layer dir");
        store
            .save_image(ImageRecord {
                digest: Digest::of_bytes(b"manifest"),
                names: BTreeSet::from(["r/a:1".to_owned()]),
                config_digest: config.clone(),
                layers: vec![kept.clone()],
                config: ImageConfig::default(),
                size_bytes: 0,
                pulled_at_ms: 0,
            })
            .expect("record");
        let candidates = [config.clone(), kept.clone(), left.clone()];

        let pull = store.lock_for_pull().expect("lock");
        let error = store
            .discard_unreferenced(&candidates)
            .expect_err("a pull holds the store");
        assert!(matches!(error, Error::Busy { .. }), "{error}");
        assert!(
            store.blob_path(&left).exists(),
            "nothing removed while busy"
        );
        drop(pull);

        let removed = store.discard_unreferenced(&candidates).expect("discards");
        assert_eq!(removed, std::slice::from_ref(&left));
        assert!(!store.blob_path(&left).exists() && !unpacked.exists());
        assert!(store.blob_path(&config).exists() && store.blob_path(&kept).exists());
        assert_eq!(
            store.discard_unreferenced(&candidates).expect("again"),
            Vec::<Digest>::new(),
            "nothing left to discard"
        );
    }

    #[test]
    fn insecure_registries_are_validated() {
        let settings =
            crate::RegistrySettings::insecure(&["127.0.0.1:5000".to_owned()]).expect("valid");
        assert!(settings.registries["127.0.0.1:5000"].plain_http);
        let error = crate::RegistrySettings::insecure(&["http://r:5000".to_owned()])
            .expect_err("a URL is not a registry")
            .to_string();
        assert!(
            error.contains("invalid registry \"http://r:5000\""),
            "{error}"
        );
    }
}
