//! Trusting an OIDC issuer (`cca server --oidc-issuer URL --oidc-audience
//! ID`): its discovery document names its JWKS, whose keys check the ID
//! tokens users log in with (`cca login --token`). The document and keys
//! are fetched as the server starts (a failure stops it, saying what
//! failed) and the keys again every [`REFRESH`]; a failed refresh keeps
//! the keys it has. A token naming a key id the keys do not hold (the
//! issuer rotated its keys and signs with the new one already) has the
//! JWKS fetched again at once ([`Refetch`]), but at most once every
//! [`REFETCH_INTERVAL`]: anyone can send a token with a made-up key id,
//! and must not make the server hammer the issuer. The user a token
//! names is its `sub`: an administrator gives that name roles with `cca
//! user create SUB --role …`.

use std::sync::Arc;
use std::time::Duration;

use cca_trust::jwt::{JwkSet, OidcDiscovery, Verifier};

use crate::auth::TokenAuthority;

/// How often the issuer's keys are fetched again.
pub const REFRESH: Duration = Duration::from_secs(600);
/// At most one fetch on an unknown key id in this long.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// How long one fetch may take.
const FETCH_DEADLINE: Duration = Duration::from_secs(10);

/// What went wrong reaching the issuer.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("fetching {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{0}")]
    Document(String),
}

/// An issuer's settings.
#[derive(Clone, Debug)]
pub struct OidcIssuer {
    pub issuer: String,
    /// The `aud` its ID tokens must carry (the client id).
    pub audience: String,
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<String, OidcError> {
    let failed = |reason: String| OidcError::Fetch {
        url: url.to_owned(),
        reason,
    };
    let response = client
        .get(url)
        .timeout(FETCH_DEADLINE)
        .send()
        .await
        .map_err(|error| failed(error.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("HTTP {}", response.status())));
    }
    response
        .text()
        .await
        .map_err(|error| failed(error.to_string()))
}

impl OidcIssuer {
    /// The discovery document, then the keys it names.
    async fn keys(&self, client: &reqwest::Client) -> Result<(OidcDiscovery, JwkSet), OidcError> {
        let document = fetch(client, &OidcDiscovery::url_for(&self.issuer)).await?;
        let discovery = OidcDiscovery::from_json(&document, &self.issuer)
            .map_err(|error| OidcError::Document(error.to_string()))?;
        let jwks = fetch(client, &discovery.jwks_uri).await?;
        let keys = JwkSet::from_json(&jwks).map_err(|error| {
            OidcError::Document(format!("the JWKS at {}: {error}", discovery.jwks_uri))
        })?;
        Ok((discovery, keys))
    }

    /// The keys named by the issuer's discovery document, fetched now.
    async fn fetch_keys(&self, client: &reqwest::Client) -> Result<JwkSet, OidcError> {
        self.keys(client).await.map(|(_, keys)| keys)
    }

    /// A verifier of the issuer's ID tokens, with its keys fetched now.
    pub async fn verifier(&self) -> Result<Verifier, OidcError> {
        let (_, keys) = self.keys(&reqwest::Client::new()).await?;
        Ok(Verifier::new(
            keys,
            self.issuer.clone(),
            self.audience.clone(),
        ))
    }

    /// Fetches the keys every [`REFRESH`] into `tokens` (until aborted).
    pub async fn refresh(self, tokens: Arc<TokenAuthority>) {
        let client = reqwest::Client::new();
        loop {
            tokio::time::sleep(REFRESH).await;
            match self.keys(&client).await {
                Ok((_, keys)) => tokens.set_oidc_keys(keys),
                Err(error) => {
                    tracing::warn!(issuer = %self.issuer, %error, "refreshing the OIDC issuer's keys failed; keeping the old ones");
                }
            }
        }
    }
}

/// Fetches of the issuer's keys on demand (a token with an unknown key
/// id), at most one per [`REFETCH_INTERVAL`]. Requests that need one
/// while another fetches wait for it and use its keys; those that come
/// later within the interval are decided on the keys held.
#[derive(Debug)]
pub(crate) struct Refetch {
    /// When the last on-demand fetch began; held while one runs.
    last: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    client: reqwest::Client,
    interval: Duration,
}

impl Default for Refetch {
    fn default() -> Self {
        Self::every(REFETCH_INTERVAL)
    }
}

impl Refetch {
    /// At most one fetch per `interval` (tests shorten it).
    pub(crate) fn every(interval: Duration) -> Self {
        Self {
            last: tokio::sync::Mutex::new(None),
            client: reqwest::Client::new(),
            interval,
        }
    }

    /// The issuer's keys fetched now, unless a fetch began less than the
    /// interval ago or this one fails (logged): `None` then.
    pub(crate) async fn keys(&self, issuer: &OidcIssuer) -> Option<JwkSet> {
        let mut last = self.last.lock().await;
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < self.interval) {
            return None;
        }
        *last = Some(now);
        match issuer.fetch_keys(&self.client).await {
            Ok(keys) => {
                tracing::info!(issuer = %issuer.issuer, "fetched the OIDC issuer's keys for a token of an unknown key id");
                Some(keys)
            }
            Err(error) => {
                tracing::warn!(issuer = %issuer.issuer, %error, "fetching the OIDC issuer's keys for a token of an unknown key id failed; keeping the old ones");
                None
            }
        }
    }
}
