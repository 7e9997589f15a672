//! `cca server`'s flags for the keys of secret values, turned into a
//! `cca_api::SecretKey`: the primary key-encryption key (the key file,
//! created when absent, or a KMS key through `--secret-key-command`) and
//! the old ones still accepted during a rotation. Wiring only: the keys
//! themselves live in `cca_api::secrets`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_api::SecretKey;
use cca_api::secrets::{CommandProvider, LocalKey};
use cca_store::StoreUrl;
use clap::Args;

use crate::flags;

/// The keys that seal secret values (docs/secrets.md).
#[derive(Debug, Args)]
pub(crate) struct SecretKeyArgs {
    /// The cluster's key file (32 bytes, mode 0600, created when absent):
    /// wraps new secrets' data keys unless --secret-key-id names a KMS key.
    /// Every server of a cluster must use the same keys. Default:
    /// `secret.key` beside an embedded store's directory; required with
    /// etcd (unless --secret-key-id).
    #[arg(long, env = "CCA_SECRET_KEY_FILE", value_name = "PATH")]
    secret_key_file: Option<PathBuf>,
    /// An earlier key file, still accepted to open secrets until `cca
    /// secret rotate-key` has moved them to the primary key (repeatable;
    /// must exist).
    #[arg(long, value_name = "PATH")]
    old_secret_key_file: Vec<PathBuf>,
    /// A program that wraps and unwraps data keys with a KMS, run as
    /// `COMMAND wrap KEY_ID` / `COMMAND unwrap KEY_ID`, base64 in on stdin
    /// and out on stdout (words split at spaces, no quoting).
    #[arg(long, env = "CCA_SECRET_KEY_COMMAND", value_name = "COMMAND")]
    secret_key_command: Option<String>,
    /// The KMS key that wraps new data keys (through --secret-key-command)
    /// instead of a key file.
    #[arg(long, value_name = "KEY_ID", requires = "secret_key_command")]
    secret_key_id: Option<String>,
    /// An earlier KMS key, still accepted to open secrets until they are
    /// rotated (repeatable; through --secret-key-command).
    #[arg(long, value_name = "KEY_ID", requires = "secret_key_command")]
    old_secret_key_id: Vec<String>,
    /// How long one call of --secret-key-command may take.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = flags::duration)]
    secret_key_command_timeout: Duration,
}

impl SecretKeyArgs {
    /// The server's keys, checked: the primary seals and opens a probe.
    pub(crate) fn load(&self, store: &StoreUrl) -> Result<SecretKey> {
        let command = |id: &str| -> Result<CommandProvider> {
            let Some(command) = &self.secret_key_command else {
                bail!("--secret-key-id and --old-secret-key-id need --secret-key-command");
            };
            Ok(CommandProvider::new(
                command,
                id,
                self.secret_key_command_timeout,
            )?)
        };
        if self.secret_key_command.is_some()
            && self.secret_key_id.is_none()
            && self.old_secret_key_id.is_empty()
        {
            bail!(
                "--secret-key-command is given but no key of it: add --secret-key-id KEY_ID (the KMS key that wraps new secrets) or --old-secret-key-id KEY_ID"
            );
        }
        let mut keys = match &self.secret_key_id {
            Some(id) => {
                if let Some(path) = &self.secret_key_file {
                    bail!(
                        "--secret-key-id and --secret-key-file {} both name the primary key: pass the key file as --old-secret-key-file to move its secrets to the KMS key",
                        path.display()
                    );
                }
                SecretKey::new(command(id)?)
            }
            None => crate::server_cmd::load_secret_key(&self.key_file_path(store)?)?,
        };
        for path in &self.old_secret_key_file {
            let old = LocalKey::load(path)
                .with_context(|| format!("loading --old-secret-key-file {}", path.display()))?;
            keys = keys.accepting(old);
        }
        for id in &self.old_secret_key_id {
            keys = keys.accepting(command(id)?);
        }
        keys.check()
            .context("checking the primary secret key: it must seal and open a value")?;
        tracing::info!(
            primary = keys.id(),
            accepted = ?keys.accepted_ids(),
            "secret keys ready"
        );
        Ok(keys)
    }

    /// `cca readiness server`: whether the primary key would load, without
    /// creating one (a missing file beside an embedded store is created at
    /// start) and without calling a key command (it runs at start).
    pub(crate) fn readiness(&self, store: &StoreUrl) -> cca_agent::preflight::Check {
        use cca_agent::preflight::{Check, Verdict};
        const NAME: &str = "secret key";
        if let Some(id) = &self.secret_key_id {
            return Check::new(
                NAME,
                Verdict::Pass,
                format!("KMS key {id} through --secret-key-command (called at start)"),
            );
        }
        let path = match self.key_file_path(store) {
            Ok(path) => path,
            Err(error) => return Check::new(NAME, Verdict::Fail, format!("{error:#}")),
        };
        if !path.exists() {
            return match store {
                StoreUrl::Embedded(_) => Check::new(
                    NAME,
                    Verdict::Pass,
                    format!("{} will be created at start", path.display()),
                ),
                StoreUrl::Etcd(_) => Check::new(
                    NAME,
                    Verdict::Fail,
                    format!(
                        "{} does not exist: every server of an etcd cluster needs the same key file",
                        path.display()
                    ),
                ),
            };
        }
        match LocalKey::load(&path) {
            Ok(_) => Check::new(NAME, Verdict::Pass, format!("{} loads", path.display())),
            Err(error) => Check::new(NAME, Verdict::Fail, format!("{}: {error}", path.display())),
        }
    }

    /// Where the key file is: the flag, else beside an embedded store.
    fn key_file_path(&self, store: &StoreUrl) -> Result<PathBuf> {
        if let Some(path) = &self.secret_key_file {
            return Ok(path.clone());
        }
        match store {
            StoreUrl::Embedded(dir) => {
                let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
                Ok(parent.unwrap_or_else(|| Path::new(".")).join("secret.key"))
            }
            StoreUrl::Etcd(_) => bail!(
                "--secret-key-file (or --secret-key-command with --secret-key-id) is required with an etcd store: every server of the cluster must use the same key (create the file once with `head -c 32 /dev/urandom > secret.key; chmod 600 secret.key` and copy it to each server)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        keys: SecretKeyArgs,
    }

    fn load(dir: &Path, args: &[&str]) -> Result<SecretKey> {
        let cli = Cli::try_parse_from(std::iter::once("cca").chain(args.iter().copied()))?;
        cli.keys.load(&StoreUrl::Embedded(dir.join("store")))
    }

    #[test]
    fn flags_choose_the_primary_and_the_old_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let default = load(dir.path(), &[]).expect("created beside the store");
        assert!(dir.path().join("secret.key").exists());
        let new = dir.path().join("new.key");
        let old = dir.path().join("secret.key");
        let keys = load(
            dir.path(),
            &[
                "--secret-key-file",
                new.to_str().expect("utf-8"),
                "--old-secret-key-file",
                old.to_str().expect("utf-8"),
            ],
        )
        .expect("both");
        assert_ne!(keys.id(), default.id());
        assert_eq!(keys.accepted_ids()[1], default.id());

        let kms = dir.path().join("kms.sh");
        std::fs::write(&kms, "cat").expect("written");
        let command = format!("/bin/sh {}", kms.display());
        let keys = load(
            dir.path(),
            &[
                "--secret-key-command",
                &command,
                "--secret-key-id",
                "kek-1",
                "--old-secret-key-file",
                old.to_str().expect("utf-8"),
            ],
        )
        .expect("a KMS key primary");
        assert_eq!(keys.accepted_ids(), ["kek-1", default.id()]);

        let error = load(dir.path(), &["--secret-key-command", &command])
            .expect_err("no key id")
            .to_string();
        assert!(error.contains("--secret-key-id KEY_ID"), "{error}");
        let error = load(
            dir.path(),
            &[
                "--secret-key-command",
                &command,
                "--secret-key-id",
                "kek-1",
                "--secret-key-file",
                new.to_str().expect("utf-8"),
            ],
        )
        .expect_err("two primaries")
        .to_string();
        assert!(error.contains("--old-secret-key-file"), "{error}");
        let missing = dir.path().join("missing.key");
        let error = load(
            dir.path(),
            &["--old-secret-key-file", missing.to_str().expect("utf-8")],
        )
        .expect_err("missing old key");
        assert!(format!("{error:#}").contains("missing.key"), "{error:#}");
        assert!(load(dir.path(), &["--secret-key-id", "kek-1"]).is_err());

        // A KMS command that does not work fails the start.
        let broken = dir.path().join("broken.sh");
        std::fs::write(&broken, "echo 'no credentials' >&2; exit 1").expect("written");
        let error = load(
            dir.path(),
            &[
                "--secret-key-command",
                &format!("/bin/sh {}", broken.display()),
                "--secret-key-id",
                "kek-1",
            ],
        )
        .expect_err("broken KMS");
        assert!(format!("{error:#}").contains("no credentials"), "{error:#}");
    }
}
