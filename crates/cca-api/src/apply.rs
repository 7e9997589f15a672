//! `apply` and `diff`: compare a program's facts with the desired facts in
//! the store and write the difference all or nothing (one transaction when
//! it fits, else a staged commit: see [`crate::staged`]), guarded by the
//! generation of the program facts it was planned on (re-planned on
//! conflict, never half applied).
//!
//! Semantics: every object of the program is upserted; sub-facts (tags,
//! secret grants) of the program's services that the program no longer
//! has are deleted; objects the program does not mention are left alone,
//! unless `prune` is set, in which case every program-managed fact the
//! program does not have is deleted (operator node controls and secret
//! values are never program-managed).

use std::collections::{BTreeMap, BTreeSet};

use cca_model::cluster::{EventLevel, Millis};
use cca_model::spec::{Fact, Program};
use cca_model::{Key, keys};
use cca_store::{Compare, CompareOp, KeyValue, Op, RangeRequest, Store, Txn};

use crate::error::{ApiError, ApiResult};
use crate::staged::{self, Committed, Generation};
use crate::state::{ApiState, encode, now_millis};
use crate::types::ApplyReport;
use crate::validate::check_program;

/// How many times a conflicting apply is re-planned before giving up.
const ATTEMPTS: usize = 5;

/// Desired facts per page while reading them.
const READ_PAGE: usize = 2_000;

pub(crate) use cca_model::cluster::ServiceMeta;

/// A planned apply: the report and the transaction that makes it true.
#[derive(Debug)]
pub(crate) struct ApplyPlan {
    pub(crate) report: ApplyReport,
    pub(crate) txn: Txn,
}

/// Applies (or with `dry_run`, only diffs) `program` against the store.
pub(crate) async fn apply_program(
    state: &ApiState,
    program: &Program,
    prune: bool,
    dry_run: bool,
) -> ApiResult<ApplyReport> {
    check_program(program)?;
    let facts = program
        .facts()
        .map_err(|error| ApiError::invalid(error.to_string()))?;
    let store = state.store();
    if !dry_run {
        staged::settle_and_tidy(store).await?;
    }
    for _ in 0..ATTEMPTS {
        let generation = Generation::read(store).await?;
        let current = read_desired(store).await?;
        let mut plan = plan(&facts, program, &current, prune, now_millis());
        plan.report.dry_run = dry_run;
        if dry_run || plan.report.is_empty() {
            return Ok(plan.report);
        }
        let event = state.event_op(EventLevel::Info, "apply", summarize(&plan.report));
        let Txn { compares, ops } = plan.txn;
        match staged::commit(store, &generation, compares, ops, vec![event]).await? {
            Committed::At(revision) => {
                plan.report.revision = Some(revision);
                return Ok(plan.report);
            }
            Committed::Conflict => continue,
        }
    }
    Err(ApiError::conflict(
        "desired facts kept changing while applying; nothing was written, retry",
    ))
}

/// Every desired fact, read in pages (a program of 10,000 services is
/// more than one etcd response may carry).
async fn read_desired(store: &dyn Store) -> ApiResult<BTreeMap<String, KeyValue>> {
    let mut current = BTreeMap::new();
    let mut request = RangeRequest::prefix(keys::DESIRED).limit(READ_PAGE);
    loop {
        let page = store.range(request.clone()).await?;
        current.extend(page.kvs.into_iter().map(|kv| (kv.key.clone(), kv)));
        match page.continuation {
            Some(last) => request = request.after(last),
            None => return Ok(current),
        }
    }
}

/// Compares `facts` with `current` and plans the writes. Pure.
pub(crate) fn plan(
    facts: &[Fact],
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
    prune: bool,
    now: Millis,
) -> ApplyPlan {
    let mut report = ApplyReport::default();
    let mut txn = Txn::new();
    let wanted: BTreeSet<&str> = facts.iter().map(|fact| fact.key.as_str()).collect();
    for fact in facts {
        let existing = current.get(&fact.key);
        match existing {
            None => report.created.push(fact.key.clone()),
            Some(kv) if kv.value != fact.value => report.changed.push(fact.key.clone()),
            Some(_) => {
                report.unchanged += 1;
                continue;
            }
        }
        guard(&mut txn, &fact.key, existing);
        txn.ops.push(Op::put(fact.key.clone(), fact.value.clone()));
    }
    for (key, kv) in current {
        if is_program_managed(key)
            && !wanted.contains(key.as_str())
            && (prune || belongs_to_program(key, program))
        {
            report.deleted.push(key.clone());
            guard(&mut txn, key, Some(kv));
            txn.ops.push(Op::delete(key.clone()));
        }
    }
    plan_service_meta(&report, current, now, &mut txn);
    ApplyPlan { report, txn }
}

/// Records when each created or changed service was applied, and forgets
/// deleted ones.
fn plan_service_meta(
    report: &ApplyReport,
    current: &BTreeMap<String, KeyValue>,
    now: Millis,
    txn: &mut Txn,
) {
    let written = report.created.iter().chain(&report.changed);
    for service in written.filter_map(|key| service_of_spec_key(key)) {
        let key = keys::desired_service_meta(&service);
        let existing = current.get(&key);
        let created_at = existing
            .and_then(|kv| serde_json::from_slice::<ServiceMeta>(&kv.value).ok())
            .map_or(now, |meta| meta.created_at);
        guard(txn, &key, existing);
        let meta = ServiceMeta {
            created_at,
            updated_at: now,
        };
        txn.ops.push(Op::put(key, encode(&meta)));
    }
    for service in report
        .deleted
        .iter()
        .filter_map(|key| service_of_spec_key(key))
    {
        let key = keys::desired_service_meta(&service);
        if let Some(kv) = current.get(&key) {
            guard(txn, &key, Some(kv));
            txn.ops.push(Op::delete(key));
        }
    }
}

/// The transaction only applies if `key` is still as it was read.
fn guard(txn: &mut Txn, key: &str, read: Option<&KeyValue>) {
    let revision = read.map_or(0, |kv| kv.mod_revision);
    txn.compares
        .push(Compare::mod_revision(key, CompareOp::Equal, revision));
}

/// True for the kinds of fact that programs manage (the fact table's
/// `applied` column).
fn is_program_managed(key: &str) -> bool {
    Key::parse(key).is_some_and(|key| key.kind().info().applied)
}

/// True for sub-facts (tags, grants) of a service the program defines.
fn belongs_to_program(key: &str, program: &Program) -> bool {
    match Key::parse(key) {
        Some(Key::ServiceTag { service, .. } | Key::ServiceGrant { service, .. }) => {
            program.services.contains_key(&service)
        }
        _ => false,
    }
}

/// `desired/service/{svc}` → `svc` (not for sub-facts).
fn service_of_spec_key(key: &str) -> Option<String> {
    match Key::parse(key) {
        Some(Key::Service { service }) => Some(service),
        _ => None,
    }
}

fn summarize(report: &ApplyReport) -> String {
    format!(
        "applied: {} created, {} changed, {} deleted",
        report.created.len(),
        report.changed.len(),
        report.deleted.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &[u8], mod_revision: i64) -> (String, KeyValue) {
        let kv = KeyValue {
            key: key.into(),
            value: value.to_vec(),
            create_revision: mod_revision,
            mod_revision,
            version: 1,
            lease: None,
        };
        (key.into(), kv)
    }

    fn fact(key: &str, value: &[u8]) -> Fact {
        Fact {
            key: key.into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn connections_not_in_the_program_stay_unless_pruned() {
        let current = BTreeMap::from([kv("desired/connection/db", b"{}", 3)]);
        let kept = plan(&[], &Program::default(), &current, false, 0);
        assert!(kept.report.is_empty());
        let pruned = plan(&[], &Program::default(), &current, true, 0);
        assert_eq!(pruned.report.deleted, ["desired/connection/db"]);
        assert_eq!(
            pruned.txn.compares,
            [Compare::mod_revision(
                "desired/connection/db",
                CompareOp::Equal,
                3
            )]
        );
    }

    #[test]
    fn node_controls_and_secret_values_are_never_pruned() {
        let current = BTreeMap::from([
            kv("desired/node/n1", b"{}", 2),
            kv("desired/secret/db", b"x", 2),
        ]);
        let pruned = plan(&[], &Program::default(), &current, true, 0);
        assert!(pruned.report.is_empty());
        assert!(pruned.txn.ops.is_empty());
    }

    #[test]
    fn unchanged_facts_are_counted_not_written() {
        let current = BTreeMap::from([kv("desired/gate/g", b"1", 4)]);
        let facts = [fact("desired/gate/g", b"1"), fact("desired/gate/h", b"2")];
        let planned = plan(&facts, &Program::default(), &current, false, 0);
        assert_eq!(planned.report.unchanged, 1);
        assert_eq!(planned.report.created, ["desired/gate/h"]);
        assert_eq!(planned.txn.ops.len(), 1);
    }
}
