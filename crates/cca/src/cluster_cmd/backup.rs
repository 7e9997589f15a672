//! `cca backup` and `cca restore`: wiring of `cca_store::backup`. A backup
//! reads the store through the API server (`GET /v1/backup`, a consistent
//! snapshot while the cluster runs), adds the files a restore needs (the
//! config directory's CA and keys, the secret key file) and seals it all
//! into one file with the operator's key, which never leaves this machine.
//! `--schedule` keeps taking them, proves each by restoring it into a
//! scratch store, and keeps the newest N. A restore writes into a new
//! embedded data directory or an empty etcd, with a new store identity
//! that names the old one, and puts the files back where it is told.

#![allow(clippy::print_stdout, reason = "the commands report to stdout")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_store::backup::payload::{self, PAYLOAD_FORMAT, Payload, PayloadHeader, Record};
use cca_store::backup::{BackupHeader, BackupKey, BackupReader, BackupWriter, RestoreTarget};
use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::{RangeRequest, Store, StoreUrl};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::ServerAddr;
use super::commands::client;

/// The name a config directory's file has inside a backup.
const CONFIG_PREFIX: &str = "config/";
/// The name the secret key file has inside a backup.
const SECRET_KEY: &str = "secret-key";
/// What a scheduled backup's files are called: `cca-backup-{time}.ccab`.
const SCHEDULED_PREFIX: &str = "cca-backup-";
const SCHEDULED_SUFFIX: &str = ".ccab";

#[derive(Debug, Args)]
pub(crate) struct BackupArgs {
    /// The backup file to write (with --schedule: the directory to keep
    /// them in).
    path: PathBuf,
    /// The key that seals the backup: a file of 64 hex digits.
    #[arg(long, value_name = "FILE")]
    key_file: PathBuf,
    /// Make the key file first (mode 0600; an existing one is never
    /// replaced). Keep it apart from the backups.
    #[arg(long)]
    create_key: bool,
    /// The server's secret key file, carried in the backup: secrets
    /// restored without it cannot be opened.
    #[arg(long, value_name = "FILE")]
    secret_key_file: Option<PathBuf>,
    /// Take a backup this often, prove each by restoring it into a scratch
    /// store, and keep the newest --keep (until stopped).
    #[arg(long, value_name = "DURATION", value_parser = crate::flags::duration)]
    schedule: Option<Duration>,
    /// How many scheduled backups to keep.
    #[arg(long, default_value_t = 7, requires = "schedule", value_parser = clap::value_parser!(u32).range(1..))]
    keep: u32,
    #[command(flatten)]
    addr: ServerAddr,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// The backup file.
    path: PathBuf,
    /// The key the backup was sealed with.
    #[arg(long, value_name = "FILE")]
    key_file: PathBuf,
    /// Where to restore: `embedded:DIR` (a directory without a store) or
    /// `etcd://host:port[,...]` (an empty cluster). Not with --check.
    #[arg(long, value_name = "URL", required_unless_present = "check")]
    store: Option<StoreUrl>,
    #[command(flatten)]
    etcd_tls: crate::flags::EtcdTlsArgs,
    /// Put the backup's config directory files (the cluster CA and keys)
    /// here; an existing different file is never replaced.
    #[arg(long, value_name = "DIR")]
    config_dir: Option<PathBuf>,
    /// Put the backup's secret key here (for `cca server
    /// --secret-key-file`); an existing different file is never replaced.
    #[arg(long, value_name = "FILE")]
    secret_key_file: Option<PathBuf>,
    /// Move the embedded store's revision this far past the backup's, so
    /// nothing that watched the old store mistakes the new one for it.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(i64).range(1..))]
    bump_revision: i64,
    /// Only prove the backup: unseal it and restore it into a scratch
    /// store, writing nothing else.
    #[arg(long)]
    check: bool,
}

pub(super) async fn backup(args: BackupArgs) -> Result<()> {
    let key = if args.create_key {
        BackupKey::create(&args.key_file)?
    } else {
        BackupKey::load(&args.key_file)?
    };
    let Some(every) = args.schedule else {
        let written = take(&args, key).await?;
        println!("{written}");
        return Ok(());
    };
    std::fs::create_dir_all(&args.path)
        .with_context(|| format!("creating the backup directory {}", args.path.display()))?;
    let mut ticker = tokio::time::interval(every);
    loop {
        ticker.tick().await;
        // A failed round is reported and the schedule goes on: the next
        // one may find the server back.
        match scheduled_round(&args).await {
            Ok(line) => println!("{line}"),
            Err(error) => tracing::error!("scheduled backup failed: {error:#}"),
        }
    }
}

/// One scheduled backup: taken, proven, and the oldest beyond --keep gone.
async fn scheduled_round(args: &BackupArgs) -> Result<String> {
    let stamp = humantime::format_rfc3339_seconds(
        std::time::SystemTime::UNIX_EPOCH
            + Duration::from_millis(u64::try_from(cca_model::clock::now_millis()).unwrap_or(0)),
    )
    .to_string()
    .replace([':', '-'], "");
    let path = args
        .path
        .join(format!("{SCHEDULED_PREFIX}{stamp}{SCHEDULED_SUFFIX}"));
    let round = BackupArgs {
        path: path.clone(),
        key_file: args.key_file.clone(),
        create_key: false,
        secret_key_file: args.secret_key_file.clone(),
        schedule: None,
        keep: args.keep,
        addr: args.addr.clone(),
    };
    let written = take(&round, BackupKey::load(&args.key_file)?).await?;
    let proof = prove(&path, &BackupKey::load(&args.key_file)?).await?;
    let pruned = prune(&args.path, args.keep as usize)?;
    Ok(format!(
        "{written}; {proof}; {pruned} older backup(s) removed"
    ))
}

/// Takes one backup into `args.path`; says what it wrote.
async fn take(args: &BackupArgs, key: BackupKey) -> Result<String> {
    let client = client(&args.addr)?;
    let payload = download(&client).await?;
    let files = gather_files(&args.addr, args.secret_key_file.as_deref())?;
    let header = BackupHeader {
        format: 0,
        created_at: cca_model::clock::now_millis(),
        revision: payload.revision,
        keys: payload.keys.len() as u64,
        store: payload.store.clone(),
        files: files.iter().map(|(name, _)| name.clone()).collect(),
        cipher: String::new(),
        nonce_prefix: String::new(),
        sha256: String::new(),
    };
    let temporary = args.path.with_extension("tmp");
    let file = std::fs::File::create(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    let mut writer = BackupWriter::new(file, &args.path, key, header)?;
    let bar = progress(payload.keys.len() as u64, "sealing keys");
    writer.write(
        &PayloadHeader {
            format: PAYLOAD_FORMAT,
            revision: payload.revision,
            keys: payload.keys.len() as u64,
            store: payload.store.clone(),
        }
        .encode(),
    )?;
    let mut record = Vec::new();
    for kv in &payload.keys {
        record.clear();
        Record::Key { kv: kv.clone() }.encode(&mut record);
        writer.write(&record)?;
        bar.inc(1);
    }
    for (name, bytes) in &files {
        record.clear();
        Record::File {
            name: name.clone(),
            bytes: bytes.clone(),
        }
        .encode(&mut record);
        writer.write(&record)?;
    }
    record.clear();
    Record::End {
        keys: payload.keys.len() as u64,
        files: files.len() as u64,
    }
    .encode(&mut record);
    writer.write(&record)?;
    let (header, file) = writer.finish()?;
    file.sync_all()
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, &args.path)
        .with_context(|| format!("moving the backup into place at {}", args.path.display()))?;
    bar.finish_and_clear();
    let size = std::fs::metadata(&args.path)
        .map(|meta| meta.len())
        .unwrap_or(0);
    Ok(format!(
        "backed up {} keys at revision {} of store {}{} to {} ({size} bytes, sha256 {})",
        header.keys,
        header.revision,
        header.store.as_deref().unwrap_or("(no identity)"),
        files_note(&header.files),
        args.path.display(),
        &header.sha256[..16],
    ))
}

fn files_note(files: &[String]) -> String {
    if files.is_empty() {
        " (no files: no CA in the config directory, no --secret-key-file)".into()
    } else {
        format!(" with {}", files.join(", "))
    }
}

/// The store's payload from the server, checked whole.
async fn download(client: &cca_wire::Client) -> Result<Payload> {
    let mut stream = client
        .backup()
        .await
        .context("asking the server for a backup")?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} reading the store: {bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next_chunk().await? {
        bytes.extend_from_slice(&chunk);
        bar.set_position(bytes.len() as u64);
    }
    bar.finish_and_clear();
    payload::parse(&bytes).context("the server's backup stream is not whole (it failed midway?)")
}

/// The files a restore needs besides the store: every file at the top of
/// the config directory when it holds the cluster CA, and the secret key.
fn gather_files(addr: &ServerAddr, secret_key: Option<&Path>) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let config = cca_trust::config_dir::ConfigDir::new(addr.config_dir());
    if config.has_ca() {
        let mut entries: Vec<_> = std::fs::read_dir(config.root())
            .with_context(|| format!("reading {}", config.root().display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            if !entry.file_type()?.is_file() {
                continue;
            }
            let bytes = std::fs::read(entry.path())
                .with_context(|| format!("reading {}", entry.path().display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            files.push((format!("{CONFIG_PREFIX}{name}"), bytes));
        }
    }
    if let Some(path) = secret_key {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading the secret key {}", path.display()))?;
        files.push((SECRET_KEY.to_owned(), bytes));
    }
    Ok(files)
}

/// Proves a backup: unsealed, parsed, restored into a scratch store that
/// then opens and holds every key.
async fn prove(path: &Path, key: &BackupKey) -> Result<String> {
    let payload = BackupReader::open(path)?.open_payload(key)?;
    let scratch = tempfile::tempdir().context("making a scratch directory")?;
    let dir = scratch.path().join("store");
    let restored = cca_store::backup::restore(
        &payload,
        Vec::new(),
        RestoreTarget::Embedded(dir.clone()),
        1,
        |_| {},
    )
    .await?;
    let store = EmbeddedStore::open(Config::new(&dir)).await?;
    let mut held = 0;
    let mut request = RangeRequest::prefix("");
    loop {
        let page = store.range(request.clone()).await?;
        held += page.kvs.len();
        match page.continuation {
            Some(after) => request = request.after(after),
            None => break,
        }
    }
    store.close().await;
    if held != restored.keys {
        bail!(
            "{}: the scratch restore holds {held} keys, the backup {}",
            path.display(),
            restored.keys
        );
    }
    Ok(format!("proven: restored {held} keys into a scratch store"))
}

/// Removes the oldest scheduled backups in `dir` beyond the newest `keep`.
fn prune(dir: &Path, keep: usize) -> Result<usize> {
    let mut backups: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| {
                    name.starts_with(SCHEDULED_PREFIX) && name.ends_with(SCHEDULED_SUFFIX)
                })
        })
        .collect();
    backups.sort();
    let excess = backups.len().saturating_sub(keep);
    for old in &backups[..excess] {
        std::fs::remove_file(old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(excess)
}

pub(super) async fn restore(args: RestoreArgs) -> Result<()> {
    let key = BackupKey::load(&args.key_file)?;
    if args.check {
        println!("{}", prove(&args.path, &key).await?);
        return Ok(());
    }
    let reader = BackupReader::open(&args.path)?;
    let payload = reader.open_payload(&key)?;
    let Some(url) = &args.store else {
        bail!("--store is needed to restore (or --check to only prove the backup)");
    };
    let target = match url {
        StoreUrl::Embedded(dir) => RestoreTarget::Embedded(dir.clone()),
        StoreUrl::Etcd(_) => RestoreTarget::Store(args.etcd_tls.open(url).await?),
    };
    let mut identity = cca_api::identity::mint_identity()?;
    identity.restored_from = payload.store.clone();
    let replace = vec![(
        cca_model::keys::store_identity(),
        serde_json::to_vec(&identity)?,
    )];
    let bar = progress(payload.keys.len() as u64, "restoring keys");
    let restored =
        cca_store::backup::restore(&payload, replace, target, args.bump_revision, |written| {
            bar.set_position(written as u64)
        })
        .await?;
    bar.finish_and_clear();
    let placed = put_files(
        &payload,
        args.config_dir.as_deref(),
        args.secret_key_file.as_deref(),
    )?;
    println!(
        "restored {} keys at revision {} as store {} (restored from {}); {} keys a lease held left out{}",
        restored.keys,
        restored.revision,
        identity.id,
        payload
            .store
            .as_deref()
            .unwrap_or("a store without an identity"),
        restored.leased,
        placed
    );
    Ok(())
}

/// Writes the backup's files where the flags say; notes what went where
/// and what was left in the backup.
fn put_files(
    payload: &Payload,
    config_dir: Option<&Path>,
    secret_key: Option<&Path>,
) -> Result<String> {
    let mut note = String::new();
    for (name, bytes) in &payload.files {
        let destination = match (name.strip_prefix(CONFIG_PREFIX), name.as_str()) {
            (Some(file), _) => config_dir.map(|dir| dir.join(file)),
            (None, SECRET_KEY) => secret_key.map(Path::to_path_buf),
            (None, other) => bail!("the backup holds a file `{other}` this cca does not know"),
        };
        let Some(path) = destination else {
            note.push_str(&format!(
                "; {name} left in the backup (no --config-dir/--secret-key-file)"
            ));
            continue;
        };
        write_new(&path, bytes)?;
        note.push_str(&format!("; {name} → {}", path.display()));
    }
    Ok(note)
}

/// Writes `bytes` to `path` (mode 0600), unless a different file is there.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(held) = std::fs::read(path) {
        if held == bytes {
            return Ok(());
        }
        bail!(
            "{} exists and differs from the backup's copy: move it away first",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!("{{bar:30}} {{pos}}/{{len}} {what} ({{per_sec}})"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
