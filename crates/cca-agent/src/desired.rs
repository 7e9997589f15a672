//! What the control plane last asked this node to run: the assignments
//! (instance placement plus the service spec), the revision they are
//! current at, and whether they are known at all. Kept on disk so that a
//! restarted agent keeps running the same instances while the control
//! plane is unreachable, and never mistakes "nothing heard yet" for
//! "run nothing".
//!
//! A snapshot from another store (its identity differs) or from this store
//! rewound (its revision is behind one this node saw) is a resync: the
//! assignments it lacks are not stopped at once but kept as *unclaimed*,
//! offered to the scheduler for adoption (see [`cca_model::recovery`]);
//! the supervisor stops the ones nobody claims.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use cca_model::Revision;
use cca_model::cluster::Millis;
use cca_wire::types::{Assignment, AssignmentLine, Resume, StreamOrigin};
use serde::{Deserialize, Serialize};

use crate::error::AgentError;

/// The file the desired state is cached in, inside the agent's data dir.
pub const FILE_NAME: &str = "desired.json";

/// The node's assignments at a revision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// The revision of the last assignment line applied (0: none yet).
    pub revision: Revision,
    /// True once a full snapshot has been received (now or in an earlier
    /// run): only then may instances that nothing claims be removed.
    pub known: bool,
    /// The store and stream epoch of the last snapshot.
    #[serde(default)]
    pub origin: StreamOrigin,
    /// By instance id.
    pub assignments: BTreeMap<String, Assignment>,
    /// Assignments of a store this node no longer follows, by instance id:
    /// kept running until adopted or given up (see the module doc).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unclaimed: BTreeMap<String, UnclaimedRun>,
}

/// An instance the node ran for a store it no longer follows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnclaimedRun {
    pub assignment: Assignment,
    /// When the resync found it unclaimed.
    pub since: Millis,
}

/// An unclaimed entry is forgotten this long after the resync that made
/// it (the supervisor gives up on it far sooner; this only bounds the file).
const UNCLAIMED_FORGOTTEN_AFTER: Millis = 24 * 3600 * 1000;

/// What applying a line asks of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Changed,
    /// History is gone: reconnect for a fresh snapshot.
    Resnapshot,
}

impl Desired {
    /// Applies one line of the assignment stream, received at `now`.
    pub fn apply(&mut self, line: AssignmentLine, now: Millis) -> Applied {
        match line {
            AssignmentLine::Snapshot {
                revision,
                assignments,
                origin,
            } => {
                let resync = self.resync_reason(&origin, revision);
                let previous = std::mem::take(&mut self.assignments);
                self.assignments = assignments
                    .into_iter()
                    .map(|assignment| (assignment.instance.id.clone(), assignment))
                    .collect();
                if let Some(reason) = resync {
                    tracing::warn!(
                        %reason,
                        "resyncing from scratch: instances the store does not place here keep running, offered for adoption"
                    );
                    for (id, assignment) in previous {
                        if !self.assignments.contains_key(&id) {
                            self.unclaimed.entry(id).or_insert(UnclaimedRun {
                                assignment,
                                since: now,
                            });
                        }
                    }
                }
                self.revision = revision;
                self.origin = origin;
                self.known = true;
            }
            AssignmentLine::Put {
                revision,
                assignment,
            } => {
                self.assignments
                    .insert(assignment.instance.id.clone(), *assignment);
                self.revision = self.revision.max(revision);
            }
            AssignmentLine::Delete { revision, id } => {
                self.assignments.remove(&id);
                self.revision = self.revision.max(revision);
            }
            AssignmentLine::Compacted { .. } => return Applied::Resnapshot,
        }
        let assignments = &self.assignments;
        self.unclaimed.retain(|id, run| {
            !assignments.contains_key(id)
                && now.saturating_sub(run.since) < UNCLAIMED_FORGOTTEN_AFTER
        });
        Applied::Changed
    }

    /// Why a snapshot of `origin` at `revision` is a resync rather than a
    /// fresh look at the same history, if it is: another store, or this
    /// one behind what the node already saw.
    fn resync_reason(&self, origin: &StreamOrigin, revision: Revision) -> Option<String> {
        if !self.known {
            return None;
        }
        let (was, now) = (&self.origin.store, &origin.store);
        if !was.is_empty() && !now.is_empty() && was != now {
            return Some(format!(
                "the store's identity changed from {was} to {now} (a new or restored store)"
            ));
        }
        (revision < self.revision).then(|| {
            format!(
                "the store is at revision {revision}, behind revision {} this node saw (it went back in time)",
                self.revision
            )
        })
    }

    /// Where a stream that ended resumes: at the last revision applied, not
    /// after it. One revision may be many lines (placements committed
    /// together), and a stream may end between two of them (a broken
    /// connection, or a server that gave up on a slow reader); resuming
    /// after it would lose the rest for good. The server replays the whole
    /// revision, and its lines apply again without effect. 0 (a snapshot)
    /// before any line.
    pub fn resume(&self) -> Resume {
        Resume {
            from: self.revision,
            epoch: self.origin.epoch.clone(),
        }
    }

    /// Loads the cached state; a missing file is an empty, unknown state.
    pub fn load(dir: &Path) -> Result<Self, AgentError> {
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| AgentError::Cache {
                path,
                problem: format!(
                    "does not decode ({err}); remove it to start from the control plane's state"
                ),
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(err) => Err(AgentError::Cache {
                path,
                problem: err.to_string(),
            }),
        }
    }

    /// Writes the state atomically (temp file, fsync, rename).
    pub fn save(&self, dir: &Path) -> Result<(), AgentError> {
        let path = dir.join(FILE_NAME);
        let temporary: PathBuf = dir.join(format!("{FILE_NAME}.tmp"));
        let fail = |err: std::io::Error| AgentError::Cache {
            path: path.clone(),
            problem: err.to_string(),
        };
        let bytes = serde_json::to_vec(self).map_err(|err| AgentError::Cache {
            path: path.clone(),
            problem: err.to_string(),
        })?;
        let mut file = std::fs::File::create(&temporary).map_err(fail)?;
        file.write_all(&bytes).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&temporary, &path).map_err(fail)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn lines_apply_in_order_and_compaction_asks_for_a_snapshot() {
        let mut desired = Desired::default();
        assert!(!desired.known);
        let snapshot = snapshot(5, "s1", &[]);
        assert_eq!(desired.apply(snapshot, NOW), Applied::Changed);
        assert!(desired.known);
        assert_eq!(desired.revision, 5);
        let delete = AssignmentLine::Delete {
            revision: 7,
            id: "gone".into(),
        };
        assert_eq!(desired.apply(delete, NOW), Applied::Changed);
        assert_eq!(desired.revision, 7);
        let compacted = AssignmentLine::Compacted {
            compact_revision: 9,
        };
        assert_eq!(desired.apply(compacted, NOW), Applied::Resnapshot);
    }

    const NOW: Millis = 1_000_000;

    fn snapshot(revision: Revision, store: &str, ids: &[&str]) -> AssignmentLine {
        AssignmentLine::Snapshot {
            revision,
            assignments: ids.iter().map(|id| assignment(id)).collect(),
            origin: StreamOrigin {
                store: store.into(),
                epoch: "e1".into(),
            },
        }
    }

    fn put(revision: Revision, id: &str) -> AssignmentLine {
        AssignmentLine::Put {
            revision,
            assignment: Box::new(assignment(id)),
        }
    }

    /// An assignment of an instance `id` of `web` on `n1`.
    pub(crate) fn assignment(id: &str) -> Assignment {
        let instance = cca_model::cluster::Instance {
            id: id.into(),
            service: "web".into(),
            node: "n1".into(),
            ordinal: None,
            spec_hash: String::new(),
            cpu: cca_model::spec::Cpu(100),
            memory: cca_model::spec::Memory(1 << 20),
            host_ports: BTreeMap::new(),
            created_at: 0,
            stopping: false,
            replaces: None,
            failures: Vec::new(),
            resized: None,
        };
        Assignment {
            instance,
            spec: None,
            secrets: Vec::new(),
            probes: Default::default(),
        }
    }

    #[test]
    fn a_stream_cut_inside_a_revision_resumes_at_that_revision() {
        let mut desired = Desired::default();
        assert_eq!(
            desired.resume(),
            Resume::SNAPSHOT,
            "nothing yet: a snapshot"
        );
        desired.apply(snapshot(5, "s1", &[]), NOW);
        desired.apply(put(6, "web-1"), NOW);
        // Revision 7 placed web-2 and web-3; the stream ended after web-2.
        desired.apply(put(7, "web-2"), NOW);
        let resume = desired.resume();
        assert_eq!(resume.from, 7, "web-3 is still to come");
        assert_eq!(resume.epoch, "e1", "in the snapshot's epoch");
        let replayed = [put(7, "web-2"), put(7, "web-3"), put(8, "web-4")];
        for line in replayed {
            desired.apply(line, NOW);
        }
        let ids: Vec<&str> = desired.assignments.keys().map(String::as_str).collect();
        assert_eq!(ids, ["web-1", "web-2", "web-3", "web-4"]);
        assert_eq!(desired.resume().from, 8);
    }

    /// A snapshot of the same store at or past what the node saw is a
    /// fresh look: what it lacks was deleted meanwhile, and stops.
    #[test]
    fn a_snapshot_of_the_same_history_leaves_nothing_unclaimed() {
        let mut desired = Desired::default();
        desired.apply(snapshot(5, "s1", &["web-1", "web-2"]), NOW);
        desired.apply(snapshot(9, "s1", &["web-1"]), NOW);
        assert!(desired.unclaimed.is_empty());
        assert_eq!(desired.assignments.len(), 1);
    }

    /// Another store's snapshot, or this store's behind what the node saw,
    /// is a resync: what it lacks is kept unclaimed, and a later placement
    /// of the same id claims it.
    #[test]
    fn a_snapshot_of_another_store_or_a_rewound_one_keeps_the_rest_unclaimed() {
        for (store, revision) in [("s2", 50), ("s1", 3)] {
            let mut desired = Desired::default();
            desired.apply(snapshot(5, "s1", &["web-1", "web-2"]), NOW);
            desired.apply(put(8, "web-3"), NOW);
            desired.apply(snapshot(revision, store, &["web-1"]), NOW + 1);
            let unclaimed: Vec<&str> = desired.unclaimed.keys().map(String::as_str).collect();
            assert_eq!(unclaimed, ["web-2", "web-3"], "{store}@{revision}");
            assert_eq!(desired.unclaimed["web-2"].since, NOW + 1);
            assert_eq!(desired.revision, revision);
            desired.apply(put(revision + 1, "web-3"), NOW + 2);
            let unclaimed: Vec<&str> = desired.unclaimed.keys().map(String::as_str).collect();
            assert_eq!(unclaimed, ["web-2"], "web-3 was claimed");
            desired.apply(
                put(revision + 2, "web-4"),
                NOW + UNCLAIMED_FORGOTTEN_AFTER + 1,
            );
            assert!(desired.unclaimed.is_empty(), "forgotten in the end");
        }
    }

    /// The first snapshot a node ever sees is no resync, whatever it says.
    #[test]
    fn the_first_snapshot_is_no_resync() {
        let mut desired = Desired {
            assignments: BTreeMap::from([("web-1".to_owned(), assignment("web-1"))]),
            ..Desired::default()
        };
        desired.apply(snapshot(5, "s1", &[]), NOW);
        assert!(desired.unclaimed.is_empty());
    }

    #[test]
    fn the_cache_round_trips_and_a_damaged_one_is_refused_with_its_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            Desired::load(dir.path()).expect("missing is empty"),
            Desired::default()
        );
        let desired = Desired {
            revision: 3,
            known: true,
            ..Desired::default()
        };
        desired.save(dir.path()).expect("save");
        assert_eq!(Desired::load(dir.path()).expect("load"), desired);
        std::fs::write(dir.path().join(FILE_NAME), b"{not json").expect("damage");
        let err = Desired::load(dir.path()).expect_err("damaged");
        let message = err.to_string();
        assert!(
            message.contains(FILE_NAME) && message.contains("remove it"),
            "{message}"
        );
    }
}
