//! Init steps, run in order before an instance's main start. A step's
//! `command` runs as a short-lived instance of its own (`{id}.init-{step}`)
//! with the main instance's environment and ports — as a container of the
//! step's own `image` when it has one, in the main container's network
//! namespace, or for a host process on the host's network — and must exit
//! 0. Its `probe` names a connection whose host and port must then answer
//! a TCP connect: the service VIP the host names when the API found one
//! (`ProbeAddress::vip`) or, when the VIP came after the assignment, the
//! one this node's rules have since learned; else the host resolved on
//! the node. Attempts
//! repeat every second, each noted for the instance's status, until one
//! answers or the step's `timeout` (2 minutes unless set) passes.
//!
//! A command that exits non-zero fails the instance (the scheduler replaces
//! it). A step that runs out of time is not the instance's fault — what it
//! waits for is not there yet — so the start is tried again after the
//! restart backoff, the instance pending with the reason meanwhile.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cca_model::spec::{INIT_STEP_TIMEOUT, InitStep};
use cca_runtime::{InstanceSpec, InstanceState as RtState, Runtime};
use cca_wire::types::ProbeAddress;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::netplane::NodeNet;
use crate::supervisor::StartProblem;

/// The pause between two probe attempts.
const PROBE_PAUSE: Duration = Duration::from_secs(1);

/// How long one connect attempt may take.
const PROBE_ATTEMPT: Duration = Duration::from_secs(2);

/// What a start is doing now, for the instance's status while it starts;
/// shared between the start task and the supervisor.
#[derive(Clone, Debug, Default)]
pub(crate) struct StartNote(Arc<Mutex<Option<String>>>);

impl StartNote {
    pub(crate) fn set(&self, note: String) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(note);
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Runs one step (see the module documentation).
pub(crate) async fn run_step(
    runtime: &Arc<dyn Runtime>,
    main: &InstanceSpec,
    step: &InitStep,
    probes: &BTreeMap<String, ProbeAddress>,
    node_net: Option<&NodeNet>,
    note: &StartNote,
) -> Result<(), StartProblem> {
    let timeout = Duration::from_millis(step.timeout.unwrap_or(INIT_STEP_TIMEOUT).0);
    let deadline = Instant::now() + timeout;
    if let Some(command) = &step.command {
        note.set(format!("init step `{}`: running", step.name));
        run_command(runtime, main, step, command, deadline, timeout).await?;
    }
    let Some(connection) = &step.probe else {
        return Ok(());
    };
    let Some(address) = probes.get(connection) else {
        return Err(StartProblem::Retry(format!(
            "init step `{}`: connection `{connection}` is not defined",
            step.name
        )));
    };
    // The VIP may be allocated after the assignment was sent: this
    // node's rules learn it, so look there when the assignment had none.
    let mut address = address.clone();
    let service = address
        .host
        .strip_suffix(&format!(".{}", cca_model::net::DNS_ZONE))
        .unwrap_or(&address.host)
        .to_owned();
    let vip_of = move || node_net.and_then(|net| net.vip(&service));
    probe(
        &step.name,
        connection,
        &mut address,
        &vip_of,
        (deadline, timeout),
        note,
    )
    .await
}

/// Runs the step's command as an instance of its own until it exits, or
/// until `deadline` (then it is stopped).
async fn run_command(
    runtime: &Arc<dyn Runtime>,
    main: &InstanceSpec,
    step: &InitStep,
    command: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), StartProblem> {
    let id = format!("{}.init-{}", main.id, step.name);
    let mut spec = main.clone();
    spec.id = id.clone();
    spec.command = command.to_owned();
    if let Some(image) = &step.image {
        if spec.image.is_none() {
            spec.host_network = true;
        }
        spec.image = Some(image.clone());
    }
    let failed = |error: cca_runtime::Error| {
        StartProblem::Failed(format!("init step `{}`: {error}", step.name))
    };
    let _ = runtime.remove(&id).await;
    runtime.create(spec).await.map_err(failed)?;
    runtime.start(&id).await.map_err(failed)?;
    let exit = loop {
        match runtime.inspect(&id).await {
            Ok(status) if status.state == RtState::Exited => break status.exit,
            Ok(_) if Instant::now() >= deadline => {
                let _ = runtime.stop(&id, Duration::from_secs(5)).await;
                let _ = runtime.remove(&id).await;
                return Err(StartProblem::Retry(format!(
                    "init step `{}` did not finish within {}",
                    step.name,
                    humantime::format_duration(timeout)
                )));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(error) => return Err(failed(error)),
        }
    };
    let _ = runtime.remove(&id).await;
    match exit {
        Some(exit) if exit.code == Some(0) => Ok(()),
        Some(exit) => Err(StartProblem::Failed(format!(
            "init step `{}` {exit}",
            step.name
        ))),
        None => Err(StartProblem::Failed(format!(
            "init step `{}` ended without an exit status",
            step.name
        ))),
    }
}

/// Dials `address` until it answers or `deadline` passes.
async fn probe(
    step: &str,
    connection: &str,
    address: &mut ProbeAddress,
    vip_of: &(dyn Fn() -> Option<std::net::Ipv4Addr> + Sync),
    (deadline, timeout): (Instant, Duration),
    note: &StartNote,
) -> Result<(), StartProblem> {
    loop {
        if address.vip.is_none() {
            address.vip = vip_of();
        }
        let target = match address.vip {
            Some(vip) => format!("{}:{} (VIP {vip})", address.host, address.port),
            None => format!("{}:{}", address.host, address.port),
        };
        let last = match tokio::time::timeout(PROBE_ATTEMPT, connect(address)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {}s", PROBE_ATTEMPT.as_secs()),
        };
        if Instant::now() + PROBE_PAUSE >= deadline {
            return Err(StartProblem::Retry(format!(
                "init step `{step}`: connection `{connection}` ({target}) did not answer within \
                 {}: {last}",
                humantime::format_duration(timeout)
            )));
        }
        note.set(format!(
            "init step `{step}`: waiting for connection `{connection}` ({target}): {last}"
        ));
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// One TCP connect to the VIP, or to the host resolved on this node.
async fn connect(address: &ProbeAddress) -> std::io::Result<()> {
    match address.vip {
        Some(vip) => TcpStream::connect((vip, address.port)).await.map(drop),
        None => TcpStream::connect((address.host.as_str(), address.port))
            .await
            .map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(port: u16) -> ProbeAddress {
        ProbeAddress {
            host: "127.0.0.1".into(),
            port,
            vip: None,
        }
    }

    #[tokio::test]
    async fn a_probe_waits_for_the_connection_to_answer() {
        let spare = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = spare.local_addr().expect("address").port();
        drop(spare);
        let note = StartNote::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let waiting = tokio::spawn({
            let note = note.clone();
            async move {
                probe(
                    "wait",
                    "db",
                    &mut address(port),
                    &|| None,
                    (deadline, Duration::from_secs(10)),
                    &note,
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let noted = note.get().expect("a note while waiting");
        assert!(
            noted.contains("waiting for connection `db` (127.0.0.1:") && noted.contains("refused"),
            "{noted}"
        );
        let _listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("binds the port again");
        waiting
            .await
            .expect("joins")
            .expect("answers once something listens");
    }

    /// The assignment was sent before the service had a VIP: the probe
    /// finds it on this node (here: loopback) and dials it.
    #[tokio::test]
    async fn a_probe_without_a_vip_finds_the_one_the_node_learned_since() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = listener.local_addr().expect("address").port();
        let mut address = ProbeAddress {
            host: "db.cca.invalid".into(),
            port,
            vip: None,
        };
        let learned = || Some(std::net::Ipv4Addr::LOCALHOST);
        let timeout = Duration::from_secs(5);
        probe(
            "wait",
            "db",
            &mut address,
            &learned,
            (Instant::now() + timeout, timeout),
            &StartNote::default(),
        )
        .await
        .expect("answers on the learned VIP");
        assert_eq!(address.vip, Some(std::net::Ipv4Addr::LOCALHOST));
    }

    #[tokio::test]
    async fn a_probe_that_never_answers_gives_up_at_the_deadline_to_be_retried() {
        let spare = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let port = spare.local_addr().expect("address").port();
        drop(spare);
        let timeout = Duration::from_millis(1_200);
        let started = Instant::now();
        let outcome = probe(
            "wait",
            "db",
            &mut address(port),
            &|| None,
            (started + timeout, timeout),
            &StartNote::default(),
        )
        .await;
        let Err(StartProblem::Retry(problem)) = outcome else {
            panic!("a retry: {outcome:?}");
        };
        assert!(
            problem.contains("connection `db` (127.0.0.1:")
                && problem.contains("did not answer within 1s 200ms"),
            "{problem}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
