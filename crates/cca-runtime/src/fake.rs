//! `FakeRuntime`: an in-memory [`Runtime`] for other crates' unit tests
//! (feature `fake`). It records every call with typed arguments, follows
//! the same state rules as the real runtimes (no double start, no removing
//! a running instance), and lets a test inject failures, make an instance
//! exit (with a code, by a signal, OOM-killed), script logs and exec
//! output, and plant instances "left by an earlier agent" for adoption.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::memory::{created_status, end_run, refuse_when_running, stop_at_once};

use crate::{
    Error, ExecOutput, ExecRequest, ExitReason, InstanceSpec, InstanceState, InstanceStatus,
    Limits, LogOptions, LogStream, Operation, Result, Runtime, Usage,
};

/// One recorded call. `Create` holds its spec boxed: a spec is far larger
/// than every other call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Create(Box<InstanceSpec>),
    Start(String),
    Stop { id: String, grace: Duration },
    Remove(String),
    Inspect(String),
    List,
    Logs { id: String, options: LogOptions },
    Exec { id: String, request: ExecRequest },
    Usage(String),
    Resize { id: String, limits: Limits },
}

/// An injected failure: calls of `operation` (on `id`, or any instance)
/// fail with `message`, `remaining` more times (`None`: until cleared).
#[derive(Clone, Debug)]
struct Failure {
    operation: Operation,
    id: Option<String>,
    message: String,
    remaining: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    instances: BTreeMap<String, InstanceStatus>,
    failures: Vec<Failure>,
    /// Instances (or every instance, key `None`) that exit with this code
    /// right after each start.
    exit_after_start: HashMap<Option<String>, i32>,
    logs: HashMap<String, Vec<String>>,
    exec_outputs: HashMap<String, ExecOutput>,
    usage: HashMap<String, Usage>,
    next_pid: u32,
}

/// A recording, scriptable runtime. All methods take `&self`; share it as
/// `Arc<FakeRuntime>` and hand a clone to the code under test as
/// `Arc<dyn Runtime>`.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Every call so far, forgetting them.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.state().calls)
    }

    /// Calls of `operation` on `id` (or any instance) fail from now on.
    pub fn fail(&self, operation: Operation, id: Option<&str>, message: &str) {
        self.add_failure(operation, id, message, None);
    }

    /// The next call of `operation` on `id` (or any instance) fails.
    pub fn fail_once(&self, operation: Operation, id: Option<&str>, message: &str) {
        self.add_failure(operation, id, message, Some(1));
    }

    pub fn clear_failures(&self) {
        self.state().failures.clear();
    }

    /// Every start of `id` (or of any instance) is followed at once by an
    /// exit with `code`, as a command that fails fast.
    pub fn exit_after_start(&self, id: Option<&str>, code: i32) {
        self.state()
            .exit_after_start
            .insert(id.map(str::to_owned), code);
    }

    /// A running instance's process exits by itself with `code`.
    pub fn exit(&self, id: &str, code: i32) {
        self.end(id, Some(code), None, ExitReason::Exited);
    }

    /// A running instance is killed by `signal` (not by the runtime).
    pub fn kill(&self, id: &str, signal: i32) {
        self.end(id, None, Some(signal), ExitReason::Exited);
    }

    /// A running instance is OOM-killed.
    pub fn oom_kill(&self, id: &str) {
        let limit = self.status(id).and_then(|status| status.spec.memory_bytes);
        self.end(
            id,
            None,
            Some(9),
            ExitReason::OutOfMemory { limit_bytes: limit },
        );
    }

    /// The lines `logs` returns for `id`.
    pub fn set_logs(&self, id: &str, lines: &[&str]) {
        let lines = lines.iter().map(|line| (*line).to_owned()).collect();
        self.state().logs.insert(id.to_owned(), lines);
    }

    /// What `exec` returns for `id` (default: success, empty output).
    pub fn set_exec_output(&self, id: &str, output: ExecOutput) {
        self.state().exec_outputs.insert(id.to_owned(), output);
    }

    /// What `usage` reports for the instance while it runs (nothing used
    /// until set).
    pub fn set_usage(&self, id: &str, usage: Usage) {
        self.state().usage.insert(id.to_owned(), usage);
    }

    /// Plants a running instance as if started by an earlier agent process
    /// (`adopted: true`); returns its pid.
    pub fn insert_running(&self, spec: InstanceSpec) -> u32 {
        let mut state = self.state();
        let pid = next_pid(&mut state);
        let mut status = created_status(spec, "fake");
        status.state = InstanceState::Running;
        status.pid = Some(pid);
        status.started_at_ms = Some(cca_model::clock::now_millis());
        status.adopted = true;
        state.instances.insert(status.id.clone(), status);
        pid
    }

    /// The current status of `id`, without recording a call.
    pub fn status(&self, id: &str) -> Option<InstanceStatus> {
        self.state().instances.get(id).cloned()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add_failure(
        &self,
        operation: Operation,
        id: Option<&str>,
        message: &str,
        remaining: Option<usize>,
    ) {
        self.state().failures.push(Failure {
            operation,
            id: id.map(str::to_owned),
            message: message.to_owned(),
            remaining,
        });
    }

    fn end(&self, id: &str, code: Option<i32>, signal: Option<i32>, reason: ExitReason) {
        let mut state = self.state();
        if let Some(status) = state.instances.get_mut(id)
            && status.state == InstanceState::Running
        {
            end_run(status, code, signal, reason, cca_model::clock::now_millis());
        }
    }

    /// Records the call and returns the injected failure, if any.
    fn enter(&self, call: Call, operation: Operation, id: &str) -> Result<MutexGuard<'_, State>> {
        let mut state = self.state();
        state.calls.push(call);
        let matching = state.failures.iter_mut().position(|failure| {
            failure.operation == operation && failure.id.as_deref().is_none_or(|f| f == id)
        });
        if let Some(index) = matching {
            let failure = &mut state.failures[index];
            let message = failure.message.clone();
            if let Some(remaining) = &mut failure.remaining {
                *remaining -= 1;
                if *remaining == 0 {
                    state.failures.remove(index);
                }
            }
            return Err(Error::Failed {
                id: id.to_owned(),
                operation,
                message,
            });
        }
        Ok(state)
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn kind(&self) -> &'static str {
        "fake"
    }

    async fn create(&self, spec: InstanceSpec) -> Result<String> {
        let mut state = self.enter(
            Call::Create(Box::new(spec.clone())),
            Operation::Create,
            &spec.id,
        )?;
        spec.validate()?;
        if state.instances.contains_key(&spec.id) {
            return Err(Error::AlreadyExists { id: spec.id });
        }
        let id = spec.id.clone();
        state
            .instances
            .insert(id.clone(), created_status(spec, "fake"));
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        let mut state = self.enter(Call::Start(id.to_owned()), Operation::Start, id)?;
        let pid = next_pid(&mut state);
        let exit_code = state
            .exit_after_start
            .get(&Some(id.to_owned()))
            .or_else(|| state.exit_after_start.get(&None))
            .copied();
        let status = existing(&mut state, id)?;
        refuse_when_running(status, Operation::Start)?;
        status.state = InstanceState::Running;
        status.pid = Some(pid);
        status.started_at_ms = Some(cca_model::clock::now_millis());
        status.exit = None;
        status.adopted = false;
        if let Some(code) = exit_code {
            end_run(
                status,
                Some(code),
                None,
                ExitReason::Exited,
                cca_model::clock::now_millis(),
            );
        }
        Ok(())
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<InstanceStatus> {
        let call = Call::Stop {
            id: id.to_owned(),
            grace,
        };
        let mut state = self.enter(call, Operation::Stop, id)?;
        let status = existing(&mut state, id)?;
        stop_at_once(status);
        Ok(status.clone())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let mut state = self.enter(Call::Remove(id.to_owned()), Operation::Remove, id)?;
        refuse_when_running(existing(&mut state, id)?, Operation::Remove)?;
        state.instances.remove(id);
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<InstanceStatus> {
        let mut state = self.enter(Call::Inspect(id.to_owned()), Operation::Inspect, id)?;
        existing(&mut state, id).map(|status| status.clone())
    }

    async fn list(&self) -> Result<Vec<InstanceStatus>> {
        let state = self.enter(Call::List, Operation::List, "")?;
        Ok(state.instances.values().cloned().collect())
    }

    async fn logs(&self, id: &str, options: LogOptions) -> Result<LogStream> {
        let call = Call::Logs {
            id: id.to_owned(),
            options,
        };
        let mut state = self.enter(call, Operation::Logs, id)?;
        existing(&mut state, id)?;
        let lines = state.logs.get(id).cloned().unwrap_or_default();
        let skip = options
            .tail
            .map_or(0, |tail| lines.len().saturating_sub(tail));
        Ok(LogStream::from_lines(lines.into_iter().skip(skip)))
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecOutput> {
        let call = Call::Exec {
            id: id.to_owned(),
            request,
        };
        let mut state = self.enter(call, Operation::Exec, id)?;
        let status = existing(&mut state, id)?;
        status.require_running(Operation::Exec)?;
        let success = ExecOutput {
            code: Some(0),
            ..ExecOutput::default()
        };
        Ok(state.exec_outputs.get(id).cloned().unwrap_or(success))
    }

    async fn usage(&self, id: &str) -> Result<Usage> {
        let mut state = self.enter(Call::Usage(id.to_owned()), Operation::Usage, id)?;
        let status = existing(&mut state, id)?;
        status.require_running(Operation::Usage)?;
        Ok(state.usage.get(id).copied().unwrap_or_default())
    }

    async fn resize(&self, id: &str, limits: Limits) -> Result<()> {
        let call = Call::Resize {
            id: id.to_owned(),
            limits,
        };
        let mut state = self.enter(call, Operation::Resize, id)?;
        let status = existing(&mut state, id)?;
        limits.set_on(std::sync::Arc::make_mut(&mut status.spec));
        Ok(())
    }
}

fn next_pid(state: &mut State) -> u32 {
    state.next_pid = state.next_pid.max(10_000) + 1;
    state.next_pid
}

fn existing<'a>(state: &'a mut State, id: &str) -> Result<&'a mut InstanceStatus> {
    state
        .instances
        .get_mut(id)
        .ok_or_else(|| Error::NotFound { id: id.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> InstanceSpec {
        InstanceSpec::new(id, "web", "true")
    }

    #[tokio::test]
    async fn calls_are_recorded_with_their_arguments() {
        let fake = FakeRuntime::new();
        fake.create(spec("a")).await.expect("create");
        fake.start("a").await.expect("start");
        fake.stop("a", Duration::from_secs(2)).await.expect("stop");
        assert_eq!(
            fake.take_calls(),
            [
                Call::Create(Box::new(spec("a"))),
                Call::Start("a".into()),
                Call::Stop {
                    id: "a".into(),
                    grace: Duration::from_secs(2)
                },
            ]
        );
        assert!(fake.calls().is_empty());
    }

    #[tokio::test]
    async fn injected_failures_hit_matching_calls_only() {
        let fake = FakeRuntime::new();
        fake.create(spec("a")).await.expect("create a");
        fake.create(spec("b")).await.expect("create b");
        fake.fail_once(Operation::Start, Some("a"), "no such file");
        fake.start("b").await.expect("b is unaffected");
        let error = fake.start("a").await.expect_err("a fails once");
        assert_eq!(error.to_string(), "instance a: start failed: no such file");
        fake.start("a").await.expect("then a starts");

        fake.fail(Operation::List, None, "disk gone");
        assert!(fake.list().await.is_err());
        assert!(fake.list().await.is_err());
        fake.clear_failures();
        assert_eq!(fake.list().await.expect("list").len(), 2);
    }

    #[tokio::test]
    async fn exits_can_be_scripted() {
        let fake = FakeRuntime::new();
        fake.exit_after_start(Some("a"), 3);
        fake.create(spec("a")).await.expect("create");
        fake.start("a").await.expect("start");
        let status = fake.inspect("a").await.expect("inspect");
        assert_eq!(status.state, InstanceState::Exited);
        assert_eq!(status.exit.expect("exit").code, Some(3));

        fake.create(spec("b")).await.expect("create");
        fake.start("b").await.expect("start");
        fake.oom_kill("b");
        let exit = fake.status("b").and_then(|s| s.exit).expect("exit");
        assert!(matches!(exit.reason, ExitReason::OutOfMemory { .. }));
    }

    #[tokio::test]
    async fn state_rules_match_the_real_runtimes() {
        let fake = FakeRuntime::new();
        let pid = fake.insert_running(spec("old"));
        let found = fake.list().await.expect("list");
        assert_eq!((found[0].pid, found[0].adopted), (Some(pid), true));
        assert!(matches!(
            fake.start("old").await,
            Err(Error::InvalidState { .. })
        ));
        assert!(matches!(
            fake.remove("old").await,
            Err(Error::InvalidState { .. })
        ));
        assert!(matches!(
            fake.create(spec("old")).await,
            Err(Error::AlreadyExists { .. })
        ));
        let stopped = fake.stop("old", Duration::ZERO).await.expect("stop");
        assert_eq!(stopped.exit.expect("exit").reason, ExitReason::Stopped);
        fake.remove("old").await.expect("remove");
        assert!(matches!(
            fake.inspect("old").await,
            Err(Error::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn logs_and_exec_return_what_was_scripted() {
        let fake = FakeRuntime::new();
        fake.insert_running(spec("a"));
        fake.set_logs("a", &["one", "two", "three"]);
        let options = LogOptions {
            tail: Some(2),
            follow: false,
        };
        let lines = fake
            .logs("a", options)
            .await
            .expect("logs")
            .collect()
            .await
            .expect("lines");
        assert_eq!(lines, ["two", "three"]);
        let output = fake
            .exec("a", ExecRequest::new(["true"], Duration::from_secs(1)))
            .await
            .expect("exec");
        assert!(output.success());
    }
}
