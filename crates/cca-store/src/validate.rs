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
}
