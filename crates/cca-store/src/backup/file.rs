//! The backup file: `CCATTLER-BACKUP 1` on the first line, a JSON header
//! on the second (format, creation time, revision, key count, the store's
//! identity, the files it carries, the cipher, and the SHA-256 of every
//! byte after the header, written last), then the payload sealed with
//! AES-256-GCM in chunks of at most 64 KiB: each chunk is its length and
//! its ciphertext, its nonce the file's random prefix and the chunk's
//! index, its associated data the index and whether it is the last, so
//! chunks cannot be reordered, dropped or cut off unnoticed.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};

use super::payload::{self, Payload, PayloadError};
use crate::types::Revision;

/// The first line of every backup file.
const MAGIC: &[u8] = b"CCATTLER-BACKUP 1\n";
/// The file format this code writes and reads.
pub const FILE_FORMAT: u32 = 1;
const CIPHER: &str = "AES-256-GCM";
const CHUNK_BYTES: usize = 64 * 1024;
const TAG_BYTES: usize = 16;
/// A header line longer than this is not ours.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// What can go wrong making or reading a backup; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{}: {problem}", path.display())]
    Io { path: PathBuf, problem: String },
    #[error("{}: not a CCattler backup (its first line is not `CCATTLER-BACKUP 1`)", path.display())]
    Foreign { path: PathBuf },
    #[error("{}: the header is not valid: {problem}", path.display())]
    Header { path: PathBuf, problem: String },
    #[error("{}: the file is corrupt or truncated: its checksum does not match the header's", path.display())]
    Checksum { path: PathBuf },
    #[error("{}: the key does not open this backup (chunk {chunk}); is it the key file it was made with?", path.display())]
    Key { path: PathBuf, chunk: u64 },
    #[error("{}: the sealed payload is cut off after chunk {chunk}", path.display())]
    Truncated { path: PathBuf, chunk: u64 },
    #[error("{}: {source}", path.display())]
    Payload { path: PathBuf, source: PayloadError },
    #[error("key file {}: {problem}", path.display())]
    KeyFile { path: PathBuf, problem: String },
}

/// The second line of a backup file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    pub format: u32,
    /// When it was made, in milliseconds since the epoch.
    pub created_at: i64,
    /// Every key is as of this revision of the store.
    pub revision: Revision,
    pub keys: u64,
    /// The identity of the store it was taken from.
    #[serde(default)]
    pub store: Option<String>,
    /// The files it carries besides the store, by name.
    pub files: Vec<String>,
    pub cipher: String,
    /// The random half of every chunk's nonce, hex.
    pub nonce_prefix: String,
    /// SHA-256 of every byte after the header line, hex.
    pub sha256: String,
}

/// The 256-bit key a backup is sealed with, kept by the operator in a
/// file of 64 hex digits.
pub struct BackupKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for BackupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackupKey(..)")
    }
}

impl BackupKey {
    /// Reads the key in `path`.
    pub fn load(path: &Path) -> Result<Self, BackupError> {
        let fail = |problem: String| BackupError::KeyFile {
            path: path.to_owned(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|error| {
            fail(format!(
                "cannot be read ({error}); make one with `cca backup --create-key`"
            ))
        })?;
        let bytes = cca_model::hex::decode(text.trim())
            .filter(|bytes| bytes.len() == 32)
            .ok_or_else(|| fail("does not hold a key: 64 hex digits are expected".into()))?;
        Self::from_bytes(&bytes).ok_or_else(|| fail("is not a usable AES-256 key".into()))
    }

    /// Makes a new random key in `path` (mode 0600), refusing to replace
    /// an existing file.
    pub fn create(path: &Path) -> Result<Self, BackupError> {
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |problem: String| BackupError::KeyFile {
            path: path.to_owned(),
            problem,
        };
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| fail("the random source failed".into()))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|error| {
                fail(format!(
                    "cannot be created ({error}); an existing key is never replaced"
                ))
            })?;
        file.write_all(format!("{}\n", cca_model::hex::encode(&bytes)).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|error| fail(error.to_string()))?;
        Self::from_bytes(&bytes).ok_or_else(|| fail("is not a usable AES-256 key".into()))
    }

    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let key = UnboundKey::new(&AES_256_GCM, bytes).ok()?;
        Some(BackupKey {
            key: LessSafeKey::new(key),
        })
    }
}

/// What a chunk is sealed with besides the key.
fn chunk_nonce(prefix: &[u8; 8], index: u64) -> Option<Nonce> {
    let mut nonce = [0u8; 12];
    nonce[..8].copy_from_slice(prefix);
    nonce[8..].copy_from_slice(&u32::try_from(index).ok()?.to_be_bytes());
    Some(Nonce::assume_unique_for_key(nonce))
}

fn chunk_aad(index: u64, last: bool) -> [u8; 9] {
    let mut aad = [0u8; 9];
    aad[..8].copy_from_slice(&index.to_be_bytes());
    aad[8] = u8::from(last);
    aad
}

/// Writes a backup file: the header first (its checksum patched in at the
/// end), then the payload as it comes, sealed a chunk at a time.
pub struct BackupWriter<W: Write + Seek> {
    out: W,
    path: PathBuf,
    key: BackupKey,
    header: BackupHeader,
    nonce_prefix: [u8; 8],
    header_at: u64,
    chunk: Vec<u8>,
    index: u64,
    digest: Context,
    written: u64,
}

impl<W: Write + Seek> BackupWriter<W> {
    /// Starts a backup of `header`'s store into `out` (named `path` in
    /// errors); `header`'s cipher, nonce and checksum are filled in here.
    pub fn new(
        mut out: W,
        path: &Path,
        key: BackupKey,
        mut header: BackupHeader,
    ) -> Result<Self, BackupError> {
        let io = io_error(path);
        let mut nonce_prefix = [0u8; 8];
        aws_lc_rs::rand::fill(&mut nonce_prefix).map_err(|_| BackupError::Io {
            path: path.to_owned(),
            problem: "the random source failed".into(),
        })?;
        header.format = FILE_FORMAT;
        header.cipher = CIPHER.into();
        header.nonce_prefix = cca_model::hex::encode(&nonce_prefix);
        header.sha256 = "0".repeat(64);
        out.write_all(MAGIC).map_err(&io)?;
        let header_at = out.stream_position().map_err(&io)?;
        out.write_all(&header_line(&header)).map_err(&io)?;
        Ok(Self {
            out,
            path: path.to_owned(),
            key,
            header,
            nonce_prefix,
            header_at,
            chunk: Vec::with_capacity(CHUNK_BYTES + TAG_BYTES),
            index: 0,
            digest: Context::new(&SHA256),
            written: 0,
        })
    }

    /// Appends payload bytes.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<(), BackupError> {
        while !bytes.is_empty() {
            let room = CHUNK_BYTES - self.chunk.len();
            let (now, later) = bytes.split_at(room.min(bytes.len()));
            self.chunk.extend_from_slice(now);
            bytes = later;
            if self.chunk.len() == CHUNK_BYTES {
                self.seal(false)?;
            }
        }
        Ok(())
    }

    /// Payload bytes sealed so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Seals the last chunk, writes the checksum into the header and
    /// flushes; returns the header and the writer.
    pub fn finish(mut self) -> Result<(BackupHeader, W), BackupError> {
        self.seal(true)?;
        let io = io_error(&self.path);
        self.header.sha256 = cca_model::hex::encode(self.digest.clone().finish().as_ref());
        let end = self.out.stream_position().map_err(&io)?;
        self.out
            .seek(SeekFrom::Start(self.header_at))
            .map_err(&io)?;
        self.out
            .write_all(&header_line(&self.header))
            .map_err(&io)?;
        self.out.seek(SeekFrom::Start(end)).map_err(&io)?;
        self.out.flush().map_err(&io)?;
        Ok((self.header, self.out))
    }

    fn seal(&mut self, last: bool) -> Result<(), BackupError> {
        let nonce = chunk_nonce(&self.nonce_prefix, self.index).ok_or_else(|| BackupError::Io {
            path: self.path.clone(),
            problem: "too many chunks for one backup".into(),
        })?;
        self.written += self.chunk.len() as u64;
        let aad = chunk_aad(self.index, last);
        self.key
            .key
            .seal_in_place_append_tag(nonce, Aad::from(aad), &mut self.chunk)
            .map_err(|_| BackupError::Io {
                path: self.path.clone(),
                problem: "sealing a chunk failed".into(),
            })?;
        let len = u32::try_from(self.chunk.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes();
        let io = io_error(&self.path);
        for bytes in [&len[..], &self.chunk[..]] {
            self.digest.update(bytes);
            self.out.write_all(bytes).map_err(&io)?;
        }
        self.chunk.clear();
        self.index += 1;
        Ok(())
    }
}

impl<W: Write + Seek> std::fmt::Debug for BackupWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupWriter")
            .field("path", &self.path)
            .field("chunks", &self.index)
            .finish_non_exhaustive()
    }
}

fn header_line(header: &BackupHeader) -> Vec<u8> {
    let mut line = serde_json::to_vec(header).unwrap_or_default();
    line.push(b'\n');
    line
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |error| BackupError::Io {
        path: path.to_owned(),
        problem: error.to_string(),
    }
}

/// A backup file read and checked against its checksum (no key needed),
/// ready to be opened with its key.
#[derive(Debug)]
pub struct BackupReader {
    pub header: BackupHeader,
    path: PathBuf,
    sealed: Vec<u8>,
}

impl BackupReader {
    /// Reads `path`, refusing a foreign file, a bad header, and a file whose
    /// bytes do not match the header's checksum.
    pub fn open(path: &Path) -> Result<Self, BackupError> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut file| file.read_to_end(&mut bytes))
            .map_err(io_error(path))?;
        Self::from_bytes(path, bytes)
    }

    fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, BackupError> {
        let Some(rest) = bytes.strip_prefix(MAGIC) else {
            return Err(BackupError::Foreign {
                path: path.to_owned(),
            });
        };
        let bad = |problem: String| BackupError::Header {
            path: path.to_owned(),
            problem,
        };
        let newline = rest
            .iter()
            .take(MAX_HEADER_BYTES)
            .position(|byte| *byte == b'\n')
            .ok_or_else(|| bad("no header line".into()))?;
        let header: BackupHeader =
            serde_json::from_slice(&rest[..newline]).map_err(|error| bad(error.to_string()))?;
        if header.format != FILE_FORMAT || header.cipher != CIPHER {
            return Err(bad(format!(
                "format {} with {}; this cca reads format {FILE_FORMAT} with {CIPHER}",
                header.format, header.cipher
            )));
        }
        let sealed = rest[newline + 1..].to_vec();
        let digest = aws_lc_rs::digest::digest(&SHA256, &sealed);
        if cca_model::hex::encode(digest.as_ref()) != header.sha256 {
            return Err(BackupError::Checksum {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            header,
            path: path.to_owned(),
            sealed,
        })
    }

    /// Opens the sealed payload with `key` and parses it.
    pub fn open_payload(self, key: &BackupKey) -> Result<Payload, BackupError> {
        let prefix: [u8; 8] = cca_model::hex::decode(&self.header.nonce_prefix)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| BackupError::Header {
                path: self.path.clone(),
                problem: "its nonce prefix is not 16 hex digits".into(),
            })?;
        let plain = self.unseal(key, &prefix)?;
        payload::parse(&plain).map_err(|source| BackupError::Payload {
            path: self.path.clone(),
            source,
        })
    }

    fn unseal(&self, key: &BackupKey, prefix: &[u8; 8]) -> Result<Vec<u8>, BackupError> {
        let mut plain = Vec::with_capacity(self.sealed.len());
        let mut rest = &self.sealed[..];
        let mut index = 0u64;
        let truncated = |chunk| BackupError::Truncated {
            path: self.path.clone(),
            chunk,
        };
        loop {
            if rest.len() < 4 {
                return Err(truncated(index));
            }
            let (len, after) = rest.split_at(4);
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            if after.len() < len {
                return Err(truncated(index));
            }
            let (sealed, after) = after.split_at(len);
            let last = after.is_empty();
            let mut chunk = sealed.to_vec();
            let nonce = chunk_nonce(prefix, index).ok_or_else(|| truncated(index))?;
            let opened = key
                .key
                .open_in_place(nonce, Aad::from(chunk_aad(index, last)), &mut chunk)
                .map_err(|_| {
                    if last {
                        // The last chunk of a cut file was sealed as not
                        // the last: a key that opened the others is right.
                        if index > 0 {
                            truncated(index)
                        } else {
                            BackupError::Key {
                                path: self.path.clone(),
                                chunk: index,
                            }
                        }
                    } else {
                        BackupError::Key {
                            path: self.path.clone(),
                            chunk: index,
                        }
                    }
                })?;
            plain.extend_from_slice(opened);
            if last {
                return Ok(plain);
            }
            rest = after;
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::payload::{PAYLOAD_FORMAT, PayloadHeader, Record};
    use crate::types::KeyValue;

    fn key_in(dir: &Path, name: &str) -> (PathBuf, BackupKey) {
        let path = dir.join(name);
        let key = BackupKey::create(&path).expect("creates a key");
        (path, key)
    }

    fn header() -> BackupHeader {
        BackupHeader {
            format: 0,
            created_at: 1,
            revision: 42,
            keys: 3000,
            store: Some("s1".into()),
            files: vec!["ca.pem".into()],
            cipher: String::new(),
            nonce_prefix: String::new(),
            sha256: String::new(),
        }
    }

    /// A payload of 3,000 keys with 100-byte values: several chunks.
    fn payload_bytes() -> Vec<u8> {
        let mut bytes = PayloadHeader {
            format: PAYLOAD_FORMAT,
            revision: 42,
            keys: 3000,
            store: Some("s1".into()),
        }
        .encode();
        for i in 0..3000 {
            let kv = KeyValue {
                key: format!("desired/service/s{i:05}"),
                value: vec![b'x'; 100],
                create_revision: 2,
                mod_revision: 3,
                version: 1,
                lease: None,
            };
            Record::Key { kv }.encode(&mut bytes);
        }
        Record::File {
            name: "ca.pem".into(),
            bytes: b"PEM".to_vec(),
        }
        .encode(&mut bytes);
        Record::End {
            keys: 3000,
            files: 1,
        }
        .encode(&mut bytes);
        bytes
    }

    fn write(dir: &Path, key: BackupKey) -> PathBuf {
        let path = dir.join("backup.ccab");
        let file = std::fs::File::create(&path).expect("creates");
        let mut writer = BackupWriter::new(file, &path, key, header()).expect("starts");
        for piece in payload_bytes().chunks(1000) {
            writer.write(piece).expect("writes");
        }
        writer.finish().expect("finishes");
        path
    }

    #[test]
    fn a_backup_round_trips_with_its_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (key_path, key) = key_in(dir.path(), "key");
        let path = write(dir.path(), key);
        let reader = BackupReader::open(&path).expect("opens");
        assert_eq!(reader.header.revision, 42);
        assert_eq!(reader.header.files, ["ca.pem"]);
        let payload = reader
            .open_payload(&BackupKey::load(&key_path).expect("loads"))
            .expect("unseals");
        assert_eq!(payload.keys.len(), 3000);
        assert_eq!(payload.files[0].1, b"PEM");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key_path).expect("meta").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(BackupKey::create(&key_path).is_err(), "never replaced");
    }

    #[test]
    fn foreign_corrupt_truncated_and_wrong_key_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_, key) = key_in(dir.path(), "key");
        let path = write(dir.path(), key);
        let whole = std::fs::read(&path).expect("reads");
        let refuse = |bytes: Vec<u8>| {
            BackupReader::from_bytes(&path, bytes)
                .expect_err("refused")
                .to_string()
        };
        assert!(refuse(b"SQLite format 3\0".to_vec()).contains("not a CCattler backup"));
        let mut corrupt = whole.clone();
        let last = corrupt.len() - 100;
        corrupt[last] ^= 1;
        assert!(refuse(corrupt).contains("corrupt or truncated"));
        assert!(refuse(whole[..whole.len() / 2].to_vec()).contains("corrupt or truncated"));
        let (_, other) = key_in(dir.path(), "other-key");
        let reader = BackupReader::open(&path).expect("opens");
        let wrong = reader.open_payload(&other).expect_err("wrong key");
        assert!(
            wrong.to_string().contains("the key does not open"),
            "{wrong}"
        );
        std::fs::write(dir.path().join("bad-key"), "not hex").expect("writes");
        let bad = BackupKey::load(&dir.path().join("bad-key")).expect_err("bad key");
        assert!(bad.to_string().contains("64 hex digits"), "{bad}");
    }
}
