//! The parts of an OCI image config a runtime needs — entrypoint, cmd,
//! environment, working directory, user — and the layer diff ids, read
//! from the config blob's JSON (Docker's capitalised field names).

use serde::{Deserialize, Serialize};

/// How the image says its process runs, as the runtime reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `NAME=value` lines, in the image's order.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    /// `uid`, `uid:gid` or a name; `None`: root.
    pub user: Option<String>,
    pub os: String,
    pub architecture: String,
}

impl ImageConfig {
    /// Reads a config blob.
    pub fn from_json(bytes: &[u8]) -> serde_json::Result<Self> {
        let raw: RawConfig = serde_json::from_slice(bytes)?;
        let process = raw.config.unwrap_or_default();
        Ok(Self {
            entrypoint: process.entrypoint.unwrap_or_default(),
            cmd: process.cmd.unwrap_or_default(),
            env: process.env.unwrap_or_default(),
            working_dir: process.working_dir.filter(|dir| !dir.is_empty()),
            user: process.user.filter(|user| !user.is_empty()),
            os: raw.os,
            architecture: raw.architecture,
        })
    }

    /// Entrypoint followed by cmd: the process to run when the service
    /// gives no command.
    pub fn default_args(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    config: Option<RawProcess>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawProcess {
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    user: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_style_configs_are_read_and_nulls_are_empty() {
        let json = br#"{"architecture":"amd64","os":"linux","config":{"Entrypoint":null,
            "Cmd":["sh"],"Env":["PATH=/bin"],"WorkingDir":"","User":"1000:1000"},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let config = ImageConfig::from_json(json).expect("config parses");
        assert_eq!(config.default_args(), vec!["sh".to_owned()]);
        assert_eq!(config.env, vec!["PATH=/bin".to_owned()]);
        assert_eq!(config.working_dir, None);
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.architecture, "amd64");
    }
}
