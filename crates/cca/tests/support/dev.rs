//! `cca dev` as a child process for end-to-end tests: on a free loopback
//! port with its cluster network off, its output read line by line, and
//! stopped with SIGTERM (SIGKILL if it does not stop) when dropped.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::CCA;

/// `cca dev`, stopped with SIGTERM (so it stops its instances) when the
/// test ends, pass or fail; SIGKILL if it does not stop. Its stdout lines
/// arrive on `lines`; its stderr is collected by `errors`.
pub(crate) struct Dev {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    errors: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        terminate(&mut self.child);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    /// `cca dev ARGS` in `dir` with its cluster network off (the host's
    /// own network is not a test's to change), on a free loopback port.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(CCA)
            .arg("dev")
            .args(["--listen", "127.0.0.1:0", "--no-cluster-network"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cca dev starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        // A second reader keeps stderr from filling up.
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Dev {
            child,
            lines,
            errors: Some(errors),
        }
    }

    /// Everything printed until a line for which `done` holds (within a
    /// minute), that line included.
    pub(crate) fn read_until(&self, done: impl Fn(&str, &str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut shown = String::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            shown.push_str(&line);
            shown.push('\n');
            if done(&line, &shown) {
                return shown;
            }
        }
        panic!("cca dev never printed what was awaited:\n{shown}");
    }

    /// The API's URL, from the line announcing it.
    pub(crate) fn api_url(&self) -> (String, String) {
        let shown = self.read_until(|line, _| line.starts_with("cca dev: API on "));
        let url = shown
            .lines()
            .find_map(|line| line.strip_prefix("cca dev: API on "))
            .and_then(|rest| rest.split(';').next())
            .expect("the API line")
            .to_owned();
        (url, shown)
    }

    /// Stops it with SIGTERM and returns its stderr.
    pub(crate) fn stop(mut self) -> String {
        terminate(&mut self.child);
        self.errors
            .take()
            .expect("stderr reader")
            .join()
            .expect("stderr reader")
    }
}

pub(crate) fn terminate(child: &mut std::process::Child) {
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
