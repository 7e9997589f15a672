//! What the control plane last asked this node to run: the assignments
//! (instance placement plus the service spec), the revision they are
//! current at, and whether they are known at all. Kept on disk so that a
//! restarted agent keeps running the same instances while the control
//! plane is unreachable, and never mistakes "nothing heard yet" for
//! "run nothing".

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use cca_model::Revision;
use cca_wire::types::{Assignment, AssignmentLine};
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
    /// By instance id.
    pub assignments: BTreeMap<String, Assignment>,
}

/// What applying a line asks of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Changed,
    /// History is gone: reconnect for a fresh snapshot.
    Resnapshot,
}

impl Desired {
    /// Applies one line of the assignment stream.
    pub fn apply(&mut self, line: AssignmentLine) -> Applied {
        match line {
            AssignmentLine::Snapshot {
                revision,
                assignments,
            } => {
                self.assignments = assignments
                    .into_iter()
                    .map(|assignment| (assignment.instance.id.clone(), assignment))
                    .collect();
                self.revision = revision;
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
        Applied::Changed
    }

    /// Where a stream that ended resumes: at the last revision applied, not
    /// after it. One revision may be many lines (placements committed
    /// together), and a stream may end between two of them (a broken
    /// connection, or a server that gave up on a slow reader); resuming
    /// after it would lose the rest for good. The server replays the whole
    /// revision, and its lines apply again without effect. 0 (a snapshot)
    /// before any line.
    pub fn resume_from(&self) -> Revision {
        self.revision
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
mod tests {
    use super::*;

    #[test]
    fn lines_apply_in_order_and_compaction_asks_for_a_snapshot() {
        let mut desired = Desired::default();
        assert!(!desired.known);
        let snapshot = AssignmentLine::Snapshot {
            revision: 5,
            assignments: Vec::new(),
        };
        assert_eq!(desired.apply(snapshot), Applied::Changed);
        assert!(desired.known);
        assert_eq!(desired.revision, 5);
        let delete = AssignmentLine::Delete {
            revision: 7,
            id: "gone".into(),
        };
        assert_eq!(desired.apply(delete), Applied::Changed);
        assert_eq!(desired.revision, 7);
        let compacted = AssignmentLine::Compacted {
            compact_revision: 9,
        };
        assert_eq!(desired.apply(compacted), Applied::Resnapshot);
    }

    fn put(revision: Revision, id: &str) -> AssignmentLine {
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
        AssignmentLine::Put {
            revision,
            assignment: Box::new(Assignment {
                instance,
                spec: None,
                secrets: Vec::new(),
                probes: Default::default(),
            }),
        }
    }

    #[test]
    fn a_stream_cut_inside_a_revision_resumes_at_that_revision() {
        let mut desired = Desired::default();
        assert_eq!(desired.resume_from(), 0, "nothing yet: a snapshot");
        desired.apply(put(6, "web-1"));
        // Revision 7 placed web-2 and web-3; the stream ended after web-2.
        desired.apply(put(7, "web-2"));
        let from = desired.resume_from();
        assert_eq!(from, 7, "web-3 is still to come");
        let replayed = [put(7, "web-2"), put(7, "web-3"), put(8, "web-4")];
        for line in replayed {
            desired.apply(line);
        }
        let ids: Vec<&str> = desired.assignments.keys().map(String::as_str).collect();
        assert_eq!(ids, ["web-1", "web-2", "web-3", "web-4"]);
        assert_eq!(desired.resume_from(), 8);
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
            assignments: BTreeMap::new(),
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
