//! Secret and connection files through the supervisor, against the
//! recording fake runtime and a scripted file source: an instance whose
//! files cannot be had stays pending with the reason and starts once they
//! can; the files are private, hold what the API sent, are named in the
//! environment (host paths for processes, `/run/…` with read-only mounts
//! for images), and go with the instance.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cca_agent::files::FileSource;
use cca_agent::supervisor::{Supervisor, SupervisorConfig, Tick};
use cca_model::cluster::InstanceState;
use cca_model::spec::{ServiceSpec, Workload};
use cca_runtime::fake::{Call, FakeRuntime};
use cca_runtime::{InstanceSpec, Runtime};
use cca_wire::types::{Assignment, InstanceFile};
use support::{desired, tick_until};

/// Answers what it holds, or the API's refusal while it holds nothing.
#[derive(Debug, Default)]
struct Source {
    files: Mutex<Option<Vec<InstanceFile>>>,
    asked: Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl FileSource for Source {
    async fn files(&self, node: &str, id: &str) -> Result<Vec<InstanceFile>, String> {
        self.asked
            .lock()
            .expect("lock")
            .push((node.to_owned(), id.to_owned()));
        self.files.lock().expect("lock").clone().ok_or_else(|| {
            "secret `api_token` (used by service `web`) has no value: set it with `cca secret set api_token` (HTTP 409)".to_owned()
        })
    }
}

fn file(path: &str, content: &str) -> InstanceFile {
    InstanceFile {
        path: path.into(),
        content: content.into(),
    }
}

fn assignment(id: &str, workload: Workload) -> Assignment {
    Assignment {
        instance: support::instance(id, "web"),
        spec: Some(ServiceSpec {
            connections: vec!["app_db".into()],
            ..ServiceSpec::new("web", workload)
        }),
        secrets: vec!["api_token".into()],
        probes: Default::default(),
    }
}

fn supervisor(fake: &Arc<FakeRuntime>, data: &Path, source: &Arc<Source>) -> Supervisor {
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
    Supervisor::new("n1", "127.0.0.1", runtime, config, BTreeMap::new()).with_files(
        data.join("files"),
        Arc::clone(source) as Arc<dyn FileSource>,
    )
}

fn state(tick: &Tick) -> Option<InstanceState> {
    tick.statuses.first().map(|status| status.state)
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

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn a_process_waits_for_its_files_gets_them_named_in_its_env_and_they_go_with_it() {
    let fake = Arc::new(FakeRuntime::new());
    let data = tempfile::tempdir().expect("tempdir");
    let source = Arc::new(Source::default());
    let mut supervisor = supervisor(&fake, data.path(), &source);
    let one = desired(vec![assignment(
        "web-1",
        Workload::Process { run: "true".into() },
    )]);

    // No value yet: pending with the reason, nothing created, retried.
    let tick = tick_until(&mut supervisor, &one, "pending with a reason", |tick| {
        tick.statuses[0].message.is_some()
    })
    .await;
    assert_eq!(state(&tick), Some(InstanceState::Pending));
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("cca secret set api_token") && message.contains("retrying"),
        "{message}"
    );
    assert!(creates(&fake).is_empty());
    tick_until(&mut supervisor, &one, "a retry", |_| {
        source.asked.lock().expect("lock").len() >= 2
    })
    .await;
    assert_eq!(
        source.asked.lock().expect("lock")[0],
        ("n1".into(), "web-1".into())
    );

    // The value is set: the next attempt starts it.
    *source.files.lock().expect("lock") = Some(vec![
        file("connections/app_db", "postgresql://app:p%40ss@db:5432/app"),
        file("secrets/api_token", "t0ken"),
    ]);
    let tick = tick_until(&mut supervisor, &one, "running", |tick| {
        state(tick) == Some(InstanceState::Running)
    })
    .await;
    assert_eq!(tick.statuses[0].message, None);
    let dir = data.path().join("files/web-1");
    let url = dir.join("connections/app_db");
    let token = dir.join("secrets/api_token");
    assert_eq!(
        std::fs::read_to_string(&url).expect("url"),
        "postgresql://app:p%40ss@db:5432/app"
    );
    assert_eq!(std::fs::read_to_string(&token).expect("token"), "t0ken");
    assert_eq!(mode(&url), 0o400);
    assert_eq!(mode(&token), 0o400);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("secrets")), 0o700);
    let created = creates(&fake).remove(0);
    assert!(created.mounts.is_empty(), "host processes get no mounts");
    assert_eq!(
        created.env.get("CCA_CONNECTION_APP_DB_FILE"),
        Some(&url.display().to_string())
    );
    assert_eq!(
        created.env.get("CCA_SECRET_API_TOKEN_FILE"),
        Some(&token.display().to_string())
    );

    // Unassigned: removed, and its files with it.
    let tick = tick_until(&mut supervisor, &desired(Vec::new()), "removed", |tick| {
        !tick.removed.is_empty()
    })
    .await;
    assert_eq!(tick.removed, ["web-1"]);
    assert!(!dir.exists(), "the files go with the instance");
}

#[tokio::test]
async fn an_image_gets_its_files_mounted_read_only_under_run() {
    let fake = Arc::new(FakeRuntime::new());
    let data = tempfile::tempdir().expect("tempdir");
    let source = Arc::new(Source::default());
    *source.files.lock().expect("lock") = Some(vec![
        file("connections/app_db", "postgresql://db:5432"),
        file("secrets/api_token", "t0ken"),
    ]);
    let mut supervisor = supervisor(&fake, data.path(), &source);
    let one = desired(vec![assignment(
        "web-2",
        Workload::Image {
            image: "example/web:1".into(),
            command: None,
        },
    )]);
    tick_until(&mut supervisor, &one, "running", |tick| {
        state(tick) == Some(InstanceState::Running)
    })
    .await;
    let created = creates(&fake).remove(0);
    let dir = data.path().join("files/web-2");
    let mounts: Vec<(String, String, bool)> = created
        .mounts
        .iter()
        .map(|m| {
            (
                m.source.display().to_string(),
                m.target.clone(),
                m.read_only,
            )
        })
        .collect();
    assert!(
        created.mounts.iter().all(|m| m.owned_by_workload),
        "handed to the image's user: {:?}",
        created.mounts
    );
    assert_eq!(
        mounts,
        [
            (
                dir.join("secrets").display().to_string(),
                "/run/secrets".into(),
                true
            ),
            (
                dir.join("connections").display().to_string(),
                "/run/connections".into(),
                true
            ),
        ]
    );
    assert_eq!(
        created
            .env
            .get("CCA_CONNECTION_APP_DB_FILE")
            .map(String::as_str),
        Some("/run/connections/app_db")
    );
    assert_eq!(
        created
            .env
            .get("CCA_SECRET_API_TOKEN_FILE")
            .map(String::as_str),
        Some("/run/secrets/api_token")
    );
    supervisor.stop_all().await;
    assert!(!dir.exists(), "stop_all removes the files too");
}

#[tokio::test]
async fn an_agent_without_a_files_directory_fails_such_an_instance_with_the_reason() {
    let fake = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn Runtime> = Arc::clone(&fake) as Arc<dyn Runtime>;
    let mut supervisor = Supervisor::new(
        "n1",
        "127.0.0.1",
        runtime,
        SupervisorConfig::default(),
        BTreeMap::new(),
    );
    let one = desired(vec![assignment(
        "web-3",
        Workload::Process { run: "true".into() },
    )]);
    let tick = tick_until(&mut supervisor, &one, "failed", |tick| {
        state(tick) == Some(InstanceState::Failed)
    })
    .await;
    let message = tick.statuses[0].message.clone().unwrap_or_default();
    assert!(message.contains("no files directory"), "{message}");
}
