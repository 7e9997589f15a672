//! Pulls through registry authentication: a small axum proxy started in
//! the test stands in front of the loopback `docker-registry` and speaks
//! the distribution token protocol. Requests without a valid bearer token
//! get `401` with `WWW-Authenticate: Bearer realm="http://…/token",
//! service="…",scope="repository:NAME:pull"`; `/token` hands out tokens
//! (anonymously, or only for the right basic credentials) scoped to one
//! repository; requests with a token for their repository are forwarded to
//! the registry. A second mode asks for basic credentials on every request
//! instead (`WWW-Authenticate: Basic`), as an htpasswd registry does.
//!
//! Shown: an anonymous token pull, a pull with credentials exchanged for a
//! token, a basic-auth pull; the proxy really refuses what lacks a token or
//! credentials (so the pulls went through the flow, not around it); a
//! wrong password and missing credentials fail with an error naming the
//! registry and what to do, and leave nothing in the store. Settings
//! loaded from a registry config file (`RegistrySettings::load`: plain
//! HTTP, a username and a password file) authenticate a pull the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use cca_image::testing::{TestRegistry, busybox_layer, commands_available, write_oci_layout};
use cca_image::{Error, ImageStore, Puller, RegistryConfig, RegistrySettings};

const SERVICE: &str = "cca-test-registry";
const USER: &str = "puller";
const PASSWORD: &str = "s3cret pass";

/// How the proxy wants clients to authenticate.
#[derive(Clone, Debug)]
enum Auth {
    /// Bearer tokens from `/token`, to anyone.
    AnonymousToken,
    /// Bearer tokens from `/token`, for these basic credentials only.
    CredentialedToken { user: String, password: String },
    /// Basic credentials on every request (no tokens).
    Basic { user: String, password: String },
}

/// What the proxy saw, for the tests to check the flow was followed.
#[derive(Debug, Default)]
struct Seen {
    /// `401`s sent, with the path asked for.
    challenges: Vec<String>,
    /// Tokens handed out: (token, scope, user or "" for anonymous).
    issued: Vec<(String, String, String)>,
    /// `/token` requests refused.
    token_refusals: usize,
    /// Requests forwarded to the registry: (method, path).
    forwarded: Vec<(String, String)>,
}

#[derive(Clone)]
struct Proxy {
    auth: Auth,
    /// `http://127.0.0.1:PORT` of the registry.
    upstream: String,
    /// `http://127.0.0.1:PORT/token` of this proxy.
    realm: String,
    client: reqwest::Client,
    /// Live tokens and the scope each grants.
    tokens: Arc<Mutex<HashMap<String, String>>>,
    seen: Arc<Mutex<Seen>>,
}

impl Proxy {
    fn seen<T>(&self, read: impl FnOnce(&mut Seen) -> T) -> T {
        read(&mut self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The repository a `/v2/NAME/{manifests,blobs,tags}/…` path is about
    /// (`None` for `/v2/` itself).
    fn repository(path: &str) -> Option<&str> {
        let rest = path.strip_prefix("/v2/")?;
        ["/manifests/", "/blobs/", "/tags/"]
            .iter()
            .filter_map(|marker| rest.rfind(marker).map(|at| &rest[..at]))
            .next()
    }

    fn challenge(&self, path: &str) -> Response {
        self.seen(|seen| seen.challenges.push(path.to_owned()));
        let value = match (&self.auth, Self::repository(path)) {
            (Auth::Basic { .. }, _) => format!("Basic realm=\"{SERVICE}\""),
            (_, Some(repository)) => format!(
                "Bearer realm=\"{}\",service=\"{SERVICE}\",scope=\"repository:{repository}:pull\"",
                self.realm
            ),
            (_, None) => format!("Bearer realm=\"{}\",service=\"{SERVICE}\"", self.realm),
        };
        let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
        let mut response = (StatusCode::UNAUTHORIZED, body).into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_str(&value).expect("a valid header"),
        );
        response
    }

    /// Whether the request's credentials let it read `path`.
    fn allowed(&self, headers: &HeaderMap, path: &str) -> bool {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if let Auth::Basic { user, password } = &self.auth {
            return authorization == basic(user, password);
        }
        let Some(token) = authorization.strip_prefix("Bearer ") else {
            return false;
        };
        let tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(scope) = tokens.get(token) else {
            return false;
        };
        match Self::repository(path) {
            // Any valid token may ask whether the API is there.
            None => true,
            Some(repository) => scope
                .split(' ')
                .any(|granted| granted == format!("repository:{repository}:pull")),
        }
    }

    async fn forward(
        &self,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path_and_query}", self.upstream))
            .body(body);
        for (name, value) in headers {
            if name != header::HOST && name != header::AUTHORIZATION {
                request = request.header(name, value);
            }
        }
        let upstream = match request.send().await {
            Ok(upstream) => upstream,
            Err(error) => {
                return (StatusCode::BAD_GATEWAY, format!("registry: {error}")).into_response();
            }
        };
        self.seen(|seen| {
            seen.forwarded
                .push((method.to_string(), uri.path().to_owned()))
        });
        let status = upstream.status();
        let mut response_headers = HeaderMap::new();
        for (name, value) in upstream.headers() {
            if name != header::TRANSFER_ENCODING && name != header::CONNECTION {
                response_headers.insert(name, value.clone());
            }
        }
        let bytes = upstream.bytes().await.unwrap_or_default();
        let mut response = (status, bytes).into_response();
        response.headers_mut().extend(response_headers);
        response
    }
}

/// `Basic base64(user:password)`.
fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64(format!("{user}:{password}").as_bytes()))
}

/// Standard base64 with padding (the tests need nothing more).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn token(
    State(proxy): State<Proxy>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let user = match &proxy.auth {
        Auth::AnonymousToken => String::new(),
        Auth::CredentialedToken { user, password } => {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok());
            if given != Some(basic(user, password).as_str()) {
                proxy.seen(|seen| seen.token_refusals += 1);
                let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"invalid username or password"}]}"#;
                return (StatusCode::UNAUTHORIZED, body).into_response();
            }
            user.clone()
        }
        Auth::Basic { .. } => return StatusCode::NOT_FOUND.into_response(),
    };
    if query.get("service").map(String::as_str) != Some(SERVICE) {
        return (StatusCode::BAD_REQUEST, "unknown service").into_response();
    }
    let scope = query.get("scope").cloned().unwrap_or_default();
    let token = format!("tok-{:016x}", fastrand::u64(..));
    proxy
        .tokens
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(token.clone(), scope.clone());
    proxy.seen(|seen| seen.issued.push((token.clone(), scope, user)));
    axum::Json(serde_json::json!({ "token": token, "access_token": token, "expires_in": 300 }))
        .into_response()
}

async fn registry(
    State(proxy): State<Proxy>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !proxy.allowed(&headers, uri.path()) {
        return proxy.challenge(uri.path());
    }
    proxy.forward(method, &uri, &headers, body).await
}

/// The proxy on a loopback port, stopped on drop.
struct RunningProxy {
    proxy: Proxy,
    /// `127.0.0.1:PORT`, as written in references.
    host: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start_proxy(registry: &TestRegistry, auth: Auth) -> RunningProxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let host = listener.local_addr().expect("bound").to_string();
    let proxy = Proxy {
        auth,
        upstream: format!("http://{}", registry.host),
        realm: format!("http://{host}/token"),
        client: reqwest::Client::new(),
        tokens: Arc::default(),
        seen: Arc::default(),
    };
    let app = Router::new()
        .route("/token", get(token))
        .fallback(registry_handler)
        .with_state(proxy.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    RunningProxy {
        proxy,
        host,
        server,
    }
}

async fn registry_handler(
    state: State<Proxy>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    registry(state, method, uri, headers, body).await
}

/// A registry holding `test/busybox:1`, or `None` (skipped) without tools.
fn busybox_registry(test: &str) -> Option<(TestRegistry, tempfile::TempDir)> {
    if !commands_available(test, &["docker-registry", "skopeo", "busybox"]) {
        return None;
    }
    let layout = tempfile::tempdir().expect("tempdir");
    let layer = busybox_layer().expect("busybox layer");
    write_oci_layout(layout.path(), "1", &[layer], &["sh"]).expect("layout");
    let registry = TestRegistry::start().expect("registry starts");
    registry
        .push(layout.path(), "1", "test/busybox")
        .expect("skopeo pushes");
    Some((registry, layout))
}

/// Settings for plain HTTP to `host`, with credentials when given.
fn settings(host: &str, credentials: Option<(&str, &str)>) -> RegistrySettings {
    let mut settings = RegistrySettings::plain_http(host);
    if let (Some(config), Some((user, password))) = (settings.registries.get_mut(host), credentials)
    {
        *config = RegistryConfig {
            plain_http: true,
            username: Some(user.into()),
            password: Some(password.into()),
        };
    }
    settings
}

/// Pulls `host/test/busybox:1` into a fresh store.
async fn pull(
    host: &str,
    credentials: Option<(&str, &str)>,
) -> (
    Result<cca_image::ImageRecord, Error>,
    ImageStore,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path()).expect("store opens");
    let puller = Puller::new(store.clone(), settings(host, credentials));
    let reference = format!("{host}/test/busybox:1").parse().expect("reference");
    (puller.pull(&reference).await, store, dir)
}

/// Tokens for [`USER`] with [`PASSWORD`] only.
fn credentialed_token() -> Auth {
    Auth::CredentialedToken {
        user: USER.into(),
        password: PASSWORD.into(),
    }
}

/// The proxy issued a token for the repository to [`USER`].
fn assert_token_issued_to_user(proxy: &RunningProxy) {
    let issued = proxy.proxy.seen(|seen| seen.issued.clone());
    assert!(
        issued
            .iter()
            .any(|(_, scope, user)| scope == "repository:test/busybox:pull" && user == USER),
        "a token for {USER}: {issued:?}"
    );
}

/// The proxy refuses a manifest request without credentials, with the
/// challenge a client needs to authenticate.
async fn assert_refused_without_auth(proxy: &RunningProxy, expected_challenge: &str) {
    let url = format!("http://{}/v2/test/busybox/manifests/1", proxy.host);
    let response = reqwest::get(&url).await.expect("the proxy answers");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(challenge, expected_challenge);
}

/// The error names the registry and the image, says access was refused,
/// and nothing was stored.
fn assert_refused(
    result: Result<cca_image::ImageRecord, Error>,
    store: &ImageStore,
    host: &str,
    hint: &str,
) {
    let error = result.expect_err("the pull is refused").to_string();
    assert!(error.contains(host), "names the registry: {error}");
    assert!(error.contains("test/busybox"), "names the image: {error}");
    assert!(error.contains(hint), "{error:?} lacks {hint:?}");
    assert!(!error.contains(PASSWORD), "no password in errors: {error}");
    assert!(
        store.images().expect("images").is_empty(),
        "nothing recorded"
    );
}

#[tokio::test]
async fn an_anonymous_bearer_token_is_fetched_and_used() {
    let Some((registry, _layout)) = busybox_registry("anonymous_bearer_token") else {
        return;
    };
    let proxy = start_proxy(&registry, Auth::AnonymousToken).await;
    assert_refused_without_auth(
        &proxy,
        &format!(
            "Bearer realm=\"http://{}/token\",service=\"{SERVICE}\",scope=\"repository:test/busybox:pull\"",
            proxy.host
        ),
    )
    .await;

    let (pulled, store, _dir) = pull(&proxy.host, None).await;
    let image = pulled.expect("an anonymous token pull works");
    assert_eq!(store.layer_dirs(&image).len(), 1);
    let (issued, forwarded) = proxy
        .proxy
        .seen(|seen| (seen.issued.clone(), seen.forwarded.clone()));
    assert!(
        issued
            .iter()
            .any(|(_, scope, user)| scope == "repository:test/busybox:pull" && user.is_empty()),
        "an anonymous token for the repository: {issued:?}"
    );
    assert!(
        forwarded
            .iter()
            .any(|(_, path)| path == "/v2/test/busybox/manifests/1"),
        "the manifest went through with the token: {forwarded:?}"
    );
    assert!(
        forwarded
            .iter()
            .any(|(_, path)| path.contains("/blobs/sha256:")),
        "so did the blobs: {forwarded:?}"
    );
}

#[tokio::test]
async fn credentials_are_exchanged_for_a_token_and_a_wrong_password_is_refused() {
    let Some((registry, _layout)) = busybox_registry("credentialed_token") else {
        return;
    };
    let proxy = start_proxy(&registry, credentialed_token()).await;

    let (pulled, store, _dir) = pull(&proxy.host, Some((USER, PASSWORD))).await;
    let image = pulled.expect("a pull with the right credentials works");
    assert_eq!(store.layer_dirs(&image).len(), 1);
    assert_token_issued_to_user(&proxy);

    let wrong = "the registry refused the credentials configured for it (user puller): check the \
                 username and password";
    let (pulled, store, _dir) = pull(&proxy.host, Some((USER, "wrong"))).await;
    assert_refused(pulled, &store, &proxy.host, wrong);
    let (pulled, store, _dir) = pull(&proxy.host, None).await;
    assert_refused(
        pulled,
        &store,
        &proxy.host,
        "the registry refused access: it needs credentials this node does not have",
    );
    assert!(
        proxy.proxy.seen(|seen| seen.token_refusals) >= 2,
        "the token endpoint refused the wrong password and the anonymous request"
    );
}

#[tokio::test]
async fn basic_credentials_are_sent_when_the_registry_asks_for_them() {
    let Some((registry, _layout)) = busybox_registry("basic_auth") else {
        return;
    };
    let auth = Auth::Basic {
        user: USER.into(),
        password: PASSWORD.into(),
    };
    let proxy = start_proxy(&registry, auth).await;
    assert_refused_without_auth(&proxy, &format!("Basic realm=\"{SERVICE}\"")).await;

    let (pulled, store, _dir) = pull(&proxy.host, Some((USER, PASSWORD))).await;
    let image = pulled.expect("a basic-auth pull works");
    assert_eq!(store.layer_dirs(&image).len(), 1);
    let forwarded = proxy.proxy.seen(|seen| seen.forwarded.clone());
    assert!(
        forwarded
            .iter()
            .any(|(_, path)| path == "/v2/test/busybox/manifests/1"),
        "{forwarded:?}"
    );

    let (pulled, store, _dir) = pull(&proxy.host, Some((USER, "wrong"))).await;
    assert_refused(
        pulled,
        &store,
        &proxy.host,
        "refused the credentials configured for it (user puller)",
    );
}

#[tokio::test]
async fn settings_loaded_from_a_registry_config_file_authenticate_a_pull() {
    let Some((registry, _layout)) = busybox_registry("registry_config_file") else {
        return;
    };
    let proxy = start_proxy(&registry, credentialed_token()).await;

    let config_dir = tempfile::tempdir().expect("tempdir");
    let config = config_dir.path().join("registries.json");
    let write = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
    };
    write(
        &config_dir.path().join("password"),
        &format!("{PASSWORD}\n"),
    );
    write(
        &config,
        &format!(
            r#"{{"registries": {{"{}": {{"insecure": true, "username": "{USER}", "password_file": "password"}}}}}}"#,
            proxy.host
        ),
    );
    let loaded = RegistrySettings::load(&config).expect("the config loads");
    assert_eq!(
        loaded.warnings.len(),
        1,
        "only the plain-HTTP credentials warning: {:?}",
        loaded.warnings
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path()).expect("store opens");
    let reference = format!("{}/test/busybox:1", proxy.host)
        .parse()
        .expect("reference");
    let image = Puller::new(store.clone(), loaded.settings)
        .pull(&reference)
        .await
        .expect("a pull with the file's credentials works");
    assert_eq!(store.layer_dirs(&image).len(), 1);
    assert_token_issued_to_user(&proxy);
    assert_eq!(proxy.proxy.seen(|seen| seen.token_refusals), 0);
}
