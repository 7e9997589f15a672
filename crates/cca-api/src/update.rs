//! The one read-modify-write loop behind the API's updates (scale, delete,
//! node controls, secrets): read what the change depends on, build one
//! guarded transaction, and on a failed compare read again and rebuild,
//! with jittered backoff, until it commits or a deadline passes. A change
//! that only sets a value (scale to N) therefore lands however many
//! clients write the same key at once: each round one of them wins, the
//! others re-read and re-apply. Only an error of the attempt itself (not
//! found, invalid, store down) or the deadline ends it early.

use std::future::Future;
use std::time::Duration;

use cca_store::{Revision, Txn, TxnOutcome};
use tokio::time::Instant;

use crate::error::{ApiError, ApiResult};
use crate::state::ApiState;

/// How long an update keeps re-reading and re-applying before answering
/// 409: well under clients' request timeouts, far above the time 32
/// writers of one key need to land one after another.
pub(crate) const UPDATE_DEADLINE: Duration = Duration::from_secs(10);

/// The first backoff cap; it doubles per conflict up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// Runs `attempt` (a fresh read and the transaction built from it, with
/// what to answer) and commits its transaction, again on every failed
/// compare, until it commits or [`UPDATE_DEADLINE`] passes. Answers the
/// attempt's value with the committed revision; `what` names the thing in
/// the 409 ("service `web`").
pub(crate) async fn read_modify_write<T, F, Fut>(
    state: &ApiState,
    what: &str,
    attempt: F,
) -> ApiResult<(T, Revision)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ApiResult<(Txn, T)>>,
{
    read_modify_write_within(state, what, UPDATE_DEADLINE, attempt).await
}

/// [`read_modify_write`] for a change that may turn out to be needed no
/// more: an attempt that finds nothing to write (`None` for its
/// transaction) answers its value at once, with no revision.
pub(crate) async fn read_modify_write_if<T, F, Fut>(
    state: &ApiState,
    what: &str,
    mut attempt: F,
) -> ApiResult<(T, Option<Revision>)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ApiResult<(Option<Txn>, T)>>,
{
    let deadline = Instant::now() + UPDATE_DEADLINE;
    let mut cap = FIRST_BACKOFF;
    loop {
        let (txn, value) = attempt().await?;
        let Some(txn) = txn else {
            return Ok((value, None));
        };
        if let TxnOutcome::Committed { revision } = state.store().txn(txn).await? {
            return Ok((value, Some(revision)));
        }
        let pause = jitter(cap);
        if Instant::now() + pause >= deadline {
            return Err(ApiError::conflict(format!(
                "{what} kept changing for {}s while updating it; nothing was written, retry",
                UPDATE_DEADLINE.as_secs_f64()
            )));
        }
        tokio::time::sleep(pause).await;
        cap = (cap * 2).min(MAX_BACKOFF);
    }
}

async fn read_modify_write_within<T, F, Fut>(
    state: &ApiState,
    what: &str,
    patience: Duration,
    mut attempt: F,
) -> ApiResult<(T, Revision)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ApiResult<(Txn, T)>>,
{
    let deadline = Instant::now() + patience;
    let mut cap = FIRST_BACKOFF;
    loop {
        let (txn, value) = attempt().await?;
        if let TxnOutcome::Committed { revision } = state.store().txn(txn).await? {
            return Ok((value, revision));
        }
        let pause = jitter(cap);
        if Instant::now() + pause >= deadline {
            return Err(ApiError::conflict(format!(
                "{what} kept changing for {}s while updating it; nothing was written, retry",
                patience.as_secs_f64()
            )));
        }
        tokio::time::sleep(pause).await;
        cap = (cap * 2).min(MAX_BACKOFF);
    }
}

/// Full jitter: a uniform pause in `[0, cap]`, so writers that lost the
/// same round do not collide again in lockstep.
fn jitter(cap: Duration) -> Duration {
    let micros = u64::try_from(cap.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(fastrand::u64(0..=micros))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cca_store::embedded::{Config, EmbeddedStore};
    use cca_store::{Compare, CompareOp, Op, Store};

    use super::*;
    use crate::state::{ApiConfig, no_extra_metrics};

    async fn state(dir: &std::path::Path) -> ApiState {
        let store: Arc<dyn Store> = Arc::new(
            EmbeddedStore::open(Config::new(dir))
                .await
                .expect("store opens"),
        );
        let cache = Arc::new(
            cca_control::Cache::start(Arc::clone(&store))
                .await
                .expect("cache starts"),
        );
        ApiState::new(store, cache, ApiConfig::default(), no_extra_metrics())
    }

    #[tokio::test]
    async fn a_change_that_never_lands_answers_409_at_the_deadline() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = state(dir.path()).await;
        let attempts = AtomicUsize::new(0);
        let started = Instant::now();
        let error =
            read_modify_write_within(&state, "thing `x`", Duration::from_millis(300), || {
                attempts.fetch_add(1, Ordering::Relaxed);
                // A compare that can never hold: the key does not exist.
                let txn = Txn::new()
                    .when(Compare::mod_revision("x", CompareOp::Equal, 12_345))
                    .then(Op::put("x", b"1".to_vec()));
                async move { Ok((txn, ())) }
            })
            .await
            .expect_err("never commits");
        assert_eq!(error.status, axum::http::StatusCode::CONFLICT);
        assert_eq!(
            error.message,
            "thing `x` kept changing for 0.3s while updating it; nothing was written, retry"
        );
        // It kept trying for the whole deadline, not a fixed few attempts.
        assert!(attempts.load(Ordering::Relaxed) > 5, "{attempts:?}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(state.store().get("x").await.expect("get").is_none());
    }

    #[tokio::test]
    async fn an_error_of_the_attempt_ends_the_update_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = state(dir.path()).await;
        let error = read_modify_write(&state, "thing `x`", || async {
            Err::<(Txn, ()), _>(ApiError::not_found("thing `x` not found"))
        })
        .await
        .expect_err("fails");
        assert_eq!(error, ApiError::not_found("thing `x` not found"));
    }

    #[test]
    fn jitter_stays_within_its_cap() {
        for _ in 0..1000 {
            assert!(jitter(FIRST_BACKOFF) <= FIRST_BACKOFF);
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
