//! How etcd's failures map onto [`StoreError`]. The question that matters
//! for every failure is whether the request could have taken effect: a
//! request that surely did not may be sent again, one that may have must not
//! be resent blindly when it is not idempotent (a transaction), and some
//! failures are final answers that retrying would only repeat.

use std::error::Error as StdError;
use std::io;

use crate::error::StoreError;

/// Why one attempt at a request failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The request surely had no effect: it never reached etcd, or etcd
    /// refused it before proposing anything. Safe to send again.
    NotApplied(String),
    /// The request may or may not have taken effect (the connection broke
    /// after it was sent, or no answer came in time).
    MaybeApplied(String),
    /// A definitive answer; retrying would not change it.
    Final(StoreError),
}

/// gRPC status codes, a stable part of the gRPC wire protocol.
mod code {
    pub(super) const INVALID_ARGUMENT: i32 = 3;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const UNAVAILABLE: i32 = 14;
}

/// etcd's error messages (`api/v3rpc/rpctypes`), stable across etcd 3.x.
pub(super) mod message {
    pub(crate) const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
    pub(crate) const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
    pub(crate) const FUTURE_REVISION: &str =
        "etcdserver: mvcc: required revision is a future revision";
    pub(super) const REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";
    pub(super) const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
    pub(super) const DUPLICATE_KEY: &str = "etcdserver: duplicate key given in txn request";
    /// Refusals that etcd gives before proposing a request to raft.
    pub(super) const REFUSED_BEFORE_PROPOSING: &[&str] = &[
        "etcdserver: no leader",
        "etcdserver: not leader",
        "etcdserver: too many requests",
        "etcdserver: not capable",
        "etcdserver: rpc not supported for learner",
    ];
    /// Prefix of every message etcd itself (not the transport) produces.
    pub(super) const ETCD: &str = "etcdserver:";
}

/// True when etcd answered with exactly this error message.
pub(super) fn server_said(error: &etcd_client::Error, message: &str) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message() == message)
}

/// Sorts a failed request's error into a [`Failure`].
pub(super) fn classify(error: etcd_client::Error) -> Failure {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            classify_status(i32::from(status.code()), status.message(), &status)
        }
        // Raised while setting up a connection, before any request.
        etcd_client::Error::TransportError(err) => {
            Failure::NotApplied(format!("cannot connect: {err}"))
        }
        etcd_client::Error::IoError(err) => Failure::MaybeApplied(format!("I/O error: {err}")),
        other => Failure::Final(StoreError::Backend(format!("etcd client: {other}"))),
    }
}

fn classify_status(code: i32, message: &str, status: &(dyn StdError + 'static)) -> Failure {
    if let Some(invalid) = invalid_request(code, message) {
        return Failure::Final(StoreError::InvalidRequest(invalid));
    }
    if message::REFUSED_BEFORE_PROPOSING.contains(&message) {
        return Failure::NotApplied(message.to_owned());
    }
    if never_connected(status) {
        return Failure::NotApplied(format!("cannot connect: {}", describe(message, status)));
    }
    if code == code::UNAVAILABLE || !message.starts_with(message::ETCD) {
        // etcd's own "unavailable" answers (request timed out, leader
        // changed, server stopped) come after the request was proposed;
        // transport failures come after it was sent. Either way it may
        // have been applied.
        return Failure::MaybeApplied(describe(message, status));
    }
    Failure::Final(StoreError::Backend(format!(
        "etcd refused the request: {message}"
    )))
}

/// Requests etcd will never accept, whoever sends them.
fn invalid_request(code: i32, message: &str) -> Option<String> {
    let reason = match message {
        message::REQUEST_TOO_LARGE => {
            "etcd refused the request as too large (its --max-request-bytes limit)"
        }
        message::TOO_MANY_OPS => {
            "the transaction has more operations (or compares) than etcd allows in one \
             transaction (its --max-txn-ops limit, 128 by default)"
        }
        message::DUPLICATE_KEY => "etcd refused a transaction that changes one key twice",
        // The gRPC layer's own message-size check ("grpc: received message
        // larger than max").
        _ if code == code::RESOURCE_EXHAUSTED && message.contains("larger than max") => {
            "etcd refused the request as too large"
        }
        _ if code == code::INVALID_ARGUMENT && message.starts_with(message::ETCD) => {
            return Some(format!("etcd refused the request: {message}"));
        }
        _ => return None,
    };
    Some(format!("{reason}: {message}"))
}

/// True when the failure happened while connecting, so the request was
/// never written to a connection.
fn never_connected(status: &(dyn StdError + 'static)) -> bool {
    let mut source = status.source();
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>()
            && matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::AddrNotAvailable
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
            )
        {
            return true;
        }
        // tonic wraps connector errors as "tcp connect error" (including
        // connect timeouts, which carry no I/O error kind we can trust).
        if err.to_string().starts_with("tcp connect error") {
            return true;
        }
        source = err.source();
    }
    false
}

/// A status message and its causes on one line, for messages people read.
fn describe(message: &str, status: &(dyn StdError + 'static)) -> String {
    let mut text = message.to_owned();
    let mut source = status.source();
    while let Some(err) = source {
        let cause = err.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = err.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    /// An error with one cause, like tonic's `Status` and its source.
    #[derive(Debug)]
    struct Caused(&'static str, Option<Box<dyn StdError + Send + Sync>>);

    impl fmt::Display for Caused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Caused {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1
                .as_deref()
                .map(|err| err as &(dyn StdError + 'static))
        }
    }

    fn status(message: &'static str) -> Caused {
        Caused(message, None)
    }

    fn io_status(message: &'static str, kind: io::ErrorKind) -> Caused {
        let io = io::Error::new(kind, "os error");
        Caused(
            message,
            Some(Box::new(Caused("transport error", Some(Box::new(io))))),
        )
    }

    fn kind(failure: &Failure) -> &'static str {
        match failure {
            Failure::NotApplied(_) => "not applied",
            Failure::MaybeApplied(_) => "maybe applied",
            Failure::Final(StoreError::InvalidRequest(_)) => "invalid",
            Failure::Final(_) => "final",
        }
    }

    #[test]
    fn failures_before_sending_are_safe_to_retry() {
        let refused = io_status("tcp connect error", io::ErrorKind::ConnectionRefused);
        assert_eq!(
            kind(&classify_status(14, "tcp connect error", &refused)),
            "not applied"
        );
        for message in ["etcdserver: no leader", "etcdserver: too many requests"] {
            assert_eq!(
                kind(&classify_status(14, message, &status(message))),
                "not applied"
            );
        }
    }

    #[test]
    fn failures_after_sending_leave_the_outcome_open() {
        let reset = io_status("transport error", io::ErrorKind::ConnectionReset);
        assert_eq!(
            kind(&classify_status(2, "transport error", &reset)),
            "maybe applied"
        );
        let timed_out = "etcdserver: request timed out";
        assert_eq!(
            kind(&classify_status(14, timed_out, &status(timed_out))),
            "maybe applied"
        );
        let Failure::MaybeApplied(reason) = classify_status(2, "transport error", &reset) else {
            panic!("maybe applied");
        };
        assert_eq!(reason, "transport error: os error");
    }

    #[test]
    fn requests_etcd_never_accepts_are_invalid_and_other_refusals_final() {
        let too_large = message::REQUEST_TOO_LARGE;
        assert_eq!(
            kind(&classify_status(3, too_large, &status(too_large))),
            "invalid"
        );
        let grpc_limit = "grpc: received message larger than max (2000000 vs. 1572864)";
        assert_eq!(
            kind(&classify_status(8, grpc_limit, &status(grpc_limit))),
            "invalid"
        );
        let no_space = "etcdserver: mvcc: database space exceeded";
        assert_eq!(
            kind(&classify_status(8, no_space, &status(no_space))),
            "final"
        );
    }
}
