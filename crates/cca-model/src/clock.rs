//! The wall clock, read in one place: [`now_millis`] is the instant every
//! fact, status and event carries ([`Millis`], milliseconds since the Unix
//! epoch). It lives in the vocabulary crate because every crate that
//! stamps a time already depends on it (or, for the runtime and image
//! crates, depends on nothing else of ours) and reading the clock is not
//! IO; it is still a side input, so controllers never call it: they get
//! `now` from their `Context` and stay pure (cca-control's tests check
//! that). `clippy.toml` disallows `SystemTime::now` everywhere else.
//! Spans are `std::time::Duration`; [`span_millis`] turns one into
//! milliseconds for arithmetic on instants.

use crate::cluster::Millis;

/// Milliseconds since the Unix epoch now; 0 for a clock set before 1970,
/// `Millis::MAX` past the year 292 million.
#[must_use]
#[allow(
    clippy::disallowed_methods,
    reason = "the one place that reads the wall clock"
)]
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            Millis::try_from(elapsed.as_millis()).unwrap_or(Millis::MAX)
        })
}

/// The wall clock as a `SystemTime` (to the millisecond, the same reading
/// as [`now_millis`]): what certificate and token checks take.
#[must_use]
pub fn system_now() -> std::time::SystemTime {
    std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(now_millis()).unwrap_or(0))
}

/// `span` in whole milliseconds, to add to or subtract from a [`Millis`]
/// instant (spans are `std::time::Duration` everywhere else); saturates.
#[must_use]
pub fn span_millis(span: std::time::Duration) -> Millis {
    Millis::try_from(span.as_millis()).unwrap_or(Millis::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_convert_to_whole_milliseconds_and_saturate() {
        assert_eq!(span_millis(std::time::Duration::from_micros(1_999)), 1);
        assert_eq!(span_millis(std::time::Duration::from_secs(5)), 5_000);
        assert_eq!(span_millis(std::time::Duration::MAX), Millis::MAX);
    }

    #[test]
    fn now_is_after_2024_and_does_not_go_back() {
        let first = now_millis();
        // 2024-01-01T00:00:00Z.
        assert!(first > 1_704_067_200_000, "{first}");
        assert!(now_millis() >= first);
    }
}
