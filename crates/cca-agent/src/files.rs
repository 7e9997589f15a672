//! An instance's secret and connection files: fetched from the API just
//! before the instance is created (`FileSource`, implemented by the API
//! client), written under `FILES/{instance}/` — `secrets/{name}` holding a
//! granted secret's value, `connections/{name}` a connection's URL;
//! directories 0700, files 0400, each written beside its place and renamed
//! into it — and removed with the instance. Image workloads get the two
//! directories bind-mounted read-only at `/run/secrets` and
//! `/run/connections`; every workload gets `CCA_SECRET_{NAME}_FILE` and
//! `CCA_CONNECTION_{NAME}_FILE` naming each file where it sees it. Contents
//! are never logged.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use cca_wire::types::{Assignment, InstanceFile};

/// Where the files of an instance come from.
#[async_trait::async_trait]
pub trait FileSource: Send + Sync + fmt::Debug {
    /// The files of instance `id` placed on `node`; the error says why
    /// they cannot be had (a secret without a value, the API away).
    async fn files(&self, node: &str, id: &str) -> Result<Vec<InstanceFile>, String>;
}

#[async_trait::async_trait]
impl FileSource for cca_wire::Client {
    async fn files(&self, node: &str, id: &str) -> Result<Vec<InstanceFile>, String> {
        self.instance_files(node, id)
            .await
            .map(|answer| answer.files)
            .map_err(|error| error.to_string())
    }
}

/// The kinds of file, each its own directory.
pub const KINDS: [(&str, &str); 2] = [("secrets", "SECRET"), ("connections", "CONNECTION")];

/// Whether an assignment's instance gets files: its service references a
/// connection or is granted a secret explicitly.
pub fn needed(assignment: &Assignment) -> bool {
    !assignment.secrets.is_empty()
        || assignment
            .spec
            .as_ref()
            .is_some_and(|spec| !spec.connections.is_empty())
}

/// `(kind, name)` of every file an assignment's instance gets, in the
/// order the API answers them.
pub fn expected(assignment: &Assignment) -> Vec<(&'static str, String)> {
    let connections = assignment
        .spec
        .iter()
        .flat_map(|spec| spec.connections.iter())
        .map(|name| ("connections", name.clone()));
    let secrets = assignment
        .secrets
        .iter()
        .map(|name| ("secrets", name.clone()));
    connections.chain(secrets).collect()
}

/// `CCA_SECRET_{NAME}_FILE` / `CCA_CONNECTION_{NAME}_FILE`: the name
/// upper-cased, other characters as `_`.
pub fn env_name(kind: &str, name: &str) -> String {
    let label = KINDS
        .iter()
        .find(|(dir, _)| *dir == kind)
        .map_or("FILE", |(_, label)| label);
    format!("CCA_{label}_{}_FILE", cca_runtime::env_name_part(name))
}

/// `FILES/{id}`.
pub fn instance_dir(root: &Path, id: &str) -> PathBuf {
    root.join(id)
}

/// Replaces the files of instance `id` with `files`. Each path must be
/// `secrets/NAME` or `connections/NAME`; anything else is refused.
pub fn write(root: &Path, id: &str, files: &[InstanceFile]) -> Result<(), String> {
    let dir = instance_dir(root, id);
    let failed = |what: &str, path: &Path, error: std::io::Error| {
        format!(
            "writing the instance's files: {what} {}: {error}",
            path.display()
        )
    };
    remove(root, id).map_err(|error| failed("cannot clear", &dir, error))?;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    for (kind, _) in KINDS {
        let sub = dir.join(kind);
        builder
            .create(&sub)
            .map_err(|error| failed("cannot create", &sub, error))?;
    }
    for file in files {
        let (kind, name) = file
            .path
            .split_once('/')
            .filter(|(kind, name)| KINDS.iter().any(|(dir, _)| dir == kind) && is_file_name(name))
            .ok_or_else(|| {
                format!(
                    "the API sent a file named {:?}, not secrets/NAME or connections/NAME",
                    file.path
                )
            })?;
        let path = dir.join(kind).join(name);
        let tmp = dir.join(kind).join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let written = (|| {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .open(&tmp)?;
            out.write_all(file.content.as_bytes())?;
            out.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if let Err(error) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(failed("cannot write", &path, error));
        }
    }
    Ok(())
}

/// Removes the files of instance `id` (nothing to do when there are none).
pub fn remove(root: &Path, id: &str) -> std::io::Result<()> {
    match std::fs::remove_dir_all(instance_dir(root, id)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

fn is_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_are_private_replaced_and_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let file = |path: &str, content: &str| InstanceFile {
            path: path.into(),
            content: content.into(),
        };
        write(
            root.path(),
            "web-1",
            &[file("secrets/tok", "a"), file("connections/db", "pg://x")],
        )
        .expect("write");
        let secret = root.path().join("web-1/secrets/tok");
        assert_eq!(std::fs::read_to_string(&secret).expect("read"), "a");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&secret), 0o400);
        assert_eq!(mode(&root.path().join("web-1")), 0o700);
        assert_eq!(mode(&root.path().join("web-1/connections")), 0o700);
        // A second write replaces the set: a file no longer sent goes.
        write(root.path(), "web-1", &[file("secrets/tok", "b")]).expect("rewrite");
        assert_eq!(std::fs::read_to_string(&secret).expect("read"), "b");
        assert!(!root.path().join("web-1/connections/db").exists());
        let error = write(root.path(), "web-1", &[file("../etc/passwd", "x")]).expect_err("bad");
        assert!(error.contains("not secrets/NAME"), "{error}");
        remove(root.path(), "web-1").expect("remove");
        assert!(!root.path().join("web-1").exists());
        remove(root.path(), "web-1").expect("nothing to remove");
        assert_eq!(env_name("secrets", "db-pass"), "CCA_SECRET_DB_PASS_FILE");
        assert_eq!(
            env_name("connections", "app_db"),
            "CCA_CONNECTION_APP_DB_FILE"
        );
    }
}
