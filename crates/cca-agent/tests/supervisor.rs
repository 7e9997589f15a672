//! The supervisor against the recording fake runtime: it starts what is
//! assigned (with ports and environment), restarts crashes with backoff and
//! gives up after the threshold with the exit code and log tail, stops what
//! the scheduler stops, adopts instances an earlier agent left running,
//! removes orphans only once the assignments are known, keeps an instance
//! a resync left unclaimed until adopted or given up, and refuses what
//! it cannot run with a reason. Through a `RuntimeSet` of two fakes:
//! image workloads go to the container runtime pinned to the image's
//! digest, a node without containers or a failed pull fails the instance
//! with the reason and creates nothing. Volumes: node-local directories,
//! per ordinal for stateful services, mounted into image workloads and
//! named in the environment of process workloads, kept when an instance
//! goes. Host ports: one held outside the cluster (a fake probe) fails the
//! start or a restart naming it, creates nothing, and is reported held.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cca_agent::desired::{Desired, UnclaimedRun};
use cca_agent::host_ports::ListenerOwner;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_agent::{Containers, RuntimeSet};
use cca_image::{Digest, ImageConfig, ImageRecord, ImageStore, RegistrySettings};
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::{
    Cpu, HealthCheck, InitStep, Memory, PortSpec, Probe, Resources, ServiceSpec, VolumeSpec,
    Workload,
};
use cca_runtime::fake::{Call, FakeRuntime};
use cca_runtime::{InstanceSpec, InstanceState as RtState, Limits, Mount, Operation, Runtime};
use cca_wire::types::Assignment;
use support::{desired, tick_until};

fn service(workload: Workload) -> ServiceSpec {
    ServiceSpec {
        ports: vec![PortSpec::tcp("http", 8080)],
        env: BTreeMap::from([("GREETING".into(), "hi".into())]),
        ..ServiceSpec::new("web", workload)
    }
}

fn assignment(id: &str, workload: Workload, stopping: bool) -> Assignment {
    Assignment {
        instance: Instance {
            host_ports: BTreeMap::from([("http".into(), 20001)]),
            stopping,
            ..support::instance(id, "web")
        },
        spec: Some(service(workload)),
        secrets: Vec::new(),
        probes: Default::default(),
    }
}

fn run(command: &str) -> Workload {
    Workload::Process {
        run: command.into(),
    }
}

fn supervisor(fake: &Arc<FakeRuntime>) -> Supervisor {
    let config = SupervisorConfig {
        restart_threshold: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
        stable_after: Duration::from_secs(30),
        stop_grace: Duration::from_millis(100),
        log_tail: 5,
        ..SupervisorConfig::default()
    };
    let runtime: Arc<dyn Runtime> = Arc::clone(fake) as Arc<dyn Runtime>;
    Supervisor::new("n1", "127.0.0.1", runtime, config, BTreeMap::new())
}

fn state_of(tick: &Tick, id: &str) -> Option<InstanceState> {
    tick.statuses.iter().find(|s| s.id == id).map(|s| s.state)
}

#[tokio::test]
async fn an_assigned_instance_is_created_with_its_ports_and_env_and_started() {
    let fake = Arc::new(FakeRuntime::new());
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![assignment("web-1", run("cca whoami"), false)]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    let created = fake.calls().into_iter().find_map(|call| match call {
        Call::Create(spec) => Some(spec),
        _ => None,
    });
    let created = created.expect("a create call");
    assert_eq!(created.command, "cca whoami");
    assert_eq!(created.env.get("GREETING").map(String::as_str), Some("hi"));
    assert_eq!(
        (created.ports[0].name.as_str(), created.ports[0].host_port),
        ("http", 20001)
    );
    let status = &tick.statuses[0];
    assert_eq!(
        (status.node.as_str(), status.host_ports.get("http")),
        ("n1", Some(&20001))
    );
    assert!(status.pid.is_some());
}

#[tokio::test]
async fn a_crashing_instance_is_restarted_then_reported_failed_with_its_exit_and_logs() {
    let fake = Arc::new(FakeRuntime::new());
    fake.exit_after_start(Some("web-1"), 3);
    fake.set_logs("web-1", &["starting", "error: no database"]);
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![assignment("web-1", run("false"), false)]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let status = &tick.statuses[0];
    let exit = status.last_exit.as_ref().expect("the last exit");
    assert_eq!(exit.code, Some(3));
    assert_eq!(exit.log_tail, ["starting", "error: no database"]);
    assert_eq!(
        status.restarts, 2,
        "restarted until the threshold of 3 crashes"
    );
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("gave up after 3 consecutive crashes"),
        "{status:?}"
    );
    let starts = fake
        .calls()
        .iter()
        .filter(|call| matches!(call, Call::Start(_)))
        .count();
    assert_eq!(starts, 3);
}

#[tokio::test]
async fn a_stopping_instance_is_stopped_and_reported_stopped() {
    let fake = Arc::new(FakeRuntime::new());
    let mut supervisor = supervisor(&fake);
    let running = desired(vec![assignment("web-1", run("sleep 100"), false)]);
    tick_until(&mut supervisor, &running, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    let stopping = desired(vec![assignment("web-1", run("sleep 100"), true)]);
    tick_until(&mut supervisor, &stopping, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Stopped)
    })
    .await;
    assert!(
        fake.calls()
            .iter()
            .any(|call| matches!(call, Call::Stop { id, .. } if id == "web-1"))
    );
}

/// Vertical autoscaling's size reaches a running instance in place, with
/// no restart; a runtime that refuses is not asked again for the same
/// limits and the status says they wait for the next start.
#[tokio::test]
async fn a_resized_instance_gets_its_new_limits_in_place() {
    let fake = Arc::new(FakeRuntime::new());
    let mut supervisor = supervisor(&fake);
    let mut placed = assignment("web-1", run("sleep 100"), false);
    let desired_now = desired(vec![placed.clone()]);
    tick_until(&mut supervisor, &desired_now, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    placed.instance.resized = Some(Resources {
        cpu: Some(Cpu(300)),
        memory: Some(Memory(96 << 20)),
    });
    let wanted = Limits {
        cpu_millis: Some(300),
        memory_bytes: Some(96 << 20),
    };
    let tick = supervisor.tick(&desired(vec![placed.clone()])).await;
    assert_eq!(state_of(&tick, "web-1"), Some(InstanceState::Running));
    let resizes: Vec<Limits> = fake
        .calls()
        .into_iter()
        .filter_map(|call| match call {
            Call::Resize { limits, .. } => Some(limits),
            _ => None,
        })
        .collect();
    assert_eq!(resizes, [wanted]);
    assert!(
        !fake
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Stop { .. })),
        "not restarted"
    );
    let status = fake.inspect("web-1").await.expect("inspect");
    assert_eq!(Limits::of(&status.spec), wanted);

    // Refused: asked once, and the status says why.
    placed.instance.resized = Some(Resources {
        cpu: Some(Cpu(600)),
        memory: None,
    });
    fake.fail(Operation::Resize, Some("web-1"), "no cpu cgroup");
    let next = desired(vec![placed]);
    supervisor.tick(&next).await;
    let tick = supervisor.tick(&next).await;
    let refused = fake
        .calls()
        .into_iter()
        .filter(|call| matches!(call, Call::Resize { .. }))
        .count();
    assert_eq!(refused, 2, "the first resize and one refused attempt");
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(message.contains("apply at the next start"), "{message}");
}

#[tokio::test]
async fn an_instance_left_running_by_an_earlier_agent_is_adopted_not_restarted() {
    let fake = Arc::new(FakeRuntime::new());
    let pid = fake.insert_running(InstanceSpec::new("web-1", "web", "sleep 100"));
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![assignment("web-1", run("sleep 100"), false)]);
    let tick = supervisor.tick(&desired).await;
    assert_eq!(state_of(&tick, "web-1"), Some(InstanceState::Running));
    assert_eq!(tick.statuses[0].pid, Some(pid));
    assert!(
        !fake
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Create(_) | Call::Start(_) | Call::Stop { .. })),
        "{:?}",
        fake.calls()
    );
}

#[tokio::test]
async fn orphans_are_removed_only_once_the_assignments_are_known() {
    let fake = Arc::new(FakeRuntime::new());
    fake.insert_running(InstanceSpec::new("old-1", "old", "sleep 100"));
    let mut supervisor = supervisor(&fake);
    let mut unknown = desired(Vec::new());
    unknown.known = false;
    let tick = supervisor.tick(&unknown).await;
    assert!(
        tick.removed.is_empty(),
        "nothing heard yet: keep everything"
    );
    assert!(fake.status("old-1").is_some());
    let tick = supervisor.tick(&desired(Vec::new())).await;
    assert_eq!(tick.removed, ["old-1"]);
    assert!(fake.status("old-1").is_none());
}

/// An instance a resync left unclaimed keeps running, reported for
/// adoption, while the store does not know its service; once the store
/// knows it, it goes after the claim grace unless placed again, and a
/// placement of its id adopts it as it runs.
#[tokio::test]
async fn an_unclaimed_instance_waits_for_adoption_then_goes_unless_placed() {
    let fake = Arc::new(FakeRuntime::new());
    let pid = fake.insert_running(InstanceSpec::new("web-1", "web", "sleep 100"));
    fake.insert_running(InstanceSpec::new("db-1", "db", "sleep 100"));
    let config = SupervisorConfig {
        claim_grace: Duration::ZERO,
        ..SupervisorConfig::default()
    };
    let runtime: Arc<dyn Runtime> = Arc::clone(&fake) as Arc<dyn Runtime>;
    let mut supervisor = Supervisor::new("n1", "127.0.0.1", runtime, config, BTreeMap::new());
    let mut resynced = desired(Vec::new());
    let since = cca_model::clock::now_millis();
    for (id, service) in [("web-1", "web"), ("db-1", "db")] {
        let mut left = assignment(id, run("sleep 100"), false);
        left.instance.service = service.into();
        let run = UnclaimedRun {
            assignment: left,
            since,
        };
        resynced.unclaimed.insert(id.into(), run);
    }
    let tick = supervisor.tick(&resynced).await;
    assert!(tick.removed.is_empty(), "{:?}", tick.removed);
    let offered: Vec<&str> = tick.unclaimed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(offered, ["db-1", "web-1"]);
    // The store knows `db` now, not `web`: db-1 goes (no grace here).
    supervisor.services_known(&["db".to_owned()].into());
    let tick = supervisor.tick(&resynced).await;
    assert_eq!(tick.removed, ["db-1"]);
    assert!(fake.status("db-1").is_none());
    let offered: Vec<&str> = tick.unclaimed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(offered, ["web-1"]);
    // The scheduler adopts web-1: same process, nothing restarted.
    let mut adopted = desired(vec![assignment("web-1", run("sleep 100"), false)]);
    adopted.unclaimed.clear();
    let tick = supervisor.tick(&adopted).await;
    assert_eq!(tick.statuses[0].pid, Some(pid));
    assert!(tick.unclaimed.is_empty());
    assert!(
        !fake
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Create(_) | Call::Start(_))),
        "{:?}",
        fake.calls()
    );
}

fn supervisor_over(runtime: RuntimeSet) -> Supervisor {
    let config = SupervisorConfig {
        restart_threshold: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
        stable_after: Duration::from_secs(30),
        stop_grace: Duration::from_millis(100),
        log_tail: 5,
        ..SupervisorConfig::default()
    };
    Supervisor::new(
        "n1",
        "127.0.0.1",
        Arc::new(runtime),
        config,
        BTreeMap::new(),
    )
}

fn image(reference: &str) -> Workload {
    Workload::Image {
        image: reference.into(),
        command: Some("httpd -f".into()),
    }
}

fn creates(fake: &FakeRuntime) -> Vec<InstanceSpec> {
    fake.calls()
        .into_iter()
        .filter_map(|call| match call {
            Call::Create(spec) => Some(*spec),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_image_workload_on_a_node_without_containers_fails_with_the_reason() {
    let fake = Arc::new(FakeRuntime::new());
    let set = RuntimeSet::processes_only(
        Arc::clone(&fake) as Arc<dyn Runtime>,
        "no OCI runtime found: neither runc nor crun is on PATH",
    );
    let mut supervisor = supervisor_over(set);
    let desired = desired(vec![assignment("web-1", image("busybox:1"), false)]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("image `busybox:1` needs a container runtime")
            && message.contains("neither runc nor crun"),
        "{message}"
    );
    assert!(creates(&fake).is_empty());
}

/// A node with a fake process runtime, a fake container runtime and a real
/// image store in a temporary directory.
struct Node {
    processes: Arc<FakeRuntime>,
    containers: Arc<FakeRuntime>,
    store: ImageStore,
    _dir: tempfile::TempDir,
}

impl Node {
    fn new() -> (Self, RuntimeSet) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ImageStore::open(dir.path().join("images")).expect("store");
        let processes = Arc::new(FakeRuntime::new());
        let containers = Arc::new(FakeRuntime::new());
        let set = RuntimeSet::new(
            Arc::clone(&processes) as Arc<dyn Runtime>,
            Containers::new(
                Arc::clone(&containers) as Arc<dyn Runtime>,
                store.clone(),
                RegistrySettings::insecure(&["127.0.0.1:1".to_owned()]).expect("settings"),
            ),
        );
        let node = Self {
            processes,
            containers,
            store,
            _dir: dir,
        };
        (node, set)
    }
}

#[tokio::test]
async fn a_failed_pull_fails_the_instance_with_the_reason_and_creates_nothing() {
    let (node, set) = Node::new();
    let mut supervisor = supervisor_over(set);
    let desired = desired(vec![
        assignment("unreachable", image("127.0.0.1:1/test/busybox:1"), false),
        assignment("invalid", image("Not A Reference"), false),
    ]);
    let tick = tick_until(&mut supervisor, &desired, "both", |t| {
        state_of(t, "unreachable") == Some(InstanceState::Failed)
            && state_of(t, "invalid") == Some(InstanceState::Failed)
    })
    .await;
    let message = |id: &str| {
        tick.statuses
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.message.clone())
            .unwrap_or_default()
    };
    let unreachable = message("unreachable");
    assert!(
        unreachable.contains("pulling the image failed")
            && unreachable.contains("registry 127.0.0.1:1"),
        "{unreachable}"
    );
    let invalid = message("invalid");
    assert!(
        invalid.contains("invalid image reference \"Not A Reference\""),
        "{invalid}"
    );
    assert!(creates(&node.containers).is_empty() && creates(&node.processes).is_empty());
    assert!(node.store.images().expect("images").is_empty());
}

#[tokio::test]
async fn images_go_to_the_container_runtime_pinned_to_their_digest_and_lists_merge() {
    let (node, set) = Node::new();
    // An image already in the store is not pulled (the registry at port 1
    // would refuse).
    let digest = Digest::of_bytes(b"manifest");
    node.store
        .save_image(ImageRecord {
            digest: digest.clone(),
            names: ["127.0.0.1:1/test/app:1".to_owned()].into(),
            config_digest: Digest::of_bytes(b"config"),
            layers: Vec::new(),
            config: ImageConfig::default(),
            size_bytes: 0,
            pulled_at_ms: 0,
        })
        .expect("record");
    let mut supervisor = supervisor_over(set);
    let desired = desired(vec![
        assignment("app-1", image("127.0.0.1:1/test/app:1"), false),
        assignment("web-1", run("serve"), false),
    ]);
    tick_until(&mut supervisor, &desired, "both", |t| {
        state_of(t, "app-1") == Some(InstanceState::Running)
            && state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    let container = creates(&node.containers);
    assert_eq!(container.len(), 1);
    assert_eq!(
        (container[0].id.as_str(), container[0].command.as_str()),
        ("app-1", "httpd -f")
    );
    assert_eq!(
        container[0].image.as_deref(),
        Some(format!("127.0.0.1:1/test/app@{digest}").as_str())
    );
    let process = creates(&node.processes);
    assert_eq!(
        process.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["web-1"]
    );

    // Orphans in both runtimes are found through the merged list and
    // removed by the runtime that holds them.
    let tick = tick_until(&mut supervisor, &desired_none(), "none", |t| {
        t.removed.len() == 2
    })
    .await;
    let mut removed = tick.removed.clone();
    removed.sort();
    assert_eq!(removed, ["app-1", "web-1"]);
    assert!(node.containers.status("app-1").is_none());
    assert!(node.processes.status("web-1").is_none());
    assert_eq!(
        node.store.images().expect("images").len(),
        1,
        "a named image stays"
    );
}

fn desired_none() -> Desired {
    desired(Vec::new())
}

fn with_init(mut assignment: Assignment, command: &str) -> Assignment {
    if let Some(spec) = assignment.spec.as_mut() {
        spec.init.push(InitStep {
            name: "migrate".into(),
            command: Some(command.into()),
            image: None,
            probe: None,
            timeout: None,
        });
    }
    assignment
}

#[tokio::test]
async fn init_steps_run_to_completion_before_the_main_command() {
    let fake = Arc::new(FakeRuntime::new());
    fake.exit_after_start(Some("web-1.init-migrate"), 0);
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![with_init(
        assignment("web-1", run("serve"), false),
        "migrate --up",
    )]);
    tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    let order: Vec<String> = fake
        .calls()
        .into_iter()
        .filter_map(|call| match call {
            Call::Create(spec) => Some(format!("create {} `{}`", spec.id, spec.command)),
            Call::Start(id) => Some(format!("start {id}")),
            Call::Remove(id) => Some(format!("remove {id}")),
            _ => None,
        })
        .collect();
    let position = |needle: &str| {
        order
            .iter()
            .position(|line| line == needle)
            .unwrap_or_else(|| panic!("{needle} missing in {order:?}"))
    };
    assert!(
        position("create web-1.init-migrate `migrate --up`") < position("start web-1.init-migrate")
    );
    assert!(
        position("start web-1.init-migrate") < position("start web-1"),
        "{order:?}"
    );
    assert!(
        fake.status("web-1.init-migrate").is_none(),
        "the init step's instance is removed"
    );
}

#[tokio::test]
async fn an_init_step_running_across_ticks_is_not_removed_as_an_orphan() {
    let fake = Arc::new(FakeRuntime::new());
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![with_init(
        assignment("web-1", run("serve"), false),
        "migrate --up",
    )]);
    // The step runs (it has not exited) while the supervisor ticks on.
    tick_until(&mut supervisor, &desired, "web-1.init-migrate", |_| {
        fake.status("web-1.init-migrate")
            .is_some_and(|status| status.state == RtState::Running)
    })
    .await;
    for _ in 0..3 {
        supervisor.tick(&desired).await;
    }
    assert!(
        fake.status("web-1.init-migrate").is_some(),
        "the running init step was removed: {:?}",
        fake.calls()
    );
    fake.exit("web-1.init-migrate", 0);
    tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
}

#[tokio::test]
async fn a_failing_init_step_fails_the_instance_and_names_the_step() {
    let fake = Arc::new(FakeRuntime::new());
    fake.exit_after_start(Some("web-1.init-migrate"), 2);
    let mut supervisor = supervisor(&fake);
    let desired = desired(vec![with_init(
        assignment("web-1", run("serve"), false),
        "migrate --up",
    )]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("init step `migrate`") && message.contains("code 2"),
        "{message}"
    );
    assert!(
        !fake
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Start(id) if id == "web-1")),
        "the main command never started"
    );
}

/// An assignment of a service with one `data` volume at `/var/lib/data`.
fn with_volume(id: &str, workload: Workload, ordinal: Option<u32>) -> Assignment {
    let mut assignment = assignment(id, workload, false);
    assignment.instance.ordinal = ordinal;
    if let Some(spec) = assignment.spec.as_mut() {
        spec.stateful = ordinal.is_some();
        spec.volumes = vec![VolumeSpec {
            name: "data".into(),
            path: "/var/lib/data".into(),
            size: None,
        }];
    }
    assignment
}

#[tokio::test]
async fn a_stateful_image_gets_its_ordinal_volume_mounted_and_keeps_it_across_replacement() {
    let fake = Arc::new(FakeRuntime::new());
    let data = tempfile::tempdir().expect("tempdir");
    let mut supervisor = supervisor(&fake).with_volumes_dir(data.path().join("volumes"));
    let running =
        |id: &'static str| move |t: &Tick| state_of(t, id) == Some(InstanceState::Running);
    let first = desired(vec![with_volume("web-0", image("example/db:1"), Some(0))]);
    tick_until(&mut supervisor, &first, "web-0", running("web-0")).await;
    let dir = data.path().join("volumes/web/data-0");
    let expected = vec![Mount {
        source: dir.clone(),
        target: "/var/lib/data".into(),
        read_only: false,
        owned_by_workload: false,
    }];
    assert_eq!(creates(&fake)[0].mounts, expected);
    assert!(dir.is_dir(), "created before the instance");
    std::fs::write(dir.join("table"), "rows").expect("the workload writes");

    // The instance goes (an orphan once unassigned); its volume stays, and
    // the replacement with the same ordinal mounts the same directory.
    tick_until(&mut supervisor, &desired(Vec::new()), "web-0", |t| {
        t.removed.iter().any(|id| id == "web-0")
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("table")).expect("kept"),
        "rows"
    );
    fake.take_calls();
    let replacement = desired(vec![with_volume("web-0", image("example/db:1"), Some(0))]);
    tick_until(&mut supervisor, &replacement, "web-0", running("web-0")).await;
    assert_eq!(creates(&fake)[0].mounts, expected);
    assert_eq!(
        std::fs::read_to_string(dir.join("table")).expect("kept"),
        "rows"
    );
}

#[tokio::test]
async fn a_process_workload_is_told_its_volume_directory_instead_of_a_mount() {
    let fake = Arc::new(FakeRuntime::new());
    let data = tempfile::tempdir().expect("tempdir");
    let mut supervisor = supervisor(&fake).with_volumes_dir(data.path().join("volumes"));
    let desired = desired(vec![with_volume("web-1", run("true"), None)]);
    tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    let created = creates(&fake).remove(0);
    assert!(created.mounts.is_empty(), "host processes get no mounts");
    let dir = data.path().join("volumes/web/data");
    assert_eq!(
        created.env.get("CCA_VOLUME_DATA"),
        Some(&dir.display().to_string())
    );
    assert!(dir.is_dir());
}

#[tokio::test]
async fn a_volume_without_a_volume_directory_or_with_a_bad_name_fails_with_the_reason() {
    let fake = Arc::new(FakeRuntime::new());
    let mut supervisor = supervisor(&fake);
    let desired_one = desired(vec![with_volume("web-1", image("example/db:1"), None)]);
    let tick = tick_until(&mut supervisor, &desired_one, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(message.contains("no volume directory"), "{message}");

    let data = tempfile::tempdir().expect("tempdir");
    let mut supervisor = supervisor_with(&fake, data.path());
    let mut bad = with_volume("web-2", image("example/db:1"), None);
    if let Some(spec) = bad.spec.as_mut() {
        spec.volumes[0].name = "..".into();
    }
    let tick = tick_until(&mut supervisor, &desired(vec![bad]), "web-2", |t| {
        state_of(t, "web-2") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(message.contains("cannot name a directory"), "{message}");
    assert!(creates(&fake).is_empty(), "nothing is created");
}

fn supervisor_with(fake: &Arc<FakeRuntime>, data: &std::path::Path) -> Supervisor {
    supervisor(fake).with_volumes_dir(data.join("volumes"))
}

/// A node network that attaches nothing (the processes here have none).
#[derive(Debug)]
struct NoAttachments;

impl cca_agent::InstanceNetwork for NoAttachments {
    fn attach(&self, id: &str) -> cca_net::Result<cca_net::Attachment> {
        panic!("a process is never attached, but {id} was")
    }
    fn publish(&self, _: &str, _: u16, _: u16, _: cca_net::Proto) -> cca_net::Result<()> {
        Ok(())
    }
    fn detach(&self, _: &str) -> cca_net::Result<()> {
        Ok(())
    }
    fn cleanup_orphans(&self, _: &[String]) -> cca_net::Result<cca_net::CleanupReport> {
        Ok(cca_net::CleanupReport::default())
    }
}

/// The network map with `instance` as the one target of service `web`.
fn targeting(instance: Option<&str>) -> cca_model::net::NetworkMap {
    use cca_model::net::{Affinity, NetworkChange, ServiceNet, Target, Touched};
    let targets = instance
        .map(|instance| Target {
            instance: instance.into(),
            node: "n1".into(),
            address: [127, 0, 0, 1].into(),
            port: 20000,
        })
        .into_iter()
        .collect();
    let mut map = cca_model::net::NetworkMap::default();
    map.apply(
        NetworkChange::Service(Arc::new(ServiceNet {
            name: "web".into(),
            vip: Some([10, 43, 0, 1].into()),
            ports: vec![],
            affinity: Affinity::None,
            endpoints: [("http".to_owned(), targets)].into(),
            members: vec![],
            asleep: false,
            scale_to_zero: None,
        })),
        &mut Touched::default(),
    );
    map
}

#[tokio::test]
async fn a_stopping_instance_drains_until_the_node_no_longer_sends_it_flows() {
    let fake = Arc::new(FakeRuntime::new());
    let node_net = Arc::new(cca_agent::NodeNet::default());
    node_net.set(cca_agent::netplane::Ready {
        network: Arc::new(NoAttachments),
        subnet: "10.42.1.0/24".parse().expect("a prefix"),
        dns: cca_agent::netplane::node_dns([10, 42, 1, 1].into()),
    });
    let mut supervisor = supervisor(&fake).with_node_net(Arc::clone(&node_net));
    let running = desired(vec![assignment("web-1", run("sleep 100"), false)]);
    tick_until(&mut supervisor, &running, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    node_net.set_targets(&targeting(Some("web-1")));
    let stopping = desired(vec![assignment("web-1", run("sleep 100"), true)]);
    for _ in 0..3 {
        supervisor.tick(&stopping).await;
    }
    let stopped = |fake: &FakeRuntime| {
        fake.calls()
            .iter()
            .any(|call| matches!(call, Call::Stop { id, .. } if id == "web-1"))
    };
    assert!(!stopped(&fake), "still a VIP target here: not stopped yet");
    node_net.set_targets(&targeting(None));
    tick_until(&mut supervisor, &stopping, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Stopped)
    })
    .await;
    assert!(stopped(&fake));
}

/// A port probe that finds the ports in `held` held, on any address, and
/// the listeners on the ports in `others` another program's; it counts
/// the owner look-ups.
#[derive(Debug, Default)]
struct HeldElsewhere {
    held: std::sync::Mutex<std::collections::BTreeSet<u16>>,
    others: std::sync::Mutex<std::collections::BTreeSet<u16>>,
    asked: std::sync::atomic::AtomicUsize,
}

impl cca_agent::host_ports::PortProbe for HeldElsewhere {
    fn is_held(&self, _: std::net::IpAddr, port: u16, _: cca_runtime::Protocol) -> bool {
        self.held.lock().expect("not poisoned").contains(&port)
    }

    fn listener_owner(&self, _: std::net::IpAddr, port: u16, _: u32) -> ListenerOwner {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.others.lock().expect("not poisoned").contains(&port) {
            ListenerOwner::Other
        } else {
            ListenerOwner::Instance
        }
    }
}

/// `web-1` with a TCP health check on a host port something listens on
/// (the test's listener, standing in for the instance's or another's).
fn probed_on(listener: &std::net::TcpListener) -> Assignment {
    let port = listener.local_addr().expect("address").port();
    let mut assignment = assignment("web-1", run("cca whoami"), false);
    assignment.instance.host_ports = BTreeMap::from([("http".into(), port)]);
    if let Some(spec) = assignment.spec.as_mut() {
        spec.health = Some(HealthCheck {
            probe: Probe::Tcp { port: 8080 },
            interval: cca_model::spec::Duration(50),
            timeout: cca_model::spec::Duration(500),
            retries: 1,
        });
    }
    assignment
}

#[tokio::test]
async fn a_health_probe_answered_by_another_programs_listener_fails_naming_the_port() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = listener.local_addr().expect("address").port();
    let fake = Arc::new(FakeRuntime::new());
    let probe = Arc::new(HeldElsewhere::default());
    let mut first = supervisor(&fake).with_port_probe(Arc::clone(&probe) as _);
    let desired = desired(vec![probed_on(&listener)]);
    let tick = tick_until(&mut first, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(tick.statuses[0].healthy, Some(true), "its own listener");
    // The owner of a run's listener is asked once.
    probe.others.lock().expect("not poisoned").insert(port);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        first.tick(&desired).await;
    }
    assert_eq!(probe.asked.load(std::sync::atomic::Ordering::Relaxed), 1);

    // A run whose port was free when it started, but another program
    // bound it first and answers there.
    let fake = Arc::new(FakeRuntime::new());
    let mut second = supervisor(&fake).with_port_probe(Arc::clone(&probe) as _);
    let tick = tick_until(&mut second, &desired, "a failed health probe", |t| {
        t.statuses[0]
            .message
            .as_deref()
            .is_some_and(|message| message.contains("not this instance's"))
    })
    .await;
    assert_ne!(tick.statuses[0].healthy, Some(true));
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "127.0.0.1:{port} answers, but its listener is not this instance's"
        )),
        "{message}"
    );
}

#[tokio::test]
async fn a_host_port_held_outside_the_cluster_fails_the_start_and_is_reported_held() {
    let fake = Arc::new(FakeRuntime::new());
    let probe = Arc::new(HeldElsewhere::default());
    probe.held.lock().expect("not poisoned").insert(20001);
    let mut supervisor = supervisor(&fake).with_port_probe(Arc::clone(&probe) as _);
    let desired = desired(vec![assignment("web-1", run("cca whoami"), false)]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.starts_with(
            "host port 20001/tcp on 127.0.0.1 is held by something outside the cluster"
        ),
        "{message}"
    );
    assert_eq!(tick.held_ports, Some([20001].into()));
    assert!(
        !fake
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Create(_))),
        "nothing created on a held port: {:?}",
        fake.calls()
    );
}

#[tokio::test]
async fn a_free_host_port_starts_the_instance_and_reports_nothing_held() {
    let fake = Arc::new(FakeRuntime::new());
    let probe = Arc::new(HeldElsewhere::default());
    let mut supervisor = supervisor(&fake).with_port_probe(probe);
    let desired = desired(vec![assignment("web-1", run("cca whoami"), false)]);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(tick.held_ports, Some(Default::default()));
}

#[tokio::test]
async fn a_restart_onto_a_port_taken_meanwhile_fails_naming_it() {
    let fake = Arc::new(FakeRuntime::new());
    fake.exit_after_start(Some("web-1"), 1);
    let probe = Arc::new(HeldElsewhere::default());
    let mut supervisor = supervisor(&fake).with_port_probe(Arc::clone(&probe) as _);
    let desired = desired(vec![assignment("web-1", run("false"), false)]);
    tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Restarting)
    })
    .await;
    // Something binds the port while the instance waits for its restart.
    probe.held.lock().expect("not poisoned").insert(20001);
    let tick = tick_until(&mut supervisor, &desired, "web-1", |t| {
        state_of(t, "web-1") == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(message.contains("host port 20001/tcp"), "{message}");
    assert_eq!(tick.held_ports, Some([20001].into()));
}
