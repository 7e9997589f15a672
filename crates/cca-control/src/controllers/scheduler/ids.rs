//! Instance ids, derived from the view alone (the spec hash that tells a
//! rolled instance from a current one is `cca_model::spec::spec_hash`,
//! shared with apply's service versions). Stateful instances are
//! `{svc}-{ordinal}`; others are `{svc}-{suffix}` where the suffix is the
//! base-36 of the view's revision and a counter. Revisions only grow, so
//! an id is never reused — and a plan made twice from the same (stale) view
//! mints the same ids, which makes the second commit's create-only guard
//! fail instead of placing twice.

use cca_store::Revision;

/// Ids one reconcile may mint: the counter has 16 bits next to the revision.
pub(crate) const MAX_MINTED_PER_CYCLE: u32 = 1 << 16;

/// The id of a stateful service's instance with `ordinal`.
pub(crate) fn stateful_id(service: &str, ordinal: u32) -> String {
    format!("{service}-{ordinal}")
}

/// Lower-case base 36, the shortest spelling of a number in DNS-safe letters.
pub(crate) fn base36(mut value: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Mints the ids of new non-stateful instances during one reconcile.
#[derive(Debug)]
pub(crate) struct IdMinter {
    revision: Revision,
    next: u32,
    /// Ids this cycle may mint, at most [`MAX_MINTED_PER_CYCLE`].
    limit: u32,
}

impl IdMinter {
    pub(crate) fn new(revision: Revision, limit: u32) -> Self {
        Self {
            revision,
            next: 0,
            limit: limit.min(MAX_MINTED_PER_CYCLE),
        }
    }

    /// True once this cycle may mint no more ids.
    pub(crate) fn exhausted(&self) -> bool {
        self.next >= self.limit
    }

    /// The next id for `service` that `taken` does not know, or `None`
    /// once this cycle's ids are used up (the rest waits a cycle).
    pub(crate) fn mint(&mut self, service: &str, taken: impl Fn(&str) -> bool) -> Option<String> {
        while self.next < self.limit {
            let seed = (self.revision.max(0) as u64) << 16 | u64::from(self.next);
            self.next += 1;
            let id = format!("{service}-{}", base36(seed));
            if !taken(&id) {
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base36_spells_numbers() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(1 << 16), "1ekg");
    }

    #[test]
    fn ids_are_deterministic_unique_and_skip_taken_ones() {
        let mut minter = IdMinter::new(7, MAX_MINTED_PER_CYCLE);
        let first = minter.mint("web", |_| false).expect("mints");
        let third = minter.mint("web", |id| id == "web-9tz5").expect("mints");
        assert_eq!(first, "web-9tz4");
        assert_eq!(third, "web-9tz6", "a taken id is skipped");
        assert_eq!(
            IdMinter::new(7, MAX_MINTED_PER_CYCLE).mint("web", |_| false),
            Some(first)
        );
    }
}
