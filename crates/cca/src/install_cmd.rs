//! `cca install server|agent [--unit-dir DIR] -- FLAGS…`: writes the
//! systemd unit that runs `cca server` or `cca agent` with FLAGS, after
//! checking them with the very parser that command uses, so a unit never
//! holds a flag its service would refuse at boot. What the units hold and
//! why (an agent stopped or restarted leaves its workloads running; a
//! join token stays out of a world-readable file) is in docs/install.md.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};

/// `cca install server|agent …`
#[derive(Debug, Args)]
pub(crate) struct InstallArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Write the unit of `cca server` with FLAGS.
    Server(UnitArgs),
    /// Write the unit of `cca agent` with FLAGS.
    Agent(UnitArgs),
}

#[derive(Debug, Args)]
struct UnitArgs {
    /// Where the unit file goes.
    #[arg(long, default_value = "/etc/systemd/system")]
    unit_dir: PathBuf,
    /// The `cca` binary the unit runs (default: this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Replace a different unit file of the same name.
    #[arg(long)]
    force: bool,
    /// The flags of `cca server` or `cca agent`, after `--`.
    #[arg(last = true, allow_hyphen_values = true, value_name = "FLAGS")]
    flags: Vec<OsString>,
}

/// Which service a unit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Service {
    Server,
    Agent,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Server => "server",
            Service::Agent => "agent",
        }
    }

    fn unit_name(self) -> String {
        format!("cca-{}.service", self.name())
    }
}

/// `parse` checks a command line (`cca server …` or `cca agent …`) as
/// `cca` itself would parse it, returning its usage error.
pub(crate) fn run(
    args: InstallArgs,
    parse: impl Fn(&[OsString]) -> Result<(), clap::Error>,
) -> Result<ExitCode> {
    let (service, unit) = match args.role {
        Role::Server(unit) => (Service::Server, unit),
        Role::Agent(unit) => (Service::Agent, unit),
    };
    let flags = strings(&unit.flags)?;
    check_flags(service, &flags, &parse)?;
    let binary = match &unit.binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe()
            .and_then(|exe| exe.canonicalize())
            .context("finding this binary's path (give --binary)")?,
    };
    let binary = binary
        .to_str()
        .context("the binary's path is not UTF-8")?
        .to_owned();
    let text = unit_file(service, &binary, &flags);
    let path = unit.unit_dir.join(service.unit_name());
    write_unit(&path, &text, unit.force)?;
    crate::cluster_cmd::output::line(&format!(
        "wrote {}\nnext: systemctl daemon-reload && systemctl enable --now {}",
        path.display(),
        service.unit_name()
    ));
    Ok(ExitCode::SUCCESS)
}

fn strings(flags: &[OsString]) -> Result<Vec<String>> {
    flags
        .iter()
        .map(|flag| {
            flag.to_str()
                .map(str::to_owned)
                .with_context(|| format!("the flag {flag:?} is not UTF-8"))
        })
        .collect()
}

/// Refuses flags the service would refuse, and a join token (a unit file
/// is readable by every user of the machine).
fn check_flags(
    service: Service,
    flags: &[String],
    parse: &impl Fn(&[OsString]) -> Result<(), clap::Error>,
) -> Result<()> {
    if flags
        .iter()
        .any(|flag| flag == "--join" || flag.starts_with("--join="))
    {
        bail!(
            "a join token in a unit file is readable by every user of this machine: put \
             CCA_JOIN_TOKEN=TOKEN in /etc/default/cca-agent (mode 0600), which the unit reads, \
             and leave --join out"
        );
    }
    let line: Vec<OsString> = ["cca", service.name()]
        .into_iter()
        .map(OsString::from)
        .chain(flags.iter().map(OsString::from))
        .collect();
    parse(&line).map_err(|error| {
        anyhow::anyhow!(
            "`cca {} {}` would not start:\n{}",
            service.name(),
            flags.join(" "),
            error.render()
        )
    })
}

/// The unit's text.
fn unit_file(service: Service, binary: &str, flags: &[String]) -> String {
    let exec = std::iter::once(quote(binary))
        .chain(std::iter::once(service.name().to_owned()))
        .chain(flags.iter().map(|flag| quote(flag)))
        .collect::<Vec<_>>()
        .join(" ");
    let (description, specific) = match service {
        Service::Server => (
            "CCattler control plane (cca server)",
            "# SIGTERM: the server stops serving, stops its controllers and resigns\n\
             # leadership, so a standby takes over at once.\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=30\n",
        ),
        Service::Agent => (
            "CCattler node agent (cca agent)",
            "# Only the agent is stopped: the instances it runs keep running, and\n\
             # the agent adopts them when it starts again (an upgrade restarts no\n\
             # workload).\n\
             KillMode=process\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=30\n\
             # The join token (CCA_JOIN_TOKEN=…), kept out of this world-readable file.\n\
             EnvironmentFile=-/etc/default/cca-agent\n",
        ),
    };
    format!(
        "# Written by `cca install {name}`. Run it again to change the flags.\n\
         [Unit]\n\
         Description={description}\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={exec}\n\
         Restart=always\n\
         RestartSec=2s\n\
         # Many connections: a server holds one per agent and per watch, an\n\
         # agent one per instance log it follows.\n\
         LimitNOFILE=1048576\n\
         {specific}\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        name = service.name(),
    )
}

/// One word of `ExecStart=` as systemd reads it: plain when it is only
/// characters systemd takes as they are, else in double quotes with `\`
/// and `"` escaped; `%` (a specifier) doubled, `$` (a variable) doubled.
fn quote(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty()
        && escaped
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-$".contains(c));
    if plain {
        escaped
    } else {
        format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// Writes `text` at `path` whole (a temporary file renamed), unless a
/// different file is there and `force` is not given.
fn write_unit(path: &Path, text: &str, force: bool) -> Result<()> {
    if let Ok(existing) = std::fs::read_to_string(path)
        && existing != text
        && !force
    {
        bail!(
            "{} exists with other contents; give --force to replace it",
            path.display()
        );
    }
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temporary = path.with_extension("service.tmp");
    std::fs::write(&temporary, text).with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_words_are_quoted_the_way_systemd_reads_them() {
        assert_eq!(quote("--store"), "--store");
        assert_eq!(quote("etcd://a:2379,b:2379"), "etcd://a:2379,b:2379");
        assert_eq!(quote("team=web x"), "\"team=web x\"");
        assert_eq!(quote("100%"), "100%%");
        assert_eq!(quote("$HOME"), "$$HOME");
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(quote(""), "\"\"");
    }

    #[test]
    fn an_agent_unit_leaves_workloads_running_and_reads_its_token_from_a_file() {
        let unit = unit_file(
            Service::Agent,
            "/usr/local/bin/cca",
            &["--server".into(), "https://10.0.0.5:9770".into()],
        );
        assert!(
            unit.contains("ExecStart=/usr/local/bin/cca agent --server https://10.0.0.5:9770\n")
        );
        assert!(unit.contains("KillMode=process\n"));
        assert!(unit.contains("EnvironmentFile=-/etc/default/cca-agent\n"));
        let server = unit_file(Service::Server, "/usr/local/bin/cca", &[]);
        assert!(!server.contains("KillMode=process"));
    }

    #[test]
    fn a_join_token_is_refused_before_the_flags_are_parsed() {
        let never = |_: &[OsString]| -> Result<(), clap::Error> { unreachable!("not parsed") };
        let error =
            check_flags(Service::Agent, &["--join=abc".into()], &never).expect_err("refused");
        assert!(error.to_string().contains("CCA_JOIN_TOKEN"), "{error}");
    }
}
