//! The byte encoding of records in the data file: key-values, log entries
//! and leases. Fixed little-endian integers and length-prefixed bytes; every
//! decoder checks lengths and says what is wrong instead of panicking.

use crate::types::{KeyValue, LeaseId, Revision, WatchEvent};

/// A record that does not decode; the caller adds which table and key.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DecodeError(pub(super) String);

pub(super) type Decoded<T> = Result<T, DecodeError>;

/// A lease as persisted: its TTL and the wall-clock instant it expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LeaseRecord {
    pub(super) ttl_secs: i64,
    /// Milliseconds since the Unix epoch.
    pub(super) deadline_ms: i64,
}

/// Everything of a key-value but the key, which is the table key.
pub(super) fn encode_kv(kv: &KeyValue, out: &mut Vec<u8>) {
    out.extend_from_slice(&kv.create_revision.to_le_bytes());
    out.extend_from_slice(&kv.mod_revision.to_le_bytes());
    out.extend_from_slice(&kv.version.to_le_bytes());
    out.extend_from_slice(&kv.lease.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&kv.value);
}

pub(super) fn decode_kv(key: &str, bytes: &[u8]) -> Decoded<KeyValue> {
    let mut reader = Reader::new(bytes);
    let create_revision = reader.i64("create revision")?;
    let mod_revision = reader.i64("mod revision")?;
    let version = reader.i64("version")?;
    let lease = reader.i64("lease")?;
    if create_revision < 1 || mod_revision < create_revision || version < 1 {
        return Err(DecodeError(format!(
            "impossible revisions (create {create_revision}, mod {mod_revision}, version {version})"
        )));
    }
    Ok(KeyValue {
        key: key.to_owned(),
        value: reader.rest().to_vec(),
        create_revision,
        mod_revision,
        version,
        lease: (lease != 0).then_some(lease),
    })
}

const EVENT_PUT: u8 = 1;
const EVENT_DELETE: u8 = 2;

/// The events of one revision.
pub(super) fn encode_events(events: &[WatchEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(events.len() as u32).to_le_bytes());
    for event in events {
        match event {
            WatchEvent::Put(kv) => {
                out.push(EVENT_PUT);
                put_bytes(&mut out, kv.key.as_bytes());
                let mut record = Vec::with_capacity(32 + kv.value.len());
                encode_kv(kv, &mut record);
                put_bytes(&mut out, &record);
            }
            WatchEvent::Delete { key, .. } => {
                out.push(EVENT_DELETE);
                put_bytes(&mut out, key.as_bytes());
            }
        }
    }
    out
}

pub(super) fn decode_events(revision: Revision, bytes: &[u8]) -> Decoded<Vec<WatchEvent>> {
    let mut reader = Reader::new(bytes);
    let count = reader.u32("event count")?;
    let mut events = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let tag = reader.u8("event kind")?;
        let key = reader.string("event key")?;
        let event = match tag {
            EVENT_PUT => WatchEvent::Put(decode_kv(&key, reader.bytes("event record")?)?),
            EVENT_DELETE => WatchEvent::Delete { key, revision },
            other => return Err(DecodeError(format!("unknown event kind {other}"))),
        };
        if event.revision() != revision {
            return Err(DecodeError(format!(
                "event for `{}` carries revision {} inside log entry {revision}",
                event.key(),
                event.revision()
            )));
        }
        events.push(event);
    }
    if !reader.rest().is_empty() {
        return Err(DecodeError(format!(
            "{} trailing bytes after the events",
            reader.rest().len()
        )));
    }
    Ok(events)
}

pub(super) fn encode_lease(lease: &LeaseRecord) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&lease.ttl_secs.to_le_bytes());
    out[8..].copy_from_slice(&lease.deadline_ms.to_le_bytes());
    out
}

pub(super) fn decode_lease(id: LeaseId, bytes: &[u8]) -> Decoded<LeaseRecord> {
    let mut reader = Reader::new(bytes);
    let ttl_secs = reader.i64("lease ttl")?;
    let deadline_ms = reader.i64("lease deadline")?;
    if ttl_secs < 1 || !reader.rest().is_empty() {
        return Err(DecodeError(format!("malformed lease {id}")));
    }
    Ok(LeaseRecord {
        ttl_secs,
        deadline_ms,
    })
}

pub(super) fn encode_i64(value: i64) -> [u8; 8] {
    value.to_le_bytes()
}

pub(super) fn decode_i64(what: &str, bytes: &[u8]) -> Decoded<i64> {
    let mut reader = Reader::new(bytes);
    let value = reader.i64(what)?;
    if reader.rest().is_empty() {
        Ok(value)
    } else {
        Err(DecodeError(format!("{what} has trailing bytes")))
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A cursor over a record that reports truncation by field name.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn take(&mut self, len: usize, what: &str) -> Decoded<&'a [u8]> {
        if self.bytes.len() < len {
            return Err(DecodeError(format!(
                "truncated: {what} needs {len} bytes, {} left",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Decoded<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Decoded<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Decoded<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Decoded<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    fn bytes(&mut self, what: &str) -> Decoded<&'a [u8]> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    fn string(&mut self, what: &str) -> Decoded<String> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError(format!("{what} is not UTF-8")))
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: Revision, lease: Option<LeaseId>) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: b"value".to_vec(),
            create_revision: 2,
            mod_revision: rev,
            version: 3,
            lease,
        }
    }

    #[test]
    fn records_round_trip() {
        let mut bytes = Vec::new();
        encode_kv(&kv("a", 7, Some(9)), &mut bytes);
        assert_eq!(decode_kv("a", &bytes), Ok(kv("a", 7, Some(9))));

        let events = vec![
            WatchEvent::Put(kv("a", 7, None)),
            WatchEvent::Delete {
                key: "b".into(),
                revision: 7,
            },
        ];
        assert_eq!(decode_events(7, &encode_events(&events)), Ok(events));

        let lease = LeaseRecord {
            ttl_secs: 15,
            deadline_ms: 1_700_000_000_000,
        };
        assert_eq!(decode_lease(1, &encode_lease(&lease)), Ok(lease));
    }

    #[test]
    fn truncated_and_inconsistent_records_are_reported() {
        let mut bytes = Vec::new();
        encode_kv(&kv("a", 7, None), &mut bytes);
        let err = decode_kv("a", &bytes[..20]).expect_err("truncated");
        assert!(
            err.0.contains("truncated: version needs 8 bytes"),
            "{}",
            err.0
        );

        let events = encode_events(&[WatchEvent::Put(kv("a", 7, None))]);
        let err = decode_events(8, &events).expect_err("wrong revision");
        assert!(err.0.contains("inside log entry 8"), "{}", err.0);
        assert!(decode_events(7, &events[..events.len() - 1]).is_err());
        assert!(decode_lease(1, &[0u8; 5]).is_err());
    }
}
