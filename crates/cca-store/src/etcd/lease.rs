//! Leases on etcd: grant, keep-alive, revoke, and finding which lease a
//! refused put named. etcd raises every TTL to its minimum lease TTL
//! (1.5 × the election timeout, rounded up to whole seconds: 2 s with
//! etcd's defaults), and [`Store::keep_alive`](crate::Store::keep_alive)
//! reports the TTL etcd actually granted.

use std::time::Duration;

use super::EtcdStore;
use super::client::Resend;
use super::errors::{Failure, classify, message, server_said};
use crate::error::{Result, StoreError};
use crate::types::LeaseId;

impl EtcdStore {
    pub(super) async fn grant(&self, ttl_secs: i64) -> Result<LeaseId> {
        // Granting twice after a lost answer leaks one lease, which expires
        // on its own: harmless, so it is retried like a read.
        let response = self
            .members
            .call("lease grant", Resend::Always, |member, _| {
                let mut client = member.lease.clone();
                async move { client.grant(ttl_secs, None).await.map_err(classify) }
            })
            .await?;
        if !response.error().is_empty() {
            return Err(StoreError::Backend(format!(
                "etcd refused a lease: {}",
                response.error()
            )));
        }
        Ok(response.id())
    }

    pub(super) async fn renew(&self, lease: LeaseId) -> Result<Duration> {
        let ttl = self
            .members
            .call("lease keep-alive", Resend::Always, |member, _| async move {
                member.renewals.renew(lease).await
            })
            .await?;
        Ok(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
    }

    pub(super) async fn revoke(&self, lease: LeaseId) -> Result<()> {
        self.members
            .call("lease revoke", Resend::Always, |member, maybe_revoked| {
                let mut client = member.lease.clone();
                async move {
                    match client.revoke(lease).await {
                        Ok(_) => Ok(()),
                        Err(err) if server_said(&err, message::LEASE_NOT_FOUND) => {
                            if maybe_revoked {
                                // Our own earlier attempt removed it.
                                Ok(())
                            } else {
                                Err(Failure::Final(StoreError::LeaseNotFound(lease)))
                            }
                        }
                        Err(err) => Err(classify(err)),
                    }
                }
            })
            .await
    }

    /// The lease to blame when etcd refused a transaction for naming an
    /// unknown lease (etcd does not say which): the first of `leases`
    /// etcd does not know, or the first of them if all have reappeared
    /// (which they cannot; lease ids are not reused).
    pub(super) async fn missing_lease(&self, leases: &[LeaseId]) -> Result<LeaseId> {
        for &lease in leases {
            let ttl = self
                .members
                .call("lease lookup", Resend::Always, |member, _| {
                    let mut client = member.lease.clone();
                    async move { client.time_to_live(lease, None).await.map_err(classify) }
                })
                .await?
                .ttl();
            if ttl < 0 {
                return Ok(lease);
            }
        }
        leases.first().copied().ok_or_else(|| {
            StoreError::Backend("etcd reported an unknown lease for a txn that names none".into())
        })
    }
}
