//! Trusting an OIDC issuer (`cca server --oidc-issuer URL --oidc-audience
//! ID`): its discovery document names its JWKS, whose keys check the ID
//! tokens users log in with (`cca login --token`). The document and keys
//! are fetched as the server starts (a failure stops it, saying what
//! failed) and the keys again every [`REFRESH`], so an issuer's key
//! rotation is followed; a failed refresh keeps the keys it has. The
//! user a token names is its `sub`: an administrator gives that name
//! roles with `cca user create SUB --role …`.

use std::sync::Arc;
use std::time::Duration;

use cca_trust::jwt::{JwkSet, OidcDiscovery, Verifier};

use crate::auth::TokenAuthority;

/// How often the issuer's keys are fetched again.
pub const REFRESH: Duration = Duration::from_secs(600);
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
