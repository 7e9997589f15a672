//! Secret values at rest and in use: the cluster's secret key (a 32-byte
//! file every API server of a cluster shares, created on first start),
//! sealing a value into the record stored at `desired/secret/{name}`
//! (AES-256-GCM from `aws-lc-rs`, a random 96-bit nonce per value, the
//! secret's name as associated data so a record copied under another name
//! is refused, the key's id in the record so a server with another key
//! says so), opening it again, and assembling a connection's URL with its
//! secret as the password. Nothing here logs or prints a value: every type
//! holding one has a redacted `Debug`.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::digest;
use cca_model::cluster::Millis;
use cca_model::spec::ConnectionSpec;

/// Length of the cluster's secret key, in bytes.
pub const KEY_LEN: usize = 32;
/// The AEAD every record of format 1 uses.
pub const ALGORITHM: &str = "AES-256-GCM";
/// Largest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
/// The record format written by this version.
const FORMAT: u32 = 1;

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
}

/// A stored value that cannot be opened, or a value that cannot be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "secret `{name}` was sealed with key {sealed_with}, but this server's key is {key_id}: every server of the cluster must use the same --secret-key-file (or set the secret again with `cca secret set {name}`)"
    )]
    WrongKey {
        name: String,
        sealed_with: String,
        key_id: String,
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
}

/// The cluster's secret key. `Debug` shows only its id.
pub struct SecretKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
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

pub use cca_model::spec::SealedSecret;

impl SecretKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).ok()?);
        // The id names the key without revealing it: a hash of it, cut short.
        let mut context = digest::Context::new(&digest::SHA256);
        context.update(b"cca secret key id\0");
        context.update(bytes);
        let id = format!("sha256:{}", hex(&context.finish().as_ref()[..8]));
        Some(Self { key, id })
    }

    /// Reads the key at `path`, creating it (32 random bytes, mode 0600)
    /// when there is none. The `bool` says whether it was created. Refuses
    /// a file of another length or that group or others may read.
    pub fn load_or_create(path: &Path) -> Result<(Self, bool), SecretKeyError> {
        match std::fs::metadata(path) {
            Ok(_) => Self::load(path).map(|key| (key, false)),
            Err(error) if error.kind() == ErrorKind::NotFound => match Self::create(path) {
                Ok(key) => Ok((key, true)),
                // Another server sharing the directory created it first.
                Err(SecretKeyError::Create { error: source, .. })
                    if source.kind() == ErrorKind::AlreadyExists =>
                {
                    Self::load(path).map(|key| (key, false))
                }
                Err(error) => Err(error),
            },
            Err(source) => Err(SecretKeyError::Read {
                path: path.to_owned(),
                error: source,
            }),
        }
    }

    /// Reads an existing key file.
    pub fn load(path: &Path) -> Result<Self, SecretKeyError> {
        let read_error = |source| SecretKeyError::Read {
            path: path.to_owned(),
            error: source,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        let mode = file.metadata().map_err(read_error)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretKeyError::TooOpen {
                path: path.to_owned(),
                mode,
            });
        }
        let mut bytes = Vec::with_capacity(KEY_LEN);
        // One byte more than a key tells a long file from a key.
        Read::by_ref(&mut file)
            .take(KEY_LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        let len = if bytes.len() > KEY_LEN {
            usize::try_from(file.metadata().map_err(read_error)?.len()).unwrap_or(usize::MAX)
        } else {
            bytes.len()
        };
        Self::from_bytes(&bytes).ok_or(SecretKeyError::WrongLength {
            path: path.to_owned(),
            len,
        })
    }

    fn create(path: &Path) -> Result<Self, SecretKeyError> {
        let create_error = |source| SecretKeyError::Create {
            path: path.to_owned(),
            error: source,
        };
        let mut bytes = [0u8; KEY_LEN];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| SecretKeyError::Random)?;
        let key = Self::from_bytes(&bytes).ok_or(SecretKeyError::Random)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(create_error)?;
        }
        // Written beside it and linked into place: a crash never leaves a
        // short key file that the next start would refuse.
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::hard_link(&tmp, path)
        })();
        let _ = std::fs::remove_file(&tmp);
        written.map_err(create_error)?;
        Ok(key)
    }

    /// The key's id, as recorded in every value it seals.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Encrypts `value` for the secret `name`.
    pub fn seal(
        &self,
        name: &str,
        value: &SecretValue,
        set_at: Millis,
    ) -> Result<SealedSecret, SecretError> {
        let seal_error = || SecretError::Seal {
            name: name.to_owned(),
        };
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| seal_error())?;
        let mut in_out = value.0.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut in_out,
            )
            .map_err(|_| seal_error())?;
        Ok(SealedSecret {
            format: FORMAT,
            algorithm: ALGORITHM.to_owned(),
            key_id: self.id.clone(),
            nonce: hex(&nonce),
            ciphertext: hex(&in_out),
            set_at,
        })
    }

    /// Decrypts the value of the secret `name`; refuses a record sealed
    /// with another key, for another name, or altered in any byte.
    pub fn open(&self, name: &str, sealed: &SealedSecret) -> Result<SecretValue, SecretError> {
        if sealed.format != FORMAT || sealed.algorithm != ALGORITHM {
            return Err(SecretError::Unsupported {
                name: name.to_owned(),
                format: sealed.format,
                algorithm: sealed.algorithm.clone(),
            });
        }
        if sealed.key_id != self.id {
            return Err(SecretError::WrongKey {
                name: name.to_owned(),
                sealed_with: sealed.key_id.clone(),
                key_id: self.id.clone(),
            });
        }
        let corrupt = |problem: &str| SecretError::Corrupt {
            name: name.to_owned(),
            problem: problem.to_owned(),
        };
        let nonce: [u8; NONCE_LEN] = unhex(&sealed.nonce)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| corrupt("the nonce is not 12 hex bytes"))?;
        let mut in_out =
            unhex(&sealed.ciphertext).ok_or_else(|| corrupt("the ciphertext is not hex"))?;
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut in_out,
            )
            .map_err(|_| corrupt("the authentication tag does not match"))?;
        String::from_utf8(plain.to_vec())
            .map(SecretValue)
            .map_err(|_| SecretError::NotText {
                name: name.to_owned(),
            })
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn test_key(byte: u8) -> SecretKey {
        SecretKey::from_bytes(&[byte; KEY_LEN]).expect("32 bytes")
    }

    #[test]
    fn a_sealed_value_opens_again_and_hides_the_value() {
        let key = test_key(7);
        let value = SecretValue::new("p@ss:w/rd");
        let sealed = key.seal("db", &value, 5).expect("seal");
        assert_eq!(sealed.key_id, key.id());
        assert!(!sealed.ciphertext.contains(&hex(b"p@ss")));
        assert_eq!(key.open("db", &sealed), Ok(value.clone()));
        // A fresh nonce each time.
        assert_ne!(key.seal("db", &value, 5).expect("seal").nonce, sealed.nonce);
        assert_eq!(format!("{value:?}"), "SecretValue(<redacted>)");
        assert!(!format!("{key:?}").contains("07"));
    }

    #[test]
    fn a_tampered_record_is_refused() {
        let key = test_key(7);
        let sealed = key
            .seal("db", &SecretValue::new("hunter2"), 5)
            .expect("seal");
        let mut flipped = sealed.clone();
        let first = u8::from_str_radix(&flipped.ciphertext[..2], 16).expect("hex") ^ 1;
        flipped
            .ciphertext
            .replace_range(..2, &format!("{first:02x}"));
        let error = key.open("db", &flipped).expect_err("tampered");
        assert!(matches!(error, SecretError::Corrupt { .. }));
        assert!(error.to_string().contains("cca secret set db"), "{error}");
        // The same record under another name fails too (the name is AAD).
        assert!(matches!(
            key.open("other", &sealed),
            Err(SecretError::Corrupt { .. })
        ));
        let mut bad_nonce = sealed.clone();
        bad_nonce.nonce = "zz".into();
        assert!(matches!(
            key.open("db", &bad_nonce),
            Err(SecretError::Corrupt { .. })
        ));
        let error = test_key(8).open("db", &sealed).expect_err("other key");
        assert!(matches!(error, SecretError::WrongKey { .. }));
        assert!(error.to_string().contains("--secret-key-file"), "{error}");
    }

    #[test]
    fn key_files_are_created_private_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("secret.key");
        let (created, fresh) = SecretKey::load_or_create(&path).expect("create");
        assert!(fresh);
        let meta = std::fs::metadata(&path).expect("meta");
        assert_eq!(meta.len(), KEY_LEN as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let (loaded, fresh) = SecretKey::load_or_create(&path).expect("load");
        assert!(!fresh);
        assert_eq!(loaded.id(), created.id());
        let leftovers = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .count();
        assert_eq!(leftovers, 1);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let error = SecretKey::load_or_create(&path).expect_err("too open");
        assert!(error.to_string().contains("chmod 600"), "{error}");

        let short = dir.path().join("short.key");
        std::fs::write(&short, b"0123456789").expect("write");
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let error = SecretKey::load_or_create(&short).expect_err("short");
        assert!(
            error.to_string().contains("holds 10 bytes, not 32"),
            "{error}"
        );
        std::fs::write(&short, [1u8; 100]).expect("write");
        let error = SecretKey::load(&short).expect_err("long");
        assert!(error.to_string().contains("holds 100 bytes"), "{error}");
    }

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
