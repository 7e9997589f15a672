//! Secret and connection files in a real container, end to end: the
//! agent's supervisor over a `RuntimeSet` with the real `oci` runtime runs
//! a busybox container (image built in the test, pulled from a loopback
//! `docker-registry`) of a service that uses connection `app_db` and is
//! granted secret `db_password`, its files coming from a test
//! `FileSource` as the API would answer them. From inside the container
//! the workload reads the exact URL and value at `/run/connections/app_db`
//! and `/run/secrets/db_password` (also through the `CCA_*_FILE`
//! variables), sees both mounts read-only, and fails to write to them even
//! as root. After removal nothing is left: no container, no files.
//! Skipped without root or the tools `scripts/test` installs.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cca_agent::files::FileSource;
use cca_model::cluster::{Instance, InstanceState};
use cca_model::spec::ServiceSpec;
use cca_wire::types::{Assignment, InstanceFile};
use support::{BusyboxRegistry, Node, desired, image_service, instance, state, tick_until};

const ID: &str = "web-files";
const URL: &str = "postgresql://app:p%40ss%3Aw%2Frd@postgres:5432/app";
const PASSWORD: &str = "p@ss:w/rd";

/// The files the API answers for the instance.
#[derive(Debug)]
struct Source;

#[async_trait::async_trait]
impl FileSource for Source {
    async fn files(&self, node: &str, id: &str) -> Result<Vec<InstanceFile>, String> {
        assert_eq!((node, id), ("n1", ID), "asked for the instance's files");
        Ok(vec![
            InstanceFile {
                path: "connections/app_db".into(),
                content: URL.into(),
            },
            InstanceFile {
                path: "secrets/db_password".into(),
                content: PASSWORD.into(),
            },
        ])
    }
}

/// What the workload prints: the two files, the same through the
/// variables, whether each mount is read-only in `/proc/mounts`, and what
/// becomes of writes (root in the container: only the mount stops them).
const COMMAND: &str = "cat /run/connections/app_db; echo; cat /run/secrets/db_password; echo; \
    cat \"$CCA_CONNECTION_APP_DB_FILE\"; echo; cat \"$CCA_SECRET_DB_PASSWORD_FILE\"; echo; \
    for dir in connections secrets; do \
      grep -q \" /run/$dir [^ ]* ro[, ]\" /proc/mounts && echo $dir mounted ro || echo $dir mounted rw; \
    done; \
    echo changed 2>/dev/null > /run/secrets/db_password && echo overwrote || echo overwrite refused; \
    touch /run/connections/extra 2>/dev/null && echo created || echo create refused; \
    exec sleep 600";

fn assignment(image: &str, stopping: bool) -> Assignment {
    let service = ServiceSpec {
        connections: vec!["app_db".into()],
        ..image_service("web", image, COMMAND)
    };
    Assignment {
        instance: Instance {
            stopping,
            ..instance(ID, "web")
        },
        spec: Some(service),
        secrets: vec!["db_password".into()],
        probes: Default::default(),
    }
}

/// Waits until the container's output is `expected`.
async fn wait_for_output(log: &Path, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = std::fs::read_to_string(log).unwrap_or_default();
        if output == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the container's output is not {expected:?}: {output:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_container_reads_its_connection_url_and_secret_read_only() {
    let test = "container_files";
    if !support::can_run(test, &["runc", "docker-registry", "skopeo", "busybox"]) {
        return;
    }
    let registry = BusyboxRegistry::start();
    let node = Node::new(&registry).await;
    let _cleanup = node.cleanup(&[ID]);
    let files = node.dir.path().join("files");
    let mut supervisor = node.supervisor().with_files(&files, Arc::new(Source));
    let image = registry.image.as_str();

    let running = desired(vec![assignment(image, false)]);
    tick_until(&mut supervisor, &running, "running", |t| {
        state(t) == Some(InstanceState::Running)
    })
    .await;
    let log = node.oci.instance_dir(ID).join("output.log");
    let expected = format!(
        "{URL}\n{PASSWORD}\n{URL}\n{PASSWORD}\n\
         connections mounted ro\nsecrets mounted ro\n\
         overwrite refused\ncreate refused\n"
    );
    wait_for_output(&log, &expected).await;
    assert_eq!(
        std::fs::read_to_string(files.join(ID).join("secrets/db_password")).expect("on the host"),
        PASSWORD,
        "unchanged on the host"
    );

    let stopping = desired(vec![assignment(image, true)]);
    tick_until(&mut supervisor, &stopping, "stopped", |t| {
        state(t) == Some(InstanceState::Stopped)
    })
    .await;
    tick_until(&mut supervisor, &desired(Vec::new()), "removed", |t| {
        t.removed == [ID]
    })
    .await;
    node.assert_container_gone(ID);
    assert!(
        !files.join(ID).exists(),
        "the instance's files are left in {}",
        files.display()
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&files.display().to_string()),
        "a mount of the files is left"
    );
}
