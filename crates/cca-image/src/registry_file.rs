//! Registry settings from a file (`cca agent --registry-config FILE`,
//! `cca image pull --registry-config FILE`), so credentials never go on a
//! command line: a JSON object whose `registries` map each registry host,
//! as written in image references, to `insecure` (plain HTTP), `username`
//! and `password_file` (a path, relative to the file's directory; one
//! trailing newline dropped) or `password`. Everything is checked when
//! the file is read — unknown keys, a username without a password, a
//! password file that cannot be read — and each error names the file, the
//! line or the field, and what to do. Group- or world-readable secrets
//! (and credentials for a plain-HTTP registry) are warnings, returned for
//! the caller to show.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{RegistryConfig, RegistrySettings};

/// Why a registry config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryFileError {
    #[error("registry config {}: cannot read it: {error} (check the path and its permissions)", path.display())]
    Read {
        path: PathBuf,
        /// Not a `#[source]`: the message carries it, once.
        error: std::io::Error,
    },

    /// Not JSON, or not the expected shape (an unknown key, a wrong type);
    /// `message` carries serde_json's line and column.
    #[error("registry config {}: {message} ({hint})", path.display())]
    Parse {
        path: PathBuf,
        message: String,
        hint: &'static str,
    },

    /// A registry's settings do not make sense together, or its password
    /// file cannot be used.
    #[error("registry config {}: {field}: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        /// Where in the file, e.g. `registries."r.example.com".password_file`.
        field: String,
        /// What is wrong and what to do.
        reason: String,
    },
}

/// Settings read from a registry config file, with what deserves a
/// warning (shown by the caller: it is not an error).
#[derive(Clone, Debug, Default)]
pub struct LoadedRegistrySettings {
    pub settings: RegistrySettings,
    pub warnings: Vec<String>,
}

/// The file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    registries: BTreeMap<String, RawRegistry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    #[serde(default)]
    insecure: bool,
    username: Option<String>,
    password: Option<String>,
    password_file: Option<PathBuf>,
}

/// The permission bits that let group or others read a file.
const SHARED_READ: u32 = 0o044;

impl RegistrySettings {
    /// Reads and checks a registry config file (see the module docs for
    /// the format).
    pub fn load(path: &Path) -> Result<LoadedRegistrySettings, RegistryFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| RegistryFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let (mut loaded, inline_passwords) = parse(&text, path)?;
        if inline_passwords && let Some(mode) = shared_mode(path) {
            loaded.warnings.insert(
                0,
                format!(
                    "registry config {}: holds passwords and is readable by others (mode {mode:o}): \
                     chmod 600 it, or use password_file",
                    path.display()
                ),
            );
        }
        Ok(loaded)
    }

    /// Checks `text` as the contents of the registry config file at
    /// `path` (which names it in errors and anchors relative
    /// `password_file`s). Password files are read; the file's own
    /// permissions are [`RegistrySettings::load`]'s to check.
    pub fn parse_file(
        text: &str,
        path: &Path,
    ) -> Result<LoadedRegistrySettings, RegistryFileError> {
        parse(text, path).map(|(loaded, _)| loaded)
    }

    /// Allows plain HTTP to each of `registries` (`--insecure-registry`),
    /// keeping any credentials configured for them; refuses a registry
    /// that is not `HOST[:PORT]`.
    pub fn allow_plain_http(&mut self, registries: &[String]) -> crate::Result<()> {
        let insecure = Self::insecure(registries)?;
        for host in insecure.registries.into_keys() {
            self.registries.entry(host).or_default().plain_http = true;
        }
        Ok(())
    }
}

/// The settings in `text`, and whether a password is written in it rather
/// than in a password file.
fn parse(text: &str, path: &Path) -> Result<(LoadedRegistrySettings, bool), RegistryFileError> {
    let raw: RawFile = serde_json::from_str(text).map_err(|error| {
        let hint = match error.classify() {
            serde_json::error::Category::Syntax => "fix the JSON syntax there",
            serde_json::error::Category::Eof => {
                "the JSON ends early: is the file complete? An empty config is `{}`"
            }
            serde_json::error::Category::Data => {
                "expected {\"registries\": {\"HOST[:PORT]\": {\"insecure\": BOOL, \
                 \"username\": TEXT, \"password_file\": PATH or \"password\": TEXT}}}"
            }
            serde_json::error::Category::Io => "check the file",
        };
        RegistryFileError::Parse {
            path: path.to_owned(),
            message: error.to_string(),
            hint,
        }
    })?;
    let inline_passwords = raw
        .registries
        .values()
        .any(|registry| registry.password.is_some());
    let base = path.parent().unwrap_or(Path::new(""));
    let mut loaded = LoadedRegistrySettings::default();
    for (host, registry) in raw.registries {
        let config = check_registry(path, base, &host, registry, &mut loaded.warnings)?;
        loaded.settings.registries.insert(host, config);
    }
    Ok((loaded, inline_passwords))
}

fn check_registry(
    path: &Path,
    base: &Path,
    host: &str,
    registry: RawRegistry,
    warnings: &mut Vec<String>,
) -> Result<RegistryConfig, RegistryFileError> {
    let invalid = |field: &str, reason: String| RegistryFileError::Invalid {
        path: path.to_owned(),
        field: if field.is_empty() {
            format!("registries.{host:?}")
        } else {
            format!("registries.{host:?}.{field}")
        },
        reason,
    };
    crate::reference::validate_registry(host).map_err(|reason| {
        invalid(
            "",
            format!(
                "{reason}: key each registry by HOST or HOST:PORT as written in image \
                 references (no scheme, no path)"
            ),
        )
    })?;
    let password = match (registry.password, registry.password_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "password",
                "both password and password_file are set: keep one (password_file keeps the \
                 secret out of this file)"
                    .into(),
            ));
        }
        (Some(password), None) => Some(password),
        (None, Some(file)) => Some(
            read_password_file(&base.join(file), warnings)
                .map_err(|reason| invalid("password_file", reason))?,
        ),
        (None, None) => None,
    };
    match (&registry.username, &password) {
        (Some(username), _) if username.is_empty() => {
            return Err(invalid(
                "username",
                "is empty: give the user name, or remove username and the password for \
                 anonymous access"
                    .into(),
            ));
        }
        (Some(_), None) => {
            return Err(invalid(
                "",
                "username without a password: add password_file (a file holding the password) \
                 or password"
                    .into(),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "",
                "a password without username: add username, or remove the password for \
                 anonymous access"
                    .into(),
            ));
        }
        (Some(_), Some(password)) if password.is_empty() => {
            return Err(invalid(
                "password",
                "is empty: give the registry's password (or remove username for anonymous \
                 access)"
                    .into(),
            ));
        }
        _ => {}
    }
    if registry.insecure && password.is_some() {
        warnings.push(format!(
            "registry config {}: registries.{host:?}: credentials for a plain-HTTP registry \
             cross the network readable by anyone on the way: use HTTPS (remove insecure) \
             where you can",
            path.display()
        ));
    }
    Ok(RegistryConfig {
        plain_http: registry.insecure,
        username: registry.username,
        password,
    })
}

/// The password in `file` (one trailing newline dropped), warning when
/// others may read it; the error says what to do.
fn read_password_file(file: &Path, warnings: &mut Vec<String>) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|error| {
        format!(
            "cannot read {}: {error}: check the path (relative paths start at the config \
             file's directory) and that the agent's user may read it",
            file.display()
        )
    })?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(format!(
            "{} is empty: write the registry's password into it",
            file.display()
        ));
    }
    if let Some(mode) = shared_mode(file) {
        warnings.push(format!(
            "password file {} is readable by others (mode {mode:o}): chmod 600 it",
            file.display()
        ));
    }
    Ok(password.to_owned())
}

/// The file's permission bits when group or others may read it.
fn shared_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & SHARED_READ != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A config file with `text` (mode 600) in a fresh directory.
    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("registries.json");
        write(&path, text, 0o600);
        (dir, path)
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn error(text: &str) -> String {
        let (_dir, path) = file(text);
        RegistrySettings::load(&path)
            .expect_err("the config is refused")
            .to_string()
    }

    fn assert_mentions(message: &str, parts: &[&str]) {
        for part in parts {
            assert!(message.contains(part), "{message:?} lacks {part:?}");
        }
    }

    #[test]
    fn credentials_from_a_password_file_and_plain_http_are_read() {
        let (dir, path) = file(
            r#"{"registries": {
                "registry.example.com": {"username": "ci", "password_file": "secret"},
                "10.0.0.5:5000": {"insecure": true},
                "r.example.org": {"username": "bot", "password": "inline"}
            }}"#,
        );
        write(&dir.path().join("secret"), "s3cret pass\n", 0o600);
        let loaded = RegistrySettings::load(&path).expect("the config loads");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let registries = &loaded.settings.registries;
        let example = &registries["registry.example.com"];
        assert!(!example.plain_http);
        assert_eq!(example.username.as_deref(), Some("ci"));
        assert_eq!(example.password.as_deref(), Some("s3cret pass"));
        let local = &registries["10.0.0.5:5000"];
        assert!(local.plain_http);
        assert_eq!(
            (local.username.clone(), local.password.clone()),
            (None, None)
        );
        assert_eq!(
            registries["r.example.org"].password.as_deref(),
            Some("inline")
        );
    }

    #[test]
    fn an_empty_config_and_an_absolute_password_file_work() {
        let (_dir, path) = file("{}");
        let loaded = RegistrySettings::load(&path).expect("an empty config loads");
        assert!(loaded.settings.registries.is_empty());

        let secrets = tempfile::tempdir().expect("tempdir");
        let secret = secrets.path().join("pw");
        write(&secret, "pw\r\n", 0o400);
        let text = format!(
            r#"{{"registries": {{"r.io": {{"username": "u", "password_file": {:?}}}}}}}"#,
            secret.display().to_string()
        );
        let (_dir, path) = file(&text);
        let loaded = RegistrySettings::load(&path).expect("loads");
        assert_eq!(
            loaded.settings.registries["r.io"].password.as_deref(),
            Some("pw")
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_the_line_and_the_keys_allowed() {
        let message = error(
            "{\"registries\": {\n  \"r.io\": {\n    \"username\": \"u\",\n    \"passwd\": \"x\"\n  }\n}}",
        );
        assert_mentions(
            &message,
            &[
                "registries.json",
                "unknown field `passwd`",
                "password_file",
                "line 4",
            ],
        );
        let message = error(r#"{"registry": {}}"#);
        assert_mentions(
            &message,
            &["unknown field `registry`", "expected `registries`"],
        );
    }

    #[test]
    fn bad_json_and_wrong_types_say_where() {
        assert_mentions(
            &error("{\"registries\": {\n\"r.io\": {\"insecure\": yes}}}"),
            &["registries.json", "line 2", "fix the JSON syntax there"],
        );
        assert_mentions(
            &error(r#"{"registries": {"r.io": {"insecure": "true"}}}"#),
            &["invalid type: string", "expected a boolean", "line 1"],
        );
        assert_mentions(&error(""), &["ends early", "An empty config is `{}`"]);
    }

    #[test]
    fn incomplete_or_contradictory_credentials_are_refused_naming_the_field() {
        assert_mentions(
            &error(r#"{"registries": {"r.io": {"username": "u"}}}"#),
            &[
                "registries.json",
                "registries.\"r.io\"",
                "username without a password",
                "add password_file",
            ],
        );
        assert_mentions(
            &error(r#"{"registries": {"r.io": {"password": "p"}}}"#),
            &["registries.\"r.io\"", "without username"],
        );
        assert_mentions(
            &error(
                r#"{"registries": {"r.io": {"username": "u", "password": "p", "password_file": "f"}}}"#,
            ),
            &["registries.\"r.io\".password", "keep one"],
        );
        assert_mentions(
            &error(r#"{"registries": {"r.io": {"username": "", "password": "p"}}}"#),
            &["registries.\"r.io\".username", "is empty"],
        );
        assert_mentions(
            &error(r#"{"registries": {"r.io": {"username": "u", "password": ""}}}"#),
            &["registries.\"r.io\".password", "is empty"],
        );
    }

    #[test]
    fn a_registry_key_must_be_a_host_as_in_references() {
        assert_mentions(
            &error(r#"{"registries": {"https://r.io": {"insecure": true}}}"#),
            &["registries.\"https://r.io\"", "HOST:PORT", "no scheme"],
        );
        assert_mentions(
            &error(r#"{"registries": {"r.io:99999": {}}}"#),
            &["registries.\"r.io:99999\"", "port"],
        );
    }

    #[test]
    fn password_files_that_cannot_be_used_are_refused() {
        let message =
            error(r#"{"registries": {"r.io": {"username": "u", "password_file": "missing"}}}"#);
        assert_mentions(
            &message,
            &[
                "registries.\"r.io\".password_file",
                "cannot read",
                "missing",
                "No such file",
            ],
        );
        let (dir, path) =
            file(r#"{"registries": {"r.io": {"username": "u", "password_file": "pw"}}}"#);
        write(&dir.path().join("pw"), "\n", 0o600);
        let message = RegistrySettings::load(&path)
            .expect_err("refused")
            .to_string();
        assert_mentions(&message, &["password_file", "is empty"]);
    }

    #[test]
    fn a_missing_config_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope.json");
        let message = RegistrySettings::load(&path)
            .expect_err("refused")
            .to_string();
        assert_mentions(
            &message,
            &["registry config", "nope.json", "cannot read it"],
        );
    }

    #[test]
    fn secrets_readable_by_others_and_credentials_over_plain_http_are_warnings() {
        let (dir, path) = file(
            r#"{"registries": {
                "a.io": {"username": "u", "password": "p"},
                "b.io": {"username": "u", "password_file": "pw"},
                "c.io:5000": {"insecure": true, "username": "u", "password": "p"}
            }}"#,
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write(&dir.path().join("pw"), "p", 0o640);
        let loaded = RegistrySettings::load(&path).expect("warnings do not refuse it");
        let warnings = loaded.warnings.join("\n");
        assert_eq!(loaded.warnings.len(), 3, "{warnings}");
        assert_mentions(
            &warnings,
            &[
                "holds passwords and is readable by others (mode 644)",
                "password file",
                "(mode 640): chmod 600 it",
                "registries.\"c.io:5000\": credentials for a plain-HTTP registry",
            ],
        );
    }

    #[test]
    fn a_readable_config_without_inline_passwords_is_no_warning() {
        let (dir, path) =
            file(r#"{"registries": {"r.io": {"username": "u", "password_file": "pw"}}}"#);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write(&dir.path().join("pw"), "p", 0o600);
        let loaded = RegistrySettings::load(&path).expect("loads");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }

    #[test]
    fn insecure_registries_are_added_to_loaded_settings_keeping_credentials() {
        let (_dir, path) =
            file(r#"{"registries": {"r.io:5000": {"username": "u", "password": "p"}}}"#);
        let mut settings = RegistrySettings::load(&path).expect("loads").settings;
        settings
            .allow_plain_http(&["r.io:5000".to_owned(), "other:1".to_owned()])
            .expect("valid hosts");
        let config = &settings.registries["r.io:5000"];
        assert!(config.plain_http);
        assert_eq!(config.password.as_deref(), Some("p"));
        assert!(settings.registries["other:1"].plain_http);
        let refused = settings.allow_plain_http(&["http://x".to_owned()]);
        assert!(refused.is_err());
    }
}
