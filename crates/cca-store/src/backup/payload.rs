//! The backup payload: what a store snapshot and a backup's files become
//! as one byte stream. A JSON header line, then records: `K` (a key with
//! its value, revisions and whether a lease held it), `F` (a named file)
//! and `E` (the end, with the number of keys and files before it).
//! Lengths are big-endian `u32`, revisions `i64`.

use serde::{Deserialize, Serialize};

use crate::types::{KeyValue, Revision};

/// The payload format this code writes and reads.
pub const PAYLOAD_FORMAT: u32 = 1;

/// The first line of a payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadHeader {
    pub format: u32,
    /// Every key is as of this revision.
    pub revision: Revision,
    /// Keys the payload holds.
    pub keys: u64,
    /// The store's identity (`meta/store`), when it has one.
    #[serde(default)]
    pub store: Option<String>,
}

/// One record of a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Key {
        kv: KeyValue,
    },
    File {
        name: String,
        bytes: Vec<u8>,
    },
    /// The last record: how many keys and files came before it.
    End {
        keys: u64,
        files: u64,
    },
}

impl PayloadHeader {
    /// The header line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

impl Record {
    /// Appends the record's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Key { kv } => {
                out.push(b'K');
                put_bytes(out, kv.key.as_bytes());
                put_bytes(out, &kv.value);
                out.extend_from_slice(&kv.create_revision.to_be_bytes());
                out.extend_from_slice(&kv.mod_revision.to_be_bytes());
                out.extend_from_slice(&kv.version.to_be_bytes());
                out.push(u8::from(kv.lease.is_some()));
            }
            Record::File { name, bytes } => {
                out.push(b'F');
                put_bytes(out, name.as_bytes());
                put_bytes(out, bytes);
            }
            Record::End { keys, files } => {
                out.push(b'E');
                out.extend_from_slice(&keys.to_be_bytes());
                out.extend_from_slice(&files.to_be_bytes());
            }
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// What reading a payload found wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("the payload header is not valid: {0}")]
    Header(String),
    #[error("the payload is of format {0}; this cca reads format {PAYLOAD_FORMAT}")]
    Format(u32),
    #[error("record {index} is malformed: {problem}")]
    Record { index: u64, problem: String },
    #[error("the payload ends before its end record (cut off after {0} records)")]
    Truncated(u64),
    #[error(
        "the end record counts {keys} keys and {files} files, but {seen_keys} and {seen_files} came"
    )]
    Count {
        keys: u64,
        files: u64,
        seen_keys: u64,
        seen_files: u64,
    },
}

/// A whole payload, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    pub revision: Revision,
    pub store: Option<String>,
    pub keys: Vec<KeyValue>,
    pub files: Vec<(String, Vec<u8>)>,
}

/// Parses a whole payload, checking its header, every record and the
/// counts of its end record.
pub fn parse(bytes: &[u8]) -> Result<Payload, PayloadError> {
    let newline = bytes
        .iter()
        .position(|byte| *byte == b'\n')
        .ok_or_else(|| PayloadError::Header("no header line".into()))?;
    let header: PayloadHeader = serde_json::from_slice(&bytes[..newline])
        .map_err(|error| PayloadError::Header(error.to_string()))?;
    if header.format != PAYLOAD_FORMAT {
        return Err(PayloadError::Format(header.format));
    }
    let mut cursor = Cursor {
        bytes: &bytes[newline + 1..],
        index: 0,
    };
    let mut payload = Payload {
        revision: header.revision,
        store: header.store,
        keys: Vec::with_capacity(usize::try_from(header.keys).unwrap_or(0).min(1 << 20)),
        files: Vec::new(),
    };
    loop {
        match cursor.record()? {
            Some(Record::Key { kv }) => payload.keys.push(kv),
            Some(Record::File { name, bytes }) => payload.files.push((name, bytes)),
            Some(Record::End { keys, files }) => {
                let (seen_keys, seen_files) =
                    (payload.keys.len() as u64, payload.files.len() as u64);
                if keys != seen_keys || files != seen_files {
                    return Err(PayloadError::Count {
                        keys,
                        files,
                        seen_keys,
                        seen_files,
                    });
                }
                return Ok(payload);
            }
            None => return Err(PayloadError::Truncated(cursor.index)),
        }
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    index: u64,
}

impl Cursor<'_> {
    fn record(&mut self) -> Result<Option<Record>, PayloadError> {
        let Some((&tag, _)) = self.bytes.split_first() else {
            return Ok(None);
        };
        self.bytes = &self.bytes[1..];
        let record = match tag {
            b'K' => {
                let key = self.text("key")?;
                let value = self.bytes_field("value")?.to_vec();
                let create_revision = self.i64("create revision")?;
                let mod_revision = self.i64("mod revision")?;
                let version = self.i64("version")?;
                let leased = self.take(1, "lease flag")?[0] == 1;
                Record::Key {
                    kv: KeyValue {
                        key,
                        value,
                        create_revision,
                        mod_revision,
                        version,
                        // Only whether one held it survives: leases are
                        // not restored.
                        lease: leased.then_some(0),
                    },
                }
            }
            b'F' => Record::File {
                name: self.text("file name")?,
                bytes: self.bytes_field("file")?.to_vec(),
            },
            b'E' => Record::End {
                keys: self.u64("key count")?,
                files: self.u64("file count")?,
            },
            other => return Err(self.bad(format!("unknown record type {other:#04x}"))),
        };
        self.index += 1;
        Ok(Some(record))
    }

    fn bad(&self, problem: String) -> PayloadError {
        PayloadError::Record {
            index: self.index,
            problem,
        }
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&[u8], PayloadError> {
        if self.bytes.len() < len {
            return Err(self.bad(format!("its {what} is cut off")));
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn bytes_field(&mut self, what: &str) -> Result<&[u8], PayloadError> {
        let len = u32::from_be_bytes(self.array(what)?) as usize;
        self.take(len, what)
    }

    fn text(&mut self, what: &str) -> Result<String, PayloadError> {
        let bytes = self.bytes_field(what)?.to_vec();
        String::from_utf8(bytes).map_err(|_| self.bad(format!("its {what} is not UTF-8")))
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], PayloadError> {
        let taken = self.take(N, what)?;
        let mut array = [0; N];
        array.copy_from_slice(taken);
        Ok(array)
    }

    fn i64(&mut self, what: &str) -> Result<i64, PayloadError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, PayloadError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, lease: Option<i64>) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: format!("value of {key}").into_bytes(),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            lease,
        }
    }

    fn payload(records: &[Record]) -> Vec<u8> {
        let header = PayloadHeader {
            format: PAYLOAD_FORMAT,
            revision: 9,
            keys: 2,
            store: Some("abc".into()),
        };
        let mut bytes = header.encode();
        for record in records {
            record.encode(&mut bytes);
        }
        bytes
    }

    #[test]
    fn a_payload_round_trips_and_keeps_only_whether_a_lease_held_a_key() {
        let records = [
            Record::Key { kv: kv("a", None) },
            Record::Key {
                kv: kv("b", Some(42)),
            },
            Record::File {
                name: "ca.pem".into(),
                bytes: b"PEM".to_vec(),
            },
            Record::End { keys: 2, files: 1 },
        ];
        let read = parse(&payload(&records)).expect("parses");
        assert_eq!(read.revision, 9);
        assert_eq!(read.store.as_deref(), Some("abc"));
        assert_eq!(read.keys, [kv("a", None), kv("b", Some(0))]);
        assert_eq!(read.files, [("ca.pem".to_owned(), b"PEM".to_vec())]);
    }

    #[test]
    fn a_cut_or_miscounted_payload_is_refused_with_the_reason() {
        let whole = payload(&[
            Record::Key { kv: kv("a", None) },
            Record::End { keys: 1, files: 0 },
        ]);
        let cut = &whole[..whole.len() - 10];
        assert!(
            matches!(parse(cut), Err(PayloadError::Record { .. })),
            "{:?}",
            parse(cut)
        );
        let no_end = payload(&[Record::Key { kv: kv("a", None) }]);
        assert_eq!(parse(&no_end), Err(PayloadError::Truncated(1)));
        let miscounted = payload(&[
            Record::Key { kv: kv("a", None) },
            Record::End { keys: 2, files: 0 },
        ]);
        assert!(matches!(
            parse(&miscounted),
            Err(PayloadError::Count { .. })
        ));
        let mut future = whole.clone();
        future.splice(0..11, b"{\"format\":7".iter().copied());
        assert!(matches!(
            parse(&future),
            Err(PayloadError::Format(7)) | Err(PayloadError::Header(_))
        ));
    }
}
