//! Lease renewals on reused keep-alive streams. A server renews one lease
//! per agent every few seconds: 5,000 agents are 2,500 renewals a second.
//! Opening a gRPC stream for each (with the extra round trip etcd-client
//! needs to tell a renewal's TTL) cost etcd more than the renewals
//! themselves, and renewals queued until leases expired.
//!
//! A stream carries one renewal at a time and goes back to an idle pool
//! once answered, so streams are opened only when more renewals are in
//! flight than ever before. One renewal at a time per stream matters:
//! etcd answers a stream's requests in turn, and it holds the renewal of
//! a lease that has just expired until the lease's revocation has gone
//! through raft (seconds, when thousands expire at once); on a shared
//! stream every renewal behind it would wait too and expire in turn.
//!
//! A stream whose renewal failed or was given up (a timeout drops it
//! mid-answer) is closed, not pooled; a broken stream empties the pool,
//! whose streams share its connection.

use std::sync::Mutex;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};

use super::errors::{Failure, classify};
use crate::error::StoreError;
use crate::types::LeaseId;

/// Idle streams kept per member; more are closed when they come back.
const MAX_IDLE: usize = 256;

/// The keep-alive streams to one member.
pub(super) struct Renewals {
    client: LeaseClient,
    idle: Mutex<Vec<Channel>>,
}

/// One keep-alive stream: where renewals go and where answers come.
struct Channel {
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

impl Renewals {
    pub(super) fn new(client: LeaseClient) -> Self {
        Self {
            client,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Renews `lease` once; the TTL etcd granted.
    pub(super) async fn renew(&self, lease: LeaseId) -> Result<i64, Failure> {
        let mut channel = match self.take_idle() {
            Some(channel) => channel,
            None => self.open(lease).await?,
        };
        let mut keeper = LeaseKeeper {
            id: lease,
            sender: channel.keeper.sender.clone(),
        };
        if keeper.keep_alive().await.is_err() {
            self.broken();
            return Err(Failure::NotApplied(
                "the keep-alive stream had closed; the renewal was not sent".into(),
            ));
        }
        let answer = match channel.answers.message().await {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                self.broken();
                return Err(Failure::MaybeApplied(
                    "etcd closed the keep-alive stream without answering".into(),
                ));
            }
            Err(err) => {
                self.broken();
                return Err(classify(err));
            }
        };
        self.give_back(channel);
        if answer.ttl() > 0 {
            Ok(answer.ttl())
        } else {
            Err(Failure::Final(StoreError::LeaseNotFound(lease)))
        }
    }

    /// A new stream, opened (as etcd-client opens one) with a renewal of
    /// `lease`, whose TTL it keeps to itself: the caller renews again.
    async fn open(&self, lease: LeaseId) -> Result<Channel, Failure> {
        let mut client = self.client.clone();
        let (keeper, answers) = client.keep_alive(lease).await.map_err(|err| match err {
            // etcd-client's answer when the first renewal found no lease.
            etcd_client::Error::LeaseKeepAliveError(_) => {
                Failure::Final(StoreError::LeaseNotFound(lease))
            }
            other => classify(other),
        })?;
        Ok(Channel { keeper, answers })
    }

    fn take_idle(&self) -> Option<Channel> {
        lock(&self.idle).pop()
    }

    fn give_back(&self, channel: Channel) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(channel);
        }
    }

    /// A stream broke: the idle ones share its connection and likely its
    /// fate, so they are closed rather than each failing a renewal.
    fn broken(&self) {
        lock(&self.idle).clear();
    }
}

fn lock(idle: &Mutex<Vec<Channel>>) -> std::sync::MutexGuard<'_, Vec<Channel>> {
    idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
