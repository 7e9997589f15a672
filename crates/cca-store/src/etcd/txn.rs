//! Our transactions in etcd's terms. etcd says only *that* a compare
//! failed; we report *which*: the failure branch reads every compared key,
//! at the very revision the compares were evaluated at, and the compares
//! are re-evaluated here on what it read. `Exists`/`Absent` become compares
//! on the create revision (0 for an absent key). Ops map one to one: the
//! shared validation already refuses what etcd would (a key written twice).

use std::collections::{BTreeSet, HashMap};

use etcd_client::{
    Compare as EtcdCompare, CompareOp as EtcdCompareOp, DeleteOptions, PutOptions, Txn as EtcdTxn,
    TxnOp, TxnOpResponse, TxnResponse,
};

use super::EtcdStore;
use super::client::Resend;
use super::errors::{classify, message, server_said};
use super::keys::Namespace;
use crate::error::{Result, StoreError};
use crate::types::{Compare, CompareOp, CompareTarget, KeyValue, LeaseId, Op, Txn, TxnOutcome};

impl EtcdStore {
    /// Sends a transaction once — resent only when it surely was not
    /// applied — and reads etcd's answer.
    pub(super) async fn apply(&self, request: EtcdRequest) -> Result<TxnOutcome> {
        let paced = self.writes.enter().await;
        let slot = self.kv_slot().await?;
        let answer = self
            .members
            .call("transaction", Resend::OnlyIfNotApplied, |member, _| {
                let mut kv = member.kv.clone();
                let etcd_txn = request.request.clone();
                async move {
                    match kv.txn(etcd_txn).await {
                        Ok(response) => Ok(Some(response)),
                        // etcd does not say which lease; looked up below.
                        Err(err) if server_said(&err, message::LEASE_NOT_FOUND) => Ok(None),
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await;
        // Free the slots first: looking up a missing lease reads again.
        // Every ending tells the window something: an answer its latency,
        // a timeout that etcd is behind.
        drop(slot);
        paced.answered();
        match answer? {
            Some(response) => request.outcome(&self.ns, &response),
            None => Err(StoreError::LeaseNotFound(
                self.missing_lease(&request.leases).await?,
            )),
        }
    }
}

/// A transaction ready to send, with what is needed to read the answer.
#[derive(Clone, Debug)]
pub(super) struct EtcdRequest {
    request: EtcdTxn,
    compares: Vec<Compare>,
    /// The keys the failure branch reads, in the order it reads them.
    compared_keys: Vec<String>,
    /// The leases the puts attach keys to, each once.
    leases: Vec<LeaseId>,
}

impl EtcdRequest {
    pub(super) fn new(ns: &Namespace, txn: &Txn) -> Self {
        let compared_keys: Vec<String> = txn
            .compares
            .iter()
            .map(|compare| compare.key.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let request = EtcdTxn::new()
            .when(
                txn.compares
                    .iter()
                    .map(|c| compare(ns, c))
                    .collect::<Vec<_>>(),
            )
            .and_then(txn.ops.iter().map(|op| op_of(ns, op)).collect::<Vec<_>>())
            .or_else(
                compared_keys
                    .iter()
                    .map(|key| TxnOp::get(ns.key(key), None))
                    .collect::<Vec<_>>(),
            );
        Self {
            request,
            compares: txn.compares.clone(),
            compared_keys,
            leases: leases(txn),
        }
    }

    /// Our outcome for etcd's answer.
    pub(super) fn outcome(&self, ns: &Namespace, response: &TxnResponse) -> Result<TxnOutcome> {
        let revision = response
            .header()
            .map(|header| header.revision())
            .ok_or_else(|| StoreError::Backend("etcd txn response has no header".into()))?;
        if response.succeeded() {
            return Ok(TxnOutcome::Committed { revision });
        }
        let current = self.compared_values(ns, response)?;
        let index = first_failing(&self.compares, &current).ok_or_else(|| {
            StoreError::Backend(format!(
                "etcd reported a failed compare, yet every compare holds for the keys it \
                 returned at revision {revision}"
            ))
        })?;
        Ok(TxnOutcome::CompareFailed { index, revision })
    }

    /// The compared keys as the failure branch read them.
    fn compared_values(
        &self,
        ns: &Namespace,
        response: &TxnResponse,
    ) -> Result<HashMap<String, Option<KeyValue>>> {
        let reads = response.op_responses();
        if reads.len() != self.compared_keys.len() {
            return Err(StoreError::Backend(format!(
                "etcd answered {} reads for {} compared keys",
                reads.len(),
                self.compared_keys.len()
            )));
        }
        let mut values = HashMap::with_capacity(reads.len());
        for (key, read) in self.compared_keys.iter().zip(reads) {
            let TxnOpResponse::Get(read) = read else {
                return Err(StoreError::Backend(format!(
                    "etcd answered a read of `{key}` with something else"
                )));
            };
            let kv = read.kvs().first().map(|kv| ns.key_value(kv)).transpose()?;
            values.insert(key.clone(), kv);
        }
        Ok(values)
    }
}

/// The leases a transaction attaches keys to, each once.
fn leases(txn: &Txn) -> Vec<LeaseId> {
    let mut leases = Vec::new();
    for op in &txn.ops {
        if let Op::Put {
            lease: Some(id), ..
        } = op
            && !leases.contains(id)
        {
            leases.push(*id);
        }
    }
    leases
}

/// The index of the first compare that does not hold for `current`.
fn first_failing(
    compares: &[Compare],
    current: &HashMap<String, Option<KeyValue>>,
) -> Option<usize> {
    compares
        .iter()
        .position(|compare| !compare.holds(current.get(&compare.key).and_then(Option::as_ref)))
}

fn compare(ns: &Namespace, compare: &Compare) -> EtcdCompare {
    let key = ns.key(&compare.key);
    match &compare.target {
        // An absent key has mod revision 0 in etcd too.
        CompareTarget::ModRevision(op, revision) => {
            EtcdCompare::mod_revision(key, compare_op(*op), *revision)
        }
        // etcd fails a value compare on an absent key, as we do.
        CompareTarget::Value(op, value) => EtcdCompare::value(key, compare_op(*op), value.clone()),
        CompareTarget::Exists => EtcdCompare::create_revision(key, EtcdCompareOp::Greater, 0),
        CompareTarget::Absent => EtcdCompare::create_revision(key, EtcdCompareOp::Equal, 0),
    }
}

fn compare_op(op: CompareOp) -> EtcdCompareOp {
    match op {
        CompareOp::Equal => EtcdCompareOp::Equal,
        CompareOp::NotEqual => EtcdCompareOp::NotEqual,
        CompareOp::Less => EtcdCompareOp::Less,
        CompareOp::Greater => EtcdCompareOp::Greater,
    }
}

fn op_of(ns: &Namespace, op: &Op) -> TxnOp {
    match op {
        Op::Put { key, value, lease } => {
            let options = lease.map(|id| PutOptions::new().with_lease(id));
            TxnOp::put(ns.key(key), value.clone(), options)
        }
        Op::Delete { key } => TxnOp::delete(ns.key(key), None),
        Op::DeletePrefix { prefix } => {
            let (start, end) = ns.prefix_range(prefix);
            TxnOp::delete(start, Some(DeleteOptions::new().with_range(end)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_branch_reads_each_compared_key_once() {
        let txn = Txn::new()
            .when(Compare::exists("b"))
            .when(Compare::absent("a"))
            .when(Compare::value("b", CompareOp::Equal, "x"));
        let request = EtcdRequest::new(&Namespace::new("n/"), &txn);
        assert_eq!(request.compared_keys, ["a", "b"]);
    }

    #[test]
    fn the_first_compare_that_does_not_hold_is_named() {
        let kv = KeyValue {
            key: "b".into(),
            value: b"y".to_vec(),
            create_revision: 2,
            mod_revision: 3,
            version: 2,
            lease: None,
        };
        let current = HashMap::from([("a".to_owned(), None), ("b".to_owned(), Some(kv))]);
        let compares = [
            Compare::absent("a"),
            Compare::mod_revision("b", CompareOp::Equal, 3),
            Compare::value("a", CompareOp::NotEqual, "x"),
            Compare::value("b", CompareOp::Equal, "x"),
        ];
        assert_eq!(
            first_failing(&compares, &current),
            Some(2),
            "a value compare on an absent key fails"
        );
        assert_eq!(first_failing(&compares[..2], &current), None);
    }
}
