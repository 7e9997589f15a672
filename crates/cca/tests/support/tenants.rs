//! A server with a CA and two tenants' users, for the tests of what a
//! user sees: alice (tenant `a`, service `web-a`) and bob (tenant `b`,
//! service `web-b`), each with a token, and `cca` as either or as the
//! local admin.

use std::path::PathBuf;
use std::process::Command;

use super::{CCA, Server, text};

pub(crate) struct TwoTenants {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) server: Server,
}

impl TwoTenants {
    /// A cluster with users alice (tenant `a`, service `web-a`) and bob
    /// (tenant `b`, service `web-b`), and their tokens.
    pub(crate) fn with_two_tenants() -> (Self, String, String) {
        let cluster = TwoTenants::start();
        for (user, tenant) in [("alice", "a"), ("bob", "b")] {
            cluster.ok(&[
                "user",
                "create",
                user,
                "--role",
                "developer",
                "--tenant",
                tenant,
            ]);
        }
        let token = |user: &str| cluster.ok(&["user", "token", user]).trim().to_owned();
        let (alice, bob) = (token("alice"), token("bob"));
        cluster.apply(&alice, "web-a");
        cluster.apply(&bob, "web-b");
        (cluster, alice, bob)
    }

    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (server, config) = Server::start_with_ca(dir.path(), "mcp");
        TwoTenants {
            dir,
            config,
            server,
        }
    }

    /// `cca ARGS` as the local admin, asserting success.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let output = self.command(None).args(args).output().expect("cca runs");
        assert!(output.status.success(), "cca {args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `cca` as the local admin (`token` None) or with a user's token.
    pub(crate) fn command(&self, token: Option<&str>) -> Command {
        let mut command = Command::new(CCA);
        command
            .current_dir(self.dir.path())
            .env("CCA_CONFIG_DIR", &self.config)
            .env("CCA_SERVER", &self.server.url)
            .env("CCA_CREDENTIALS", self.dir.path().join("credentials.json"))
            .env_remove("CCA_TOKEN");
        if let Some(token) = token {
            command.env("CCA_TOKEN", token);
        }
        command
    }

    pub(crate) fn apply(&self, token: &str, service: &str) {
        let path = self.dir.path().join(format!("{service}.cca"));
        let program = format!("service {service} {{\n  run = \"sleep 600\"\n}}\n");
        std::fs::write(&path, program).expect("write the program");
        let output = self
            .command(Some(token))
            .arg("apply")
            .arg(&path)
            .output()
            .expect("cca apply runs");
        assert!(
            output.status.success(),
            "apply {service}: {}",
            text(&output)
        );
    }
}
