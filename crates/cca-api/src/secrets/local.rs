//! The local key-encryption key: a 32-byte file (mode 0600, created on
//! first start, refused when another length or readable by group or
//! others) that wraps data keys with AES-256-GCM. A wrap is `nonce ‖
//! ciphertext ‖ tag`, its associated data the purpose and the key's id, so
//! a wrapped data key is never taken for anything else. The same key opens
//! records of format 1, which older servers sealed with it directly.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::digest;

use super::envelope::{DataKey, KeyProvider};
use super::{KEY_LEN, ProviderError, SecretKeyError};

/// What a wrap's associated data starts with; the key's id follows.
const WRAP_PURPOSE: &[u8] = b"cca secret data key wrap v1\0";

/// A key file's key. `Debug` shows only its id.
pub struct LocalKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl LocalKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).ok()?);
        // The id names the key without revealing it: a hash of it, cut
        // short. Format-1 records carry the same id.
        let mut context = digest::Context::new(&digest::SHA256);
        context.update(b"cca secret key id\0");
        context.update(bytes);
        let id = format!(
            "sha256:{}",
            cca_model::hex::encode(&context.finish().as_ref()[..8])
        );
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

    /// The key's id, as recorded in every record it wraps (or, format 1,
    /// seals).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The AEAD key itself, for records of format 1.
    pub(super) fn aead(&self) -> &LessSafeKey {
        &self.key
    }

    fn wrap_aad(&self) -> Vec<u8> {
        let mut aad = WRAP_PURPOSE.to_vec();
        aad.extend_from_slice(self.id.as_bytes());
        aad
    }
}

impl KeyProvider for LocalKey {
    fn key_id(&self) -> &str {
        &self.id
    }

    fn wrap(&self, data_key: &DataKey) -> Result<Vec<u8>, ProviderError> {
        let failed = || ProviderError::Wrap {
            key_id: self.id.clone(),
        };
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| failed())?;
        let mut in_out = data_key.bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.wrap_aad().as_slice()),
                &mut in_out,
            )
            .map_err(|_| failed())?;
        let mut wrapped = nonce.to_vec();
        wrapped.append(&mut in_out);
        Ok(wrapped)
    }

    fn unwrap(&self, wrapped: &[u8]) -> Result<DataKey, ProviderError> {
        let refused = || ProviderError::Unwrap {
            key_id: self.id.clone(),
        };
        let (nonce, sealed) = wrapped.split_at_checked(NONCE_LEN).ok_or_else(refused)?;
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| refused())?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.wrap_aad().as_slice()),
                &mut in_out,
            )
            .map_err(|_| refused())?;
        DataKey::from_bytes(plain).ok_or_else(refused)
    }

    fn legacy(&self) -> Option<&LocalKey> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_created_private_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("secret.key");
        let (created, fresh) = LocalKey::load_or_create(&path).expect("create");
        assert!(fresh);
        let meta = std::fs::metadata(&path).expect("meta");
        assert_eq!(meta.len(), KEY_LEN as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let (loaded, fresh) = LocalKey::load_or_create(&path).expect("load");
        assert!(!fresh);
        assert_eq!(loaded.id(), created.id());
        let leftovers = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .count();
        assert_eq!(leftovers, 1);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let error = LocalKey::load_or_create(&path).expect_err("too open");
        assert!(error.to_string().contains("chmod 600"), "{error}");

        let short = dir.path().join("short.key");
        std::fs::write(&short, b"0123456789").expect("write");
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let error = LocalKey::load_or_create(&short).expect_err("short");
        assert!(
            error.to_string().contains("holds 10 bytes, not 32"),
            "{error}"
        );
        std::fs::write(&short, [1u8; 100]).expect("write");
        let error = LocalKey::load(&short).expect_err("long");
        assert!(error.to_string().contains("holds 100 bytes"), "{error}");
    }

    #[test]
    fn a_wrap_unwraps_only_with_its_key_and_unaltered() {
        let key = LocalKey::from_bytes(&[7; KEY_LEN]).expect("32 bytes");
        let data_key = DataKey::from_bytes(&[42; KEY_LEN]).expect("32 bytes");
        let wrapped = key.wrap(&data_key).expect("wraps");
        assert_eq!(wrapped.len(), NONCE_LEN + KEY_LEN + 16);
        assert!(!wrapped.windows(4).any(|w| w == [42; 4]), "in the clear");
        assert_eq!(
            key.unwrap(&wrapped).expect("unwraps").bytes(),
            &[42; KEY_LEN]
        );
        assert_ne!(key.wrap(&data_key).expect("wraps"), wrapped, "fresh nonce");

        let mut flipped = wrapped.clone();
        flipped[NONCE_LEN] ^= 1;
        let error = key.unwrap(&flipped).expect_err("tampered");
        assert!(error.to_string().contains("was altered"), "{error}");
        assert!(key.unwrap(&wrapped[..10]).is_err(), "short");
        let other = LocalKey::from_bytes(&[8; KEY_LEN]).expect("32 bytes");
        assert!(other.unwrap(&wrapped).is_err(), "another key");
        assert!(!format!("{key:?}").contains("07"));
    }
}
