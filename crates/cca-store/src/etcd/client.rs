//! Connections to the etcd members and the retry discipline every request
//! goes through. Two gRPC connections per member, one for leases (their
//! keep-alives on long-lived streams, see [`super::renewals`]) and one
//! for everything else; requests go to the current
//! member and move to the next one when it cannot be reached, so a dead
//! member costs one failed attempt, not a random share of all requests.
//! Failed attempts are retried with jittered exponential backoff, except
//! that a request which may already have taken effect is only resent when
//! sending it twice is harmless.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, KvClient, LeaseClient, TlsOptions, WatchClient,
};

use super::Config;
use super::errors::Failure;
use crate::error::{Result, StoreError};

/// HTTP/2 keep-alive pings find a dead connection that no error announces
/// (a partitioned member). etcd answers pings sent more often than every
/// 5 s (`--grpc-keepalive-min-time`) by closing the connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// One etcd member and the clients that talk to it.
pub(super) struct Member {
    pub(super) url: String,
    pub(super) kv: KvClient,
    pub(super) watch: WatchClient,
    pub(super) lease: LeaseClient,
    /// Keep-alives, on long-lived streams over the lease connection.
    pub(super) renewals: super::renewals::Renewals,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Whether a request may be sent again after an attempt that may have
/// taken effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resend {
    /// Taking effect twice is harmless (reads, keep-alives, revocations).
    Always,
    /// Taking effect twice is not (transactions): resend only after
    /// attempts that surely had no effect.
    OnlyIfNotApplied,
}

/// The members of the cluster, the one requests currently go to, and how
/// hard to try.
#[derive(Debug)]
pub(super) struct Members {
    members: Vec<Arc<Member>>,
    current: AtomicUsize,
    attempts: u32,
    backoff: Backoff,
    request_timeout: Duration,
}

impl Members {
    /// Prepares a client per endpoint. Connections are made lazily, on the
    /// first request, so this fails only on malformed endpoints.
    pub(super) async fn connect(config: &Config) -> Result<Self> {
        if config.endpoints.is_empty() {
            return Err(StoreError::InvalidRequest(
                "etcd store needs at least one endpoint, e.g. http://127.0.0.1:2379".into(),
            ));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            // etcd counts pings on idle connections as abuse.
            .with_keep_alive_while_idle(false)
            // A member cut off from the quorum refuses at once instead of
            // letting requests hang; we then move on to another member.
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls));
        }
        let endpoints: Vec<String> = config
            .endpoints
            .iter()
            .map(|url| endpoint_url(url, config.tls.is_some()))
            .collect();
        let mut members = Vec::with_capacity(endpoints.len());
        for url in &endpoints {
            let connect = || async {
                Client::connect([url], Some(options.clone()))
                    .await
                    .map_err(|err| {
                        StoreError::InvalidRequest(format!("etcd endpoint `{url}`: {err}"))
                    })
            };
            let client = connect().await?;
            // Lease calls get a connection of their own: bulk reads and
            // transactions can then neither delay a keep-alive behind
            // their flow control nor take it down with them when h2 closes
            // a connection that reset too many cancelled streams.
            let leases = connect().await?;
            members.push(Arc::new(Member {
                url: url.clone(),
                kv: client
                    .kv_client()
                    .max_decoding_message_size(config.max_response_bytes),
                watch: client
                    .watch_client()
                    .max_decoding_message_size(config.max_response_bytes),
                lease: leases.lease_client(),
                renewals: super::renewals::Renewals::new(leases.lease_client()),
            }));
        }
        Ok(Self {
            members,
            current: AtomicUsize::new(0),
            attempts: config.retry_attempts.max(1),
            backoff: Backoff {
                base: config.retry_base_delay,
                max: config.retry_max_delay,
            },
            request_timeout: config.request_timeout,
        })
    }

    /// The member requests currently go to, and its index.
    fn pick(&self) -> (usize, Arc<Member>) {
        let index = self.current.load(Ordering::Relaxed) % self.members.len();
        (index, Arc::clone(&self.members[index]))
    }

    /// Moves on from the member at `index` after it failed us, unless
    /// another request already did.
    fn failed(&self, index: usize) {
        let next = (index + 1) % self.members.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// One attempt, which fails as "maybe applied" when no answer comes
    /// within the request timeout.
    async fn within_timeout<T>(
        &self,
        attempt: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        tokio::time::timeout(self.request_timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::MaybeApplied(format!(
                    "no answer within {:?}",
                    self.request_timeout
                )))
            })
    }

    /// The endpoints, for messages.
    fn endpoints(&self) -> String {
        let urls: Vec<&str> = self.members.iter().map(|m| m.url.as_str()).collect();
        urls.join(", ")
    }

    /// Runs `attempt` against the current member until it succeeds, fails
    /// for good, or the retries run out. `attempt` is told whether an
    /// earlier attempt may have taken effect, so it can read "already done"
    /// answers (lease not found on a revoke) as success.
    pub(super) async fn call<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Arc<Member>, bool) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut maybe_applied = false;
        let mut last_failure = String::new();
        for retry in 0..self.attempts {
            if retry > 0 {
                tokio::time::sleep(self.backoff.delay(retry)).await;
            }
            let (index, member) = self.pick();
            let url = member.url.clone();
            let outcome = self.within_timeout(attempt(member, maybe_applied)).await;
            match outcome {
                Ok(value) => return Ok(value),
                Err(Failure::Final(err)) => return Err(err),
                Err(Failure::NotApplied(reason)) => {
                    tracing::debug!(what, %url, %reason, "etcd request not applied; retrying");
                    last_failure = format!("{url}: {reason}");
                }
                Err(Failure::MaybeApplied(reason)) if resend == Resend::OnlyIfNotApplied => {
                    // The next request should not wait on this member too.
                    self.failed(index);
                    return Err(StoreError::OutcomeUnknown {
                        reason: format!("{what} sent to etcd at {url}: {reason}"),
                    });
                }
                Err(Failure::MaybeApplied(reason)) => {
                    tracing::debug!(what, %url, %reason, "etcd request failed; retrying");
                    maybe_applied = true;
                    last_failure = format!("{url}: {reason}");
                }
            }
            self.failed(index);
        }
        Err(StoreError::Unavailable {
            reason: format!(
                "{what} failed {} times against etcd [{}]; last: {last_failure}",
                self.attempts,
                self.endpoints()
            ),
        })
    }
}

/// Exponential backoff between attempts.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    /// The delay before the first retry; doubled for every further one.
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// How long to wait before retry number `retry` (1-based), with "equal
    /// jitter": at least half the delay so retries stay spaced out, the
    /// rest random so that clients do not retry in lockstep.
    fn delay(self, retry: u32) -> Duration {
        let exponential = self
            .base
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16))
            .min(self.max);
        let half = exponential / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// etcd-client's TLS settings: the CA as the only root, and the client
/// certificate when there is one.
fn tls_options(tls: &super::Tls) -> TlsOptions {
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
    if let Some(client) = &tls.client {
        options = options.identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
    }
    options
}

/// An endpoint's URL for the transport: `https://` under TLS (an
/// `etcd://` store URL names hosts, not schemes).
fn endpoint_url(url: &str, tls: bool) -> String {
    match (tls, url.strip_prefix("http://")) {
        (true, Some(host)) => format!("https://{host}"),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for (retry, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (40, 1000),
        ] {
            let full = Duration::from_millis(full);
            for _ in 0..20 {
                let delay = backoff.delay(retry);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "retry {retry}: {delay:?}"
                );
            }
        }
    }
}
