//! The node's view of the cluster network: follows the API's network stream
//! (`GET /v1/agent/nodes/{node}/network`) into a [`NetworkView`] that the
//! node's data plane, overlay and DNS server all read, so a node's rules
//! and its DNS answers come from one view of the facts. Each consumer keeps
//! the view it last applied and asks the new one what changed
//! ([`NetworkMap::touched_since`]), so views published faster than a
//! consumer applies them coalesce without losing a change.
//!
//! The view is cached in the data directory (`network.json`, written at
//! most every [`SAVE_EVERY`]) so that a node restarted while the control
//! plane is away still routes its services and answers their names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cca_model::Revision;
use cca_model::net::{NetworkChange, NetworkMap, Touched};
use cca_wire::Client;
use cca_wire::types::{NetworkLine, Resume, StreamOrigin};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::retry::Retry;

/// The cache file's name in the data directory.
pub const CACHE_FILE: &str = "network-map.json";
/// The cache is written at most this often (the map of a large cluster is
/// megabytes; the stream may change it many times a second).
pub const SAVE_EVERY: Duration = Duration::from_secs(5);

/// The network map at a revision of the store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkView {
    /// 0 until the first snapshot (or the cache) arrived.
    pub revision: Revision,
    /// The stream epoch of the last snapshot (a resume point counts in it).
    pub epoch: String,
    pub map: NetworkMap,
}

/// What a line did to the view.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    Changed,
    Unchanged,
    /// The server cannot resume: reconnect for a snapshot.
    Resnapshot,
}

impl NetworkView {
    /// Applies one line of the stream.
    pub(crate) fn apply(&mut self, line: NetworkLine) -> Applied {
        let mut touched = Touched::default();
        match line {
            NetworkLine::Snapshot {
                revision,
                changes,
                origin,
            } => {
                self.epoch = origin.epoch;
                let mut map = NetworkMap::default();
                for change in changes {
                    map.apply(change, &mut touched);
                }
                let changed = map != self.map;
                self.map = map;
                self.revision = revision;
                if changed {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                }
            }
            NetworkLine::Changes { revision, changes } => {
                self.revision = self.revision.max(revision);
                let mut changed = false;
                for change in changes {
                    changed |= self.map.apply(change, &mut touched);
                }
                if changed {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                }
            }
            NetworkLine::Compacted { .. } => Applied::Resnapshot,
        }
    }
}

/// The cache file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    revision: Revision,
    changes: Vec<NetworkChange>,
}

/// Reads the cached view; `None` when there is none or it does not parse
/// (the stream's snapshot replaces it either way).
pub fn load_cached(data_dir: &Path) -> Option<NetworkView> {
    let bytes = std::fs::read(data_dir.join(CACHE_FILE)).ok()?;
    let cached: Cached = match serde_json::from_slice(&bytes) {
        Ok(cached) => cached,
        Err(error) => {
            tracing::warn!(%error, "ignoring an unreadable network map cache");
            return None;
        }
    };
    let mut view = NetworkView::default();
    view.apply(NetworkLine::Snapshot {
        revision: cached.revision,
        changes: cached.changes,
        origin: StreamOrigin::default(),
    });
    Some(view)
}

fn save(view: &NetworkView, data_dir: &Path) -> std::io::Result<()> {
    let changes = view.map.changes();
    let cached = Cached {
        revision: view.revision,
        changes,
    };
    let bytes = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
    let path = data_dir.join(CACHE_FILE);
    let temporary = data_dir.join(format!("{CACHE_FILE}.tmp"));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(temporary, path)
}

/// Follows `node`'s network stream into `views` until `stop`, caching the
/// view under `data_dir` (public so the benchmark's observer nodes follow
/// the map exactly as an agent does).
pub async fn follow_network(
    client: Client,
    node: String,
    data_dir: PathBuf,
    views: watch::Sender<Arc<NetworkView>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = Retry::new();
    let mut view = NetworkView::clone(&views.borrow());
    let mut resume = Resume::SNAPSHOT;
    let mut saver = Saver::new(data_dir);
    loop {
        let stream = tokio::select! {
            stream = client.network(&node, &resume) => stream,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "network stream unavailable; retrying");
                let wait = retry.next_delay(error.retry_after(), fastrand::f64());
                if pause(wait, &mut stop).await {
                    break;
                }
                continue;
            }
        };
        loop {
            let line = tokio::select! {
                line = stream.next() => Some(line),
                () = saver.due() => None,
                _ = stop.wait_for(|stop| *stop) => break,
            };
            let Some(line) = line else {
                saver.save(&view).await;
                continue;
            };
            let line = match line {
                Some(Ok(line)) => line,
                Some(Err(error)) => {
                    tracing::warn!(%error, "network stream broke; reconnecting");
                    break;
                }
                None => break,
            };
            match view.apply(line) {
                Applied::Changed => {
                    retry.reset();
                    views.send_replace(Arc::new(view.clone()));
                    saver.changed();
                }
                Applied::Unchanged => retry.reset(),
                Applied::Resnapshot => {
                    resume = Resume::SNAPSHOT;
                    break;
                }
            }
            resume = Resume {
                from: view.revision + 1,
                epoch: view.epoch.clone(),
            };
        }
        if *stop.borrow() || pause(retry.next_delay(None, fastrand::f64()), &mut stop).await {
            break;
        }
    }
    saver.save(&view).await;
}

async fn pause(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|stop| *stop) => true,
    }
}

/// Writes the cache at most every [`SAVE_EVERY`], and only after a change.
struct Saver {
    data_dir: PathBuf,
    /// A change is waiting to be written at this instant.
    due: Option<tokio::time::Instant>,
}

impl Saver {
    fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            due: None,
        }
    }

    fn changed(&mut self) {
        self.due
            .get_or_insert_with(|| tokio::time::Instant::now() + SAVE_EVERY);
    }

    /// Resolves when a write is due (never while none is).
    async fn due(&self) {
        match self.due {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    async fn save(&mut self, view: &NetworkView) {
        if self.due.take().is_none() {
            return;
        }
        let view = view.clone();
        let dir = self.data_dir.clone();
        match tokio::task::spawn_blocking(move || save(&view, &dir)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "caching the network map failed"),
            Err(error) => tracing::warn!(%error, "caching the network map did not finish"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;

    use cca_model::net::{Affinity, ServiceNet};

    use super::*;

    fn service(name: &str, vip: u8) -> NetworkChange {
        NetworkChange::Service(Arc::new(ServiceNet {
            name: name.into(),
            vip: Some(Ipv4Addr::new(10, 43, 0, vip)),
            ports: vec![],
            affinity: Affinity::None,
            endpoints: BTreeMap::new(),
            members: vec![],
            asleep: false,
            scale_to_zero: None,
        }))
    }

    #[test]
    fn lines_build_the_view_and_say_when_it_changed() {
        let mut view = NetworkView::default();
        let snapshot = NetworkLine::Snapshot {
            revision: 7,
            changes: vec![service("web", 1)],
            origin: StreamOrigin::default(),
        };
        assert_eq!(view.apply(snapshot.clone()), Applied::Changed);
        assert_eq!(view.revision, 7);
        assert_eq!(view.apply(snapshot), Applied::Unchanged);
        let changes = NetworkLine::Changes {
            revision: 9,
            changes: vec![NetworkChange::ServiceGone {
                service: "web".into(),
            }],
        };
        assert_eq!(view.apply(changes), Applied::Changed);
        assert!(view.map.services.is_empty());
        assert_eq!(view.revision, 9);
        assert_eq!(
            view.apply(NetworkLine::Compacted {
                compact_revision: 3
            }),
            Applied::Resnapshot
        );
    }

    #[test]
    fn the_cache_round_trips_and_a_bad_one_is_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut view = NetworkView::default();
        view.apply(NetworkLine::Snapshot {
            revision: 12,
            changes: vec![service("web", 1), service("db", 2)],
            origin: StreamOrigin::default(),
        });
        save(&view, dir.path()).expect("saves");
        assert_eq!(load_cached(dir.path()), Some(view));
        std::fs::write(dir.path().join(CACHE_FILE), b"{not json").expect("writes");
        assert_eq!(load_cached(dir.path()), None);
    }
}
