//! A cluster's trust on disk: the config directory `cca init` fills
//! (`/etc/ccattler` by default) and the server and the CLI read. The only
//! IO of this crate, synchronous and small.
//!
//! ```text
//! ca.pem      the cluster CA's certificate (what clients trust)      0644
//! ca.key      the CA's key (signs every certificate)                 0600
//! server.pem  the server's certificate, then the CA's (its chain)    0644
//! server.key  the server's key                                       0600
//! admin.pem   the local admin's client certificate (user `admin`)    0600
//! admin.key   its key                                                0600
//! token.key   the key user tokens are signed with (ES256, PKCS#8)    0600
//! ```
//!
//! The server renews `server.pem` itself two thirds into its life
//! ([`ConfigDir::renew_server`]): the same key, so only that file
//! changes.
//!
//! A node keeps its own credentials in its data directory
//! ([`NodeCredentials`]): `tls/ca.pem` (0644) and `tls/node.pem` (0600),
//! the node's certificate followed by its key in one file, so a renewal
//! replaces both with one rename and a crash never pairs a new key with
//! an old certificate.
//!
//! Keys are written with mode 0600 from the start (never widened later)
//! and refused when group or others may read them; every file is written
//! to a temporary name and renamed, so a crash leaves the old file or the
//! new one. `init` refuses to touch a directory that already holds a CA:
//! a second CA would orphan every certificate the first one issued.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::identity::Identity;
use crate::jwt::SigningKey;
use crate::pki::{self, CertInfo, ClusterCa, Fingerprint, Issue, Names};

/// The default config directory.
pub const DEFAULT_DIR: &str = "/etc/ccattler";
/// The local admin's user name.
pub const ADMIN_USER: &str = "admin";

/// What went wrong with a config directory.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{} already holds a cluster CA: refusing to overwrite it (a new CA would orphan every certificate the old one issued); use another --config-dir, or move the old one away first", dir.display())]
    CaExists { dir: PathBuf },
    #[error("{}: {problem}", path.display())]
    File { path: PathBuf, problem: String },
    #[error("{} may be read by group or others (mode {mode:03o}): run `chmod 600 {}`", path.display(), path.display())]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("{}: {source}", path.display())]
    Certificate { path: PathBuf, source: pki::Error },
    #[error("{} holds no cluster CA: run `cca init --config-dir {}` first", dir.display(), dir.display())]
    NoCa { dir: PathBuf },
}

/// What `cca init` asks for.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// The cluster's name, in the CA's subject.
    pub cluster: String,
    /// The server's name (its identity `server:NAME`).
    pub server: String,
    /// Host names and addresses the server's certificate is valid for.
    pub hosts: Names,
}

/// What `init` made.
#[derive(Clone, Debug)]
pub struct Initialized {
    pub fingerprint: Fingerprint,
    pub files: Vec<PathBuf>,
}

/// The files a server serves with, checked.
#[derive(Debug)]
pub struct ServerFiles {
    pub ca: ClusterCa,
    /// The server's certificate followed by the CA's.
    pub chain_pem: String,
    pub key_pem: String,
    pub certificate: CertInfo,
}

/// The server's certificate after a renewal, as written.
#[derive(Debug)]
pub struct RenewedServer {
    /// The new certificate followed by the CA's.
    pub chain_pem: String,
    pub certificate: CertInfo,
}

/// How long until a server certificate that is `certificate` at `now` is
/// due for renewal (two thirds into its life): zero once due.
pub fn server_renewal_wait(certificate: &CertInfo, now: SystemTime) -> std::time::Duration {
    certificate
        .renew_at()
        .duration_since(now)
        .unwrap_or_default()
}

/// The files a client authenticates with, checked.
#[derive(Clone)]
pub struct ClientFiles {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub certificate: CertInfo,
}

impl std::fmt::Debug for ClientFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFiles")
            .field("certificate", &self.certificate.identity)
            .finish_non_exhaustive()
    }
}

/// A config directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigDir {
    root: PathBuf,
}

impl ConfigDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca.pem")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.root.join("ca.key")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.root.join("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.root.join("server.key")
    }

    pub fn admin_cert(&self) -> PathBuf {
        self.root.join("admin.pem")
    }

    pub fn admin_key(&self) -> PathBuf {
        self.root.join("admin.key")
    }

    /// True once `init` made a CA here.
    pub fn has_ca(&self) -> bool {
        self.ca_cert().exists() || self.ca_key().exists()
    }

    /// Makes the cluster CA, the server's certificate and the local admin's
    /// client certificate. Refuses if a CA is already here; writes
    /// nothing until every certificate is made.
    pub fn init(&self, options: &InitOptions, now: SystemTime) -> Result<Initialized, ConfigError> {
        if self.has_ca() {
            return Err(ConfigError::CaExists {
                dir: self.root.clone(),
            });
        }
        let certificate = |what: &Path| {
            let path = what.to_path_buf();
            move |source| ConfigError::Certificate { path, source }
        };
        let ca = ClusterCa::generate(&options.cluster, now, pki::CA_VALIDITY)
            .map_err(certificate(&self.ca_cert()))?;
        let server = ca
            .issue(
                &Issue::new(
                    Identity::Server(options.server.clone()),
                    options.hosts.clone(),
                ),
                now,
            )
            .map_err(certificate(&self.server_cert()))?;
        let admin = ca
            .issue(
                &Issue::new(Identity::User(ADMIN_USER.to_owned()), Names::none()),
                now,
            )
            .map_err(certificate(&self.admin_cert()))?;
        create_dir(&self.root)?;
        let chain = format!("{}{}", server.cert_pem, ca.cert_pem());
        let token_key = SigningKey::generate().map_err(|error| ConfigError::File {
            path: self.token_key(),
            problem: error.to_string(),
        })?;
        let files = [
            (self.token_key(), token_key.to_pkcs8_pem(), 0o600),
            (self.ca_key(), ca.key_pem(), 0o600),
            (self.ca_cert(), ca.cert_pem().to_owned(), 0o644),
            (self.server_key(), server.key_pem.clone(), 0o600),
            (self.server_cert(), chain, 0o644),
            (self.admin_key(), admin.key_pem.clone(), 0o600),
            (self.admin_cert(), admin.cert_pem.clone(), 0o600),
        ];
        for (path, text, mode) in &files {
            write_file(path, text, *mode)?;
        }
        Ok(Initialized {
            fingerprint: ca.fingerprint(),
            files: files.into_iter().map(|(path, _, _)| path).collect(),
        })
    }

    /// The key user tokens are signed with.
    pub fn token_key(&self) -> PathBuf {
        self.root.join("token.key")
    }

    /// The token signing key, checked (0600); made (and written 0600) when
    /// the directory predates it.
    pub fn load_token_key(&self) -> Result<SigningKey, ConfigError> {
        let path = self.token_key();
        let bad = |error: crate::jwt::KeyError| ConfigError::File {
            path: path.clone(),
            problem: error.to_string(),
        };
        if path.exists() {
            return SigningKey::from_pkcs8_pem(&read_key(&path)?).map_err(bad);
        }
        let key = SigningKey::generate().map_err(bad)?;
        write_file(&path, &key.to_pkcs8_pem(), 0o600)?;
        Ok(key)
    }

    /// The server's files, checked as a server starts: the CA loads and its
    /// key fits, keys are 0600, the server's certificate is the CA's, valid
    /// now, a server's, and its key fits.
    pub fn load_server(&self, now: SystemTime) -> Result<ServerFiles, ConfigError> {
        if !self.has_ca() {
            return Err(ConfigError::NoCa {
                dir: self.root.clone(),
            });
        }
        let ca_pem = read(&self.ca_cert())?;
        let ca_key = read_key(&self.ca_key())?;
        let ca = ClusterCa::load(&ca_pem, &ca_key).map_err(|source| ConfigError::Certificate {
            path: self.ca_key(),
            source,
        })?;
        let chain_pem = read(&self.server_cert())?;
        let key_pem = read_key(&self.server_key())?;
        let bad = |source| ConfigError::Certificate {
            path: self.server_cert(),
            source,
        };
        let certificate = pki::verify_issued(&chain_pem, ca.cert_pem(), now).map_err(bad)?;
        pki::check_key_matches(&chain_pem, &key_pem).map_err(bad)?;
        if !matches!(certificate.identity, Some(Identity::Server(_))) {
            return Err(ConfigError::File {
                path: self.server_cert(),
                problem: format!(
                    "it is not a server's certificate (it names {}); run `cca init` again in a new directory",
                    certificate
                        .identity
                        .as_ref()
                        .map_or_else(|| "no identity".to_owned(), ToString::to_string)
                ),
            });
        }
        Ok(ServerFiles {
            ca,
            chain_pem,
            key_pem,
            certificate,
        })
    }

    /// Renews the server's certificate: `ca` issues it again for the
    /// same key, identity and host names, valid a year from `now`, and
    /// `server.pem` is replaced atomically (0644, as `init` writes it: a
    /// certificate is public). The key file is not touched, so a crash
    /// leaves the old certificate or the new one, each fitting
    /// `server.key`.
    pub fn renew_server(
        &self,
        ca: &ClusterCa,
        now: SystemTime,
    ) -> Result<RenewedServer, ConfigError> {
        let bad = |source| ConfigError::Certificate {
            path: self.server_cert(),
            source,
        };
        let current = read(&self.server_cert())?;
        let cert_pem = ca.reissue(&current, now).map_err(bad)?;
        let certificate = pki::verify_issued(&cert_pem, ca.cert_pem(), now).map_err(bad)?;
        let chain_pem = format!("{cert_pem}{}", ca.cert_pem());
        write_file(&self.server_cert(), &chain_pem, 0o644)?;
        Ok(RenewedServer {
            chain_pem,
            certificate,
        })
    }

    /// The local admin's files, checked as a client starts.
    pub fn load_admin(&self, now: SystemTime) -> Result<ClientFiles, ConfigError> {
        self.load_client(&self.admin_cert(), &self.admin_key(), now)
    }

    /// A client certificate and key at `cert`/`key`, checked against this
    /// directory's CA.
    pub fn load_client(
        &self,
        cert: &Path,
        key: &Path,
        now: SystemTime,
    ) -> Result<ClientFiles, ConfigError> {
        let ca_pem = read(&self.ca_cert())?;
        let cert_pem = read(cert)?;
        let key_pem = read_key(key)?;
        let bad = |source| ConfigError::Certificate {
            path: cert.to_path_buf(),
            source,
        };
        let certificate = pki::verify_issued(&cert_pem, &ca_pem, now).map_err(bad)?;
        pki::check_key_matches(&cert_pem, &key_pem).map_err(bad)?;
        Ok(ClientFiles {
            ca_pem,
            cert_pem,
            key_pem,
            certificate,
        })
    }
}

/// A node's certificate, key and cluster CA, in `DATA/tls/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCredentials {
    dir: PathBuf,
}

const PRIVATE_KEY_BEGIN: &str = "-----BEGIN PRIVATE KEY-----";

impl NodeCredentials {
    /// The credentials of the agent whose data directory is `data_dir`.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("tls"),
        }
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The node's certificate, then its key (PKCS#8).
    pub fn node_file(&self) -> PathBuf {
        self.dir.join("node.pem")
    }

    /// Whether the node has joined (it has a certificate to load).
    pub fn exist(&self) -> bool {
        self.node_file().exists()
    }

    /// Stores what a join or a renewal brought: the CA's certificate, the
    /// node's certificate and its key. The node file is written whole or
    /// not at all.
    pub fn save(&self, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<(), ConfigError> {
        create_dir(&self.dir)?;
        write_file(&self.ca_cert(), ca_pem, 0o644)?;
        let combined = format!("{}\n{}", cert_pem.trim_end(), key_pem);
        write_file(&self.node_file(), &combined, 0o600)
    }

    /// The node's credentials, checked: the key file is 0600, the
    /// certificate is the CA's, valid at `now`, names node `node` and fits
    /// the key.
    pub fn load(&self, node: &str, now: SystemTime) -> Result<ClientFiles, ConfigError> {
        let ca_pem = read(&self.ca_cert())?;
        let combined = read_key(&self.node_file())?;
        let (cert_pem, key_pem) = match combined.find(PRIVATE_KEY_BEGIN) {
            Some(at) => combined.split_at(at),
            None => {
                return Err(ConfigError::File {
                    path: self.node_file(),
                    problem: "it holds no private key: join the cluster again".into(),
                });
            }
        };
        let bad = |source| ConfigError::Certificate {
            path: self.node_file(),
            source,
        };
        let certificate = pki::verify_issued(cert_pem, &ca_pem, now).map_err(bad)?;
        pki::check_key_matches(cert_pem, key_pem).map_err(bad)?;
        let expected = Identity::Node(node.to_owned());
        if certificate.identity.as_ref() != Some(&expected) {
            return Err(ConfigError::File {
                path: self.node_file(),
                problem: format!(
                    "it is the certificate of {}, not of {expected}: give the agent its own \
                     --data-dir, or --node that name",
                    certificate
                        .identity
                        .as_ref()
                        .map_or_else(|| "no identity".to_owned(), ToString::to_string)
                ),
            });
        }
        Ok(ClientFiles {
            ca_pem,
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            certificate,
        })
    }
}

fn create_dir(dir: &Path) -> Result<(), ConfigError> {
    fs::create_dir_all(dir).map_err(|error| ConfigError::File {
        path: dir.to_path_buf(),
        problem: format!("cannot create the directory: {error}"),
    })
}

fn read(path: &Path) -> Result<String, ConfigError> {
    fs::read_to_string(path).map_err(|error| ConfigError::File {
        path: path.to_path_buf(),
        problem: format!("cannot read it: {error}"),
    })
}

/// Reads a key file, refusing one that group or others may read.
fn read_key(path: &Path) -> Result<String, ConfigError> {
    let metadata = fs::metadata(path).map_err(|error| ConfigError::File {
        path: path.to_path_buf(),
        problem: format!("cannot read it: {error}"),
    })?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    read(path)
}

/// Writes `text` to `path` with `mode` through a temporary file and a
/// rename (fsync'd), so the file is whole or absent.
fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), ConfigError> {
    let failed = |error: std::io::Error| ConfigError::File {
        path: path.to_path_buf(),
        problem: format!("cannot write it: {error}"),
    };
    let temporary = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    fs::rename(&temporary, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn options() -> InitOptions {
        InitOptions {
            cluster: "test".into(),
            server: "s1".into(),
            hosts: Names::from_hosts(["localhost", "127.0.0.1"]).expect("hosts"),
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    #[test]
    fn the_token_key_loads_back_and_is_made_for_an_older_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ConfigDir::new(dir.path().join("cca"));
        config.init(&options(), now()).expect("init");
        let made = config.load_token_key().expect("loads");
        assert_eq!(
            config.load_token_key().expect("again").key_id(),
            made.key_id()
        );
        fs::remove_file(config.token_key()).expect("remove");
        let fresh = config.load_token_key().expect("made anew");
        assert_ne!(fresh.key_id(), made.key_id());
        let mode = fs::metadata(config.token_key())
            .expect("written")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        fs::set_permissions(config.token_key(), fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            config.load_token_key(),
            Err(ConfigError::TooOpen { .. })
        ));
    }

    #[test]
    fn init_writes_a_ca_a_server_and_an_admin_that_load_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ConfigDir::new(dir.path().join("cca"));
        let made = config.init(&options(), now()).expect("init");
        assert_eq!(made.files.len(), 7);
        for key in [
            config.ca_key(),
            config.server_key(),
            config.admin_key(),
            config.token_key(),
        ] {
            let mode = fs::metadata(&key).expect("exists").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let server = config.load_server(now()).expect("server files");
        assert_eq!(server.ca.fingerprint(), made.fingerprint);
        assert_eq!(
            server.certificate.identity,
            Some(Identity::Server("s1".into()))
        );
        let admin = config.load_admin(now()).expect("admin files");
        assert_eq!(
            admin.certificate.identity,
            Some(Identity::User("admin".into()))
        );
        assert!(!format!("{admin:?}").contains("PRIVATE KEY"));

        let again = config.init(&options(), now()).expect_err("a CA is there");
        assert!(
            again.to_string().contains("refusing to overwrite"),
            "{again}"
        );
    }

    #[test]
    fn the_server_certificate_is_renewed_for_the_same_key_and_names() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ConfigDir::new(dir.path());
        config.init(&options(), now()).expect("init");
        let before = config.load_server(now()).expect("server files");
        let wait = server_renewal_wait(&before.certificate, now());
        let two_thirds = pki::SERVER_CERT_VALIDITY * 2 / 3;
        assert!(
            wait <= two_thirds && wait + Duration::from_secs(600) > two_thirds,
            "due two thirds into a year: {wait:?}"
        );
        let due = now() + wait;
        assert_eq!(
            server_renewal_wait(&before.certificate, due + Duration::from_secs(1)),
            Duration::ZERO
        );

        let renewed = config.renew_server(&before.ca, due).expect("renews");
        let after = config
            .load_server(before.certificate.not_after + Duration::from_secs(3600))
            .expect("the renewed files load, and outlive the old certificate");
        assert_eq!(after.chain_pem, renewed.chain_pem);
        assert_eq!(after.certificate.serial, renewed.certificate.serial);
        assert_ne!(after.certificate.serial, before.certificate.serial);
        assert_eq!(after.certificate.identity, before.certificate.identity);
        assert_eq!(after.certificate.names, before.certificate.names);
        assert_eq!(after.key_pem, before.key_pem, "the same key");
        let mode = fs::metadata(config.server_cert())
            .expect("written")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o644);

        // Another cluster's CA does not renew this server's certificate.
        let other = ClusterCa::generate("other", now(), pki::CA_VALIDITY).expect("ca");
        let refused = config.renew_server(&other, due).expect_err("not its CA");
        assert!(
            refused.to_string().contains("not signed by the CA"),
            "{refused}"
        );
        assert_eq!(
            config.load_server(due).expect("unchanged").chain_pem,
            renewed.chain_pem
        );
    }

    #[test]
    fn loading_refuses_open_keys_missing_cas_and_expired_certificates() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = ConfigDir::new(dir.path());
        let missing = config.load_server(now()).expect_err("no CA");
        assert!(missing.to_string().contains("cca init"), "{missing}");

        config.init(&options(), now()).expect("init");
        fs::set_permissions(config.server_key(), fs::Permissions::from_mode(0o644)).expect("chmod");
        let open = config.load_server(now()).expect_err("open key");
        assert!(open.to_string().contains("chmod 600"), "{open}");
        fs::set_permissions(config.server_key(), fs::Permissions::from_mode(0o600)).expect("chmod");

        let later = now() + pki::SERVER_CERT_VALIDITY + Duration::from_secs(3600);
        let expired = config.load_server(later).expect_err("expired");
        assert!(expired.to_string().contains("server.pem"), "{expired}");

        // The admin's certificate as the server's: not a server's.
        fs::copy(config.admin_cert(), config.server_cert()).expect("copy");
        fs::copy(config.admin_key(), config.server_key()).expect("copy");
        let wrong = config.load_server(now()).expect_err("a user's certificate");
        assert!(wrong.to_string().contains("not a server"), "{wrong}");
    }
}
