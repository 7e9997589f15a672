//! Leader election on a store lease. The winner holds `meta/leader`
//! attached to its lease; the key's mod revision is the **fencing token**
//! that every controller commit compares against, so a deposed leader's
//! late commit is refused by the store itself. Losers wait for the key to
//! vanish (resignation or lease expiry) and campaign again.

use std::sync::Arc;
use std::time::Duration;

use cca_model::cluster::Millis;
use cca_model::keys;
use cca_store::{
    Compare, CompareOp, LeaseId, Op, Revision, Store, StoreError, Txn, WatchEvent, WatchMessage,
};
use tokio::sync::watch;

pub use cca_model::cluster::LeaderRecord;

/// How this server campaigns.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Names this server in `meta/leader`.
    pub server_id: String,
    /// Leadership lapses this long after the last successful keep-alive.
    pub ttl: Duration,
}

impl LeaderConfig {
    /// How long leadership outlives a leader that died without resigning:
    /// a standby leads this long after (plus one campaign), inside the
    /// 10 s failover goal. Keep-alives go every third of it, so two lost
    /// renewals in a row are survived; measured to hold through a
    /// 100,000-instance deploy on etcd sharing the leader's cores
    /// (docs/benchmarks.md, "Leader failover").
    pub const DEFAULT_TTL: Duration = Duration::from_secs(8);

    pub fn new(server_id: impl Into<String>) -> Self {
        Self {
            server_id: server_id.into(),
            ttl: Self::DEFAULT_TTL,
        }
    }
}

/// Held leadership: the fencing token and a signal that flips when it ends.
#[derive(Debug)]
pub struct Leadership {
    pub token: Revision,
    pub lease: LeaseId,
    pub since: Millis,
    lost: watch::Receiver<bool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Leadership {
    /// The compare that makes a transaction valid only while we lead.
    pub fn fence(&self) -> Compare {
        Compare::mod_revision(keys::leader(), CompareOp::Equal, self.token)
    }

    /// Resolves once leadership is lost (lease gone or unrenewable).
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|lost| *lost).await;
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Gives leadership up at once so another server can take over without
    /// waiting for the TTL.
    pub async fn resign(self, store: &dyn Store) {
        if let Err(error) = store.revoke_lease(self.lease).await {
            tracing::warn!(%error, "resigning leadership failed; it lapses with the lease");
        }
    }
}

/// Campaigns until this server leads. Cancel-safe: dropping the future
/// leaves at most an unused lease that expires on its own.
pub async fn acquire(
    store: &Arc<dyn Store>,
    config: &LeaderConfig,
    now: impl Fn() -> Millis,
) -> Leadership {
    let mut backoff = Backoff::new();
    let mut seen_leader = None;
    loop {
        match try_acquire(store, config, now()).await {
            Ok(Some(leadership)) => return leadership,
            Ok(None) => {
                backoff.reset();
                wait_for_vacancy(store.as_ref(), config, &mut seen_leader).await;
            }
            Err(error) => {
                tracing::warn!(%error, "leader campaign failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

async fn try_acquire(
    store: &Arc<dyn Store>,
    config: &LeaderConfig,
    now: Millis,
) -> Result<Option<Leadership>, StoreError> {
    let lease = store.grant_lease(config.ttl).await?;
    let record = LeaderRecord {
        server: config.server_id.clone(),
        since: now,
    };
    let value = serde_json::to_vec(&record).map_err(|err| StoreError::Backend(err.to_string()))?;
    let txn = Txn::new()
        .when(Compare::absent(keys::leader()))
        .then(Op::put_with_lease(keys::leader(), value, lease));
    match store.txn(txn).await {
        Ok(outcome) if outcome.is_committed() => {
            let (flag, lost) = watch::channel(false);
            let keeper = tokio::spawn(keep_alive(Arc::clone(store), lease, config.ttl, flag));
            tracing::info!(server = %config.server_id, token = outcome.revision(), "became leader");
            Ok(Some(Leadership {
                token: outcome.revision(),
                lease,
                since: now,
                lost,
                keeper,
            }))
        }
        Ok(_) => {
            let _ = store.revoke_lease(lease).await;
            Ok(None)
        }
        Err(error) => {
            let _ = store.revoke_lease(lease).await;
            Err(error)
        }
    }
}

/// Renews the lease every third of its TTL; flags leadership lost when the
/// lease is gone or could not be renewed for a whole TTL.
async fn keep_alive(
    store: Arc<dyn Store>,
    lease: LeaseId,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        match store.keep_alive(lease).await {
            Ok(_) => renewed = tokio::time::Instant::now(),
            Err(StoreError::LeaseNotFound(_)) => break,
            Err(error) => {
                tracing::warn!(%error, "leader lease keep-alive failed");
                if renewed.elapsed() >= ttl {
                    break;
                }
            }
        }
    }
    tracing::warn!(
        lease,
        "leadership lost: the leader lease could not be renewed"
    );
    let _ = lost.send(true);
}

/// Waits until `meta/leader` is deleted, or at most one TTL (then the
/// caller simply campaigns again). Logs who leads when it differs from
/// `seen_leader`, the leader this standby last logged.
async fn wait_for_vacancy(
    store: &dyn Store,
    config: &LeaderConfig,
    seen_leader: &mut Option<String>,
) {
    let Ok(Some(current)) = store.get(&keys::leader()).await else {
        return;
    };
    let leader = serde_json::from_slice::<LeaderRecord>(&current.value)
        .ok()
        .map(|record| record.server);
    if let Some(name) = leader
        .as_deref()
        .filter(|name| seen_leader.as_deref() != Some(*name))
    {
        tracing::info!(server = %config.server_id, leader = %name, "standing by: another server leads");
        *seen_leader = leader;
    }
    let watched = async {
        let Ok(mut stream) = store.watch(&keys::leader(), current.mod_revision + 1).await else {
            return;
        };
        while let Some(Ok(message)) = stream.next().await {
            match message {
                WatchMessage::Events { events, .. } => {
                    if events.iter().any(|event| matches!(event, WatchEvent::Delete { key, .. } if *key == keys::leader())) {
                        return;
                    }
                }
                WatchMessage::Compacted { .. } => return,
            }
        }
    };
    let _ = tokio::time::timeout(config.ttl, watched).await;
}

/// Jittered exponential backoff: 10 ms doubling to 2 s, each wait drawn
/// from the upper half of the current step so retries spread out.
#[derive(Debug)]
pub(crate) struct Backoff {
    step: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(2);

    pub(crate) fn new() -> Self {
        Self { step: Self::FIRST }
    }

    pub(crate) fn reset(&mut self) {
        self.step = Self::FIRST;
    }

    pub(crate) fn next(&mut self) -> Duration {
        self.next_with(fastrand::f64())
    }

    /// The next wait with `draw` (in `[0, 1)`) as the jitter: what
    /// [`Backoff::next`] does with a random draw, for callers that inject it.
    pub(crate) fn next_with(&mut self, draw: f64) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(Self::MAX);
        let half = step / 2;
        half + half.mul_f64(draw.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let mut backoff = Backoff::new();
        let waits: Vec<Duration> = (0..12).map(|_| backoff.next()).collect();
        assert!(waits[0] >= Duration::from_millis(5) && waits[0] <= Duration::from_millis(10));
        assert!(waits[3] >= Duration::from_millis(40) && waits[3] <= Duration::from_millis(80));
        assert!(waits.iter().all(|wait| *wait <= Backoff::MAX));
        assert!(waits[11] >= Backoff::MAX / 2);
        backoff.reset();
        assert!(backoff.next() <= Duration::from_millis(10));
    }
}
