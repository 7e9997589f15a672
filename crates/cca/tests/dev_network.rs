//! `cca dev` as root, tried as a new user would (issue 13, item 6): an
//! image imported with `cca image import` runs busybox `httpd` on its own
//! port 8080, two replicas. On the host's network the second replica
//! could not bind; in the cluster network each container has a namespace
//! of its own, so both run, and both URLs `cca dev` prints (host ports
//! published to the declared port) answer, as does the service's VIP.
//!
//! Root only (skips, saying why, otherwise). `cca dev` runs in a network
//! namespace the test makes, so the host's own network is never touched;
//! SIGTERM stops its instances, and the namespace goes with the test.

mod netcluster;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use netcluster::{images, root_test};

const CCA: &str = env!("CARGO_BIN_EXE_cca");

/// A network namespace of the test's; deleted (with everything in it)
/// when the test ends, pass or fail.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// `cca dev`, stopped with SIGTERM (so it stops its instances) when the
/// test ends, then killed if it lingers.
struct Dev(std::process::Child);

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(pid) = i32::try_from(self.0.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn in_namespace(namespace: &str, program: &str) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/run/netns/{namespace}"))
        .arg(program);
    command
}

#[test]
fn two_replicas_of_an_off_the_shelf_image_both_answer_under_cca_dev() {
    if !root_test("two_replicas_of_an_off_the_shelf_image_both_answer_under_cca_dev") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let namespace = Namespace(format!("cca-devtest-{}", std::process::id()));
    let created = Command::new("ip")
        .args(["netns", "add", &namespace.0])
        .status()
        .expect("ip runs");
    assert!(created.success(), "creating namespace {}", namespace.0);
    let lo = in_namespace(&namespace.0, "ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("ip runs");
    assert!(lo.success());

    let data = dir.path().join("data");
    let layouts = images::build_all(&[images::net()], dir.path());
    let imported = Command::new(CCA)
        .args(["image", "--data-dir"])
        .arg(data.join("agent"))
        .arg("import")
        .arg(&layouts[0])
        .args(["--name", "httpd:1"])
        .output()
        .expect("cca image import runs");
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let file = dir.path().join("web.cca");
    std::fs::write(
        &file,
        "service web {\n  image = \"httpd:1\"\n  command = \"mkdir -p /www && echo $CCA_INSTANCE > /www/index.html && exec httpd -f -p 8080 -h /www\"\n  replicas = 2\n  port http 8080\n}\n",
    )
    .expect("writes the program");

    let mut dev = Dev(in_namespace(&namespace.0, CCA)
        .arg("dev")
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:9770"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cca dev starts"));
    let stdout = dev.0.stdout.take().expect("stdout piped");
    let (lines, screen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });

    // The status screen prints a URL per running instance's port.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut urls = std::collections::BTreeSet::new();
    while urls.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = screen
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("two URLs within 90 s; saw {urls:?}"));
        assert!(
            !line.contains("cluster network off"),
            "cca dev as root must join the cluster network: {line}"
        );
        // Instances' lines name their service; the API's line does not.
        if line.contains("web/http")
            && let Some(url) = line
                .split_whitespace()
                .find(|word| word.starts_with("http://"))
        {
            urls.insert(url.to_owned());
        }
    }
    let mut answered = std::collections::BTreeSet::new();
    for url in &urls {
        let body = curl(&namespace.0, url);
        assert!(body.starts_with("web-"), "{url} answered {body:?}");
        answered.insert(body);
    }
    assert_eq!(answered.len(), 2, "each URL reaches its own replica");

    // The service's VIP reaches them too.
    let services = in_namespace(&namespace.0, CCA)
        .args(["get", "services", "--server", "https://127.0.0.1:9770"])
        // `cca dev`'s own CA and local admin.
        .arg("--config-dir")
        .arg(data.join("trust"))
        .output()
        .expect("cca get runs");
    let table = String::from_utf8_lossy(&services.stdout).into_owned();
    let vip = table
        .lines()
        .find(|line| line.starts_with("web "))
        .and_then(|line| line.split_whitespace().nth(5))
        .unwrap_or_else(|| panic!("a VIP for web: {table}"))
        .to_owned();
    let body = curl(&namespace.0, &format!("http://{vip}:8080/"));
    assert!(answered.contains(&body), "the VIP answered {body:?}");
}

/// GET `url` from inside `namespace`, retried for a while (an instance
/// reported running may need a moment to listen).
fn curl(namespace: &str, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = in_namespace(namespace, "curl")
            .args(["-s", "-m", "2", url])
            .output()
            .expect("curl runs");
        if output.status.success() {
            return String::from_utf8_lossy(&output.stdout).trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "GET {url}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
