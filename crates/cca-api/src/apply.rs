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
//! values are never program-managed). Facts of a kind this version retired
//! (`cca_model::keys::RETIRED_PREFIXES`) are deleted by any apply. Before planning, `tenancy` refuses
//! a takeover of another tenant's object and a gate host that a gate
//! outside the program serves.
//!
//! Service versions: every service spec the apply writes is also kept as a
//! version (`desired/service/{svc}/version/{hash}`, the hash the scheduler
//! stamps on the instances it places) in the same transaction, so an
//! instance placed before a rolling update keeps receiving its own spec.
//! The same transaction prunes versions no instance uses beyond the newest
//! [`KEPT_VERSIONS`] of each service (all of them once the service is
//! deleted); see [`plan_versions`] for why that never drops a version an
//! instance runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cca_control::View;
use cca_model::cluster::{EventLevel, Millis};
use cca_model::spec::{Fact, Program, ServiceSpec, ServiceVersion, spec_hash};
use cca_model::{Key, Revision, keys};
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

/// Versions of a service kept beyond those instances run (the current one
/// included). Documented in docs/api.md.
pub(crate) const KEPT_VERSIONS: usize = 10;

/// How long an apply waits for the cache to reflect what it read before
/// it plans without pruning versions (it cannot tell which are in use).
const CATCH_UP: Duration = Duration::from_secs(2);

/// The versions instances are placed with: (service, spec hash).
pub(crate) type InUse<'v> = BTreeSet<(&'v str, &'v str)>;

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
        let (current, read_at) = read_desired(store).await?;
        crate::tenancy::check_takeover(program, &current)?;
        crate::tenancy::check_hosts(program, &current, prune)?;
        // Which versions instances run, from a view that holds every
        // instance committed before the desired facts were read.
        let view = tokio::time::timeout(CATCH_UP, state.cache().view_at_least(read_at))
            .await
            .ok()
            .transpose()?;
        let in_use = view.as_deref().map(versions_in_use);
        let mut plan = plan(
            &facts,
            program,
            &current,
            in_use.as_ref(),
            prune,
            now_millis(),
        );
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
/// more than one etcd response may carry), and the revision the last page
/// was read at.
async fn read_desired(store: &dyn Store) -> ApiResult<(BTreeMap<String, KeyValue>, Revision)> {
    let mut current = BTreeMap::new();
    let mut request = RangeRequest::prefix(keys::DESIRED).limit(READ_PAGE);
    loop {
        let page = store.range(request.clone()).await?;
        current.extend(page.kvs.into_iter().map(|kv| (kv.key.clone(), kv)));
        match page.continuation {
            Some(last) => request = request.after(last),
            None => return Ok((current, page.revision)),
        }
    }
}

/// The (service, spec hash) pairs of every placed instance in `view`, and
/// of every rollout's target and previous version: the scheduler may place
/// the one, an automatic rollback or an undo may return to the other.
pub(crate) fn versions_in_use(view: &View) -> InUse<'_> {
    let placed = view
        .instances
        .values()
        .map(|instance| (instance.service.as_str(), instance.spec_hash.as_str()));
    let rolled = view.rollouts.iter().flat_map(|(service, rollout)| {
        let versions = std::iter::once(rollout.target.as_str()).chain(rollout.previous.as_deref());
        versions.map(move |version| (service.as_str(), version))
    });
    placed.chain(rolled).collect()
}

/// Compares `facts` with `current` and plans the writes. Pure. Versions
/// are pruned only when `in_use` is known.
pub(crate) fn plan(
    facts: &[Fact],
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
    in_use: Option<&InUse<'_>>,
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
        let unwanted = is_program_managed(key)
            && !wanted.contains(key.as_str())
            && ((prune && crate::tenancy::may_prune(key, current, program.tenant.as_deref()))
                || belongs_to_program(key, program));
        if unwanted || keys::is_retired(key) {
            report.deleted.push(key.clone());
            guard(&mut txn, key, Some(kv));
            txn.ops.push(Op::delete(key.clone()));
        }
    }
    plan_service_meta(&report, current, now, &mut txn);
    plan_versions(&report, program, current, in_use, now, &mut txn);
    ApplyPlan { report, txn }
}

/// Writes the version of every service spec this apply writes and prunes
/// versions. Per service, kept are: the version written, the version that
/// was current when `current` was read, the versions `in_use` names, and
/// the newest [`KEPT_VERSIONS`] (by the revision of the apply that last
/// wrote them; none once the service has no spec). The rest are deleted.
///
/// Why no version an instance runs is deleted: the scheduler places an
/// instance only with its view's current spec hash, guarded by the spec's
/// mod revision, or with its rollout's target. `in_use` comes from a view
/// at least as new as `current`, so it holds every instance committed
/// before the read. An instance committed after it carries the hash of the
/// spec current at its commit: the one read (always kept), unless the spec
/// changed after the read — and then this apply fails and is planned
/// again: it is guarded by the desired generation (every program write
/// bumps it) and, when it fits one transaction, by the spec key of every
/// service whose versions it prunes. Or it carries its rollout's target,
/// which `in_use` names, or names as the previous version of the rollout
/// that replaced it (a new rollout's previous is always the target before).
///
/// A spec written before versions existed has none: the first apply that
/// changes it records it as a version too (dated by the service's last
/// update), so the instances still running it keep receiving it.
fn plan_versions(
    report: &ApplyReport,
    program: &Program,
    current: &BTreeMap<String, KeyValue>,
    in_use: Option<&InUse<'_>>,
    now: Millis,
    txn: &mut Txn,
) {
    let spec_services = |keys: &[String]| -> BTreeSet<String> {
        keys.iter()
            .filter_map(|key| service_of_spec_key(key))
            .collect()
    };
    let mut written = spec_services(&report.created);
    written.extend(spec_services(&report.changed));
    let deleted = spec_services(&report.deleted);
    let mut held: BTreeMap<String, Vec<(String, &KeyValue)>> = BTreeMap::new();
    for (key, kv) in current {
        if let Some(Key::ServiceVersion { service, version }) = Key::parse(key) {
            held.entry(service).or_default().push((version, kv));
        }
    }
    let services: BTreeSet<&String> = written.iter().chain(held.keys()).collect();
    for service in services {
        let versions = held.get(service).map_or(&[][..], Vec::as_slice);
        let spec_key = keys::desired_service(service);
        let read_kv = current.get(&spec_key);
        let read = read_kv.and_then(|kv| serde_json::from_slice::<ServiceSpec>(&kv.value).ok());
        let read_hash = read.as_ref().map(spec_hash);
        let new_spec = written
            .contains(service)
            .then(|| program.services.get(service))
            .flatten();
        let new_hash = new_spec.map(spec_hash);
        if let (Some(spec), Some(hash)) = (new_spec, &new_hash) {
            let existing = version_of(versions, hash);
            let created_at = existing
                .and_then(|kv| serde_json::from_slice::<ServiceVersion>(&kv.value).ok())
                .map_or(now, |version| version.created_at);
            put_version(txn, service, hash, spec, created_at, now, existing);
            if let (Some(read), Some(read_hash)) = (&read, &read_hash)
                && read_hash != hash
                && version_of(versions, read_hash).is_none()
            {
                let since = current
                    .get(&keys::desired_service_meta(service))
                    .and_then(|kv| serde_json::from_slice::<ServiceMeta>(&kv.value).ok())
                    .map_or(now, |meta| meta.updated_at);
                put_version(txn, service, read_hash, read, since, since, None);
            }
        }
        let Some(in_use) = in_use else { continue };
        let has_spec =
            written.contains(service) || (read_kv.is_some() && !deleted.contains(service));
        let budget = if has_spec { KEPT_VERSIONS } else { 0 };
        let mut ranked: Vec<(&str, Revision)> = versions
            .iter()
            .map(|(hash, kv)| (hash.as_str(), kv.mod_revision))
            .collect();
        // Newest first; the version written now and the one it replaces
        // rank above every other.
        let first = [new_hash.as_deref(), read_hash.as_deref()];
        ranked.retain(|(hash, _)| !first.contains(&Some(*hash)));
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut order: Vec<&str> = first.iter().flatten().copied().collect();
        order.dedup();
        order.extend(ranked.iter().map(|(hash, _)| *hash));
        let mut keep: BTreeSet<&str> = order.iter().take(budget).copied().collect();
        keep.extend(first.iter().flatten().copied());
        let mut pruned = false;
        for (hash, kv) in versions {
            if keep.contains(hash.as_str()) || in_use.contains(&(service.as_str(), hash.as_str())) {
                continue;
            }
            guard(txn, &kv.key, Some(kv));
            txn.ops.push(Op::delete(kv.key.clone()));
            pruned = true;
        }
        if pruned && !written.contains(service) && !deleted.contains(service) {
            guard(txn, &spec_key, read_kv);
        }
    }
}

/// The version of `hash` among a service's `versions`, as read.
fn version_of<'a>(versions: &[(String, &'a KeyValue)], hash: &str) -> Option<&'a KeyValue> {
    versions
        .iter()
        .find(|(held, _)| held == hash)
        .map(|(_, kv)| *kv)
}

/// Puts the version `hash` of `service`, guarded on `existing`.
fn put_version(
    txn: &mut Txn,
    service: &str,
    hash: &str,
    spec: &ServiceSpec,
    created_at: Millis,
    applied_at: Millis,
    existing: Option<&KeyValue>,
) {
    let key = keys::desired_service_version(service, hash);
    guard(txn, &key, existing);
    let version = ServiceVersion {
        spec: spec.clone(),
        created_at,
        applied_at,
    };
    txn.ops.push(Op::put(key, encode(&version)));
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
        // Its rollout's pause or undo goes with it: a service applied
        // again later starts afresh.
        for key in [
            keys::desired_service_meta(&service),
            keys::desired_rollout(&service),
        ] {
            if let Some(kv) = current.get(&key) {
                guard(txn, &key, Some(kv));
                txn.ops.push(Op::delete(key));
            }
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
        let kept = plan(&[], &Program::default(), &current, None, false, 0);
        assert!(kept.report.is_empty());
        let pruned = plan(&[], &Program::default(), &current, None, true, 0);
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
        let pruned = plan(&[], &Program::default(), &current, None, true, 0);
        assert!(pruned.report.is_empty());
        assert!(pruned.txn.ops.is_empty());
    }

    #[test]
    fn any_apply_deletes_retired_group_facts() {
        let group = br#"{"name":"pair","services":["a","b"],"tenant":"t"}"#;
        let current = BTreeMap::from([
            kv("desired/group/pair", group, 5),
            kv("desired/connection/db", b"{}", 3),
        ]);
        let planned = plan(&[], &Program::default(), &current, None, false, 0);
        assert_eq!(planned.report.deleted, ["desired/group/pair"]);
        assert_eq!(
            planned.txn.compares,
            [Compare::mod_revision(
                "desired/group/pair",
                CompareOp::Equal,
                5
            )]
        );
    }

    #[test]
    fn unchanged_facts_are_counted_not_written() {
        let current = BTreeMap::from([kv("desired/gate/g", b"1", 4)]);
        let facts = [fact("desired/gate/g", b"1"), fact("desired/gate/h", b"2")];
        let planned = plan(&facts, &Program::default(), &current, None, false, 0);
        assert_eq!(planned.report.unchanged, 1);
        assert_eq!(planned.report.created, ["desired/gate/h"]);
        assert_eq!(planned.txn.ops.len(), 1);
    }
}
