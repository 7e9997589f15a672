//! Envelope encryption: [`SecretKey`], the server's key-encryption keys
//! (one primary that wraps every new data key, old ones still accepted
//! for unwrapping), seals a value under a fresh [`DataKey`] and wraps that
//! key with the primary ([`KeyProvider`]); opens a record of format 2 by
//! unwrapping its data key with the KEK its `key_id` names, or of format 1
//! with the key file it was sealed under; and [`SecretKey::rewrap`]s a
//! record under the primary for a rotation, leaving the value's
//! ciphertext as it is.

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use cca_model::cluster::Millis;

use super::local::LocalKey;
use super::{
    ALGORITHM, KEY_LEN, ProviderError, SealedSecret, SecretError, SecretKeyError, SecretValue,
};

/// Records sealed by older servers: the value directly under a key file.
const FORMAT_DIRECT: u32 = 1;
/// Records written by this version: the value under a wrapped data key.
const FORMAT_ENVELOPE: u32 = 2;

/// One value's own 256-bit key. `Debug` never shows it.
pub struct DataKey([u8; KEY_LEN]);

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(<redacted>)")
    }
}

impl DataKey {
    /// A data key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// 32 fresh random bytes.
    fn random() -> Option<Self> {
        let mut bytes = [0u8; KEY_LEN];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// The key's bytes, for a provider to wrap.
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    fn aead(&self) -> Option<LessSafeKey> {
        Some(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &self.0).ok()?,
        ))
    }
}

impl Drop for DataKey {
    fn drop(&mut self) {
        // Best effort: the compiler may keep copies, but the key does not
        // linger in this buffer.
        self.0.fill(0);
    }
}

/// A key-encryption key: wraps and unwraps data keys. Implementations
/// never log or return a key in an error.
pub trait KeyProvider: fmt::Debug + Send + Sync {
    /// The KEK's id, recorded in every record whose data key it wraps.
    fn key_id(&self) -> &str;
    /// The wrapped form of `data_key`, opaque bytes.
    fn wrap(&self, data_key: &DataKey) -> Result<Vec<u8>, ProviderError>;
    /// The data key `wrapped` holds; refuses anything this KEK did not wrap.
    fn unwrap(&self, wrapped: &[u8]) -> Result<DataKey, ProviderError>;
    /// The key file's key, which alone opens records of format 1.
    fn legacy(&self) -> Option<&LocalKey> {
        None
    }
}

/// What a rotation did to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrap {
    /// Already a format-2 record under the primary KEK: nothing to write.
    Current,
    /// The record to write instead: same value, data key wrapped by the
    /// primary (a format-1 record is sealed again under a new data key).
    Rewrapped(SealedSecret),
}

/// The server's key-encryption keys: the primary wraps every new data key;
/// the old ones are accepted for unwrapping until a rotation has moved
/// every record to the primary. `Debug` shows only their ids.
#[derive(Clone)]
pub struct SecretKey {
    primary: Arc<dyn KeyProvider>,
    old: Vec<Arc<dyn KeyProvider>>,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKey")
            .field("primary", &self.primary.key_id())
            .field(
                "old",
                &self.old.iter().map(|kek| kek.key_id()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl SecretKey {
    /// Keys with `primary` only.
    pub fn new(primary: impl KeyProvider + 'static) -> Self {
        Self {
            primary: Arc::new(primary),
            old: Vec::new(),
        }
    }

    /// Also accepts `old` for unwrapping (a KEK of the primary's id, or of
    /// one already accepted, is ignored).
    #[must_use]
    pub fn accepting(mut self, old: impl KeyProvider + 'static) -> Self {
        if self.provider(old.key_id()).is_none() {
            self.old.push(Arc::new(old));
        }
        self
    }

    /// A key file's key from its 32 bytes, as the only KEK.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        LocalKey::from_bytes(bytes).map(Self::new)
    }

    /// The key file at `path` (created when absent) as the only KEK; the
    /// `bool` says whether it was created. See [`LocalKey::load_or_create`].
    pub fn load_or_create(path: &std::path::Path) -> Result<(Self, bool), SecretKeyError> {
        LocalKey::load_or_create(path).map(|(key, created)| (Self::new(key), created))
    }

    /// The primary KEK's id.
    pub fn id(&self) -> &str {
        self.primary.key_id()
    }

    /// Every accepted KEK's id, the primary first.
    pub fn accepted_ids(&self) -> Vec<&str> {
        std::iter::once(&self.primary)
            .chain(&self.old)
            .map(|kek| kek.key_id())
            .collect()
    }

    fn provider(&self, key_id: &str) -> Option<&Arc<dyn KeyProvider>> {
        std::iter::once(&self.primary)
            .chain(&self.old)
            .find(|kek| kek.key_id() == key_id)
    }

    /// Seals and opens a throwaway value with the primary KEK: a start-up
    /// check that the key file or KMS command works, before any secret
    /// depends on it.
    pub fn check(&self) -> Result<(), SecretError> {
        let name = "cca-start-up-check";
        let probe = SecretValue::new(cca_model::hex::encode(
            DataKey::random()
                .ok_or_else(|| SecretError::Seal {
                    name: name.to_owned(),
                })?
                .bytes(),
        ));
        let sealed = self.seal(name, &probe, 0)?;
        if self.open(name, &sealed)? == probe {
            Ok(())
        } else {
            Err(corrupt(name, "the value opened is not the value sealed"))
        }
    }

    /// Encrypts `value` for the secret `name` under a fresh data key,
    /// wrapped by the primary KEK.
    pub fn seal(
        &self,
        name: &str,
        value: &SecretValue,
        set_at: Millis,
    ) -> Result<SealedSecret, SecretError> {
        let seal_error = || SecretError::Seal {
            name: name.to_owned(),
        };
        let data_key = DataKey::random().ok_or_else(seal_error)?;
        let wrapped_key = self.wrap_under_primary(name, &data_key)?;
        let aead = data_key.aead().ok_or_else(seal_error)?;
        let (nonce, ciphertext) = seal_with(&aead, name, value).ok_or_else(seal_error)?;
        Ok(SealedSecret {
            tenant: None,
            format: FORMAT_ENVELOPE,
            algorithm: ALGORITHM.to_owned(),
            key_id: self.primary.key_id().to_owned(),
            wrapped_key: cca_model::hex::encode(&wrapped_key),
            nonce,
            ciphertext,
            set_at,
        })
    }

    /// `data_key` of secret `name` wrapped by the primary KEK.
    fn wrap_under_primary(&self, name: &str, data_key: &DataKey) -> Result<Vec<u8>, SecretError> {
        self.primary
            .wrap(data_key)
            .map_err(|error| SecretError::Provider {
                name: name.to_owned(),
                error: Box::new(error),
            })
    }

    /// Decrypts the value of the secret `name`; refuses a record sealed
    /// under a KEK this server does not accept, for another name, or
    /// altered in any byte (value, nonce or wrapped key).
    pub fn open(&self, name: &str, sealed: &SealedSecret) -> Result<SecretValue, SecretError> {
        self.open_keeping_key(name, sealed).map(|(value, _)| value)
    }

    /// The record `sealed` of secret `name` under the primary KEK, the
    /// value unchanged: its data key unwrapped and wrapped again (format
    /// 2), or the value sealed again under a new data key (format 1).
    /// Opens the value first, so a damaged record is reported, never
    /// rewrapped.
    pub fn rewrap(&self, name: &str, sealed: &SealedSecret) -> Result<Rewrap, SecretError> {
        if sealed.format == FORMAT_ENVELOPE
            && sealed.algorithm == ALGORITHM
            && sealed.key_id == self.primary.key_id()
        {
            return Ok(Rewrap::Current);
        }
        let (value, data_key) = self.open_keeping_key(name, sealed)?;
        let Some(data_key) = data_key else {
            return self.seal(name, &value, sealed.set_at).map(|fresh| {
                Rewrap::Rewrapped(SealedSecret {
                    tenant: sealed.tenant.clone(),
                    ..fresh
                })
            });
        };
        // The value opened under this data key, so the key is good and the
        // ciphertext stays as it is.
        let rewrapped = self.wrap_under_primary(name, &data_key)?;
        Ok(Rewrap::Rewrapped(SealedSecret {
            key_id: self.primary.key_id().to_owned(),
            wrapped_key: cca_model::hex::encode(&rewrapped),
            ..sealed.clone()
        }))
    }

    /// The value, and its data key when the record has one (format 2): a
    /// rotation wraps it again without a second call to the KEK.
    fn open_keeping_key(
        &self,
        name: &str,
        sealed: &SealedSecret,
    ) -> Result<(SecretValue, Option<DataKey>), SecretError> {
        if sealed.algorithm != ALGORITHM
            || (sealed.format != FORMAT_ENVELOPE && sealed.format != FORMAT_DIRECT)
        {
            return Err(SecretError::Unsupported {
                name: name.to_owned(),
                format: sealed.format,
                algorithm: sealed.algorithm.clone(),
            });
        }
        let kek = self
            .provider(&sealed.key_id)
            .filter(|kek| sealed.format == FORMAT_ENVELOPE || kek.legacy().is_some())
            .ok_or_else(|| SecretError::WrongKey {
                name: name.to_owned(),
                sealed_with: sealed.key_id.clone(),
                accepted: self.accepted_ids().join(", "),
            })?;
        if let Some(legacy) = kek.legacy().filter(|_| sealed.format == FORMAT_DIRECT) {
            return open_with(legacy.aead(), name, sealed).map(|value| (value, None));
        }
        let wrapped = cca_model::hex::decode(&sealed.wrapped_key)
            .filter(|bytes| !bytes.is_empty())
            .ok_or_else(|| corrupt(name, "the wrapped data key is not hex"))?;
        let data_key = kek
            .unwrap(&wrapped)
            .map_err(|error| SecretError::Provider {
                name: name.to_owned(),
                error: Box::new(error),
            })?;
        let aead = data_key
            .aead()
            .ok_or_else(|| corrupt(name, "the data key is unusable"))?;
        open_with(&aead, name, sealed).map(|value| (value, Some(data_key)))
    }

    /// Seals `value` as older servers did (format 1, directly under the
    /// primary key file), for tests of the conversion.
    #[doc(hidden)]
    pub fn seal_format_1(
        &self,
        name: &str,
        value: &SecretValue,
        set_at: Millis,
    ) -> Option<SealedSecret> {
        let legacy = self.primary.legacy()?;
        let (nonce, ciphertext) = seal_with(legacy.aead(), name, value)?;
        Some(SealedSecret {
            tenant: None,
            format: FORMAT_DIRECT,
            algorithm: ALGORITHM.to_owned(),
            key_id: legacy.id().to_owned(),
            wrapped_key: String::new(),
            nonce,
            ciphertext,
            set_at,
        })
    }
}

fn corrupt(name: &str, problem: &str) -> SecretError {
    SecretError::Corrupt {
        name: name.to_owned(),
        problem: problem.to_owned(),
    }
}

/// Hex nonce and ciphertext of `value` under `key`, the name as
/// associated data.
fn seal_with(key: &LessSafeKey, name: &str, value: &SecretValue) -> Option<(String, String)> {
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce).ok()?;
    let mut in_out = value.expose().as_bytes().to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(name.as_bytes()),
        &mut in_out,
    )
    .ok()?;
    Some((
        cca_model::hex::encode(&nonce),
        cca_model::hex::encode(&in_out),
    ))
}

fn open_with(
    key: &LessSafeKey,
    name: &str,
    sealed: &SealedSecret,
) -> Result<SecretValue, SecretError> {
    let nonce: [u8; NONCE_LEN] = cca_model::hex::decode(&sealed.nonce)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| corrupt(name, "the nonce is not 12 hex bytes"))?;
    let mut in_out = cca_model::hex::decode(&sealed.ciphertext)
        .ok_or_else(|| corrupt(name, "the ciphertext is not hex"))?;
    let plain = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(name.as_bytes()),
            &mut in_out,
        )
        .map_err(|_| corrupt(name, "the authentication tag does not match"))?;
    String::from_utf8(plain.to_vec())
        .map(SecretValue::new)
        .map_err(|_| SecretError::NotText {
            name: name.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_key(byte: u8) -> LocalKey {
        LocalKey::from_bytes(&[byte; KEY_LEN]).expect("32 bytes")
    }

    fn flip_hex(text: &mut String, at: usize) {
        let byte = u8::from_str_radix(&text[at..at + 2], 16).expect("hex") ^ 1;
        text.replace_range(at..at + 2, &format!("{byte:02x}"));
    }

    #[test]
    fn a_sealed_value_opens_again_and_hides_the_value() {
        let key = SecretKey::new(file_key(7));
        let value = SecretValue::new("p@ss:w/rd");
        let sealed = key.seal("db", &value, 5).expect("seal");
        assert_eq!(sealed.format, 2);
        assert_eq!(sealed.key_id, key.id());
        assert_eq!(sealed.set_at, 5);
        assert!(!sealed.ciphertext.contains(&cca_model::hex::encode(b"p@ss")));
        assert_eq!(key.open("db", &sealed), Ok(value.clone()));
        // A fresh data key and nonce each time.
        let again = key.seal("db", &value, 5).expect("seal");
        assert_ne!(again.nonce, sealed.nonce);
        assert_ne!(again.wrapped_key, sealed.wrapped_key);
        assert_eq!(format!("{value:?}"), "SecretValue(<redacted>)");
        assert!(!format!("{key:?}").contains("07"));
    }

    #[test]
    fn the_start_up_check_catches_a_kek_that_does_not_round_trip() {
        assert_eq!(SecretKey::new(file_key(7)).check(), Ok(()));
        #[derive(Debug)]
        struct Forgetful;
        impl KeyProvider for Forgetful {
            fn key_id(&self) -> &str {
                "forgetful"
            }
            fn wrap(&self, _: &DataKey) -> Result<Vec<u8>, ProviderError> {
                Ok(vec![0; KEY_LEN])
            }
            fn unwrap(&self, wrapped: &[u8]) -> Result<DataKey, ProviderError> {
                DataKey::from_bytes(wrapped).ok_or(ProviderError::Unwrap {
                    key_id: "forgetful".into(),
                })
            }
        }
        let error = SecretKey::new(Forgetful).check().expect_err("a broken KEK");
        assert!(
            error
                .to_string()
                .contains("authentication tag does not match"),
            "{error}"
        );
    }

    #[test]
    fn a_tampered_or_misplaced_record_is_refused() {
        let key = SecretKey::new(file_key(7));
        let sealed = key
            .seal("db", &SecretValue::new("hunter2"), 5)
            .expect("seal");
        let mut flipped = sealed.clone();
        flip_hex(&mut flipped.ciphertext, 0);
        let error = key.open("db", &flipped).expect_err("tampered");
        assert!(matches!(error, SecretError::Corrupt { .. }));
        assert!(error.to_string().contains("cca secret set db"), "{error}");
        // The same record under another name fails too (the name is AAD).
        let error = key.open("other", &sealed).expect_err("renamed");
        assert!(
            error
                .to_string()
                .contains("authentication tag does not match"),
            "{error}"
        );
        let mut bad_nonce = sealed.clone();
        bad_nonce.nonce = "zz".into();
        assert!(matches!(
            key.open("db", &bad_nonce),
            Err(SecretError::Corrupt { .. })
        ));
        let mut bad_wrap = sealed.clone();
        flip_hex(&mut bad_wrap.wrapped_key, 30);
        let error = key.open("db", &bad_wrap).expect_err("wrapped key altered");
        assert!(
            matches!(error, SecretError::Provider { .. })
                && error.to_string().contains("wrapped key was altered"),
            "{error}"
        );
        let mut no_wrap = sealed.clone();
        no_wrap.wrapped_key.clear();
        assert!(matches!(
            key.open("db", &no_wrap),
            Err(SecretError::Corrupt { .. })
        ));
        let error = SecretKey::new(file_key(8))
            .open("db", &sealed)
            .expect_err("other key");
        assert!(matches!(error, SecretError::WrongKey { .. }));
        assert!(
            error.to_string().contains("--old-secret-key-file"),
            "{error}"
        );
        let mut future = sealed.clone();
        future.format = 3;
        assert!(matches!(
            key.open("db", &future),
            Err(SecretError::Unsupported { .. })
        ));
    }

    #[test]
    fn format_1_records_open_and_are_converted_by_a_rewrap() {
        let old = SecretKey::new(file_key(7));
        let value = SecretValue::new("hunter2");
        let legacy = old.seal_format_1("db", &value, 5).expect("seal");
        // The exact shape older servers wrote still decodes.
        let stored = serde_json::to_string(&legacy).expect("encodes");
        assert!(!stored.contains("wrapped_key"), "{stored}");
        let decoded: SealedSecret = serde_json::from_str(&stored).expect("decodes");
        assert_eq!(old.open("db", &decoded), Ok(value.clone()));
        assert!(old.open("other", &decoded).is_err());

        let rotated = SecretKey::new(file_key(8)).accepting(file_key(7));
        assert_eq!(rotated.open("db", &decoded), Ok(value.clone()));
        let Ok(Rewrap::Rewrapped(converted)) = rotated.rewrap("db", &decoded) else {
            panic!("a format-1 record is converted");
        };
        assert_eq!((converted.format, converted.set_at), (2, 5));
        assert_eq!(converted.key_id, rotated.id());
        assert_eq!(
            SecretKey::new(file_key(8)).open("db", &converted),
            Ok(value)
        );
        assert_eq!(rotated.rewrap("db", &converted), Ok(Rewrap::Current));
    }

    #[test]
    fn a_rewrap_moves_the_data_key_to_the_primary_and_keeps_the_value() {
        let a = SecretKey::new(file_key(1));
        let sealed = a.seal("db", &SecretValue::new("v"), 9).expect("seal");
        let both = SecretKey::new(file_key(2)).accepting(file_key(1));
        // Old records open while both are accepted; new ones go to B.
        assert_eq!(
            both.open("db", &sealed).map(|v| v.expose().to_owned()),
            Ok("v".into())
        );
        assert_eq!(
            both.seal("x", &SecretValue::new("y"), 1)
                .expect("seal")
                .key_id,
            both.id()
        );
        let Ok(Rewrap::Rewrapped(moved)) = both.rewrap("db", &sealed) else {
            panic!("rewrapped");
        };
        assert_eq!(
            moved.ciphertext, sealed.ciphertext,
            "the value is untouched"
        );
        assert_eq!(moved.nonce, sealed.nonce);
        assert_ne!(moved.wrapped_key, sealed.wrapped_key);
        let b_only = SecretKey::new(file_key(2));
        assert_eq!(
            b_only.open("db", &moved).map(|v| v.expose().to_owned()),
            Ok("v".into())
        );
        assert!(matches!(
            b_only.open("db", &sealed),
            Err(SecretError::WrongKey { .. })
        ));
        // A damaged record is reported, not rewrapped.
        let mut damaged = sealed.clone();
        flip_hex(&mut damaged.ciphertext, 0);
        assert!(matches!(
            both.rewrap("db", &damaged),
            Err(SecretError::Corrupt { .. })
        ));
        assert_eq!(format!("{both:?}").matches("sha256:").count(), 2);
    }

    #[test]
    fn debug_of_every_key_type_hides_keys_and_values() {
        let data_key = DataKey::from_bytes(&[0xab; KEY_LEN]).expect("32 bytes");
        let key = SecretKey::new(file_key(0xab)).accepting(file_key(0xcd));
        let sealed = key
            .seal("db", &SecretValue::new("topsecretvalue"), 1)
            .expect("seal");
        let shown = [
            format!("{data_key:?}"),
            format!("{key:?}"),
            format!("{:?}", file_key(0xab)),
            format!("{:?}", SecretValue::new("topsecretvalue")),
            format!("{sealed:?}"),
            format!("{:?}", Rewrap::Rewrapped(sealed.clone())),
        ];
        for text in shown {
            assert!(!text.contains("topsecretvalue"), "{text}");
            assert!(
                !text.contains(&cca_model::hex::encode(&[0xab; KEY_LEN])),
                "{text}"
            );
            assert!(!text.contains("171, 171"), "{text}");
        }
    }
}
