//! The process runtime against the real kernel: processes, sessions and
//! process groups, signals, log files, cgroup v1 limits and OOM kills,
//! adoption by a second runtime object on the same directory (a restarted
//! agent), orphan listing, exec, and a private mount namespace showing the
//! instance's own `/etc/resolv.conf` (root). Each test's guard kills what
//! it started and removes its cgroups, also when the test fails.

mod support;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use cca_image::testing::root_test;
use cca_runtime::{
    DnsConfig, Error, ExecRequest, ExitReason, InstanceSpec, InstanceState, Limits,
    LimitsEnforcement, LogOptions, PortBinding, Protocol, Runtime,
};
use support::{TestRuntime, is_alive};

fn spec(id: &str, command: &str) -> InstanceSpec {
    InstanceSpec::new(id, "svc", command)
}

/// Fields 5 and 6 of /proc/PID/stat: process group and session.
fn group_and_session(pid: u32) -> (u32, u32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<u32> = stat[stat.rfind(')').expect(")") + 1..]
        .split_whitespace()
        .skip(2)
        .take(2)
        .map(|f| f.parse().expect("number"))
        .collect();
    (fields[0], fields[1])
}

#[tokio::test]
async fn a_started_command_runs_in_its_own_session_and_logs_its_output() {
    let test = TestRuntime::new().await;
    let status = test
        .run(spec("hello", "echo hi; echo oops >&2; sleep 30"))
        .await;
    assert_eq!(status.state, InstanceState::Running);
    assert!(!status.adopted);
    let pid = status.pid.expect("pid");
    assert!(is_alive(pid));
    assert_eq!(
        group_and_session(pid),
        (pid, pid),
        "session and group leader"
    );
    let lines = test.wait_for_log("hello", "oops").await;
    assert_eq!(lines, ["hi", "oops"]);

    let stopped = test
        .runtime
        .stop("hello", Duration::from_secs(5))
        .await
        .expect("stop");
    assert_eq!(stopped.state, InstanceState::Exited);
    let exit = stopped.exit.expect("exit");
    assert_eq!((exit.reason, exit.signal), (ExitReason::Stopped, Some(15)));
    assert!(!is_alive(pid));
    test.runtime.remove("hello").await.expect("remove");
    assert!(!test.runtime.instance_dir("hello").exists());
}

#[tokio::test]
async fn stop_kills_the_whole_group_after_the_grace_period_when_term_is_ignored() {
    let test = TestRuntime::new().await;
    let command = "trap '' TERM; sleep 300 & echo $! > child.pid; echo ready; wait";
    let status = test.run(spec("stubborn", command)).await;
    test.wait_for_log("stubborn", "ready").await;
    let work = test.runtime.instance_dir("stubborn").join("work");
    let child: u32 = std::fs::read_to_string(work.join("child.pid"))
        .expect("child.pid")
        .trim()
        .parse()
        .expect("pid");
    assert!(is_alive(child));

    let grace = Duration::from_millis(500);
    let started = Instant::now();
    let stopped = test.runtime.stop("stubborn", grace).await.expect("stop");
    assert!(
        started.elapsed() >= grace,
        "SIGKILL only after the grace period"
    );
    assert_eq!(stopped.exit.expect("exit").signal, Some(9));
    assert!(!is_alive(status.pid.expect("pid")));
    assert!(!is_alive(child), "the shell's child died with the group");
}

#[tokio::test]
async fn when_the_main_process_dies_what_it_left_in_its_group_dies_too() {
    let test = TestRuntime::new().await;
    let command = "sleep 300 & echo $! > child.pid; echo ready; wait";
    let status = test.run(spec("parent", command)).await;
    test.wait_for_log("parent", "ready").await;
    let work = test.runtime.instance_dir("parent").join("work");
    let child: u32 = std::fs::read_to_string(work.join("child.pid"))
        .expect("child.pid")
        .trim()
        .parse()
        .expect("pid");
    let main = status.pid.expect("pid");
    // Killed from outside (an operator, the OOM killer): only the shell.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &main.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_alive(child) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !is_alive(child),
        "the orphaned child still holds the instance's resources"
    );
    let status = test.runtime.inspect("parent").await.expect("inspect");
    assert_eq!(status.state, InstanceState::Exited);
}

#[tokio::test]
async fn the_exit_code_is_captured_and_a_restart_reuses_the_instance() {
    let test = TestRuntime::new().await;
    test.run(spec("fails", "echo attempt; exit 3")).await;
    let status = test.wait_for("fails", InstanceState::Exited).await;
    let exit = status.exit.expect("exit");
    assert_eq!(
        (exit.code, exit.signal, &exit.reason),
        (Some(3), None, &ExitReason::Exited)
    );
    assert_eq!(exit.to_string(), "exited with code 3");

    test.runtime.start("fails").await.expect("restart");
    test.wait_for("fails", InstanceState::Exited).await;
    let lines = test.wait_for_log("fails", "attempt").await;
    assert_eq!(lines, ["attempt", "attempt"], "logs survive a restart");
}

#[tokio::test]
async fn environment_ports_and_working_directory_are_applied() {
    let test = TestRuntime::new().await;
    let cwd = tempfile::tempdir().expect("cwd");
    let mut spec = spec(
        "env",
        "echo \"$GREETING $PORT $CCA_PORT_ADMIN_UI $CCA_INSTANCE $CCA_SERVICE $CCA_NODE $(pwd) ${CARGO_MANIFEST_DIR:-private}\"",
    );
    spec.node = "node-7".into();
    spec.env.insert("GREETING".into(), "hello".into());
    spec.working_dir = Some(cwd.path().to_owned());
    spec.ports = vec![
        PortBinding {
            name: "http".into(),
            host_port: 31080,
            container_port: None,
            protocol: Protocol::Tcp,
        },
        PortBinding {
            name: "admin-ui".into(),
            host_port: 31081,
            container_port: None,
            protocol: Protocol::Tcp,
        },
    ];
    test.run(spec).await;
    test.wait_for("env", InstanceState::Exited).await;
    let lines = test.wait_for_log("env", "hello").await;
    let expected = format!(
        "hello 31080 31081 env svc node-7 {} private",
        cwd.path().display()
    );
    assert_eq!(lines, [expected]);
}

#[tokio::test]
async fn logs_rotate_at_the_size_limit_and_keep_two_old_files() {
    let test = TestRuntime::new().await;
    let mut spec = spec(
        "chatty",
        "i=0; while [ $i -lt 300 ]; do printf '%099d\\n' $i; i=$((i+1)); \
         if [ $((i % 10)) -eq 0 ]; then sleep 0.03; fi; done",
    );
    spec.log_limit_bytes = 4096;
    test.run(spec).await;
    test.wait_for("chatty", InstanceState::Exited).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dir = test.runtime.instance_dir("chatty");
    // Rotation runs every 50 ms, so a file may overshoot the limit by one
    // interval's output; once the writer is done, the current file is under it.
    let current = std::fs::metadata(dir.join("output.log"))
        .expect("output.log")
        .len();
    assert!(current <= 4096, "output.log is {current} bytes");
    assert!(dir.join("output.log.1").exists() && dir.join("output.log.2").exists());
    assert!(!dir.join("output.log.3").exists());
    let everything = test
        .runtime
        .logs("chatty", LogOptions::default())
        .await
        .expect("logs");
    let kept = everything.collect().await.expect("lines");
    assert!(
        kept.len() < 300,
        "the oldest output was dropped ({} lines kept)",
        kept.len()
    );
    let options = LogOptions {
        tail: Some(1),
        follow: false,
    };
    let last = test
        .runtime
        .logs("chatty", options)
        .await
        .expect("logs")
        .collect()
        .await
        .expect("lines");
    assert_eq!(last, [format!("{:099}", 299)]);
}

#[tokio::test]
async fn following_logs_streams_until_the_instance_ends() {
    let test = TestRuntime::new().await;
    test.run(spec(
        "ticker",
        "for i in 1 2 3; do echo tick $i; sleep 0.2; done",
    ))
    .await;
    let options = LogOptions {
        tail: None,
        follow: true,
    };
    let stream = test.runtime.logs("ticker", options).await.expect("logs");
    let lines = tokio::time::timeout(Duration::from_secs(10), stream.collect())
        .await
        .expect("the stream ends with the instance")
        .expect("lines");
    assert_eq!(lines, ["tick 1", "tick 2", "tick 3"]);
}

#[tokio::test]
async fn a_memory_limit_is_enforced_and_an_oom_kill_reported() {
    let test = TestRuntime::new().await;
    let mut spec = spec("hog", "head -c 200M /dev/zero | tail; echo survived");
    spec.memory_bytes = Some(32 << 20);
    spec.cpu_millis = Some(500);
    let status = test.run(spec).await;
    if let LimitsEnforcement::Unenforced { reason } = &status.limits {
        // As root (how scripts/test runs) the cgroup must be writable: a
        // limit silently not enforced is the failure this test exists for.
        assert!(
            !cca_image::testing::is_root(),
            "running as root, yet the memory limit is not enforced: {reason}"
        );
        println!(
            "skipping a_memory_limit_is_enforced: the memory cgroup is not writable without root: {reason}"
        );
        return;
    }
    let memory_dir = test.cgroup_dir("memory", "hog");
    let limit = std::fs::read_to_string(memory_dir.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (32u64 << 20).to_string());
    let quota = std::fs::read_to_string(test.cgroup_dir("cpu", "hog").join("cpu.cfs_quota_us"))
        .expect("quota");
    assert_eq!(quota.trim(), "50000");

    let status = test.wait_for("hog", InstanceState::Exited).await;
    let exit = status.exit.expect("exit");
    assert_eq!(
        exit.reason,
        ExitReason::OutOfMemory {
            limit_bytes: Some(32 << 20)
        },
        "{exit}"
    );
    test.runtime.remove("hog").await.expect("remove");
    assert!(!memory_dir.exists(), "the cgroup goes with the instance");
    assert!(!test.cgroup_dir("cpu", "hog").exists());
}

/// Vertical autoscaling's in-place resize: a running instance's cgroups
/// take the new limits without a restart (the same process keeps
/// running), its spec says so, and one that has stopped keeps new limits
/// for its next start.
#[tokio::test]
async fn a_running_instance_is_resized_in_place() {
    let test = TestRuntime::new().await;
    let mut spec = spec("grow", "sleep 30");
    spec.memory_bytes = Some(32 << 20);
    spec.cpu_millis = Some(500);
    let status = test.run(spec).await;
    if !cca_image::testing::is_root() {
        println!("skipping a_running_instance_is_resized_in_place: cgroups need root");
        return;
    }
    let pid = status.pid.expect("pid");
    let limits = Limits {
        cpu_millis: Some(250),
        memory_bytes: Some(96 << 20),
    };
    test.runtime.resize("grow", limits).await.expect("resize");
    let memory = std::fs::read_to_string(
        test.cgroup_dir("memory", "grow")
            .join("memory.limit_in_bytes"),
    )
    .expect("limit");
    assert_eq!(memory.trim(), (96u64 << 20).to_string());
    let quota = std::fs::read_to_string(test.cgroup_dir("cpu", "grow").join("cpu.cfs_quota_us"))
        .expect("quota");
    assert_eq!(quota.trim(), "25000");
    let status = test.runtime.inspect("grow").await.expect("inspect");
    assert_eq!(status.pid, Some(pid), "not restarted");
    assert_eq!(Limits::of(&status.spec), limits);
    // Unlimited memory.
    let unlimited = Limits {
        memory_bytes: None,
        ..limits
    };
    test.runtime
        .resize("grow", unlimited)
        .await
        .expect("resize");
    let memory = std::fs::read_to_string(
        test.cgroup_dir("memory", "grow")
            .join("memory.limit_in_bytes"),
    )
    .expect("limit");
    assert!(
        memory.trim().parse::<u64>().expect("a number") > 1 << 40,
        "{memory}"
    );
    test.runtime
        .stop("grow", Duration::ZERO)
        .await
        .expect("stop");
    test.runtime.resize("grow", limits).await.expect("resize");
    test.runtime.start("grow").await.expect("start again");
    let memory = std::fs::read_to_string(
        test.cgroup_dir("memory", "grow")
            .join("memory.limit_in_bytes"),
    )
    .expect("limit");
    assert_eq!(memory.trim(), (96u64 << 20).to_string(), "the next start's");
}

/// Every instance's use is accounted, limits or not: its CPU time grows
/// while it keeps a core busy, its memory shows what it holds, and an
/// instance that ended has no usage to read.
#[tokio::test]
async fn an_instances_cpu_time_and_memory_are_read_while_it_runs() {
    let test = TestRuntime::new().await;
    let held = 48u64 << 20;
    let command = format!("exec perl -e '$held = \"x\" x {held}; 1 while 1'");
    let status = test.run(spec("busy", &command)).await;
    assert_eq!(status.limits, LimitsEnforcement::NotRequested);
    if cca_image::testing::is_root() {
        assert!(
            test.cgroup_dir("cpuacct", "busy").is_dir(),
            "accounted in cgroups"
        );
        assert!(test.cgroup_dir("memory", "busy").is_dir());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let usage = test.runtime.usage("busy").await.expect("usage");
        if usage.cpu_nanos > 200_000_000 && usage.memory_bytes > held {
            break usage;
        }
        assert!(Instant::now() < deadline, "never busy: {usage:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(first.memory_bytes < 4 * held, "{first:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = test.runtime.usage("busy").await.expect("usage");
    assert!(
        second.cpu_nanos >= first.cpu_nanos + 100_000_000,
        "a busy instance's CPU time grows: {first:?} then {second:?}"
    );
    test.runtime
        .stop("busy", Duration::from_millis(100))
        .await
        .expect("stop");
    let ended = test.runtime.usage("busy").await.expect_err("not running");
    assert!(matches!(ended, Error::InvalidState { .. }), "{ended}");
    test.runtime.remove("busy").await.expect("remove");
    assert!(
        !test.cgroup_dir("cpuacct", "busy").exists(),
        "its cgroups go with it"
    );
}

#[tokio::test]
async fn a_restarted_agent_adopts_a_running_instance_and_can_stop_it() {
    let test = TestRuntime::new().await;
    let pid = test.run(spec("kept", "sleep 30")).await.pid.expect("pid");

    let restarted = test.reopen().await;
    let listed = restarted.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].state, listed[0].pid, listed[0].adopted),
        (InstanceState::Running, Some(pid), true)
    );
    let inspected = restarted.inspect("kept").await.expect("inspect");
    assert_eq!(inspected.pid, Some(pid));

    let stopped = restarted
        .stop("kept", Duration::from_secs(5))
        .await
        .expect("stop");
    assert_eq!(stopped.exit.expect("exit").reason, ExitReason::Stopped);
    assert!(!is_alive(pid));
    let seen_by_first = test.wait_for("kept", InstanceState::Exited).await;
    assert_eq!(
        seen_by_first.exit.expect("exit").reason,
        ExitReason::Stopped
    );
}

#[tokio::test]
async fn an_exit_while_the_agent_was_away_has_an_unknown_code() {
    let test = TestRuntime::new().await;
    let pid = test.run(spec("gone", "sleep 30")).await.pid.expect("pid");
    test.runtime
        .stop("gone", Duration::ZERO)
        .await
        .expect("kill");
    // As if the agent that was its parent died before recording the exit.
    let dir = test.runtime.instance_dir("gone");
    std::fs::remove_file(dir.join("exit.json")).expect("forget the exit");
    std::fs::remove_file(dir.join("stop-requested")).expect("forget the stop");

    let restarted = test.reopen().await;
    let status = restarted.inspect("gone").await.expect("inspect");
    assert_eq!(status.state, InstanceState::Exited);
    assert_eq!(status.pid, Some(pid));
    let exit = status.exit.expect("exit");
    assert_eq!(exit.reason, ExitReason::AgentAway);
    assert_eq!(
        exit.to_string(),
        "exited (code unknown: ended while the agent was away)"
    );
}

#[tokio::test]
async fn a_reused_pid_is_not_mistaken_for_the_instance() {
    let test = TestRuntime::new().await;
    test.run(spec("reused", "sleep 30")).await;
    let run_file = test.runtime.instance_dir("reused").join("run.json");
    let mut run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&run_file).expect("run.json")).expect("json");
    run["start_time"] = serde_json::json!(1);
    std::fs::write(&run_file, serde_json::to_vec(&run).expect("json")).expect("write");

    let restarted = test.reopen().await;
    let status = restarted.inspect("reused").await.expect("inspect");
    assert_eq!(
        status.state,
        InstanceState::Exited,
        "same pid, other start time: not ours"
    );
}

#[tokio::test]
async fn list_reports_every_instance_left_on_the_node_for_gc() {
    let test = TestRuntime::new().await;
    test.runtime
        .create(spec("created", "true"))
        .await
        .expect("create");
    test.run(spec("running", "sleep 30")).await;
    test.run(spec("exited", "exit 0")).await;
    test.wait_for("exited", InstanceState::Exited).await;

    let restarted = test.reopen().await;
    let states: Vec<(String, InstanceState)> = restarted
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|status| (status.id, status.state))
        .collect();
    assert_eq!(
        states,
        [
            ("created".to_owned(), InstanceState::Created),
            ("exited".to_owned(), InstanceState::Exited),
            ("running".to_owned(), InstanceState::Running),
        ]
    );
    for (id, state) in states {
        if state == InstanceState::Running {
            assert!(matches!(
                restarted.remove(&id).await,
                Err(Error::InvalidState { .. })
            ));
            restarted
                .stop(&id, Duration::from_secs(5))
                .await
                .expect("stop");
        }
        restarted.remove(&id).await.expect("remove");
    }
    assert!(restarted.list().await.expect("list").is_empty());
}

#[tokio::test]
async fn exec_runs_with_the_instance_environment_and_a_timeout() {
    let test = TestRuntime::new().await;
    let mut spec = spec("target", "sleep 30");
    spec.env.insert("SECRET".into(), "s3cret".into());
    test.run(spec).await;
    let request = ExecRequest::new(
        [
            "sh",
            "-c",
            "echo $SECRET $CCA_INSTANCE; basename $(pwd); exit 4",
        ],
        Duration::from_secs(5),
    );
    let output = test.runtime.exec("target", request).await.expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "s3cret target\nwork\n"
    );
    assert_eq!((output.code, output.timed_out), (Some(4), false));

    let started = Instant::now();
    let slow = ExecRequest::new(["sleep", "10"], Duration::from_millis(200));
    let output = test.runtime.exec("target", slow).await.expect("exec");
    assert!(output.timed_out && output.signal == Some(9), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    test.runtime
        .stop("target", Duration::from_secs(5))
        .await
        .expect("stop");
    let request = ExecRequest::new(["true"], Duration::from_secs(1));
    let error = test
        .runtime
        .exec("target", request)
        .await
        .expect_err("not running");
    assert_eq!(
        error.to_string(),
        "instance target: cannot exec while exited"
    );
}

#[tokio::test]
async fn misuse_is_refused_with_errors_naming_the_instance() {
    let test = TestRuntime::new().await;
    test.run(spec("busy", "sleep 30")).await;
    let error = test
        .runtime
        .start("busy")
        .await
        .expect_err("already running");
    assert_eq!(
        error.to_string(),
        "instance busy: cannot start while running"
    );
    let error = test
        .runtime
        .create(spec("busy", "true"))
        .await
        .expect_err("exists");
    assert_eq!(error.to_string(), "instance busy: already exists");
    let error = test.runtime.inspect("nobody").await.expect_err("unknown");
    assert_eq!(error.to_string(), "instance nobody: not found");
    let mut bad = spec("nowhere", "true");
    bad.working_dir = Some("/does/not/exist".into());
    let error = test.runtime.create(bad).await.expect_err("bad cwd");
    assert!(
        error
            .to_string()
            .contains("/does/not/exist is not a directory"),
        "{error}"
    );

    let vanishing = tempfile::tempdir().expect("cwd");
    let mut spec_in_vanished_dir = spec("vanished", "true");
    spec_in_vanished_dir.working_dir = Some(vanishing.path().to_owned());
    spec_in_vanished_dir.memory_bytes = Some(64 << 20);
    test.runtime
        .create(spec_in_vanished_dir)
        .await
        .expect("create");
    drop(vanishing);
    let error = test.runtime.start("vanished").await.expect_err("no cwd");
    assert!(
        error
            .to_string()
            .starts_with("instance vanished: start: spawning sh in"),
        "{error}"
    );
    assert!(
        !test.cgroup_dir("memory", "vanished").exists(),
        "no cgroup left behind"
    );
    let status = test.runtime.inspect("vanished").await.expect("inspect");
    assert_eq!(status.state, InstanceState::Created);

    test.run(spec("typo", "no-such-command-here")).await;
    let status = test.wait_for("typo", InstanceState::Exited).await;
    assert_eq!(status.exit.expect("exit").code, Some(127));
    test.wait_for_log("typo", "not found").await;
}

#[tokio::test]
async fn a_stop_right_after_start_ends_the_instance_at_once() {
    let test = TestRuntime::new().await;
    for round in 0..5 {
        let id = format!("quick-{round}");
        let pid = test.run(spec(&id, "sleep 30")).await.pid.expect("pid");
        assert_eq!(
            group_and_session(pid).0,
            pid,
            "a group leader when start returns"
        );
        let started = Instant::now();
        let stopped = test
            .runtime
            .stop(&id, Duration::from_secs(5))
            .await
            .expect("stop");
        assert!(started.elapsed() < Duration::from_secs(2), "TERM sufficed");
        assert_eq!(stopped.exit.expect("exit").signal, Some(15));
    }
}

#[tokio::test]
async fn a_spec_with_mounts_is_refused_naming_the_mount() {
    let test = TestRuntime::new().await;
    let mut with_mount = spec("vol", "true");
    with_mount.mounts = vec![cca_runtime::Mount {
        source: test.dir.path().to_path_buf(),
        target: "/data".into(),
        read_only: false,
        owned_by_workload: false,
    }];
    let error = test
        .runtime
        .create(with_mount)
        .await
        .expect_err("host processes have nothing to mount into");
    assert!(matches!(error, Error::InvalidSpec { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("vol") && message.contains("cannot mount") && message.contains("/data"),
        "{message}"
    );
    assert!(test.runtime.list().await.expect("list").is_empty());
}

fn cluster_dns() -> DnsConfig {
    DnsConfig {
        nameservers: vec![Ipv4Addr::new(10, 42, 3, 1)],
        search: vec!["cca.local".into()],
        ndots: 1,
    }
}

/// The mount namespace `/proc/{pid}/ns/mnt` names (`mnt:[INODE]`).
fn mount_namespace(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .expect("ns link")
        .display()
        .to_string()
}

async fn exec_stdout(runtime: &dyn Runtime, id: &str, argv: &[&str]) -> (Option<i32>, String) {
    let request = ExecRequest::new(argv.iter().copied(), Duration::from_secs(5));
    let output = runtime.exec(id, request).await.expect("exec");
    (
        output.code,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test]
async fn a_process_with_cluster_dns_reads_its_own_resolv_conf_in_its_own_mount_namespace() {
    let test_name = "a_process_with_cluster_dns_reads_its_own_resolv_conf";
    if !root_test(test_name, "mount namespaces", &["cat", "readlink"]) {
        return;
    }
    let test = TestRuntime::new().await;
    let host_file = std::fs::read("/etc/resolv.conf").expect("the host's resolv.conf");
    let agent_namespace = mount_namespace("self");
    let mut spec = spec("dns-1", "cat /etc/resolv.conf; echo read; sleep 30");
    spec.dns = Some(cluster_dns());
    let pid = test.run(spec).await.pid.expect("pid");

    let lines = test.wait_for_log("dns-1", "read").await;
    assert!(
        lines.iter().any(|l| l == "nameserver 10.42.3.1")
            && lines.iter().any(|l| l == "search cca.local")
            && lines.iter().any(|l| l == "options ndots:1"),
        "{lines:?}"
    );
    let instance_namespace = mount_namespace(&pid.to_string());
    assert_ne!(
        instance_namespace, agent_namespace,
        "a namespace of its own"
    );
    assert_eq!(mount_namespace("self"), agent_namespace, "the agent stayed");
    assert_eq!(
        std::fs::read("/etc/resolv.conf").expect("read"),
        host_file,
        "the host's file is untouched"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let instance_dir = test.runtime.instance_dir("dns-1").display().to_string();
    assert!(
        !mountinfo.contains(&instance_dir),
        "nothing propagated to the agent's namespace: {mountinfo}"
    );

    let (code, text) = exec_stdout(&test.runtime, "dns-1", &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(code, Some(0));
    assert!(
        text.contains("nameserver 10.42.3.1\n"),
        "exec sees it: {text}"
    );
    let (_, exec_namespace) =
        exec_stdout(&test.runtime, "dns-1", &["readlink", "/proc/self/ns/mnt"]).await;
    assert_eq!(exec_namespace.trim(), instance_namespace, "exec joins it");
    let (code, _) = exec_stdout(
        &test.runtime,
        "dns-1",
        &["sh", "-c", "echo nameserver 192.0.2.1 >> /etc/resolv.conf"],
    )
    .await;
    assert_ne!(code, Some(0), "the bound file is read-only, even for root");

    // A restarted agent: the process kept its namespace, exec still joins it.
    let restarted = test.reopen().await;
    let (_, text) = exec_stdout(&restarted, "dns-1", &["cat", "/etc/resolv.conf"]).await;
    assert!(text.contains("search cca.local\n"), "{text}");
    let stopped = restarted
        .stop("dns-1", Duration::from_secs(5))
        .await
        .expect("stop");
    assert_eq!(stopped.exit.expect("exit").reason, ExitReason::Stopped);
    assert_eq!(std::fs::read("/etc/resolv.conf").expect("read"), host_file);

    // A restart gets a new namespace with the same file.
    restarted.start("dns-1").await.expect("restart");
    let (_, text) = exec_stdout(&restarted, "dns-1", &["cat", "/etc/resolv.conf"]).await;
    assert!(text.contains("nameserver 10.42.3.1\n"), "{text}");
    restarted.stop("dns-1", Duration::ZERO).await.expect("stop");
    restarted.remove("dns-1").await.expect("remove");
}

#[tokio::test]
async fn a_symlinked_host_resolv_conf_is_replaced_where_it_points_and_kept_on_the_host() {
    let test_name = "a_symlinked_host_resolv_conf_is_replaced";
    if !root_test(test_name, "mount namespaces", &["cat"]) {
        return;
    }
    // A stand-in for a host whose /etc/resolv.conf is a symlink (as
    // systemd-resolved and resolvconf make it).
    let host = tempfile::tempdir().expect("tempdir");
    let real = host.path().join("stub-resolv.conf");
    let link = host.path().join("resolv.conf");
    std::fs::write(&real, "nameserver 127.0.0.53\n").expect("write");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let test = TestRuntime::with_config(|config| config.resolv_conf = link.clone()).await;
    let command = format!(
        "cat {}; cat {}; echo read; sleep 30",
        link.display(),
        real.display()
    );
    let mut spec = spec("dns-link", &command);
    spec.dns = Some(cluster_dns());
    test.run(spec).await;
    let lines = test.wait_for_log("dns-link", "read").await;
    let seen = lines
        .iter()
        .filter(|line| *line == "nameserver 10.42.3.1")
        .count();
    assert_eq!(seen, 2, "through the link and at its target: {lines:?}");
    assert!(
        !lines.iter().any(|line| line.contains("127.0.0.53")),
        "{lines:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&real).expect("read"),
        "nameserver 127.0.0.53\n"
    );
    assert!(std::fs::symlink_metadata(&link).expect("link").is_symlink());
}

#[tokio::test]
async fn a_process_with_cluster_dns_but_no_host_resolv_conf_is_refused_at_create() {
    let test_name = "a_process_with_cluster_dns_but_no_host_resolv_conf";
    if !root_test(test_name, "mount namespaces", &[]) {
        return;
    }
    let host = tempfile::tempdir().expect("tempdir");
    let missing = host.path().join("resolv.conf");
    let test = TestRuntime::with_config(|config| config.resolv_conf = missing.clone()).await;
    let mut spec = spec("dns-none", "true");
    spec.dns = Some(cluster_dns());
    let error = test.runtime.create(spec).await.expect_err("refused");
    let text = error.to_string();
    assert!(
        text.starts_with("instance dns-none: create failed: the host's")
            && text.contains("cannot be bound over"),
        "{text}"
    );
    assert!(
        !test.runtime.instance_dir("dns-none").exists(),
        "a refused create leaves nothing"
    );
    let mut bad = InstanceSpec::new("dns-bad", "svc", "true");
    bad.dns = Some(DnsConfig {
        nameservers: Vec::new(),
        ..cluster_dns()
    });
    let error = test.runtime.create(bad).await.expect_err("refused");
    assert!(matches!(error, Error::InvalidSpec { .. }), "{error}");
}
