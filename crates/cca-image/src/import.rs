//! Importing an image from a file instead of a registry
//! ([`ImageStore::import`]): an OCI image layout (a directory, or a tar of
//! one, gzip-compressed or not) or a `docker save` archive (`manifest.json`,
//! a config, one uncompressed tar per layer).
//!
//! Every blob is verified: OCI blobs against their descriptors' digests,
//! docker-save layers against the config's diff ids (the digest of the
//! uncompressed tar, which becomes the layer's blob digest; the image's
//! identity is the digest of an OCI manifest made for it). Blobs and layers
//! go through the store's own paths — [`ImageStore::commit_blob`] and
//! [`ImageStore::unpack_layer`], as a pull's — and the record is saved last,
//! so a failed import leaves nothing a reader would find (unreferenced blobs
//! go with the next gc). A tar archive is extracted under the store's
//! `tmp/` first; entries with `..` or absolute paths, and links pointing
//! out of the archive, are refused.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::IoContext;
use crate::{Digest, Error, ImageConfig, ImageRecord, ImageRef, ImageStore, Result};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const TAR_BLOCK: usize = 512;
/// `ustar` at this offset of a tar header (POSIX and GNU tars).
const USTAR_OFFSET: usize = 257;
/// Links followed at most when resolving an archive name.
const MAX_LINKS: usize = 16;
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

impl ImageStore {
    /// Imports the image in `path` (an OCI layout directory or tar, or a
    /// `docker save` tar) and records it under `name` when given, else
    /// under the names the archive gives (the OCI
    /// `org.opencontainers.image.ref.name` / `io.containerd.image.name`
    /// annotations, docker's `RepoTags`), each also as `name@digest`. Holds
    /// the pull lock throughout, so no garbage collection runs meanwhile.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<ImageRecord> {
        let name = name.map(str::parse::<ImageRef>).transpose()?;
        let _lock = self.lock_for_pull()?;
        let source = Source::open(self, path)?;
        let importer = Importer {
            store: self,
            path,
            source,
        };
        let parsed = if importer.source.exists("index.json") {
            importer.oci_layout()?
        } else if importer.source.exists("manifest.json") {
            importer.docker_save()?
        } else {
            return Err(importer.fail(
                "neither an OCI image layout (no index.json) nor a docker-save archive \
                 (no manifest.json)",
            ));
        };
        importer.store_image(parsed, name)
    }
}

/// What an archive says the image is, its blobs verified where read.
struct Parsed {
    digest: Digest,
    config_digest: Digest,
    config_json: Vec<u8>,
    /// Layer blob digests, base first, with their names in the archive.
    layers: Vec<(Digest, String)>,
    /// References the archive gives, as written.
    names: Vec<String>,
}

struct Importer<'a> {
    store: &'a ImageStore,
    path: &'a Path,
    source: Source,
}

impl Importer<'_> {
    fn fail(&self, reason: impl Into<String>) -> Error {
        Error::Import {
            path: self.path.to_owned(),
            reason: reason.into(),
        }
    }

    fn what(&self, blob: &str) -> String {
        format!("import {}: {blob}", self.path.display())
    }

    /// An OCI layout: `index.json` names the manifest (through one nested
    /// index at most), blobs are `blobs/sha256/{hex}`.
    fn oci_layout(&self) -> Result<Parsed> {
        let index = self.json(&self.read("index.json")?, "index.json")?;
        let top = self.select(&index, "index.json")?;
        let annotations = top.get("annotations");
        let names: Vec<String> = [
            "io.containerd.image.name",
            "org.opencontainers.image.ref.name",
        ]
        .iter()
        .find_map(|key| annotations?.get(*key)?.as_str())
        .map(|name| vec![name.to_owned()])
        .unwrap_or_default();
        let mut descriptor = top;
        let mut nested = 0;
        while INDEX_TYPES.contains(&descriptor["mediaType"].as_str().unwrap_or_default()) {
            nested += 1;
            if nested > 1 {
                return Err(self.fail("image indexes nested more than one deep"));
            }
            let (digest, bytes) = self.blob(&descriptor, "image index")?;
            let index = self.json(&bytes, &format!("image index {digest}"))?;
            descriptor = self.select(&index, &format!("image index {digest}"))?;
        }
        let (digest, manifest_json) = self.blob(&descriptor, "manifest")?;
        let manifest = self.json(&manifest_json, &format!("manifest {digest}"))?;
        let (config_digest, config_json) = self.blob(&manifest["config"], "config")?;
        let mut layers = Vec::new();
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            let layer_digest = self.descriptor_digest(layer, "layer")?;
            let file = format!("blobs/sha256/{}", layer_digest.hex());
            if !self.source.exists(&file) {
                return Err(self.fail(format!("layer {layer_digest}: missing blob {file}")));
            }
            layers.push((layer_digest, file));
        }
        let names = if names.is_empty() {
            self.docker_names()?
        } else {
            names
        };
        Ok(Parsed {
            digest,
            config_digest,
            config_json,
            layers,
            names,
        })
    }

    /// The one manifest descriptor of an index: the only one, else the one
    /// for linux/this architecture.
    fn select(&self, index: &Value, what: &str) -> Result<Value> {
        let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
        let arch = crate::node_architecture();
        let candidates: Vec<Value> = if manifests.len() <= 1 {
            manifests
        } else {
            manifests
                .into_iter()
                .filter(|m| {
                    m["platform"]["os"].as_str() == Some("linux")
                        && m["platform"]["architecture"].as_str() == Some(arch)
                })
                .collect()
        };
        match <[Value; 1]>::try_from(candidates) {
            Ok([one]) => Ok(one),
            Err(candidates) if candidates.is_empty() => {
                Err(self.fail(format!("{what} lists no image for linux/{arch}")))
            }
            Err(candidates) => Err(self.fail(format!(
                "{what} lists {} images for linux/{arch}; import takes one",
                candidates.len()
            ))),
        }
    }

    /// A `docker save` archive: `manifest.json` lists the config and the
    /// layer tars, whose digests must be the config's diff ids.
    fn docker_save(&self) -> Result<Parsed> {
        let manifests = self.json(&self.read("manifest.json")?, "manifest.json")?;
        let entry = match manifests.as_array().map(Vec::as_slice) {
            Some([one]) => one.clone(),
            Some(many) if many.len() > 1 => {
                return Err(self.fail(format!(
                    "manifest.json lists {} images; import takes one",
                    many.len()
                )));
            }
            _ => return Err(self.fail("manifest.json lists no image")),
        };
        let config_file = entry["Config"]
            .as_str()
            .ok_or_else(|| self.fail("manifest.json gives no Config"))?;
        let config_json = self.read(config_file)?;
        let config_digest = Digest::of_bytes(&config_json);
        // The config's file name is its digest (`HEX.json`, `blobs/sha256/HEX`).
        let named = config_file.rsplit('/').next().unwrap_or_default();
        let named = named.strip_suffix(".json").unwrap_or(named);
        if let Ok(expected) = format!("sha256:{named}").parse::<Digest>()
            && expected != config_digest
        {
            return Err(Error::DigestMismatch {
                what: self.what(&format!("config {config_file}")),
                expected: expected.to_string(),
                actual: config_digest.to_string(),
            });
        }
        let config = self.json(&config_json, config_file)?;
        let diff_ids: Vec<&str> = config["rootfs"]["diff_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let files: Vec<&str> = entry["Layers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if files.len() != diff_ids.len() {
            return Err(self.fail(format!(
                "manifest.json lists {} layers, config {config_file} {} diff ids",
                files.len(),
                diff_ids.len()
            )));
        }
        let mut layers = Vec::new();
        let mut descriptors = Vec::new();
        for (file, diff_id) in files.into_iter().zip(diff_ids) {
            let expected = diff_id.parse::<Digest>()?;
            let local = self.source.file(file).map_err(|reason| self.fail(reason))?;
            let actual = Digest::of_file(&local)?;
            if actual != expected {
                return Err(Error::DigestMismatch {
                    what: self.what(&format!("layer {file}")),
                    expected: expected.to_string(),
                    actual: actual.to_string(),
                });
            }
            let size = local.metadata().on("reading", &local)?.len();
            descriptors.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": expected.to_string(), "size": size,
            }));
            layers.push((expected, file.to_owned()));
        }
        // The image's identity: an OCI manifest of the same config and layers.
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest.to_string(), "size": config_json.len(),
            },
            "layers": descriptors,
        });
        let digest = Digest::of_bytes(manifest.to_string().as_bytes());
        Ok(Parsed {
            digest,
            config_digest,
            config_json,
            layers,
            names: self.docker_names()?,
        })
    }

    /// docker's `RepoTags` from `manifest.json`, when the archive has one.
    fn docker_names(&self) -> Result<Vec<String>> {
        if !self.source.exists("manifest.json") {
            return Ok(Vec::new());
        }
        let manifests = self.json(&self.read("manifest.json")?, "manifest.json")?;
        Ok(manifests
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|entry| entry["RepoTags"].as_array().cloned().unwrap_or_default())
            .filter_map(|tag| tag.as_str().map(str::to_owned))
            .collect())
    }

    /// Stores the config and layers (verified again by the store, layers
    /// unpacked) and saves the record.
    fn store_image(&self, parsed: Parsed, name: Option<ImageRef>) -> Result<ImageRecord> {
        let references = match name {
            Some(name) => vec![name],
            None if parsed.names.is_empty() => {
                return Err(self.fail(
                    "the archive names no image (no org.opencontainers.image.ref.name \
                     annotation or RepoTags); give one with --name",
                ));
            }
            None => parsed
                .names
                .iter()
                .map(|name| {
                    name.parse::<ImageRef>().map_err(|e| {
                        self.fail(format!(
                            "the archive's name {name:?}: {e}; give one with --name"
                        ))
                    })
                })
                .collect::<Result<_>>()?,
        };
        let label = references
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        let config =
            ImageConfig::from_json(&parsed.config_json).map_err(|source| Error::Config {
                image: label.clone(),
                digest: parsed.config_digest.to_string(),
                error: source,
            })?;
        crate::pull::check_platform(&label, &config)?;
        self.store.put_blob(
            &parsed.config_digest,
            &parsed.config_json,
            &self.what("config"),
        )?;
        let mut size_bytes = 0;
        for (digest, file) in &parsed.layers {
            let local = self.source.file(file).map_err(|reason| self.fail(reason))?;
            size_bytes += local.metadata().on("reading", &local)?.len();
            if !self.store.blob_path(digest).exists() {
                let mut temp = self.store.temp_file()?;
                let mut input = File::open(&local).on("opening", &local)?;
                std::io::copy(&mut input, temp.as_file_mut()).on("copying", &local)?;
                self.store
                    .commit_blob(temp, digest, &self.what(&format!("layer {file}")))?;
            }
            self.store.unpack_layer(digest)?;
        }
        let names = references
            .iter()
            .flat_map(|r| [r.clone(), r.with_digest(parsed.digest.clone())])
            .map(|r| r.to_string())
            .collect();
        let record = ImageRecord {
            digest: parsed.digest,
            names,
            config_digest: parsed.config_digest,
            layers: parsed.layers.into_iter().map(|(d, _)| d).collect(),
            config,
            size_bytes,
            pulled_at_ms: cca_model::clock::now_millis(),
        };
        tracing::info!(file = %self.path.display(), digest = %record.digest, "imported image");
        self.store.save_image(record)
    }

    /// The digest a descriptor names.
    fn descriptor_digest(&self, descriptor: &Value, what: &str) -> Result<Digest> {
        descriptor["digest"]
            .as_str()
            .ok_or_else(|| self.fail(format!("a {what} descriptor without a digest")))?
            .parse()
    }

    /// The bytes of the blob a descriptor names, verified.
    fn blob(&self, descriptor: &Value, what: &str) -> Result<(Digest, Vec<u8>)> {
        let digest = self.descriptor_digest(descriptor, what)?;
        let file = format!("blobs/sha256/{}", digest.hex());
        if !self.source.exists(&file) {
            return Err(self.fail(format!("{what} {digest}: missing blob {file}")));
        }
        let bytes = self.read(&file)?;
        let actual = Digest::of_bytes(&bytes);
        if actual != digest {
            return Err(Error::DigestMismatch {
                what: self.what(what),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok((digest, bytes))
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let local = self.source.file(name).map_err(|reason| self.fail(reason))?;
        std::fs::read(&local).on("reading", local)
    }

    fn json(&self, bytes: &[u8], what: &str) -> Result<Value> {
        serde_json::from_slice(bytes)
            .map_err(|e| self.fail(format!("{what} is not valid JSON: {e}")))
    }
}

/// The archive's files by name: a directory, or a tar extracted under the
/// store's `tmp/` (removed when dropped).
enum Source {
    Dir(PathBuf),
    Tar {
        files: HashMap<String, PathBuf>,
        _staging: tempfile::TempDir,
    },
}

impl Source {
    fn open(store: &ImageStore, path: &Path) -> Result<Self> {
        let fail = |reason: String| Error::Import {
            path: path.to_owned(),
            reason,
        };
        let metadata = std::fs::metadata(path).on("reading", path)?;
        if metadata.is_dir() {
            return Ok(Self::Dir(path.to_owned()));
        }
        let mut reader = BufReader::new(File::open(path).on("opening", path)?);
        let head = reader.fill_buf().on("reading", path)?;
        let stream: Box<dyn Read> = if head.starts_with(&GZIP_MAGIC) {
            Box::new(flate2::read::GzDecoder::new(reader))
        } else if head.len() >= TAR_BLOCK && &head[USTAR_OFFSET..USTAR_OFFSET + 5] == b"ustar" {
            Box::new(reader)
        } else {
            return Err(fail(
                "not a tar archive or an OCI layout directory (docker save and OCI layout \
                 archives are tars)"
                    .into(),
            ));
        };
        let staging = tempfile::TempDir::new_in(store.root().join("tmp"))
            .on("creating a directory in", store.root().join("tmp"))?;
        let mut files = HashMap::new();
        let mut links = HashMap::new();
        let mut archive = tar::Archive::new(stream);
        let entries = archive
            .entries()
            .map_err(|e| fail(format!("reading the tar: {e}")))?;
        for (count, entry) in entries.enumerate() {
            let mut entry = entry.map_err(|e| fail(format!("reading the tar: {e}")))?;
            let raw = entry
                .path()
                .map_err(|e| fail(format!("reading the tar: {e}")))?
                .to_string_lossy()
                .into_owned();
            let name = normalize(&raw, &[])
                .filter(|_| !raw.split('/').any(|part| part == ".."))
                .ok_or_else(|| {
                    fail(format!(
                        "entry {raw:?} escapes the archive (path traversal)"
                    ))
                })?;
            let kind = entry.header().entry_type();
            if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name()
                    .map_err(|e| fail(format!("reading the tar: {e}")))?
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                // Symlinks are relative to their directory, hard links to the root.
                let base: Vec<&str> = if kind.is_symlink() {
                    let mut dir: Vec<&str> = name.split('/').collect();
                    dir.pop();
                    dir
                } else {
                    Vec::new()
                };
                let resolved = normalize(&target, &base).filter(|_| !target.starts_with('/'));
                let resolved = resolved.ok_or_else(|| {
                    fail(format!(
                        "entry {raw:?} links to {target:?}, outside the archive (path traversal)"
                    ))
                })?;
                links.insert(name, resolved);
            } else if kind.is_file() {
                let local = staging.path().join(count.to_string());
                let mut out = File::create(&local).on("creating", &local)?;
                std::io::copy(&mut entry, &mut out)
                    .map_err(|e| fail(format!("reading entry {raw:?}: {e}")))?;
                files.insert(name, local);
            }
        }
        // Links to links resolve over successive rounds; what is left
        // points at nothing in the archive and stays missing.
        for _ in 0..MAX_LINKS {
            let resolved: Vec<(String, PathBuf)> = links
                .iter()
                .filter_map(|(name, target)| Some((name.clone(), files.get(target)?.clone())))
                .collect();
            if resolved.is_empty() {
                break;
            }
            for (name, local) in resolved {
                links.remove(&name);
                files.insert(name, local);
            }
        }
        Ok(Self::Tar {
            files,
            _staging: staging,
        })
    }

    fn exists(&self, name: &str) -> bool {
        self.file(name).is_ok()
    }

    /// The local file holding the archive's `name`, or why there is none.
    fn file(&self, name: &str) -> Result<PathBuf, String> {
        let normal = normalize(name, &[])
            .ok_or_else(|| format!("{name:?} escapes the archive (path traversal)"))?;
        match self {
            Self::Dir(dir) => {
                let path = dir.join(&normal);
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!("missing {normal}"))
                }
            }
            Self::Tar { files, .. } => files
                .get(&normal)
                .cloned()
                .ok_or_else(|| format!("missing {normal}")),
        }
    }
}

/// `name` relative to the archive root, starting from the directory
/// `base`: `.` and empty components dropped, `..` going up, `None` when
/// it would leave the root.
fn normalize(name: &str, base: &[&str]) -> Option<String> {
    let mut parts: Vec<&str> = base.to_vec();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}
