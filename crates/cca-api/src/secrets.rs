//! Secret values at rest and in use, by envelope encryption: each value
//! is sealed with its own random 256-bit data key (AES-256-GCM from
//! `aws-lc-rs`, a random 96-bit nonce, the secret's name as associated data
//! so a record copied under another name is refused), and that data key is
//! wrapped by a key-encryption key (KEK) from a [`KeyProvider`]: the local
//! key file ([`LocalKey`], 32 bytes, 0600, created on first start) or an
//! external command ([`CommandProvider`], for a KMS). The record at
//! `desired/secret/{name}` ([`SealedSecret`], format 2) holds the wrapped
//! data key and the KEK's id. [`SecretKey`] is the server's set of KEKs:
//! the primary that wraps every new data key and the old ones still
//! accepted for unwrapping, so a rotation ([`SecretKey::rewrap`]) never
//! stops reads. Records of format 1 (the value directly under the key
//! file's key, written by older servers) still open with that key file and
//! are converted by a rotation. Also `connection_url`, a connection's URL
//! with its secret as the password. Nothing here logs or prints a value or
//! a key: every type holding one has a redacted `Debug`.

mod command;
mod envelope;
mod local;

use std::fmt;
use std::path::PathBuf;

use cca_model::spec::ConnectionSpec;

pub use cca_model::spec::SealedSecret;
pub use command::{
    CommandOutput, CommandProvider, CommandRequest, CommandRunner, DEFAULT_COMMAND_TIMEOUT,
    ProcessRunner, RecordingRunner, RunError,
};
pub use envelope::{DataKey, KeyProvider, Rewrap, SecretKey};
pub use local::LocalKey;

/// Length of a key-encryption key file and of every data key, in bytes.
pub const KEY_LEN: usize = 32;
/// The AEAD every record uses, for the value and for wrapping with a key file.
pub const ALGORITHM: &str = "AES-256-GCM";
/// Largest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretKeyError {
    #[error(
        "secret key file {}: cannot read it: {error} (check the path and that the server's user may read it)",
        path.display()
    )]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "secret key file {}: cannot create it: {error} (check that its directory exists or can be created and is writable, or pass --secret-key-file)",
        path.display()
    )]
    Create {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "secret key file {} holds {len} bytes, not {KEY_LEN}: it is not a cluster secret key (restore the cluster's key file; every server of a cluster uses the same one)",
        path.display()
    )]
    WrongLength { path: PathBuf, len: usize },
    #[error(
        "secret key file {} may be read by group or others (mode {mode:03o}): run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("cannot draw random bytes for a new secret key: the system's random source failed")]
    Random,
    #[error(
        "secret key id `{}` is not usable: give the KMS's key id, 1 to 256 printable characters without spaces, not starting with `-`",
        id.escape_debug()
    )]
    BadKeyId { id: String },
    #[error(
        "secret key command `{command}` names no program: give the path of the program that wraps and unwraps keys"
    )]
    NoProgram { command: String },
}

/// A key-encryption key that failed to wrap or unwrap a data key. Never
/// holds a key, wrapped or not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error(
        "the secret key command `{program}` could not be started: {problem} (check --secret-key-command: the program must exist and be executable by the server's user)"
    )]
    Spawn { program: String, problem: String },
    #[error("the secret key command `{program} {operation} {key_id}` failed ({status}): {stderr}")]
    Failed {
        program: String,
        operation: &'static str,
        key_id: String,
        status: String,
        stderr: String,
    },
    #[error(
        "the secret key command `{program} {operation} {key_id}` did not answer within {}s and was killed (is the KMS reachable? raise --secret-key-command-timeout)",
        after.as_secs_f64()
    )]
    Timeout {
        program: String,
        operation: &'static str,
        key_id: String,
        after: std::time::Duration,
    },
    #[error(
        "the secret key command `{program} {operation} {key_id}` answered something unusable: {problem} (it must print the result in base64 on stdout)"
    )]
    Garbage {
        program: String,
        operation: &'static str,
        key_id: String,
        problem: String,
    },
    #[error("the secret key command `{program}`: talking to it failed: {problem}")]
    Io { program: String, problem: String },
    #[error(
        "the data key wrapped by key file {key_id} does not unwrap: the wrapped key was altered, or wrapped by another key of the same id"
    )]
    Unwrap { key_id: String },
    #[error(
        "wrapping a data key with key file {key_id} failed (the system's random source or AEAD failed)"
    )]
    Wrap { key_id: String },
}

/// A stored value that cannot be opened, or a value that cannot be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "secret `{name}` was sealed with key {sealed_with}, which this server does not accept (it accepts {accepted}): start every server with that key too (--old-secret-key-file or --old-secret-key-id), or set the secret again with `cca secret set {name}`"
    )]
    WrongKey {
        name: String,
        sealed_with: String,
        accepted: String,
    },
    #[error(
        "secret `{name}`: the stored record is of format {format} with {algorithm}, which this server does not know (upgrade the server, or set the secret again)"
    )]
    Unsupported {
        name: String,
        format: u32,
        algorithm: String,
    },
    #[error(
        "secret `{name}`: the stored record is damaged or was tampered with ({problem}): set it again with `cca secret set {name}`"
    )]
    Corrupt { name: String, problem: String },
    #[error("secret `{name}`: the value is not UTF-8 text after decryption: set it again")]
    NotText { name: String },
    #[error(
        "secret `{name}`: sealing the value failed (the system's random source or AEAD failed)"
    )]
    Seal { name: String },
    #[error("secret `{name}`: {error}")]
    Provider {
        name: String,
        error: Box<ProviderError>,
    },
}

/// A secret's value. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

impl SecretValue {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// The URL of a connection, `driver://user:password@host:port/database?params`,
/// with `password` (the connection's secret) and every part percent-encoded
/// where it needs to be. An IPv6 host is put in brackets.
pub fn connection_url(spec: &ConnectionSpec, password: Option<&SecretValue>) -> String {
    let mut url = format!("{}://", spec.driver);
    if spec.user.is_some() || password.is_some() {
        url.push_str(&encode(spec.user.as_deref().unwrap_or_default()));
        if let Some(password) = password {
            url.push(':');
            url.push_str(&encode(password.expose()));
        }
        url.push('@');
    }
    if spec.host.contains(':') && !spec.host.starts_with('[') {
        url.push_str(&format!("[{}]", spec.host));
    } else {
        url.push_str(&spec.host);
    }
    url.push_str(&format!(":{}", spec.port));
    if let Some(database) = &spec.database {
        url.push('/');
        url.push_str(&encode(database));
    }
    for (index, (key, value)) in spec.params.iter().enumerate() {
        url.push(if index == 0 { '?' } else { '&' });
        url.push_str(&encode(key));
        url.push('=');
        url.push_str(&encode(value));
    }
    url
}

/// Percent-encodes everything but RFC 3986's unreserved characters, which
/// is safe in the user, password, path and query parts alike.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn connection_urls_escape_user_password_and_parts() {
        let mut spec = ConnectionSpec {
            name: "app_db".into(),
            driver: "postgresql".into(),
            user: Some("app user".into()),
            secret: Some("db".into()),
            host: "postgres".into(),
            port: 5432,
            database: Some("app".into()),
            params: BTreeMap::from([("sslmode".into(), "require".into())]),
            tenant: None,
        };
        let password = SecretValue::new("p@ss:w/rd");
        assert_eq!(
            connection_url(&spec, Some(&password)),
            "postgresql://app%20user:p%40ss%3Aw%2Frd@postgres:5432/app?sslmode=require"
        );
        spec.user = None;
        spec.database = None;
        spec.params.insert("a&b".into(), "c=d".into());
        spec.host = "fd00::1".into();
        assert_eq!(
            connection_url(&spec, None),
            "postgresql://[fd00::1]:5432?a%26b=c%3Dd&sslmode=require"
        );
    }
}
