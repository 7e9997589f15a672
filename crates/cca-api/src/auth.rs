//! Who may call which route. Under [`Authentication::Certificates`] every
//! caller proves an identity with a client certificate of the cluster CA
//! (`tls::Peer`): agent routes serve only the node the certificate names
//! — a node acts only as itself — and every other route needs a user's
//! certificate, except `GET /v1/identity`, which tells anyone who the
//! server takes them for, and `POST /v1/join`, where a new node's join
//! token is its credential. [`Authentication::Open`] is plain HTTP on
//! loopback (`cca dev`, tests), where nobody proves anything.
//!
//! A user may instead present a signed token (`Authorization: Bearer`):
//! one this server issued (`cca user token`, `cca login`), checked
//! against its own key and the revoked token ids, or an OIDC issuer's
//! ID token when the server trusts one (`cca server --oidc-issuer`). What
//! a user may then do is `authz`'s: their stored record's roles decide.

use std::sync::RwLock;
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cca_trust::identity::Identity;
use cca_trust::jwt::{Claims, SigningKey, TokenError, Verifier};

use crate::error::ApiError;
use crate::state::ApiState;
use crate::tls::Peer;

/// How callers prove who they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authentication {
    /// Nobody proves anything: only for a server on loopback.
    #[default]
    Open,
    /// A client certificate of the cluster CA, or a user's signed token,
    /// on every request.
    Certificates,
}

/// The audience of the tokens this server issues.
pub const TOKEN_AUDIENCE: &str = "ccattler-api";

/// Who made a request, as this server established it: in the request's
/// extensions for the handlers and the response's for the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) identity: Identity,
    pub(crate) via: Via,
}

/// How the caller proved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    Certificate,
    /// A token this server issued.
    Token {
        jti: Option<String>,
        expires_at: u64,
    },
    /// An ID token of the trusted OIDC issuer.
    Oidc,
}

/// Issues this server's user tokens and checks presented ones: its own
/// (ES256 with the config directory's `token.key`) and, if configured,
/// an OIDC issuer's.
#[derive(Debug)]
pub struct TokenAuthority {
    key: SigningKey,
    ours: Verifier,
    oidc: Option<RwLock<Verifier>>,
    /// Who keeps the OIDC keys fresh.
    oidc_issuer: Option<crate::oidc::OidcIssuer>,
    /// The keys fetched on an unknown kid, rate-limited.
    refetch: crate::oidc::Refetch,
}

impl TokenAuthority {
    /// Tokens signed by `key`, issued as `issuer` (unique to the cluster:
    /// another cluster's tokens name another issuer).
    pub fn new(key: SigningKey, issuer: impl Into<String>) -> Self {
        let ours = Verifier::new(key.jwk_set(), issuer, TOKEN_AUDIENCE);
        Self {
            key,
            ours,
            oidc: None,
            oidc_issuer: None,
            refetch: crate::oidc::Refetch::default(),
        }
    }

    /// Also accepts ID tokens of `issuer`, checked by `verifier` (its keys
    /// fetched: `OidcIssuer::verifier`) and kept fresh while serving.
    #[must_use]
    pub fn with_oidc(mut self, issuer: crate::oidc::OidcIssuer, verifier: Verifier) -> Self {
        self.oidc = Some(RwLock::new(verifier));
        self.oidc_issuer = Some(issuer);
        self
    }

    /// The OIDC issuer to keep fresh, if any.
    pub(crate) fn oidc_issuer(&self) -> Option<&crate::oidc::OidcIssuer> {
        self.oidc_issuer.as_ref()
    }

    /// Replaces the OIDC issuer's keys (a JWKS refresh).
    pub fn set_oidc_keys(&self, keys: cca_trust::jwt::JwkSet) {
        if let Some(oidc) = &self.oidc {
            oidc.write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .set_keys(keys);
        }
    }

    /// A token for user `name`, valid for `ttl` from `now`.
    pub(crate) fn issue(
        &self,
        name: &str,
        now: std::time::SystemTime,
        ttl: Duration,
    ) -> (String, Claims) {
        let claims = Claims::new(self.ours.issuer(), name, TOKEN_AUDIENCE, now, ttl);
        (cca_trust::jwt::sign(&self.key, &claims), claims)
    }

    /// Who `token` proves, or why it proves nothing; a token naming a key
    /// the OIDC issuer's set does not hold has the keys fetched again
    /// first (at most once per [`crate::oidc::REFETCH_INTERVAL`]), so
    /// tokens of a rotated key are accepted at once.
    async fn verify_fetching(&self, token: &str) -> Result<(Claims, Via), TokenError> {
        let verdict = self.verify(token, cca_model::clock::system_now());
        match (&verdict, &self.oidc_issuer) {
            (Err(TokenError::UnknownKid { .. }), Some(issuer)) => {
                if let Some(keys) = self.refetch.keys(issuer).await {
                    self.set_oidc_keys(keys);
                }
                // Again, whether this request fetched or another did
                // meanwhile: a kid still unknown is refused.
                self.verify(token, cca_model::clock::system_now())
            }
            _ => verdict,
        }
    }

    /// Who `token` proves with the keys held now, or why it proves nothing.
    fn verify(&self, token: &str, now: std::time::SystemTime) -> Result<(Claims, Via), TokenError> {
        match self.ours.verify(token, now) {
            Ok(claims) => {
                let via = Via::Token {
                    jti: claims.jti.clone(),
                    expires_at: claims.exp,
                };
                Ok((claims, via))
            }
            // Not ours (another key or issuer): the OIDC issuer's, if one
            // is trusted, and then its verdict is the one that counts.
            Err(error @ (TokenError::WrongIssuer { .. } | TokenError::UnknownKid { .. })) => {
                match &self.oidc {
                    Some(oidc) => oidc
                        .read()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .verify(token, now)
                        .map(|claims| (claims, Via::Oidc)),
                    None => Err(error),
                }
            }
            Err(error) => Err(error),
        }
    }
}

/// The identity the request's connection proved, if any.
pub(crate) fn caller(request: &Request) -> Option<Identity> {
    request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .and_then(|ConnectInfo(peer)| peer.identity.clone())
}

/// Routes anyone may call: who-am-I, the join (a joining node has no
/// certificate yet: its join token is its credential, checked there), and
/// the console's page and assets (they hold no data: the page asks for a
/// token and reads through the routes that check it).
fn is_open(route: &str) -> bool {
    matches!(route, "/v1/identity" | "/v1/join" | "/ui" | "/ui/{file}")
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, message)
}

/// Establishes who is calling and whether they may: see the module
/// documentation and `authz`.
pub(crate) async fn authenticate(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    if state.config().authentication == Authentication::Open {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str)
        .to_owned();
    let presented = match bearer(&request) {
        Ok(presented) => presented,
        Err(refusal) => return refuse(request, refusal).await,
    };
    let certified = caller(&request);
    let caller = match identify(&state, presented, certified).await {
        Ok(caller) => caller,
        Err(refusal) => return refuse(request, refusal).await,
    };
    if let Err(refusal) = admit(&state, &request, &route, caller.as_ref()) {
        let mut response = refuse(request, refusal).await;
        if let Some(caller) = caller {
            response.extensions_mut().insert(caller);
        }
        return response;
    }
    if let Some(caller) = &caller {
        request.extensions_mut().insert(caller.clone());
    }
    let mut response = next.run(request).await;
    if let Some(caller) = caller {
        response.extensions_mut().insert(caller);
    }
    response
}

/// The refusal's answer, once a small request body has been read: an
/// HTTP/2 answer sent before the body ends the stream early, which some
/// clients (curl) report as a framing error instead of the refusal.
async fn refuse(request: Request, refusal: ApiError) -> Response {
    const DRAINED: usize = 64 * 1024;
    let _ = axum::body::to_bytes(request.into_body(), DRAINED).await;
    refusal.into_response()
}

/// The request's bearer token, if it has one.
fn bearer(request: &Request) -> Result<Option<String>, ApiError> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| {
            value
                .to_str()
                .ok()
                .and_then(|text| text.strip_prefix("Bearer "))
                .map(|token| token.trim().to_owned())
                .ok_or_else(|| unauthorized("the Authorization header must read `Bearer TOKEN`"))
        })
        .transpose()
}

/// The caller: a bearer token's user if the request has one, else the
/// identity the connection's certificate proved, else nobody.
async fn identify(
    state: &ApiState,
    bearer: Option<String>,
    certified: Option<Identity>,
) -> Result<Option<Caller>, ApiError> {
    let Some(token) = bearer else {
        return Ok(certified.map(|identity| Caller {
            identity,
            via: Via::Certificate,
        }));
    };
    let Some(tokens) = state.token_authority() else {
        return Err(unauthorized(
            "this server accepts no bearer tokens: use a client certificate",
        ));
    };
    let (claims, via) = tokens
        .verify_fetching(&token)
        .await
        .map_err(|error| unauthorized(format!("the bearer token is refused: {error}")))?;
    if let Via::Token { jti: Some(jti), .. } = &via {
        let id = cca_model::access::RevokedTarget::Token {
            jti: jti.clone(),
            expires_at: 0,
        }
        .id();
        if state.cache().view().revocations.contains_key(&id) {
            return Err(unauthorized(
                "the bearer token was revoked (logged out, or by an administrator): log in again",
            ));
        }
    }
    cca_trust::identity::check_name(&claims.sub).map_err(|error| {
        unauthorized(format!(
            "the bearer token's subject is not a user name: {error}"
        ))
    })?;
    Ok(Some(Caller {
        identity: Identity::User(claims.sub),
        via,
    }))
}

/// Whether `caller` may use `route`: nodes their own agent routes, users
/// what their roles allow (`authz`).
fn admit(
    state: &ApiState,
    request: &Request,
    route: &str,
    caller: Option<&Caller>,
) -> Result<(), ApiError> {
    if is_open(route) {
        return Ok(());
    }
    let identity = caller.map(|caller| &caller.identity);
    let path = request.uri().path();
    rule(route, path, identity)?;
    let Some(Caller {
        identity: Identity::User(name),
        via,
    }) = caller
    else {
        return Ok(());
    };
    if route == "/v1/logout" {
        return Ok(());
    }
    let view = state.cache().view();
    let user =
        crate::authz::user_record(&view, name, *via == Via::Certificate).ok_or_else(|| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "user `{name}` is not a user of this cluster: an administrator adds them with \
                 `cca user create {name} --role ROLE`"
                ),
            )
        })?;
    let named = object_name(route, path);
    // A user may mint tokens for themself.
    if route == "/v1/users/{name}/tokens" && named == Some(name.as_str()) {
        return Ok(());
    }
    let need = crate::authz::requirement(request.method(), route).ok_or_else(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{route} has no authorization rule: refused"),
        )
    })?;
    crate::authz::check(state, &view, &user, need, named)
}

/// The value of the route's last variable segment (`{name}`, `{id}`).
fn object_name<'p>(route: &str, path: &'p str) -> Option<&'p str> {
    let parts: Vec<&str> = route.split('/').collect();
    let variable = parts.iter().rposition(|part| part.starts_with('{'))?;
    path.split('/').nth(variable)
}

/// The rule by kind of caller, pure: may `caller` use `route` (the
/// matched pattern) at `path` at all?
fn rule(route: &str, path: &str, caller: Option<&Identity>) -> Result<(), ApiError> {
    let Some(caller) = caller else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs a client certificate of the cluster CA or a user's bearer \
             token: nodes get certificates when they join, users a token from their \
             administrator (`cca user token`) or their OIDC issuer",
        ));
    };
    if route.starts_with("/v1/agent/") {
        return admit_agent(route, path, caller);
    }
    match caller {
        Identity::User(_) => Ok(()),
        other => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{other} may use only the agent routes of its own node, not {route}"),
        )),
    }
}

/// Agent routes: only the node named in the path (register checks the
/// name in its body itself, through [`check_node`]).
fn admit_agent(route: &str, path: &str, caller: &Identity) -> Result<(), ApiError> {
    let Identity::Node(own) = caller else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("agent routes are for nodes; {caller} is not one"),
        ));
    };
    if route == "/v1/agent/register" {
        return Ok(());
    }
    let named = path
        .strip_prefix("/v1/agent/nodes/")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    if named == own {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("node `{own}` may act only as itself, not as node `{named}`"),
        ))
    }
}

/// For routes that name the node in their body: under certificates, the
/// caller must be that node.
pub(crate) fn check_node(
    state: &ApiState,
    caller: Option<&Identity>,
    node: &str,
) -> Result<(), ApiError> {
    if state.config().authentication == Authentication::Open {
        return Ok(());
    }
    match caller {
        Some(Identity::Node(own)) if own == node => Ok(()),
        Some(Identity::Node(own)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("node `{own}` may act only as itself, not as node `{node}`"),
        )),
        _ => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("only node `{node}` itself may do this"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use cca_trust::jwt::testing::{JWKS_PATH, TestIssuer};

    use super::*;
    use crate::oidc::{OidcIssuer, Refetch};

    /// An OIDC issuer served on loopback: its discovery document, and a
    /// JWKS the test replaces (a key rotation), counting its fetches.
    struct ServedIssuer {
        url: String,
        jwks: Arc<Mutex<String>>,
        fetches: Arc<AtomicU32>,
    }

    async fn serve_issuer() -> ServedIssuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let discovery = TestIssuer::new(url.clone()).discovery_document();
        let jwks = Arc::new(Mutex::new(String::new()));
        let fetches = Arc::new(AtomicU32::new(0));
        let (served, counted) = (Arc::clone(&jwks), Arc::clone(&fetches));
        let router = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || async move { discovery }),
            )
            .route(
                JWKS_PATH,
                axum::routing::get(move || async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    served.lock().expect("lock").clone()
                }),
            );
        tokio::spawn(async move { axum::serve(listener, router).await });
        ServedIssuer { url, jwks, fetches }
    }

    #[tokio::test]
    async fn a_token_of_an_unknown_key_id_fetches_the_keys_at_once_but_rarely() {
        let served = serve_issuer().await;
        let first = TestIssuer::new(served.url.clone());
        *served.jwks.lock().expect("lock") = first.jwks_document();
        let issuer = OidcIssuer {
            issuer: served.url.clone(),
            audience: "cca-cli".into(),
        };
        let verifier = issuer.verifier().await.expect("the issuer's keys");
        let mut authority = TokenAuthority::new(SigningKey::generate().expect("key"), "cca:test")
            .with_oidc(issuer, verifier);
        let interval = Duration::from_millis(300);
        authority.refetch = Refetch::every(interval);
        let fetches = || served.fetches.load(Ordering::SeqCst);
        let token = |issuer: &TestIssuer| {
            issuer.token(
                "alice",
                "cca-cli",
                cca_model::clock::system_now(),
                Duration::from_secs(600),
            )
        };
        let subject = |verdict: Result<(Claims, Via), TokenError>| {
            verdict.map(|(claims, via)| (claims.sub, via))
        };
        assert_eq!(
            subject(authority.verify_fetching(&token(&first)).await).expect("known key"),
            ("alice".to_owned(), Via::Oidc)
        );
        assert_eq!(fetches(), 1, "only the start's fetch");

        // The issuer rotates: its new key's first token is accepted at
        // once, after one fetch.
        let rotated = TestIssuer::new(served.url.clone());
        *served.jwks.lock().expect("lock") = rotated.jwks_document();
        assert!(authority.verify_fetching(&token(&rotated)).await.is_ok());
        assert_eq!(fetches(), 2);

        // Made-up key ids within the interval, many at once: refused on
        // the keys held, without another fetch.
        let unknown = token(&TestIssuer::new(served.url.clone()));
        let attempts = (0..20).map(|_| authority.verify_fetching(&unknown));
        for verdict in futures_util::future::join_all(attempts).await {
            assert!(
                matches!(verdict, Err(TokenError::UnknownKid { .. })),
                "{verdict:?}"
            );
        }
        assert_eq!(fetches(), 2, "no fetch within the interval");

        // Once the interval has passed, the next unknown key id fetches
        // again, and a key published meanwhile is accepted.
        let third = TestIssuer::new(served.url.clone());
        *served.jwks.lock().expect("lock") = third.jwks_document();
        tokio::time::sleep(interval).await;
        assert!(authority.verify_fetching(&token(&third)).await.is_ok());
        assert_eq!(fetches(), 3);
        assert!(
            matches!(
                authority.verify_fetching(&token(&first)).await,
                Err(TokenError::UnknownKid { .. })
            ),
            "the old key is gone with the fetched set"
        );
    }

    fn status(route: &str, path: &str, caller: Option<&Identity>) -> Option<u16> {
        if is_open(route) {
            return None;
        }
        rule(route, path, caller)
            .err()
            .map(|error| error.status.as_u16())
    }

    #[test]
    fn nodes_act_only_as_themselves_and_users_only_on_user_routes() {
        let n1 = Identity::Node("n1".into());
        let alice = Identity::User("alice".into());
        let beat = "/v1/agent/nodes/{node}/heartbeat";
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", Some(&n1)),
            None
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n2/heartbeat", Some(&n1)),
            Some(403)
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", Some(&alice)),
            Some(403)
        );
        assert_eq!(
            status(beat, "/v1/agent/nodes/n1/heartbeat", None),
            Some(401)
        );
        assert_eq!(status("/v1/services", "/v1/services", Some(&alice)), None);
        assert_eq!(status("/v1/services", "/v1/services", Some(&n1)), Some(403));
        assert_eq!(status("/v1/services", "/v1/services", None), Some(401));
        assert_eq!(status("/v1/identity", "/v1/identity", None), None);
        assert_eq!(
            status("/v1/agent/register", "/v1/agent/register", Some(&n1)),
            None,
            "the body's name is checked by the route"
        );
    }
}
