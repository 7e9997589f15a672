//! Backup and restore of 100,000 keys (`cargo bench -p cca-store --bench
//! backup`), three runs each, min / median / max: sealing a payload into a
//! backup file, and a restore — reading the file, checking its checksum,
//! unsealing, parsing and writing a new embedded data file. Beside them, in
//! the same run, the disk's own figure: writing and fsyncing the same
//! number of bytes. The target is a restore of 100,000 objects in under
//! 10 s.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::io::Write;
use std::time::{Duration, Instant};

use cca_store::KeyValue;
use cca_store::backup::payload::{PAYLOAD_FORMAT, PayloadHeader, Record};
use cca_store::backup::{BackupHeader, BackupKey, BackupReader, BackupWriter, RestoreTarget};

const KEYS: usize = 100_000;
/// About an instance record's size as JSON.
const VALUE_BYTES: usize = 400;
const RUNS: usize = 3;

fn payload() -> Vec<u8> {
    let mut bytes = PayloadHeader {
        format: PAYLOAD_FORMAT,
        revision: 1_000_000,
        keys: KEYS as u64,
        store: Some("bench".into()),
    }
    .encode();
    for i in 0..KEYS {
        let kv = KeyValue {
            key: format!(
                "derived/instance/svc-{:04}/svc-{:04}-{i:06}",
                i % 1000,
                i % 1000
            ),
            value: vec![b'x'; VALUE_BYTES],
            create_revision: 5,
            mod_revision: 7,
            version: 2,
            lease: None,
        };
        Record::Key { kv }.encode(&mut bytes);
    }
    Record::End {
        keys: KEYS as u64,
        files: 0,
    }
    .encode(&mut bytes);
    bytes
}

fn seal(dir: &std::path::Path, key: BackupKey, payload: &[u8]) -> std::path::PathBuf {
    let path = dir.join("bench.ccab");
    let file = std::fs::File::create(&path).expect("creates");
    let header = BackupHeader {
        format: 0,
        created_at: 0,
        revision: 1_000_000,
        keys: KEYS as u64,
        store: Some("bench".into()),
        files: Vec::new(),
        cipher: String::new(),
        nonce_prefix: String::new(),
        sha256: String::new(),
    };
    let mut writer = BackupWriter::new(file, &path, key, header).expect("starts");
    writer.write(payload).expect("writes");
    let (_, file) = writer.finish().expect("finishes");
    file.sync_all().expect("syncs");
    path
}

fn spread(mut runs: Vec<Duration>) -> String {
    runs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:.0} / {:.0} / {:.0} ms",
        ms(runs[0]),
        ms(runs[runs.len() / 2]),
        ms(runs[runs.len() - 1])
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let payload = payload();
    let (mut disk, mut sealing, mut restoring) = (Vec::new(), Vec::new(), Vec::new());
    let mut file_bytes = 0;
    for _ in 0..RUNS {
        let dir = tempfile::tempdir().expect("temp dir");
        let started = Instant::now();
        let mut raw = std::fs::File::create(dir.path().join("raw")).expect("creates");
        raw.write_all(&payload).expect("writes");
        raw.sync_all().expect("syncs");
        disk.push(started.elapsed());

        let key_path = dir.path().join("key");
        let key = BackupKey::create(&key_path).expect("key");
        let started = Instant::now();
        let path = seal(dir.path(), key, &payload);
        sealing.push(started.elapsed());
        file_bytes = std::fs::metadata(&path).expect("meta").len();

        let key = BackupKey::load(&key_path).expect("key");
        let target = dir.path().join("restored");
        let started = Instant::now();
        let read = BackupReader::open(&path)
            .expect("opens")
            .open_payload(&key)
            .expect("unseals");
        let restored = runtime
            .block_on(cca_store::backup::restore(
                &read,
                Vec::new(),
                RestoreTarget::Embedded(target),
                1_000_000,
                |_| {},
            ))
            .expect("restores");
        restoring.push(started.elapsed());
        assert_eq!(restored.keys, KEYS);
    }
    println!(
        "backup of {KEYS} keys ({} MB payload, {} MB file), {RUNS} runs, min / median / max:",
        payload.len() / 1_000_000,
        file_bytes / 1_000_000
    );
    println!(
        "  disk: write + fsync the payload's bytes   {}",
        spread(disk)
    );
    println!(
        "  seal into a backup file                   {}",
        spread(sealing)
    );
    println!(
        "  restore (read, check, unseal, parse, write a new store)  {}",
        spread(restoring)
    );
}
