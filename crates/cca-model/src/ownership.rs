//! Who writes what: every kind of fact has exactly one writer, given by its
//! row in the [fact table](crate::facts). The control plane's runner checks
//! each controller's writes against it before committing, which is what
//! lets controllers run without locks.

use crate::facts::Key;

/// Who may write a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The API server on behalf of a user (`cca apply`, `scale`, `delete`).
    Api,
    /// A named controller (for example `"instance"`, `"scheduler"`).
    Controller(&'static str),
    /// The agent of one node: only keys about that node or its instances.
    Agent,
    /// The server's own bookkeeping (leader election, event log).
    Server,
}

/// A write that falls outside the key layout, or into another owner's kind.
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

/// The owner of `key`, or an error when it matches no kind of fact.
pub fn owner_of(key: &str) -> Result<Owner, OwnershipError> {
    Key::parse(key)
        .map(|key| key.owner())
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
    fn owners_come_from_the_fact_table() {
        assert_eq!(
            owner_of("derived/instance/web/1"),
            Ok(Owner::Controller("scheduler"))
        );
        assert_eq!(owner_of("desired/service/web"), Ok(Owner::Api));
        assert_eq!(owner_of("observed/node/n1"), Ok(Owner::Agent));
        assert_eq!(owner_of("meta/leader"), Ok(Owner::Server));
    }

    #[test]
    fn foreign_and_unowned_writes_are_refused_with_the_key() {
        let err = check_write(&Owner::Controller("endpoint"), "derived/instance/a/1")
            .expect_err("the endpoint controller does not own instances");
        assert_eq!(
            err.to_string(),
            "key `derived/instance/a/1` belongs to Controller(\"scheduler\"), not Controller(\"endpoint\")"
        );
        for stray in [
            "derived/mystery/x",
            "desired/service/web/other/x",
            "desired/",
        ] {
            let err = owner_of(stray).expect_err("nobody owns it");
            assert_eq!(
                err.to_string(),
                format!("key `{stray}` is outside the key layout: no component owns it")
            );
        }
    }
}
