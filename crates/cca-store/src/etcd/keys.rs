//! The namespace that CCattler's keys live under in a shared etcd, and the
//! conversions between our string keys and etcd's byte keys: every key we
//! send gets the namespace prepended, every key we receive has it stripped
//! and must be UTF-8.

use cca_model::keys::prefix_end;

use crate::error::{Result, StoreError};
use crate::types::KeyValue;

/// etcd's "every key from here on" range end.
const TO_THE_END: &[u8] = b"\0";

/// The key prefix all of our keys are stored under, e.g. `cca/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Namespace(String);

impl Namespace {
    pub(super) fn new(prefix: impl Into<String>) -> Self {
        Self(prefix.into())
    }

    /// The etcd key for our `key`.
    pub(super) fn key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.0.len() + key.len());
        full.extend_from_slice(self.0.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// The etcd key range `[start, end)` holding our keys under `prefix`.
    /// An empty prefix in an empty namespace is the whole key space.
    pub(super) fn prefix_range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let start = self.key(prefix);
        let end = prefix_end(&start).unwrap_or_else(|| TO_THE_END.to_vec());
        if start.is_empty() {
            // etcd refuses an empty key; "\0" is the smallest key there is.
            return (TO_THE_END.to_vec(), end);
        }
        (start, end)
    }

    /// The etcd key right after our `key`: where a range continuing after it
    /// starts.
    pub(super) fn key_after(&self, key: &str) -> Vec<u8> {
        let mut next = self.key(key);
        next.push(0);
        next
    }

    /// Our key for an etcd key, which must lie in the namespace and be UTF-8.
    pub(super) fn strip(&self, raw: &[u8]) -> Result<String> {
        let Some(ours) = raw.strip_prefix(self.0.as_bytes()) else {
            return Err(StoreError::Backend(format!(
                "etcd returned key {:?} outside the namespace `{}`",
                String::from_utf8_lossy(raw),
                self.0
            )));
        };
        String::from_utf8(ours.to_vec()).map_err(|_| {
            StoreError::Backend(format!(
                "etcd key {:?} under namespace `{}` is not UTF-8; CCattler keys are strings, \
                 so another program must have written it",
                String::from_utf8_lossy(raw),
                self.0
            ))
        })
    }

    /// Our [`KeyValue`] for an etcd one.
    pub(super) fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue> {
        Ok(KeyValue {
            key: self.strip(kv.key())?,
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            // etcd spells "no lease" as lease 0.
            lease: (kv.lease() != 0).then_some(kv.lease()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_gain_and_lose_the_namespace() {
        let ns = Namespace::new("cca/");
        assert_eq!(ns.key("desired/x"), b"cca/desired/x");
        assert_eq!(
            ns.strip(b"cca/desired/x").ok(),
            Some("desired/x".to_owned())
        );
        let foreign = ns.strip(b"other/x").expect_err("outside the namespace");
        assert!(
            foreign.to_string().contains("outside the namespace"),
            "{foreign}"
        );
        let binary = ns.strip(b"cca/\xff").expect_err("not UTF-8");
        assert!(binary.to_string().contains("not UTF-8"), "{binary}");
    }

    #[test]
    fn prefix_ranges_cover_exactly_the_prefix() {
        let ns = Namespace::new("cca/");
        assert_eq!(
            ns.prefix_range("a/"),
            (b"cca/a/".to_vec(), b"cca/a0".to_vec())
        );
        assert_eq!(ns.prefix_range(""), (b"cca/".to_vec(), b"cca0".to_vec()));
        assert_eq!(ns.key_after("a"), b"cca/a\0");
        let bare = Namespace::new("");
        assert_eq!(bare.prefix_range(""), (b"\0".to_vec(), b"\0".to_vec()));
    }
}
