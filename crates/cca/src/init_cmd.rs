//! `cca init`: makes a cluster's trust in its config directory — the
//! cluster CA, the server's certificate and the local admin's client
//! certificate (`cca_trust::config_dir`) — and says what to run next.
//! Wiring only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cca_trust::config_dir::{ConfigDir, InitOptions};
use cca_trust::pki::Names;
use clap::Args;

/// `cca init [--config-dir DIR] [--cluster NAME] [--server-name NAME] [--host HOST]…`
#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Where the cluster's CA, certificates and keys go.
    #[arg(long, env = "CCA_CONFIG_DIR", default_value = cca_trust::config_dir::DEFAULT_DIR)]
    config_dir: PathBuf,
    /// The cluster's name, in its CA's subject.
    #[arg(long, default_value = "cca")]
    cluster: String,
    /// This server's name (its certificate's identity `server:NAME`);
    /// default: the host name.
    #[arg(long)]
    server_name: Option<String>,
    /// A host name or address clients reach the server by (repeatable);
    /// `localhost`, `127.0.0.1`, `::1` and the host name are always in.
    #[arg(long = "host", value_name = "HOST")]
    hosts: Vec<String>,
}

pub(crate) fn run(args: InitArgs) -> Result<ExitCode> {
    let host_name = host_name();
    let server = args
        .server_name
        .clone()
        .unwrap_or_else(|| host_name.clone().unwrap_or_else(|| "server".to_owned()));
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    hosts.extend(host_name);
    hosts.extend(args.hosts.iter().cloned());
    hosts.sort();
    hosts.dedup();
    let options = InitOptions {
        cluster: args.cluster.clone(),
        server,
        hosts: Names::from_hosts(&hosts).context("the server's host names")?,
    };
    let config = ConfigDir::new(&args.config_dir);
    let made = config.init(&options, cca_model::clock::system_now())?;
    report(&args, &options, &made);
    Ok(ExitCode::SUCCESS)
}

/// The host name, lower-cased, when it can be a certificate name.
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_ascii_lowercase();
    Names::from_hosts([&name]).ok().map(|_| name)
}

#[allow(clippy::print_stdout, reason = "the command's report")]
fn report(args: &InitArgs, options: &InitOptions, made: &cca_trust::config_dir::Initialized) {
    let dir = args.config_dir.display();
    println!("Cluster CA created in {dir}");
    println!("  CA fingerprint: sha256:{}", made.fingerprint);
    println!(
        "  server certificate: server:{} for {}",
        options.server, options.hosts
    );
    println!("  local admin: user:admin (admin.pem, admin.key; keep them 0600)");
    for file in &made.files {
        println!("  wrote {}", file.display());
    }
    println!();
    println!("Next:");
    println!("  cca server --config-dir {dir}     # serves HTTPS, client certificates required");
    println!("  CCA_CONFIG_DIR={dir} cca status   # the CLI as the local admin");
    println!("  CCA_CONFIG_DIR={dir} cca token create   # a join token for each new node");
}
