//! Property test: the embedded store agrees with a plain in-memory model of
//! the store's semantics under random sequences of puts, deletes, prefix
//! deletes, guarded transactions and reopens — same outcomes, same
//! revisions, same key-values, same watch events.

use std::collections::BTreeMap;
use std::sync::Arc;

use cca_store::embedded::{Config, EmbeddedStore};
use cca_store::{
    Compare, CompareOp, KeyValue, Op, RangeRequest, Revision, Store, Txn, TxnOutcome, WatchEvent,
    WatchMessage,
};
use proptest::prelude::*;

/// The specification, as simple as it can be written.
#[derive(Debug, Default)]
struct Model {
    kvs: BTreeMap<String, KeyValue>,
    revision: Revision,
    events: Vec<(Revision, Vec<WatchEvent>)>,
}

impl Model {
    fn new() -> Self {
        Self {
            revision: 1,
            ..Self::default()
        }
    }

    fn txn(&mut self, txn: &Txn) -> TxnOutcome {
        if let Some(index) = txn
            .compares
            .iter()
            .position(|compare| !compare.holds(self.kvs.get(&compare.key)))
        {
            return TxnOutcome::CompareFailed {
                index,
                revision: self.revision,
            };
        }
        let revision = self.revision + 1;
        let mut events = Vec::new();
        for op in &txn.ops {
            match op {
                Op::Put { key, value, lease } => {
                    let previous = self.kvs.get(key);
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision: previous.map_or(revision, |kv| kv.create_revision),
                        mod_revision: revision,
                        version: previous.map_or(1, |kv| kv.version + 1),
                        lease: *lease,
                    };
                    events.push(WatchEvent::Put(kv.clone()));
                    self.kvs.insert(key.clone(), kv);
                }
                Op::Delete { key } => {
                    if self.kvs.remove(key).is_some() {
                        events.push(WatchEvent::Delete {
                            key: key.clone(),
                            revision,
                        });
                    }
                }
                Op::DeletePrefix { prefix } => {
                    let doomed: Vec<String> = self
                        .kvs
                        .keys()
                        .filter(|k| k.starts_with(prefix.as_str()))
                        .cloned()
                        .collect();
                    for key in doomed {
                        self.kvs.remove(&key);
                        events.push(WatchEvent::Delete { key, revision });
                    }
                }
            }
        }
        if !events.is_empty() {
            events.sort_by(|a, b| a.key().cmp(b.key()));
            self.events.push((revision, events));
            self.revision = revision;
        }
        TxnOutcome::Committed {
            revision: self.revision,
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Txn(Txn),
    Reopen,
}

const KEYS: &[&str] = &["a", "a/1", "a/2", "b", "b/1", "c"];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS).prop_map(str::to_owned)
}

fn compare() -> impl Strategy<Value = Compare> {
    prop_oneof![
        (key(), 0..12i64).prop_map(|(k, rev)| Compare::mod_revision(k, CompareOp::Less, rev)),
        (key(), 0..12i64).prop_map(|(k, rev)| Compare::mod_revision(k, CompareOp::Equal, rev)),
        (key(), "[xy]").prop_map(|(k, v)| Compare::value(k, CompareOp::Equal, v)),
        key().prop_map(Compare::exists),
        key().prop_map(Compare::absent),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (key(), "[xy]").prop_map(|(k, v)| Op::put(k, v)),
        1 => key().prop_map(Op::delete),
        1 => prop::sample::select(&["a/", "b", "c"][..]).prop_map(Op::delete_prefix),
    ]
}

/// Txns whose ops touch distinct keys (overlapping writes are refused).
fn txn() -> impl Strategy<Value = Txn> {
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(op(), 0..4),
    )
        .prop_map(|(compares, ops)| {
            let mut chosen: Vec<Op> = Vec::new();
            for op in ops {
                let candidate = Txn {
                    compares: Vec::new(),
                    ops: chosen.iter().cloned().chain([op.clone()]).collect(),
                };
                if overlap_free(&candidate) {
                    chosen.push(op);
                }
            }
            Txn {
                compares,
                ops: chosen,
            }
        })
}

fn overlap_free(txn: &Txn) -> bool {
    let target = |op: &Op| match op {
        Op::Put { key, .. } | Op::Delete { key } => (key.clone(), false),
        Op::DeletePrefix { prefix } => (prefix.clone(), true),
    };
    txn.ops.iter().enumerate().all(|(i, a)| {
        txn.ops[i + 1..].iter().all(|b| {
            let ((ka, pa), (kb, pb)) = (target(a), target(b));
            !(ka == kb || (pa && kb.starts_with(&ka)) || (pb && ka.starts_with(&kb)))
        })
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![9 => txn().prop_map(Step::Txn), 1 => Just(Step::Reopen)]
}

async fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let open = || EmbeddedStore::open(Config::new(dir.path()));
    let mut store = Arc::new(open().await.expect("open"));
    let mut model = Model::new();
    for step in steps {
        match step {
            Step::Txn(txn) => {
                let actual = store.txn(txn.clone()).await.expect("txn");
                prop_assert_eq!(actual, model.txn(&txn));
            }
            Step::Reopen => {
                let owned = Arc::try_unwrap(store).expect("sole handle");
                owned.close().await;
                store = Arc::new(open().await.expect("reopen"));
            }
        }
        let page = store.range(RangeRequest::prefix("")).await.expect("range");
        prop_assert_eq!(page.revision, model.revision);
        prop_assert_eq!(page.kvs, model.kvs.values().cloned().collect::<Vec<_>>());
    }
    // The whole history, replayed by a watch from the start, is the model's.
    let mut watch = store.watch("", 2).await.expect("watch");
    for (revision, events) in &model.events {
        match watch.next_message().await.expect("message") {
            WatchMessage::Events {
                revision: actual,
                events: actual_events,
            } => {
                prop_assert_eq!(actual, *revision);
                prop_assert_eq!(&actual_events, events);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn embedded_store_agrees_with_the_model(steps in prop::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(run(steps))?;
    }
}
