//! The state rules shared by the runtimes that keep their instances in
//! memory — `sim` (the benchmark's simulated nodes) and `fake` (tests): the
//! status of a created instance, what a running instance refuses, and how
//! a run ends. One place, so the simulation behaves as the tests assume.

use crate::{
    Error, ExitInfo, ExitReason, InstanceSpec, InstanceState, InstanceStatus, LimitsEnforcement,
    Operation, Result,
};

/// A created, not yet started instance of `spec`; limits are reported
/// enforced `by` the runtime when the spec asks for any.
pub(crate) fn created_status(spec: InstanceSpec, by: &str) -> InstanceStatus {
    let limits = if spec.cpu_millis.is_some() || spec.memory_bytes.is_some() {
        LimitsEnforcement::Enforced { by: by.to_owned() }
    } else {
        LimitsEnforcement::NotRequested
    };
    InstanceStatus {
        id: spec.id.clone(),
        spec: spec.into(),
        state: InstanceState::Created,
        pid: None,
        started_at_ms: None,
        exit: None,
        limits,
        adopted: false,
    }
}

/// Refuses `operation` on a running instance (start twice, remove).
pub(crate) fn refuse_when_running(status: &InstanceStatus, operation: Operation) -> Result<()> {
    if status.state == InstanceState::Running {
        return Err(Error::InvalidState {
            id: status.id.clone(),
            operation,
            state: status.state,
        });
    }
    Ok(())
}

/// A graceful stop of an in-memory instance: one that runs ends now, as a
/// workload that honours SIGTERM at once would (the fake's and the
/// simulator's stop).
pub(crate) fn stop_at_once(status: &mut InstanceStatus) {
    if status.state == InstanceState::Running {
        end_run(
            status,
            None,
            Some(15),
            ExitReason::Stopped,
            cca_model::clock::now_millis(),
        );
    }
}

/// Ends the instance's run at `at_ms` (milliseconds since the epoch).
pub(crate) fn end_run(
    status: &mut InstanceStatus,
    code: Option<i32>,
    signal: Option<i32>,
    reason: ExitReason,
    at_ms: i64,
) {
    status.state = InstanceState::Exited;
    status.exit = Some(ExitInfo {
        code,
        signal,
        reason,
        finished_at_ms: at_ms,
    });
}
