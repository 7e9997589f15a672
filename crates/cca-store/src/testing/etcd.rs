//! Real etcd processes for tests: [`EtcdServer`] (one member) and
//! [`EtcdCluster`] (several, on loopback). Each member gets free loopback
//! ports and a temporary data directory, runs with fast elections
//! (heartbeat 10 ms, election timeout 100 ms) and is killed and reaped when
//! its owner is dropped, so a failing test never leaks a process.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const ETCD: &str = "/usr/bin/etcd";
/// How long a member may take to report itself healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Port collisions (another process took a port we picked) are retried.
const START_ATTEMPTS: usize = 3;

/// A single-member etcd.
#[derive(Debug)]
pub struct EtcdServer {
    member: Member,
    _dir: TempDir,
}

/// The files of an etcd serving TLS: its certificate and key, and the CA
/// client certificates must chain to (`--client-cert-auth`).
#[derive(Clone, Debug)]
pub struct EtcdTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl EtcdServer {
    /// Starts a fresh, empty etcd and waits until it serves requests.
    pub fn start() -> Self {
        let (mut cluster, dir) = Cluster::start(1, None);
        let member = cluster.members.remove(0);
        Self { member, _dir: dir }
    }

    /// Starts a fresh etcd that serves clients over TLS only and requires
    /// a client certificate of `files.client_ca`.
    pub fn start_tls(files: EtcdTlsFiles) -> Self {
        let (mut cluster, dir) = Cluster::start(1, Some(files));
        let member = cluster.members.remove(0);
        Self { member, _dir: dir }
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        self.member.client_url()
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        self.member.kill();
    }

    /// The last lines of the server's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        self.member.log_tail()
    }

    /// Starts the server again on the same ports and data, and waits until
    /// it serves requests.
    pub fn restart(&mut self) {
        self.member.kill();
        self.member.spawn();
        self.member
            .wait_healthy()
            .unwrap_or_else(|problem| panic!("{problem}"));
    }

    /// Replaces the server by an empty one on the same ports: its data is
    /// gone (a store lost and rebuilt, or restored from an old snapshot).
    pub fn wipe_and_restart(&mut self) {
        self.member.kill();
        let _ = std::fs::remove_dir_all(&self.member.data_dir);
        self.member.spawn();
        self.member
            .wait_healthy()
            .unwrap_or_else(|problem| panic!("{problem}"));
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.member.signal("STOP");
        self.member.wait_until_stopped();
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.member.signal("CONT");
    }
}

/// A multi-member etcd cluster on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one serves requests.
    pub fn start(size: usize) -> Self {
        let (cluster, dir) = Cluster::start(size, None);
        Self {
            members: cluster.members,
            _dir: dir,
        }
    }

    /// Client URLs of all members, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The index of the member that is the raft leader, waiting (up to
    /// [`READY_TIMEOUT`]) until a live member claims leadership.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let leader = self
                .members
                .iter()
                .position(|member| member.child.is_some() && member.is_leader());
            if let Some(index) = leader {
                return index;
            }
            assert!(Instant::now() < deadline, "no etcd member became leader");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills member `index` (SIGKILL) and reaps it.
    pub fn kill(&mut self, index: usize) {
        self.members[index].kill();
    }
}

/// Members being planned and started together.
struct Cluster {
    members: Vec<Member>,
}

impl Cluster {
    /// Starts `size` fresh members and the directory holding their data,
    /// retrying with new ports when one was taken meanwhile.
    fn start(size: usize, tls: Option<EtcdTlsFiles>) -> (Self, TempDir) {
        assert!(
            Path::new(ETCD).exists(),
            "etcd is not installed at {ETCD}; run `scripts/test`, which installs etcd-server"
        );
        let mut problems = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let dir = temp_dir();
            let mut cluster = Cluster::plan(dir.path(), size, tls.as_ref());
            match cluster.start_all() {
                Ok(()) => return (cluster, dir),
                Err(problem) => problems.push(problem),
            }
        }
        panic!(
            "etcd did not start after {START_ATTEMPTS} attempts:\n{}",
            problems.join("\n---\n")
        );
    }

    /// Members with fresh ports and data directories under `dir`.
    fn plan(dir: &Path, size: usize, tls: Option<&EtcdTlsFiles>) -> Self {
        let mut members: Vec<Member> = (0..size)
            .map(|index| {
                let name = format!("m{index}");
                Member {
                    data_dir: dir.join(&name),
                    log: dir.join(format!("{name}.log")),
                    name,
                    client_port: free_port(),
                    peer_port: free_port(),
                    metrics_port: free_port(),
                    tls: tls.cloned(),
                    initial_cluster: String::new(),
                    child: None,
                }
            })
            .collect();
        let initial_cluster: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        for member in &mut members {
            member.initial_cluster = initial_cluster.join(",");
        }
        Self { members }
    }

    /// Spawns every member and waits until all are healthy.
    fn start_all(&mut self) -> Result<(), String> {
        for member in &mut self.members {
            member.spawn();
        }
        self.members.iter_mut().try_for_each(Member::wait_healthy)
    }
}

/// One etcd process: its identity, ports, data, and the child while it runs.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health` and `/metrics`, whatever the client URLs speak.
    metrics_port: u16,
    tls: Option<EtcdTlsFiles>,
    data_dir: PathBuf,
    log: PathBuf,
    initial_cluster: String,
    child: Option<Child>,
}

impl Member {
    fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log file");
        let mut command = Command::new(ETCD);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca)
                .arg("--client-cert-auth");
        }
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let child = command
            .args(["--listen-metrics-urls", &metrics])
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &self.client_url()])
            .args(["--advertise-client-urls", &self.client_url()])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {ETCD}: {err}"));
        self.child = Some(child);
    }

    fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Polls `GET /health` until etcd says it is healthy.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if !self.is_running() {
                return Err(format!(
                    "etcd {} exited early:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if http_get(self.metrics_port, "/health")
                .is_some_and(|body| body.contains(r#""health":"true""#))
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "etcd {} not healthy within {READY_TIMEOUT:?}:\n{}",
            self.name,
            self.log_tail()
        ))
    }

    fn is_leader(&self) -> bool {
        http_get(self.metrics_port, "/metrics").is_some_and(|metrics| {
            metrics
                .lines()
                .any(|line| line == "etcd_server_is_leader 1")
        })
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("etcd is running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGSTOP returns before every thread has stopped; a request sent in
    /// that window could still be served. Waits until /proc shows every
    /// thread of the process stopped.
    fn wait_until_stopped(&self) {
        let child = self.child.as_ref().expect("etcd is running");
        let tasks = format!("/proc/{}/task", child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let all_stopped = std::fs::read_dir(&tasks)
                .expect("read the process's threads")
                .filter_map(Result::ok)
                .all(|task| {
                    let stat =
                        std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                    // The state follows the parenthesised command name.
                    stat.rsplit(')')
                        .next()
                        .map(str::trim_start)
                        .is_some_and(|rest| rest.starts_with('T'))
                });
            if all_stopped {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("etcd did not stop within 5 s of SIGSTOP");
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a SIGSTOPped process.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("cca-etcd-test-")
        .tempdir()
        .expect("temp dir")
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// The body of a plain HTTP/1.0 GET, or `None` if the server is not there.
fn http_get(port: u16, path: &str) -> Option<String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_owned())
}
