//! `cca dev` as a process: it starts its own agent and applies the files
//! once that agent's node is ready, so its start logs no "no nodes are
//! registered" warning; SIGTERM stops its instances and the process.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CCA: &str = env!("CARGO_BIN_EXE_cca");

/// Stops `cca dev` with SIGTERM (so it stops its instances) when the test
/// ends, pass or fail; SIGKILL if it does not stop.
struct Dev(std::process::Child);

impl Drop for Dev {
    fn drop(&mut self) {
        terminate(&mut self.0);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn terminate(child: &mut std::process::Child) {
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

#[test]
fn dev_starts_without_warning_that_no_nodes_are_registered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("app.cca");
    std::fs::write(
        &file,
        "service hello {\n  run = \"sleep 1000\"\n  replicas = 2\n}\n",
    )
    .expect("writes the program");
    let mut dev = Dev(Command::new(CCA)
        .arg("dev")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        // The host's own network is not a test's to change.
        .arg("--no-cluster-network")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cca dev starts"));
    let mut stdout = dev.0.stdout.take().expect("stdout piped");
    let mut stderr = dev.0.stderr.take().expect("stderr piped");
    // The status screen lists both instances running once they are placed
    // and started; a second read thread keeps stderr from filling up.
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut shown = String::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(60);
    while shown.matches(" running ").count() < 2 && Instant::now() < deadline {
        match stdout.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => shown.push_str(&String::from_utf8_lossy(&buffer[..read])),
        }
    }
    assert!(
        shown.matches(" running ").count() >= 2,
        "two instances running:\n{shown}"
    );
    terminate(&mut dev.0);
    let errors = errors.join().expect("stderr reader");
    assert!(
        !errors.contains("no nodes are registered"),
        "cca dev warned about its own start:\n{errors}"
    );
}
