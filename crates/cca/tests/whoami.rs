//! The built-in `cca whoami` workload as a process: it says on stdout (its
//! log, what `cca logs` shows) where it listens and every request it
//! answers, with method, path, status and peer.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::CCA;

/// Kills the workload when the test ends, pass or fail.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn whoami_logs_where_it_listens_and_each_request() {
    let mut child = Killed(
        Command::new(CCA)
            .args(["whoami", "--port", "0", "--bind", "127.0.0.1"])
            .env_remove("PORT")
            .env_remove("CCA_ADDRESS")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cca whoami starts"),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("reads the first line");
    let address = line
        .trim_end()
        .strip_prefix("whoami listening on ")
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .to_owned();

    for (method, path, status) in [("GET", "/hello", 200), ("POST", "/form", 405)] {
        let curl = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-X", method])
            .arg(format!("http://{address}{path}"))
            .status()
            .expect("curl runs");
        assert!(curl.success(), "curl {method} {path}");
        line.clear();
        stdout.read_line(&mut line).expect("reads a request line");
        let expected = format!("{method} {path} {status} from 127.0.0.1:");
        assert!(line.starts_with(&expected), "{line:?} is not {expected}…");
    }
}
