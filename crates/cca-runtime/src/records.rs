//! What the process and oci runtimes share about their on-disk records:
//! each instance is a directory under the runtime's `instances/` holding
//! JSON records written atomically (temp file, rename), so a restarted
//! agent can read them back; a record that does not decode is reported
//! with its path, never skipped.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, InstanceStatus, Operation, Result};

/// Reads `dir/name` as JSON; a missing file is `None`.
pub(crate) fn read_json<T: DeserializeOwned>(
    id: &str,
    dir: &Path,
    name: &str,
    operation: Operation,
) -> Result<Option<T>> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(Error::io(
                id,
                operation,
                format!("reading {}", path.display()),
                error,
            ));
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| Error::Corrupt {
            id: id.to_owned(),
            operation,
            path,
            error: source,
        })
}

/// Writes `value` as JSON to `dir/name` atomically: a crash leaves either
/// the old record or the new one, never half of one.
pub(crate) fn write_json<T: Serialize>(
    id: &str,
    dir: &Path,
    name: &str,
    value: &T,
    operation: Operation,
) -> Result<()> {
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.tmp"));
    let json = serde_json::to_vec_pretty(value).map_err(|source| Error::Corrupt {
        id: id.to_owned(),
        operation,
        path: path.clone(),
        error: source,
    })?;
    let io_error = |what: &str, at: &Path, error| {
        Error::io(id, operation, format!("{what} {}", at.display()), error)
    };
    std::fs::write(&temporary, json).map_err(|e| io_error("writing", &temporary, e))?;
    std::fs::rename(&temporary, &path).map_err(|e| io_error("replacing", &path, e))
}

/// The status of every instance under `instances_dir`, in id order, as
/// `status` reads it; directories without an instance record (left by a
/// crash during create) are skipped.
pub(crate) fn list_instances(
    instances_dir: &Path,
    mut status: impl FnMut(&str) -> Result<InstanceStatus>,
) -> Result<Vec<InstanceStatus>> {
    let entries = std::fs::read_dir(instances_dir).map_err(|source| Error::RuntimeDir {
        path: instances_dir.to_path_buf(),
        error: source,
    })?;
    let mut ids: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect();
    ids.sort();
    let mut statuses = Vec::with_capacity(ids.len());
    for id in ids {
        match status(&id) {
            Ok(found) => statuses.push(found),
            Err(Error::NotFound { .. }) => {
                tracing::debug!(id, "skipping a directory without an instance record");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(statuses)
}
