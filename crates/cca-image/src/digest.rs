//! Content digests (`sha256:` and 64 lowercase hex digits), validated when
//! parsed, and hashing of bytes, readers and files into them.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::IoContext;
use crate::{Error, Result};

/// A validated `sha256:…` digest. Only sha256 is accepted: it is what every
/// registry serves and what the store's paths are named by.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// The 64 hex digits, which name the blob's file in the store.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The digest of `bytes`.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest of everything `reader` yields.
    pub fn of_reader(mut reader: impl Read, path: &Path) -> Result<Self> {
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = reader.read(&mut buffer).on("reading", path)?;
            if read == 0 {
                return Ok(Self::from_hasher(hasher));
            }
            hasher.update(&buffer[..read]);
        }
    }

    /// The digest of a file's content.
    pub fn of_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).on("opening", path)?;
        Self::of_reader(file, path)
    }

    fn from_hasher(hasher: Sha256) -> Self {
        let hex = hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Self { hex }
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidDigest {
            digest: text.to_owned(),
            reason: reason.to_owned(),
        };
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| invalid("only sha256 digests are supported"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(invalid("expected 64 lowercase hex digits after sha256:"));
        }
        Ok(Self {
            hex: hex.to_owned(),
        })
    }
}

impl TryFrom<String> for Digest {
    type Error = Error;

    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> Self {
        digest.to_string()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_known_values_and_round_trip() {
        let digest = Digest::of_bytes(b"");
        assert_eq!(
            digest.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(digest.to_string().parse::<Digest>().ok(), Some(digest));
    }

    #[test]
    fn other_algorithms_and_bad_hex_are_rejected_with_the_reason() {
        let check = |text: &str, reason: &str| {
            let error = text
                .parse::<Digest>()
                .expect_err("should be rejected")
                .to_string();
            assert!(error.contains(reason), "{error:?} lacks {reason:?}");
        };
        check("sha512:abc", "only sha256");
        check("sha256:abc", "64 lowercase hex");
        check(&format!("sha256:{}", "A".repeat(64)), "64 lowercase hex");
    }
}
