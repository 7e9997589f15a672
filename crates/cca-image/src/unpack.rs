//! Unpacking one layer (a tar, gzip-compressed or not) into its own
//! directory in overlayfs form, so layers can be stacked as lowerdirs:
//! a whiteout `.wh.NAME` becomes a 0/0 character device `NAME`, an opaque
//! marker `.wh..wh..opq` becomes the `trusted.overlay.opaque=y` attribute on
//! its directory. No entry may land outside the directory: `..` components
//! are refused, and so is a path whose parent resolves (through a symlink
//! unpacked earlier) to somewhere outside it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, XattrFlags};

use crate::error::{IoContext, error_chain};
use crate::{Digest, Error, Result};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Unpacks the layer blob at `blob` into the existing empty directory
/// `target`. On error `target` holds part of the layer: the caller unpacks
/// into a temporary directory and discards it.
pub(crate) fn unpack_layer(digest: &Digest, blob: &Path, target: &Path) -> Result<()> {
    let fail = |reason: String| Error::Unpack {
        digest: digest.to_string(),
        reason,
    };
    let mut reader = BufReader::new(File::open(blob).on("opening", blob)?);
    let head = reader.fill_buf().on("reading", blob)?;
    if head.starts_with(&ZSTD_MAGIC) {
        return Err(fail("zstd-compressed layers are not supported yet".into()));
    }
    let tar_stream: Box<dyn Read> = if head.starts_with(&GZIP_MAGIC) {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    };
    let canonical_target = target.canonicalize().on("resolving", target)?;
    let mut archive = tar::Archive::new(tar_stream);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_overwrite(true);
    let entries = archive
        .entries()
        .map_err(|e| fail(format!("reading the tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| fail(format!("reading the tar stream: {e}")))?;
        let path = entry_path(&entry).map_err(&fail)?;
        unpack_entry(&mut entry, &path, &canonical_target).map_err(&fail)?;
    }
    Ok(())
}

/// The entry's path relative to the layer root; `..` is refused, leading
/// `/` and `./` are dropped.
fn entry_path<R: Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf, String> {
    let raw = entry.path().map_err(|e| format!("entry path: {e}"))?;
    let mut relative = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::ParentDir => {
                return Err(format!(
                    "entry {} escapes the layer with '..'",
                    raw.display()
                ));
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(relative)
}

fn unpack_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &Path,
    target: &Path,
) -> Result<(), String> {
    let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
        return Ok(()); // the root directory itself
    };
    let parent = safe_parent(target, path)?;
    if name == OPAQUE_MARKER {
        std::fs::create_dir_all(&parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        return rustix::fs::setxattr(&parent, "trusted.overlay.opaque", b"y", XattrFlags::empty())
            .map_err(|e| format!("marking {} opaque: {e}", parent.display()));
    }
    if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
        return write_whiteout(&parent.join(hidden));
    }
    let unpacked = entry
        .unpack_in(target)
        .map_err(|e| format!("unpacking {}: {}", path.display(), error_chain(&e)))?;
    if unpacked {
        Ok(())
    } else {
        Err(format!(
            "entry {} would be written outside the layer",
            path.display()
        ))
    }
}

/// The directory `path` goes into, created when missing, refused when it
/// resolves outside `target` (a symlink unpacked earlier pointing out).
fn safe_parent(target: &Path, path: &Path) -> Result<PathBuf, String> {
    let parent = target.join(path.parent().unwrap_or(Path::new("")));
    // The nearest existing ancestor decides: what does not exist yet is
    // created below it.
    let existing = parent.ancestors().find_map(|dir| dir.canonicalize().ok());
    if let Some(resolved) = existing
        && !resolved.starts_with(target)
    {
        return Err(format!(
            "entry {} would be written outside the layer (through a symlink to {})",
            path.display(),
            resolved.display()
        ));
    }
    Ok(parent)
}

/// Overlayfs hides a lower file behind a 0/0 character device.
fn write_whiteout(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        std::fs::remove_dir_all(path).map_err(|e| format!("replacing {}: {e}", path.display()))?;
    } else if path.symlink_metadata().is_ok() {
        std::fs::remove_file(path).map_err(|e| format!("replacing {}: {e}", path.display()))?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::CharacterDevice,
        Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .map_err(|e| format!("writing the whiteout {}: {e}", path.display()))
}
