//! Users at the command line: `cca login` (a token from `cca user token`
//! or an OIDC issuer's ID token, checked against the server before it is
//! kept), `cca logout` (the token revoked at the server and forgotten
//! here), `cca identity` (who the server takes you for; not `cca whoami`,
//! which is the built-in test workload), and where credentials come from:
//! `$CCA_TOKEN`, else the file `cca login` wrote
//! (`~/.ccattler/credentials.json`, 0600, or `$CCA_CREDENTIALS`), else the
//! config directory's local admin certificate.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::{Deserialize, Serialize};

use super::commands::client;
use super::output;
use super::{OutputArgs, ServerAddr};

/// What `cca login` keeps.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Credentials {
    pub(crate) server: String,
    pub(crate) token: String,
    /// The cluster CA (PEM) the server is checked against.
    pub(crate) ca_pem: String,
}

impl Credentials {
    /// Where they live: `$CCA_CREDENTIALS`, else `~/.ccattler/credentials.json`.
    pub(crate) fn path() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("CCA_CREDENTIALS") {
            return Some(PathBuf::from(path));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".ccattler/credentials.json"))
    }

    /// The kept credentials, if `cca login` wrote some.
    pub(crate) fn load() -> Result<Option<Credentials>> {
        let Some(path) = Self::path() else {
            return Ok(None);
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
        };
        serde_json::from_str(&text).map(Some).with_context(|| {
            format!(
                "{} is not what `cca login` writes: log in again",
                path.display()
            )
        })
    }

    fn save(&self) -> Result<PathBuf> {
        let path = Self::path().context("no HOME to keep credentials in: set CCA_CREDENTIALS")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let temporary = path.with_extension("tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .with_context(|| format!("writing {}", temporary.display()))?;
        file.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// `cca login [--server URL] (--token TOKEN | --token-file F) [--ca-file F]`
#[derive(Debug, Args)]
pub(crate) struct LoginArgs {
    #[command(flatten)]
    addr: ServerAddr,
    /// A token from `cca user token`, or an ID token of the OIDC issuer the
    /// server trusts (`-` reads it from stdin).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    token: Option<String>,
    /// Read the token from this file.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The cluster CA's certificate (default: the config directory's).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

/// `cca logout`: the kept credentials name their server.
#[derive(Debug, Args)]
pub(crate) struct LogoutArgs {}

/// `cca identity`
#[derive(Debug, Args)]
pub(crate) struct SessionArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

pub(super) async fn login(args: LoginArgs) -> Result<()> {
    let token = read_token(&args)?;
    let ca_pem = match &args.ca_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the CA certificate {}", path.display()))?,
        None => {
            let config = cca_trust::config_dir::ConfigDir::new(args.addr.config_dir());
            std::fs::read_to_string(config.ca_cert()).with_context(|| {
                format!(
                    "no cluster CA at {}: pass --ca-file with the cluster's ca.pem",
                    config.ca_cert().display()
                )
            })?
        }
    };
    let server = args
        .addr
        .server
        .clone()
        .unwrap_or_else(|| super::DEFAULT_SERVER.replacen("http://", "https://", 1));
    let credentials = Credentials {
        server,
        token,
        ca_pem,
    };
    let identity = super::commands::client_with(&credentials)?
        .identity()
        .await?;
    let Some(principal) = identity.identity else {
        bail!("the server did not take the token for anyone");
    };
    let path = credentials.save()?;
    output::line(&format!(
        "logged in to {} as {}:{} (credentials in {})",
        credentials.server,
        principal.kind,
        principal.name,
        path.display()
    ));
    Ok(())
}

fn read_token(args: &LoginArgs) -> Result<String> {
    let text = match (&args.token, &args.token_file) {
        (Some(token), _) if token == "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("reading the token from stdin")?;
            text
        }
        (Some(token), _) => token.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the token from {}", path.display()))?,
        (None, None) => {
            bail!("give the token: --token TOKEN, --token - (stdin) or --token-file FILE")
        }
    };
    let token = text.trim().to_owned();
    if token.is_empty() {
        bail!("the token is empty");
    }
    Ok(token)
}

pub(super) async fn logout(_args: LogoutArgs) -> Result<()> {
    let Some(credentials) = Credentials::load()? else {
        output::line("not logged in");
        return Ok(());
    };
    let revoked = super::commands::client_with(&credentials)?.logout().await;
    if let Some(path) = Credentials::path() {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    match revoked {
        Ok(_) => output::line(&format!(
            "logged out of {} (token revoked)",
            credentials.server
        )),
        Err(error) => output::line(&format!(
            "logged out here; the server could not revoke the token ({error}): it stays valid until it expires"
        )),
    }
    Ok(())
}

pub(super) async fn identity(args: SessionArgs) -> Result<()> {
    let identity = client(&args.addr)?.identity().await?;
    if output::structured(args.out.output, &identity)? {
        return Ok(());
    }
    match &identity.identity {
        None => output::line(&format!("anonymous (from {})", identity.address)),
        Some(principal) => {
            let via = identity.via.as_deref().unwrap_or("certificate");
            output::line(&format!("{}:{} (by {via})", principal.kind, principal.name));
            if let Some(user) = &identity.user {
                output::line(&format!("  roles:  {}", user.roles.join(", ")));
                output::line(&format!(
                    "  tenant: {}",
                    user.tenant.as_deref().unwrap_or("- (cluster-wide)")
                ));
            }
        }
    }
    Ok(())
}
