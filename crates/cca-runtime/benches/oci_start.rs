//! Start-to-healthy of a busybox container, `OciRuntime` against bare runc
//! on a prepared bundle, side by side in one run (`cargo bench -p
//! cca-runtime --bench oci_start`). The image is built from busybox-static,
//! pushed to a loopback `docker-registry` and pulled before anything is
//! timed, so both sides start from a local image.
//!
//! - `OciRuntime`: `create` + `start` of a spec running `busybox httpd`,
//!   until `GET /` answers 200 on its port (overlay mount, `config.json`,
//!   monitor, `runc run --keep`, `runc state` polling included).
//! - bare: `runc run -d` on a bundle whose overlay rootfs is mounted and
//!   whose `config.json` is the one `OciRuntime` generated for the same
//!   spec (own cgroup path), until `GET /` answers 200.
//!
//! Rounds alternate between the two, so a machine loaded by something else
//! weighs on both alike; the figure is the ratio of the medians (issue 7
//! targets ≤ 1.3×). Skipped, with the reason printed, when not root or
//! when runc, docker-registry, skopeo or busybox is missing.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cca_image::testing::{
    TestRegistry, busybox_layer, commands_available, find_command, free_port, write_oci_layout,
};
use cca_image::{ImageStore, Puller, RegistrySettings};
use cca_runtime::{InstanceSpec, OciConfig, OciRuntime, Runtime};

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// Timed rounds per side, after `WARMUP` untimed ones.
const ROUNDS: usize = 20;
const WARMUP: usize = 2;
/// How often both sides poll httpd: the resolution of every sample.
const POLL: Duration = Duration::from_millis(2);
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(10);
/// The bare side's cgroups, apart from the runtime's `cca-oci`.
const BARE_CGROUP_PARENT: &str = "cca-bench-bare";

fn main() -> BenchResult<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // a unit-test pass should not start containers.
    if !std::env::args().any(|arg| arg == "--bench") {
        return Ok(());
    }
    if !rustix::process::geteuid().is_root() {
        println!("skipping oci_start: containers need root");
        return Ok(());
    }
    if !commands_available(
        "oci_start",
        &["runc", "docker-registry", "skopeo", "busybox"],
    ) {
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> BenchResult<()> {
    let work = tempfile::tempdir()?;
    let layout = work.path().join("layout");
    write_oci_layout(&layout, "1", &[busybox_layer()?], &["sh"])?;
    let registry = TestRegistry::start()?;
    registry.push(&layout, "1", "bench/busybox")?;
    let store = ImageStore::open(work.path().join("images"))?;
    let image = format!("{}/bench/busybox:1", registry.host);
    Puller::new(store.clone(), RegistrySettings::plain_http(&registry.host))
        .pull(&image.parse()?)
        .await?;
    let runtime = OciRuntime::new(OciConfig::new(work.path().join("oci"), store.clone())).await?;
    let bare = BareRunc::prepare(&runtime, &store, &image, work.path()).await?;

    let mut ours = Vec::with_capacity(ROUNDS);
    let mut theirs = Vec::with_capacity(ROUNDS);
    for round in 0..WARMUP + ROUNDS {
        let ours_sample = time_oci_runtime(&runtime, &image, round).await;
        let bare_sample = bare.time_run(round);
        let (ours_sample, bare_sample) = (ours_sample?, bare_sample?);
        if round >= WARMUP {
            ours.push(ours_sample);
            theirs.push(bare_sample);
        }
    }
    bare.unmount();

    let (ours_median, bare_median) = (median(&mut ours), median(&mut theirs));
    println!(
        "oci_start: busybox httpd, start to first HTTP 200, {ROUNDS} rounds each, alternating"
    );
    report("OciRuntime create+start", &ours);
    report("bare runc run -d", &theirs);
    println!(
        "ratio of medians: {:.2}x ({} vs {})",
        ours_median.as_secs_f64() / bare_median.as_secs_f64(),
        ms(ours_median),
        ms(bare_median),
    );
    Ok(())
}

/// One `OciRuntime` round: timed from `create` to the first 200; the stop
/// and removal after it are not.
async fn time_oci_runtime(
    runtime: &OciRuntime,
    image: &str,
    round: usize,
) -> BenchResult<Duration> {
    let port = free_port()?;
    let id = format!("bench-{round}");
    let mut spec = InstanceSpec::new(&id, "bench", format!("exec httpd -f -p {port} -h /www"));
    spec.image = Some(image.to_owned());
    let started = Instant::now();
    runtime.create(spec).await?;
    runtime.start(&id).await?;
    let healthy = wait_healthy(port);
    let elapsed = started.elapsed();
    runtime.stop(&id, Duration::ZERO).await?;
    runtime.remove(&id).await?;
    healthy.map(|()| elapsed)
}

/// runc on a prepared bundle: the rootfs is mounted and `config.json`
/// written before anything is timed.
struct BareRunc {
    runc: PathBuf,
    state_root: PathBuf,
    bundle: PathBuf,
    /// `config.json` as `OciRuntime` generated it, the command and cgroup
    /// path replaced per round.
    config: serde_json::Value,
}

impl BareRunc {
    async fn prepare(
        runtime: &OciRuntime,
        store: &ImageStore,
        image: &str,
        work: &Path,
    ) -> BenchResult<Self> {
        // The same generator, the same spec: create one instance and take
        // its config.json.
        let mut spec = InstanceSpec::new("bench-template", "bench", "true");
        spec.image = Some(image.to_owned());
        let id = runtime.create(spec).await?;
        let generated = runtime.instance_dir(&id).join("bundle/config.json");
        let config: serde_json::Value = serde_json::from_slice(&std::fs::read(generated)?)?;
        runtime.remove(&id).await?;

        let bundle = work.join("bare/bundle");
        let (upper, overlay_work, rootfs) = (
            work.join("bare/upper"),
            work.join("bare/work"),
            bundle.join("rootfs"),
        );
        for dir in [&upper, &overlay_work, &rootfs] {
            std::fs::create_dir_all(dir)?;
        }
        let record = store.image(&image.parse()?)?;
        let lower: Vec<String> = store
            .layer_dirs(&record)
            .iter()
            .rev()
            .map(|dir| dir.display().to_string())
            .collect();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            overlay_work.display()
        );
        rustix::mount::mount(
            "overlay",
            &rootfs,
            "overlay",
            rustix::mount::MountFlags::empty(),
            Some(std::ffi::CString::new(options)?.as_c_str()),
        )?;
        Ok(Self {
            runc: find_command("runc").ok_or("runc is not on PATH")?,
            state_root: work.join("bare/state"),
            bundle,
            config,
        })
    }

    fn runc(&self) -> Command {
        let mut command = Command::new(&self.runc);
        command
            .arg("--root")
            .arg(&self.state_root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// One bare round: timed from `runc run -d` to the first 200.
    fn time_run(&self, round: usize) -> BenchResult<Duration> {
        let port = free_port()?;
        let id = format!("bare-{round}");
        let mut config = self.config.clone();
        config["process"]["args"][2] = format!("exec httpd -f -p {port} -h /www").into();
        config["linux"]["cgroupsPath"] = format!("/{BARE_CGROUP_PARENT}/{id}").into();
        std::fs::write(
            self.bundle.join("config.json"),
            serde_json::to_vec(&config)?,
        )?;
        let started = Instant::now();
        let status = self
            .runc()
            .args(["run", "-d", "--bundle"])
            .arg(&self.bundle)
            .arg(&id)
            .status()?;
        let healthy = if status.success() {
            wait_healthy(port)
        } else {
            Err(format!("runc run -d exited with {status}").into())
        };
        let elapsed = started.elapsed();
        self.runc().args(["delete", "--force", &id]).status()?;
        healthy.map(|()| elapsed)
    }

    fn unmount(&self) {
        let _ = rustix::mount::unmount(
            self.bundle.join("rootfs"),
            rustix::mount::UnmountFlags::DETACH,
        );
        // runc leaves the parent cgroups behind.
        let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten();
        for hierarchy in hierarchies.flatten() {
            let _ = std::fs::remove_dir(hierarchy.path().join(BARE_CGROUP_PARENT));
        }
    }
}

/// Polls `GET /` on loopback until it answers 200.
fn wait_healthy(port: u16) -> BenchResult<()> {
    let deadline = Instant::now() + HEALTHY_TIMEOUT;
    while Instant::now() < deadline {
        if answers_200(port) {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
    Err(format!("httpd on port {port} did not answer within {HEALTHY_TIMEOUT:?}").into())
}

fn answers_200(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut response = Vec::new();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .is_ok()
        && stream
            .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_ok()
        && stream.read_to_end(&mut response).is_ok()
        && response.starts_with(b"HTTP/1.")
        && response.get(9..12) == Some(b"200")
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn report(name: &str, sorted: &[Duration]) {
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    println!(
        "  {name:<26} median {}  min {}  p90 {}  max {}",
        ms(at(0.5)),
        ms(at(0.0)),
        ms(at(0.9)),
        ms(at(1.0)),
    );
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}
