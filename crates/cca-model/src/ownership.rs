//! The ownership table: every key prefix has exactly one writer. The control
//! plane's runner checks each controller's writes against this table before
//! committing, which is what lets controllers run without locks.

use crate::keys;

/// Who may write a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The API server on behalf of a user (`cca apply`, `scale`, `delete`).
    Api,
    /// A named controller (for example `"instance"`, `"scheduler"`).
    Controller(&'static str),
    /// The agent of one node: only keys about that node or its instances.
    Agent,
    /// The server's own bookkeeping (leader election, schema).
    Server,
}

/// A write that falls outside every owned prefix, or into another owner's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OwnershipError {
    #[error("key `{key}` is outside the key layout: no component owns it")]
    Unowned { key: String },
    #[error("key `{key}` belongs to {owner:?}, not {writer:?}")]
    Foreign {
        key: String,
        owner: Owner,
        writer: Owner,
    },
}

/// Prefix → owner, most specific first.
const TABLE: &[(&str, Owner)] = &[
    (keys::DERIVED_INSTANCES, Owner::Controller("scheduler")),
    (keys::DERIVED_UNPLACED, Owner::Controller("scheduler")),
    (keys::DERIVED_NODES, Owner::Controller("node")),
    (keys::DERIVED_ENDPOINTS, Owner::Controller("endpoint")),
    ("derived/vip/", Owner::Controller("network")),
    ("derived/subnet/", Owner::Controller("network")),
    (keys::DESIRED, Owner::Api),
    (keys::OBSERVED, Owner::Agent),
    (keys::META, Owner::Server),
    (keys::EVENTS, Owner::Server),
];

/// The owner of `key`, or an error when no prefix in the table covers it.
pub fn owner_of(key: &str) -> Result<Owner, OwnershipError> {
    TABLE
        .iter()
        .find(|(prefix, _)| key.starts_with(prefix))
        .map(|(_, owner)| owner.clone())
        .ok_or_else(|| OwnershipError::Unowned {
            key: key.to_owned(),
        })
}

/// Checks that `writer` may write `key`.
pub fn check_write(writer: &Owner, key: &str) -> Result<(), OwnershipError> {
    let owner = owner_of(key)?;
    if &owner == writer {
        Ok(())
    } else {
        Err(OwnershipError::Foreign {
            key: key.to_owned(),
            owner,
            writer: writer.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_prefix_wins() {
        assert_eq!(
            owner_of("derived/instance/web/1"),
            Ok(Owner::Controller("scheduler"))
        );
        assert_eq!(owner_of("desired/service/web"), Ok(Owner::Api));
        assert_eq!(owner_of("observed/node/n1"), Ok(Owner::Agent));
    }

    #[test]
    fn foreign_and_unowned_writes_are_refused_with_the_key() {
        let err = check_write(&Owner::Controller("endpoint"), "derived/instance/a/1")
            .expect_err("the endpoint controller does not own instances");
        assert_eq!(
            err.to_string(),
            "key `derived/instance/a/1` belongs to Controller(\"scheduler\"), not Controller(\"endpoint\")"
        );
        let err = owner_of("derived/mystery/x").expect_err("nobody owns it");
        assert_eq!(
            err.to_string(),
            "key `derived/mystery/x` is outside the key layout: no component owns it"
        );
    }
}
