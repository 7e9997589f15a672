//! `cca store`: direct access to the fact store for operators — get, put,
//! delete, range, watch, compact and status against the embedded store's
//! data directory or an etcd cluster. Output is one line per key
//! (`key = value`), or JSON objects with `-o json`.

#![allow(clippy::print_stdout, reason = "the command's output goes to stdout")]

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use cca_store::{KeyValue, Op, RangeRequest, Store, StoreUrl, Txn, WatchEvent, WatchMessage};
use clap::{Args, Subcommand, ValueEnum};

#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The store: `embedded:DIR` or `etcd://host:port[,host:port...]`.
    #[arg(
        long,
        env = "CCA_STORE",
        default_value = "embedded:.cca-dev/store",
        global = true
    )]
    store: StoreUrl,
    #[command(flatten)]
    etcd_tls: crate::flags::EtcdTlsArgs,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Text, global = true)]
    output: Output,

    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Print one key.
    Get { key: String },
    /// Set a key (the value is taken as UTF-8 text).
    Put { key: String, value: String },
    /// Delete a key, or every key under a prefix with --prefix.
    Delete {
        key: String,
        #[arg(long)]
        prefix: bool,
    },
    /// Print every key under a prefix (all keys when omitted).
    Range {
        #[arg(default_value = "")]
        prefix: String,
        /// At most this many keys.
        #[arg(long, default_value_t = 0)]
        limit: usize,
    },
    /// Print changes under a prefix as they happen, until Ctrl-C.
    Watch {
        #[arg(default_value = "")]
        prefix: String,
        /// Replay history from this revision (0: only new changes).
        #[arg(long, default_value_t = 0)]
        from: i64,
    },
    /// Discard history up to and including a revision.
    Compact { revision: i64 },
    /// Print the store's current revision.
    Status,
}

pub(crate) fn run(args: StoreArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let store = args
            .etcd_tls
            .open(&args.store)
            .await
            .with_context(|| format!("opening store {}", describe(&args.store)))?;
        execute(store, args.command, args.output).await
    })
}

fn describe(url: &StoreUrl) -> String {
    match url {
        StoreUrl::Embedded(dir) => format!("embedded:{}", dir.display()),
        StoreUrl::Etcd(endpoints) => format!("etcd {}", endpoints.join(",")),
    }
}

async fn execute(store: Arc<dyn Store>, command: StoreCommand, output: Output) -> Result<ExitCode> {
    match command {
        StoreCommand::Get { key } => match store.get(&key).await? {
            Some(kv) => print_kv(&kv, output),
            None => {
                anyhow::bail!("key `{key}` not found");
            }
        },
        StoreCommand::Put { key, value } => {
            let outcome = store.txn(Txn::new().then(Op::put(&key, value))).await?;
            print_revision(outcome.revision(), output);
        }
        StoreCommand::Delete { key, prefix } => {
            let op = if prefix {
                Op::delete_prefix(&key)
            } else {
                Op::delete(&key)
            };
            let outcome = store.txn(Txn::new().then(op)).await?;
            print_revision(outcome.revision(), output);
        }
        StoreCommand::Range { prefix, limit } => {
            let page = store
                .range(RangeRequest::prefix(prefix).limit(limit))
                .await?;
            for kv in &page.kvs {
                print_kv(kv, output);
            }
        }
        StoreCommand::Watch { prefix, from } => watch(store, &prefix, from, output).await?,
        StoreCommand::Compact { revision } => {
            store.compact(revision).await?;
            print_revision(revision, output);
        }
        StoreCommand::Status => print_revision(store.current_revision().await?, output),
    }
    Ok(ExitCode::SUCCESS)
}

async fn watch(store: Arc<dyn Store>, prefix: &str, from: i64, output: Output) -> Result<()> {
    let mut stream = store.watch(prefix, from).await?;
    loop {
        let message = tokio::select! {
            message = stream.next_message() => message?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        match message {
            WatchMessage::Events { events, .. } => {
                events.iter().for_each(|event| print_event(event, output))
            }
            WatchMessage::Compacted { compact_revision } => anyhow::bail!(
                "history up to revision {compact_revision} is compacted; watch from {} or later",
                compact_revision + 1
            ),
        }
    }
}

fn print_kv(kv: &KeyValue, output: Output) {
    match output {
        Output::Text => println!("{} = {}", kv.key, String::from_utf8_lossy(&kv.value)),
        Output::Json => println!("{}", kv_json(kv)),
    }
}

fn kv_json(kv: &KeyValue) -> serde_json::Value {
    serde_json::json!({
        "key": kv.key,
        "value": String::from_utf8_lossy(&kv.value),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
    })
}

fn print_event(event: &WatchEvent, output: Output) {
    match (event, output) {
        (WatchEvent::Put(kv), Output::Text) => {
            println!(
                "{} PUT {} = {}",
                kv.mod_revision,
                kv.key,
                String::from_utf8_lossy(&kv.value)
            );
        }
        (WatchEvent::Delete { key, revision }, Output::Text) => println!("{revision} DELETE {key}"),
        (WatchEvent::Put(kv), Output::Json) => {
            println!("{}", serde_json::json!({"type": "put", "kv": kv_json(kv)}));
        }
        (WatchEvent::Delete { key, revision }, Output::Json) => {
            println!(
                "{}",
                serde_json::json!({"type": "delete", "key": key, "revision": revision})
            );
        }
    }
}

fn print_revision(revision: i64, output: Output) {
    match output {
        Output::Text => println!("revision {revision}"),
        Output::Json => println!("{}", serde_json::json!({ "revision": revision })),
    }
}
