//! Request checks shared by both backends, so that a request refused by one
//! is refused by the other with the same message.

use crate::error::{Result, StoreError};
use crate::types::{MAX_KEY_BYTES, MAX_VALUE_BYTES, Op, Txn};

pub(crate) fn key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(StoreError::InvalidRequest("empty key".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(StoreError::InvalidRequest(format!(
            "key of {} bytes starting `{}` exceeds the limit of {MAX_KEY_BYTES} bytes",
            key.len(),
            key.chars().take(40).collect::<String>()
        )));
    }
    Ok(())
}

pub(crate) fn txn(txn: &Txn) -> Result<()> {
    for compare in &txn.compares {
        key(&compare.key)?;
    }
    for op in &txn.ops {
        match op {
            Op::Put { key: k, value, .. } => {
                key(k)?;
                if value.len() > MAX_VALUE_BYTES {
                    return Err(StoreError::InvalidRequest(format!(
                        "value for key `{k}` is {} bytes; the limit is {MAX_VALUE_BYTES} bytes",
                        value.len()
                    )));
                }
            }
            Op::Delete { key: k } => key(k)?,
            Op::DeletePrefix { prefix } if prefix.is_empty() => {
                return Err(StoreError::InvalidRequest(
                    "delete of the empty prefix (every key) is refused".into(),
                ));
            }
            Op::DeletePrefix { prefix } => key(prefix)?,
        }
    }
    no_overlapping_writes(&txn.ops)
}

/// One txn writes each key at most once (etcd refuses the same): otherwise
/// which write wins would depend on op order and watchers would see a key
/// twice in one revision. Sorted, so that the scheduler's transactions of
/// thousands of placements cost O(n log n), not a comparison (and two key
/// copies) per pair: in key order, a key equal to another or under a
/// deleted prefix sorts right after it.
fn no_overlapping_writes(ops: &[Op]) -> Result<()> {
    let mut targets: Vec<(&str, bool)> = ops
        .iter()
        .map(|op| match op {
            Op::Put { key, .. } | Op::Delete { key } => (key.as_str(), false),
            Op::DeletePrefix { prefix } => (prefix.as_str(), true),
        })
        .collect();
    targets.sort_unstable();
    for pair in targets.windows(2) {
        let [(key, is_prefix), (other_key, _)] = pair else {
            continue;
        };
        if key == other_key || (*is_prefix && other_key.starts_with(key)) {
            return Err(StoreError::InvalidRequest(format!(
                "transaction writes `{key}` and `{other_key}`, which overlap; write each key once per transaction"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_and_empty_requests_name_the_problem() {
        let big = Txn::new().then(Op::put("k", vec![0u8; MAX_VALUE_BYTES + 1]));
        let err = txn(&big).expect_err("too big");
        assert!(err.to_string().contains("value for key `k` is"), "{err}");
        let wipe = Txn::new().then(Op::delete_prefix(""));
        assert!(txn(&wipe).is_err());
        assert!(key("").is_err());
        assert!(txn(&Txn::new().then(Op::put("k", vec![0u8; MAX_VALUE_BYTES]))).is_ok());
    }

    #[test]
    fn overlapping_writes_in_one_txn_are_refused() {
        let twice = Txn::new().then(Op::put("a", "1")).then(Op::delete("a"));
        let err = txn(&twice).expect_err("same key twice");
        assert!(
            err.to_string().contains("`a` and `a`, which overlap"),
            "{err}"
        );
        let under = Txn::new()
            .then(Op::delete_prefix("dir/"))
            .then(Op::put("dir/x", "1"));
        assert!(txn(&under).is_err());
        let apart = Txn::new()
            .then(Op::delete_prefix("dir/"))
            .then(Op::put("dis", "1"));
        assert!(txn(&apart).is_ok());
    }
}
