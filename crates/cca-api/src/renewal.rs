//! The server keeps its own certificate fresh. `cca init` makes it for a
//! year; two thirds into its life the server has the CA in its config
//! directory issue it again (same key, identity and host names:
//! `cca_trust::config_dir::ConfigDir::renew_server`), writes it to
//! `server.pem`, and presents it from the next handshake on — on the API
//! listener, the liveness listener and its calls to agents, which share
//! one [`ServerCertificate`]. Open connections keep the certificate they
//! were opened with, so nothing is dropped. A failed renewal is logged
//! and retried, backing off from a minute to an hour, until it succeeds;
//! the old certificate serves meanwhile.
//!
//! The loop wakes at least hourly and compares the wall clock (an
//! argument: a fake one in tests) with the renewal time, so months of
//! sleep never drift from it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cca_trust::config_dir::{ConfigDir, server_renewal_wait};
use cca_trust::pki::{CertInfo, ClusterCa};
use tokio::sync::watch;

use crate::tls::ServerCertificate;

/// The longest sleep between two looks at the clock.
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);
/// Retries wait between these.
const RETRY_FIRST: Duration = Duration::from_secs(60);
const RETRY_MAX: Duration = Duration::from_secs(3600);

/// What the renewal works on.
pub struct ServerRenewal {
    pub dir: ConfigDir,
    pub ca: Arc<ClusterCa>,
    /// The server's key (it stays across renewals).
    pub key_pem: String,
    /// What the server presents; replaced on renewal.
    pub presented: Arc<ServerCertificate>,
    /// The certificate in use now.
    pub current: CertInfo,
    /// The wall clock (a fake one in tests).
    pub clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
}

impl std::fmt::Debug for ServerRenewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerRenewal")
            .field("dir", &self.dir)
            .field("serial", &self.current.serial)
            .finish_non_exhaustive()
    }
}

/// Renews the server's certificate two thirds into its life, and again
/// after each renewal, until `shutdown`.
pub async fn keep_renewed(mut renewal: ServerRenewal, mut shutdown: watch::Receiver<bool>) {
    let mut retry = RETRY_FIRST;
    let mut resume_at: Option<SystemTime> = None;
    loop {
        let now = (renewal.clock)();
        let due = server_renewal_wait(&renewal.current, now).is_zero()
            && resume_at.is_none_or(|at| at <= now);
        if due {
            match renew_once(&renewal, now) {
                Ok(current) => {
                    tracing::info!(
                        serial = %current.serial,
                        until = %humantime::format_rfc3339_seconds(current.not_after),
                        "renewed the server's certificate"
                    );
                    renewal.current = current;
                    retry = RETRY_FIRST;
                    resume_at = None;
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        retry_in = ?retry,
                        expires = %humantime::format_rfc3339_seconds(renewal.current.not_after),
                        "renewing the server's certificate failed; the old one serves until it expires"
                    );
                    resume_at = Some(now + retry);
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        let now = (renewal.clock)();
        let wait = match resume_at {
            Some(at) => at.duration_since(now).unwrap_or_default(),
            None => server_renewal_wait(&renewal.current, now),
        };
        tokio::select! {
            () = tokio::time::sleep(wait.min(LOOK_AT_LEAST_EVERY)) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// One renewal: issued, written, then presented.
fn renew_once(renewal: &ServerRenewal, now: SystemTime) -> Result<CertInfo, String> {
    let renewed = renewal
        .dir
        .renew_server(&renewal.ca, now)
        .map_err(|error| error.to_string())?;
    renewal
        .presented
        .replace(&renewed.chain_pem, &renewal.key_pem)
        .map_err(|error| format!("presenting the renewed certificate: {error}"))?;
    Ok(renewed.certificate)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use cca_trust::config_dir::InitOptions;
    use cca_trust::pki::{Names, SERVER_CERT_VALIDITY};

    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A fake wall clock: a fixed start plus the paused tokio clock's
    /// progress, so sleeping moves both.
    fn fake_clock(start: SystemTime) -> Arc<dyn Fn() -> SystemTime + Send + Sync> {
        let origin = tokio::time::Instant::now();
        Arc::new(move || start + origin.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn the_server_renews_its_certificate_two_thirds_into_its_life_and_presents_it() {
        let start = UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let clock = fake_clock(start);
        let dir = tempfile::tempdir().expect("dir");
        let config = ConfigDir::new(dir.path());
        config
            .init(
                &InitOptions {
                    cluster: "t".into(),
                    server: "s1".into(),
                    hosts: Names::from_hosts(["127.0.0.1"]).expect("hosts"),
                },
                start,
            )
            .expect("init");
        let files = config.load_server(start).expect("server files");
        let presented =
            Arc::new(ServerCertificate::from_pem(&files.chain_pem, &files.key_pem).expect("pem"));
        let first = files.certificate.serial.clone();
        let serial_on_disk = || {
            config
                .load_server(clock())
                .expect("loads at the fake now")
                .certificate
                .serial
        };
        let (stop, stopping) = watch::channel(false);
        let running = tokio::spawn(keep_renewed(
            ServerRenewal {
                dir: config.clone(),
                ca: Arc::new(files.ca),
                key_pem: files.key_pem.clone(),
                presented: Arc::clone(&presented),
                current: files.certificate,
                clock: Arc::clone(&clock),
            },
            stopping,
        ));

        // Nothing before two thirds of the year.
        let two_thirds = SERVER_CERT_VALIDITY * 2 / 3;
        tokio::time::sleep(two_thirds - DAY).await;
        assert_eq!(serial_on_disk(), first, "not renewed early");
        tokio::time::sleep(2 * DAY).await;
        let second = serial_on_disk();
        assert_ne!(second, first, "renewed on disk");

        // Presented: what the listeners' handshakes and the calls to
        // agents resolve is the new certificate.
        let presented_serial = |presented: &ServerCertificate| {
            CertInfo::parse(presented.leaf().expect("a certificate"))
                .expect("parses")
                .serial
        };
        assert_eq!(presented_serial(&presented), second);

        // And again two thirds into the new certificate's life.
        tokio::time::sleep(two_thirds).await;
        assert_ne!(serial_on_disk(), second, "renewed again");
        stop.send_replace(true);
        running.await.expect("stops");
    }
}
