//! The `oci` runtime against the real kernel and runc: an image built from
//! busybox-static in the test, pushed to a loopback `docker-registry` and
//! pulled into a store; `busybox httpd` reached on loopback (containers
//! share the host network for now), stop with grace then kill (httpd as
//! PID 1 ignores SIGTERM), exit codes, logs, exec, restart, adoption by a
//! second runtime object, removal leaving no mount, cgroup or state, and
//! bind mounts (a volume outliving its containers, a read-only file, a
//! root-only dir handed to the image's non-root user), and the resolver
//! files of a container with a DNS config: the generated `resolv.conf` and
//! `hosts` (also in an image without `/etc`), and glibc's `getent` in a
//! container resolving a service name through a tiny DNS responder in a
//! network namespace of the test's own.
//! A guard force-deletes the test's containers and unmounts their rootfs,
//! also when a test fails.

#[path = "support/dns.rs"]
mod dns;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cca_image::testing::{
    LayerBuilder, TestRegistry, busybox_layer, commands_available, free_port, getent_layer,
    root_test, write_oci_layout,
};
use cca_image::{ImageStore, Puller, RegistrySettings};
use cca_runtime::{
    DnsConfig, ExecRequest, ExitReason, InstanceSpec, InstanceState, LimitsEnforcement, LogOptions,
    Mount, NetworkAttachment, OciConfig, OciRuntime, PortBinding, Protocol, Runtime,
};
use dns::{DnsResponder, TestNetns};

/// A store holding the busybox test image, a runtime directory, and the
/// cleanup of whatever the test started.
struct Fixture {
    image: String,
    store: ImageStore,
    dir: tempfile::TempDir,
    runtime: OciRuntime,
    _registry: TestRegistry,
}

impl Fixture {
    async fn new(test: &str) -> Option<Self> {
        if !root_test(
            test,
            "containers",
            &["runc", "docker-registry", "skopeo", "busybox"],
        ) {
            return None;
        }
        let layout = tempfile::tempdir().expect("tempdir");
        let layer = busybox_layer().expect("busybox layer");
        write_oci_layout(layout.path(), "1", &[layer], &["sh"]).expect("layout");
        let registry = TestRegistry::start().expect("registry");
        registry
            .push(layout.path(), "1", "test/busybox")
            .expect("push");
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path().join("images")).expect("store");
        let image = format!("{}/test/busybox:1", registry.host);
        let puller = Puller::new(store.clone(), RegistrySettings::plain_http(&registry.host));
        puller
            .pull(&image.parse().expect("reference"))
            .await
            .expect("pull");
        let runtime = OciRuntime::new(OciConfig::new(dir.path().join("oci"), store.clone()))
            .await
            .expect("runtime opens");
        Some(Self {
            image,
            store,
            dir,
            runtime,
            _registry: registry,
        })
    }

    fn spec(&self, id: &str, command: &str) -> InstanceSpec {
        let mut spec = InstanceSpec::new(id, "svc", command);
        spec.image = Some(self.image.clone());
        spec
    }

    async fn run(&self, spec: InstanceSpec) {
        let id = self.runtime.create(spec).await.expect("create");
        self.runtime.start(&id).await.expect("start");
    }

    /// A second runtime object on the same directory: a restarted agent.
    async fn reopen(&self) -> OciRuntime {
        OciRuntime::new(OciConfig::new(
            self.dir.path().join("oci"),
            self.store.clone(),
        ))
        .await
        .expect("runtime reopens")
    }

    async fn wait_exited(&self, id: &str) -> cca_runtime::InstanceStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.runtime.inspect(id).await.expect("inspect");
            if status.state == InstanceState::Exited || Instant::now() > deadline {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Nothing of `id` is left: no instance dir, mount, cgroup or runc state.
    fn assert_gone(&self, id: &str) {
        let instance_dir = self.runtime.instance_dir(id);
        assert!(!instance_dir.exists(), "{} is left", instance_dir.display());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mountinfo.contains(&instance_dir.display().to_string()),
            "a mount is left"
        );
        let cgroups: Vec<PathBuf> = self
            .runtime
            .cgroup_dirs(id)
            .into_iter()
            .filter(|d| d.exists())
            .collect();
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
        let state = self.runtime.binary().state_root.join(id);
        assert!(!state.exists(), "runc state {} is left", state.display());
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let binary = self.runtime.binary().clone();
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("oci/instances")) else {
            return;
        };
        for entry in entries.flatten() {
            let _ = Command::new(&binary.path)
                .arg("--root")
                .arg(&binary.state_root)
                .args(["delete", "--force"])
                .arg(entry.file_name())
                .output();
            let _ = rustix::mount::unmount(
                entry.path().join("bundle/rootfs"),
                rustix::mount::UnmountFlags::DETACH,
            );
        }
    }
}

/// `GET /` on loopback, the body when the answer is 200.
fn http_get(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_owned())
}

async fn wait_for_http(port: u16) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(body) = http_get(port) {
            return Some(body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn busybox_httpd_serves_on_loopback_then_is_killed_after_the_grace_and_removed() {
    let Some(test) = Fixture::new("busybox_httpd_serves").await else {
        return;
    };
    let port = free_port().expect("port");
    let mut spec = test.spec("web-1", "exec httpd -f -p $PORT -h /www");
    spec.ports = vec![PortBinding {
        name: "http".into(),
        host_port: port,
        container_port: None,
        protocol: Protocol::Tcp,
    }];
    spec.memory_bytes = Some(64 << 20);
    spec.cpu_millis = Some(500);
    test.run(spec).await;

    let status = test.runtime.inspect("web-1").await.expect("inspect");
    assert_eq!(
        (status.state, status.adopted),
        (InstanceState::Running, false)
    );
    assert!(
        matches!(status.limits, LimitsEnforcement::Enforced { .. }),
        "{:?}",
        status.limits
    );
    let Some(body) = wait_for_http(port).await else {
        let log = std::fs::read_to_string(test.runtime.instance_dir("web-1").join("output.log"));
        panic!("httpd does not answer on loopback; its log: {log:?}");
    };
    assert_eq!(body, "hello from busybox\n");
    let memory = test
        .runtime
        .cgroup_dirs("web-1")
        .into_iter()
        .find(|dir| dir.join("memory.limit_in_bytes").exists())
        .expect("a memory cgroup");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    let usage = test.runtime.usage("web-1").await.expect("usage");
    assert!(
        usage.cpu_nanos > 0 && usage.memory_bytes > 0 && usage.memory_bytes < 64 << 20,
        "a serving httpd is accounted in its cgroups: {usage:?}"
    );
    // Resized in place (`runc update`): the same container, new limits.
    let limits = cca_runtime::Limits {
        cpu_millis: Some(250),
        memory_bytes: Some(96 << 20),
    };
    test.runtime.resize("web-1", limits).await.expect("resize");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (96u64 << 20).to_string());
    let resized = test.runtime.inspect("web-1").await.expect("inspect");
    assert_eq!(resized.pid, status.pid, "not restarted");
    assert_eq!(cca_runtime::Limits::of(&resized.spec), limits);
    assert!(http_get(port).is_some(), "still serving");

    let grace = Duration::from_millis(300);
    let started = Instant::now();
    let status = test.runtime.stop("web-1", grace).await.expect("stop");
    assert!(
        started.elapsed() >= grace,
        "httpd ignores SIGTERM: KILL comes after the grace"
    );
    let exit = status.exit.expect("exited");
    assert_eq!((exit.reason, exit.signal), (ExitReason::Stopped, Some(9)));
    assert!(http_get(port).is_none(), "httpd is gone");
    assert!(
        test.runtime.usage("web-1").await.is_err(),
        "an ended container has no usage"
    );

    test.runtime.remove("web-1").await.expect("remove");
    test.assert_gone("web-1");
    assert!(test.runtime.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn exit_codes_logs_exec_and_restarts() {
    let Some(test) = Fixture::new("exit_codes_logs_exec").await else {
        return;
    };
    test.run(test.spec(
        "job",
        "echo hello from $CCA_INSTANCE; echo oops >&2; exit 3",
    ))
    .await;
    let status = test.wait_exited("job").await;
    let exit = status.exit.expect("exited");
    assert_eq!((exit.code, exit.reason), (Some(3), ExitReason::Exited));
    let logs = test
        .runtime
        .logs("job", LogOptions::default())
        .await
        .expect("logs");
    // runc copies stdout and stderr through separate pipes: their relative
    // order is not kept.
    let mut lines = logs.collect().await.expect("lines");
    lines.sort();
    assert_eq!(lines, ["hello from job", "oops"]);

    test.runtime.start("job").await.expect("restart");
    let status = test.wait_exited("job").await;
    assert_eq!(status.exit.and_then(|e| e.code), Some(3));
    let logs = test
        .runtime
        .logs("job", LogOptions::default())
        .await
        .expect("logs");
    assert_eq!(
        logs.collect().await.expect("lines").len(),
        4,
        "the restart appended"
    );

    test.run(test.spec("svc", "sleep 1000")).await;
    let request = ExecRequest::new(
        [
            "sh",
            "-c",
            "echo $CCA_INSTANCE; cat /etc/hostname 2>/dev/null; hostname",
        ],
        Duration::from_secs(5),
    );
    let output = test.runtime.exec("svc", request).await.expect("exec");
    assert!(output.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().last(),
        Some("svc"),
        "uts namespace"
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("svc\n"),
        "the instance env"
    );
    let status = test
        .runtime
        .stop("svc", Duration::from_secs(5))
        .await
        .expect("stop");
    assert_eq!(status.exit.map(|e| e.reason), Some(ExitReason::Stopped));
    for id in ["job", "svc"] {
        test.runtime.remove(id).await.expect("remove");
        test.assert_gone(id);
    }
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_reported_oom_killed() {
    let Some(test) = Fixture::new("oom_killed").await else {
        return;
    };
    // busybox tail without -c keeps the last lines; /dev/zero has no
    // newline, so it buffers all 200 MiB and the kernel kills it.
    let mut spec = test.spec("hog", "head -c 200m /dev/zero | tail");
    spec.memory_bytes = Some(32 << 20);
    test.run(spec).await;
    let status = test.wait_exited("hog").await;
    let exit = status.exit.expect("exited");
    assert_eq!(
        exit.reason,
        ExitReason::OutOfMemory {
            limit_bytes: Some(32 << 20)
        },
        "{exit:?}"
    );
    assert_eq!(exit.signal, Some(9), "the shell reports tail's SIGKILL");

    // A restart is a new run with a new counter: a clean exit is an exit.
    let mut spec = test.spec("fits", "head -c 1m /dev/zero | tail -c 1 >/dev/null");
    spec.memory_bytes = Some(32 << 20);
    test.run(spec).await;
    let exit = test.wait_exited("fits").await.exit.expect("exited");
    assert_eq!((exit.code, exit.reason), (Some(0), ExitReason::Exited));

    for id in ["hog", "fits"] {
        test.runtime.remove(id).await.expect("remove");
        test.assert_gone(id);
    }
}

#[tokio::test]
async fn a_restarted_agent_adopts_a_running_container_and_learns_its_exit() {
    let Some(test) = Fixture::new("adoption").await else {
        return;
    };
    test.run(test.spec(
        "long",
        "trap 'exit 7' TERM; while true; do sleep 0.05; done",
    ))
    .await;

    let adopter = test.reopen().await;
    let listed = adopter.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].state, listed[0].adopted),
        (InstanceState::Running, true)
    );
    let status = adopter
        .stop("long", Duration::from_secs(5))
        .await
        .expect("stop");
    let exit = status.exit.expect("exited");
    assert_eq!(
        (exit.code, exit.reason),
        (Some(7), ExitReason::Stopped),
        "the trap ran on SIGTERM"
    );
    adopter.remove("long").await.expect("remove");
    test.assert_gone("long");
}

#[tokio::test]
async fn an_image_not_in_the_store_fails_create_and_leaves_nothing() {
    let Some(test) = Fixture::new("image_not_in_store").await else {
        return;
    };
    let mut spec = test.spec("ghost", "true");
    spec.image = Some("127.0.0.1:1/not/pulled:1".into());
    let error = test
        .runtime
        .create(spec)
        .await
        .expect_err("must fail")
        .to_string();
    assert_eq!(
        error,
        "instance ghost: create failed: image 127.0.0.1:1/not/pulled:1: not in the store"
    );
    let mut spec = test.spec("bad", "true");
    spec.image = Some("Not A Reference".into());
    let error = test
        .runtime
        .create(spec)
        .await
        .expect_err("must fail")
        .to_string();
    assert!(error.contains("invalid image reference"), "{error}");
    test.assert_gone("ghost");
    test.assert_gone("bad");
}

#[tokio::test]
async fn a_volume_outlives_its_containers_and_a_read_only_mount_cannot_be_written() {
    let Some(test) = Fixture::new("volume_and_read_only_mount").await else {
        return;
    };
    let volume = test.dir.path().join("volumes/db/data-0");
    std::fs::create_dir_all(&volume).expect("volume dir");
    let secret = test.dir.path().join("secret");
    std::fs::write(&secret, "s3cret\n").expect("secret file");
    let mounts = vec![
        Mount {
            source: volume.clone(),
            target: "/data".into(),
            read_only: false,
            owned_by_workload: false,
        },
        Mount {
            source: secret.clone(),
            target: "/run/secrets/password".into(),
            read_only: true,
            owned_by_workload: false,
        },
    ];

    let mut writer = test.spec(
        "writer",
        // The failed write's message goes to stdout too: stdout and
        // stderr share the log, and the shell writes its message in
        // pieces that could land inside another line.
        "echo kept > /data/file && cat /run/secrets/password \
         && if (echo x > /run/secrets/password) 2>&1; then echo WROTE; exit 1; fi; exit 0",
    );
    writer.mounts = mounts.clone();
    test.run(writer).await;
    let status = test.wait_exited("writer").await;
    let lines = test
        .runtime
        .logs("writer", LogOptions::default())
        .await
        .expect("logs")
        .collect()
        .await
        .expect("lines");
    assert_eq!(status.exit.and_then(|e| e.code), Some(0), "{lines:?}");
    assert!(lines.iter().any(|l| l == "s3cret"), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("Read-only file system")),
        "the write into the ro mount fails inside: {lines:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&secret).expect("secret"),
        "s3cret\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("file")).expect("written through"),
        "kept\n"
    );
    test.runtime.remove("writer").await.expect("remove");
    test.assert_gone("writer");
    assert!(
        volume.join("file").exists(),
        "removing a container keeps its volume"
    );

    // A second container on the same volume (a replacement) sees the file.
    let mut reader = test.spec("reader", "cat /data/file");
    reader.mounts = mounts;
    test.run(reader).await;
    let status = test.wait_exited("reader").await;
    assert_eq!(status.exit.and_then(|e| e.code), Some(0));
    let lines = test
        .runtime
        .logs("reader", LogOptions::default())
        .await
        .expect("logs")
        .collect()
        .await
        .expect("lines");
    assert_eq!(lines, ["kept"]);
    test.runtime.remove("reader").await.expect("remove");
    test.assert_gone("reader");
}

#[tokio::test]
async fn invalid_mounts_are_refused_at_create_and_leave_nothing() {
    let Some(test) = Fixture::new("invalid_mounts").await else {
        return;
    };
    let cases = [
        (
            "relative",
            test.dir.path().to_path_buf(),
            "data",
            "is not an absolute path",
        ),
        (
            "escaping",
            test.dir.path().to_path_buf(),
            "/data/../../etc",
            "contains '..'",
        ),
        (
            "missing",
            test.dir.path().join("no-such-volume"),
            "/data",
            "does not exist",
        ),
    ];
    for (id, source, target, expected) in cases {
        let mut spec = test.spec(id, "true");
        spec.mounts = vec![Mount {
            source: source.clone(),
            target: target.into(),
            read_only: false,
            owned_by_workload: false,
        }];
        let error = test
            .runtime
            .create(spec)
            .await
            .expect_err("must be refused")
            .to_string();
        assert!(error.contains(expected), "{error}");
        assert!(
            error.contains(id) && error.contains(target),
            "names both: {error}"
        );
        test.assert_gone(id);
        assert!(
            !test.dir.path().join("no-such-volume").exists(),
            "no source is created"
        );
    }
}

#[tokio::test]
async fn crun_on_hybrid_cgroups_is_refused_with_the_reason_before_anything_is_created() {
    // Hybrid as crun sees it: cgroup2 at unified holding controllers.
    let hybrid = std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers")
        .is_ok_and(|controllers| !controllers.trim().is_empty());
    if !hybrid {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping crun_on_hybrid_cgroups: cgroups are not hybrid here");
        }
        return;
    }
    if !commands_available("crun_on_hybrid_cgroups", &["crun"]) {
        return;
    }
    let crun = cca_image::testing::find_command("crun").expect("crun was found");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("images")).expect("store");
    let mut config = OciConfig::new(dir.path().join("oci"), store);
    config.binary = Some(crun.clone());
    let error = OciRuntime::new(config)
        .await
        .expect_err("crun is refused here")
        .to_string();
    for part in [
        crun.to_str().expect("utf-8 path"),
        "crun refuses hybrid cgroups",
        "use runc",
        "unified cgroup v2",
    ] {
        assert!(error.contains(part), "{error:?} lacks {part:?}");
    }
    assert!(
        !dir.path().join("oci").exists(),
        "nothing is created for a refused binary"
    );
}

#[tokio::test]
async fn a_mount_owned_by_the_workload_is_readable_by_the_images_user() {
    let Some(test) = Fixture::new("owned_by_workload").await else {
        return;
    };
    // The image runs as 1000:1001 (the record's config, as a pulled image
    // with `User` would have it).
    let mut record = test
        .store
        .images()
        .expect("images")
        .pop()
        .expect("the pulled image");
    record.config.user = Some("1000:1001".into());
    test.store.save_image(record).expect("saved");
    // Two root-only dirs of a 0400 file, as the agent writes secrets.
    let private = |name: &str| {
        let dir = test.dir.path().join(name);
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("0700");
        let file = dir.join("token");
        std::fs::write(&file, "s3cret").expect("file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).expect("0400");
        dir
    };
    let handed = private("handed");
    let kept = private("kept");
    let mut spec = test.spec(
        "reader",
        "id -u; id -g; cat /run/secrets/token; echo; \
         cat /run/kept/token 2>/dev/null || echo kept unreadable",
    );
    spec.mounts = vec![
        Mount {
            source: handed.clone(),
            target: "/run/secrets".into(),
            read_only: true,
            owned_by_workload: true,
        },
        Mount {
            source: kept.clone(),
            target: "/run/kept".into(),
            read_only: true,
            owned_by_workload: false,
        },
    ];
    test.run(spec).await;
    let status = test.wait_exited("reader").await;
    let lines = test
        .runtime
        .logs("reader", LogOptions::default())
        .await
        .expect("logs")
        .collect()
        .await
        .expect("lines");
    assert_eq!(status.exit.and_then(|e| e.code), Some(0), "{lines:?}");
    assert_eq!(lines, ["1000", "1001", "s3cret", "kept unreadable"]);
    for path in [handed.clone(), handed.join("token")] {
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!((meta.uid(), meta.gid()), (1000, 1001), "{}", path.display());
    }
    let mode = std::fs::metadata(handed.join("token"))
        .expect("metadata")
        .mode();
    assert_eq!(mode & 0o777, 0o400, "modes are kept");
    assert_eq!(
        std::fs::metadata(kept.join("token"))
            .expect("metadata")
            .uid(),
        0
    );
    test.runtime.remove("reader").await.expect("remove");
    test.assert_gone("reader");
}

fn cluster_dns(nameserver: Ipv4Addr) -> DnsConfig {
    DnsConfig {
        nameservers: vec![nameserver],
        search: vec!["cca.local".into()],
        ndots: 1,
    }
}

impl Fixture {
    /// Records an image of `layers` (uncompressed tars, base first) in the
    /// store under `name`, as `cca image import` would.
    fn import_image(&self, name: &str, layers: &[Vec<u8>]) -> String {
        let layout = tempfile::tempdir().expect("tempdir");
        write_oci_layout(layout.path(), "1", layers, &["sh"]).expect("layout");
        self.store
            .import(layout.path(), Some(name))
            .expect("the image imports");
        name.to_owned()
    }

    /// Runs `spec` to its end; its exit code and output lines.
    async fn run_to_end(&self, spec: InstanceSpec) -> (Option<i32>, Vec<String>) {
        let id = spec.id.clone();
        self.run(spec).await;
        let status = self.wait_exited(&id).await;
        let lines = self
            .runtime
            .logs(&id, LogOptions::default())
            .await
            .expect("logs")
            .collect()
            .await
            .expect("lines");
        (status.exit.and_then(|exit| exit.code), lines)
    }
}

#[tokio::test]
async fn a_container_with_cluster_dns_reads_the_generated_resolv_conf_and_hosts() {
    let Some(test) = Fixture::new("cluster_dns_resolv_conf").await else {
        return;
    };
    // The failed write's complaint goes to stdout too: the two streams
    // share the log, and a line of each can interleave mid-line.
    let show = "cat /etc/resolv.conf /etc/hosts; hostname; \
                if (echo x >> /etc/resolv.conf) 2>&1; then echo WROTE; fi; echo done";
    let mut spec = test.spec("dns-1", show);
    spec.dns = Some(cluster_dns(Ipv4Addr::new(10, 42, 3, 1)));
    let (code, lines) = test.run_to_end(spec).await;
    assert_eq!(code, Some(0), "{lines:?}");
    for expected in [
        "nameserver 10.42.3.1",
        "search cca.local",
        "options ndots:1",
        "127.0.0.1\tlocalhost",
        "127.0.1.1\tdns-1",
        "dns-1",
        "done",
    ] {
        assert!(
            lines.iter().any(|l| l == expected),
            "{expected:?} in {lines:?}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains("Read-only file system"))
            && !lines.contains(&"WROTE".into()),
        "the workload cannot change its resolver: {lines:?}"
    );
    let generated = test.runtime.instance_dir("dns-1").join("resolv.conf");
    assert!(
        std::fs::read_to_string(&generated)
            .expect("the instance's resolv.conf")
            .contains("nameserver 10.42.3.1"),
        "written into the instance's directory"
    );
    test.runtime.remove("dns-1").await.expect("remove");
    test.assert_gone("dns-1");

    // Without a DNS config the image's files stay (busybox has none).
    let (code, lines) = test
        .run_to_end(test.spec("plain", "cat /etc/resolv.conf"))
        .await;
    assert_ne!(code, Some(0));
    assert!(
        lines.iter().any(|l| l.contains("No such file")),
        "{lines:?}"
    );
    test.runtime.remove("plain").await.expect("remove");
}

#[tokio::test]
async fn an_image_without_etc_gets_the_resolver_files_too() {
    let Some(test) = Fixture::new("image_without_etc").await else {
        return;
    };
    let busybox = std::fs::read(cca_image::testing::find_command("busybox").expect("busybox"))
        .expect("busybox binary");
    let layer = LayerBuilder::new()
        .dir("bin")
        .and_then(|layer| layer.file("bin/busybox", &busybox, 0o755))
        .and_then(|layer| layer.symlink("bin/sh", "busybox"))
        .and_then(|layer| layer.symlink("bin/cat", "busybox"))
        .and_then(LayerBuilder::finish)
        .expect("layer");
    let image = test.import_image("local/no-etc:1", &[layer]);
    let mut spec = test.spec("bare", "cat /etc/resolv.conf /etc/hosts");
    spec.image = Some(image);
    spec.dns = Some(cluster_dns(Ipv4Addr::new(10, 42, 3, 1)));
    let (code, lines) = test.run_to_end(spec).await;
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(
        lines.iter().any(|l| l == "nameserver 10.42.3.1"),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l == "127.0.1.1\tbare"), "{lines:?}");
    test.runtime.remove("bare").await.expect("remove");
    test.assert_gone("bare");
}

#[tokio::test]
async fn glibc_getent_in_a_container_resolves_service_names_through_the_cluster_dns() {
    let Some(test) = Fixture::new("glibc_getent_resolves").await else {
        return;
    };
    if !commands_available("glibc_getent_resolves", &["ip", "getent", "ldd"]) {
        return;
    }
    let dns_address = Ipv4Addr::new(10, 99, 0, 1);
    let netns = TestNetns::new("dns", dns_address);
    let records = [("postgres.cca.local".to_owned(), Ipv4Addr::new(10, 43, 0, 7))];
    let responder = DnsResponder::start(&netns, dns_address, records.into_iter().collect());
    let image = test.import_image(
        "local/getent:1",
        &[
            busybox_layer().expect("busybox layer"),
            getent_layer().expect("getent layer"),
        ],
    );
    let command = "getent=/usr/bin/getent; \
                   $getent hosts postgres; echo \"postgres rc=$?\"; \
                   $getent hosts nothere; echo \"nothere rc=$?\"; \
                   $getent hosts dns-getent; $getent hosts localhost";
    let mut spec = test.spec("dns-getent", command);
    spec.image = Some(image);
    spec.network = Some(NetworkAttachment {
        netns_path: netns.path.clone(),
        address: Ipv4Addr::new(10, 99, 0, 2),
    });
    spec.dns = Some(cluster_dns(dns_address));
    let (code, lines) = test.run_to_end(spec).await;
    assert_eq!(code, Some(0), "{lines:?}");
    let fields = |line: &String| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let answers: Vec<Vec<String>> = lines.iter().map(fields).collect();
    for expected in [
        ["10.43.0.7", "postgres.cca.local"],
        ["10.99.0.2", "dns-getent"],
    ] {
        assert!(
            answers.iter().any(|answer| answer == &expected),
            "{expected:?} in {lines:?}"
        );
    }
    assert!(lines.contains(&"postgres rc=0".to_owned()), "{lines:?}");
    assert!(
        lines.contains(&"nothere rc=2".to_owned()),
        "an unknown name is not found: {lines:?}"
    );
    assert!(
        answers
            .iter()
            .any(|answer| answer.get(1).map(String::as_str) == Some("localhost")),
        "localhost from /etc/hosts (getent asks for IPv6 first): {lines:?}"
    );
    let asked = responder.asked();
    assert!(
        asked.contains(&"postgres.cca.local 1".to_owned()),
        "the search domain was tried, an A query answered: {asked:?}"
    );
    // getent asks for IPv6 first (/etc/hosts has none for the container,
    // so that goes to the server); the IPv4 address is the file's.
    assert!(
        !asked
            .iter()
            .any(|question| question.starts_with("dns-getent") && question.ends_with(" 1")),
        "the container's own IPv4 address comes from /etc/hosts: {asked:?}"
    );
    test.runtime.remove("dns-getent").await.expect("remove");
    test.assert_gone("dns-getent");
}
