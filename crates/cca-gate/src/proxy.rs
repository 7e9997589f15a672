//! The request path: find the gate by host and the pool by path, apply the
//! gate's redirect and rate limits, choose a backend (sticky cookie,
//! affinity, balance, circuit breaker), forward with the forwarding
//! headers, retry idempotent requests elsewhere under the retry budget,
//! and pass a WebSocket (any HTTP/1.1 upgrade) through once the backend
//! agrees. A gate with a cache answers fresh GETs from it (`cca-cache:
//! hit`) and stores what may be stored as it passes. The gate answers
//! itself only when it must: 404 for a host no gate serves, 405 for
//! CONNECT (a gate is no tunnel), 503 with `Retry-After` when a target has
//! no ready backend, 502/504 when backends fail or time out, 400 when a
//! request body cannot be read, 429 over a rate limit; each with a
//! plain-text body saying which.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body as _, Frame, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::uri::PathAndQuery;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::balance::{Lease, Outcome, Pool, Preference, hash64};
use crate::cache::{self, CacheKey, Collector, Stored};
use crate::forward::{self, Forwarding, Origin};
use crate::gate_state::GateState;
use crate::metrics::{Metrics, class_index};
use crate::passed::Answer;
use crate::serve_h1::{ClientIo, OwnUpgraded, UpgradeSlot};
use crate::server::{Activity, Busy};
use crate::table::{GateRoutes, RouteTable};
use crate::traffic::{self, Traffic, Wake};
use crate::upstream::{RequestLine, Upgraded, UpstreamBody, UpstreamError};

/// Every body the gate sends or receives.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// Why a body broke off: the client's or the backend's connection failed.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// How long a client is told to wait before trying a target with no
/// ready backend again.
const RETRY_AFTER_SECS: u64 = 5;

/// One client connection as its requests see it: who it is, the proxy
/// that answers it, and the route table its requests last used.
#[derive(Debug)]
pub struct Peer {
    pub client: SocketAddr,
    /// The connection is TLS (the request came in over HTTPS).
    pub tls: bool,
    pub activity: Arc<Activity>,
    proxy: Arc<Proxy>,
    /// The client's address as the forwarding headers write it.
    address: forward::ClientAddress,
    /// The key `source-ip` affinity hashes.
    address_hash: u64,
    table: Mutex<Arc<Snapshot>>,
}

/// A route table as one connection holds it. A request takes the
/// connection's own reference: taking the table itself would write its
/// reference count, a cache line every request on every thread shares.
#[derive(Debug)]
struct Snapshot {
    generation: u64,
    table: Arc<RouteTable>,
}

impl Peer {
    pub fn new(proxy: Arc<Proxy>, client: SocketAddr, tls: bool, activity: Arc<Activity>) -> Self {
        let snapshot = proxy.snapshot();
        Self {
            client,
            tls,
            activity,
            proxy,
            address: forward::ClientAddress::new(client),
            address_hash: hash64(client.ip().to_string().as_bytes()),
            table: Mutex::new(Arc::new(snapshot)),
        }
    }

    /// Answers one request: the response, and what counts the request in
    /// flight (its connection busy) until it is dropped once the response
    /// has been sent.
    pub fn answer(
        &self,
        request: Request<Body>,
    ) -> impl Future<Output = (Answer<Body>, Busy)> + '_ {
        self.proxy.serve(request, self)
    }

    /// Answers one request; the request counts as in flight until the
    /// response's body has been sent or dropped.
    pub async fn handle(&self, request: Request<Body>) -> Response<Body> {
        let (answer, busy) = self.answer(request).await;
        answer.into_response().map(|body| {
            Guarded {
                inner: body,
                _guard: busy,
            }
            .boxed_unsync()
        })
    }

    /// The current route table, through the connection's own reference.
    fn table(&self) -> Arc<Snapshot> {
        let generation = self.proxy.generation.load(Ordering::Acquire);
        let mut held = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.generation != generation {
            *held = Arc::new(self.proxy.snapshot());
        }
        Arc::clone(&held)
    }
}

/// How the proxy answers, beyond what each gate says.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProxyOptions {
    /// Log every request (target `cca_gate::access`).
    pub access_log: bool,
    /// The node's HTTPS port, for redirects to HTTPS (443 is left out of
    /// the URL).
    pub https_port: Option<u16>,
}

/// The proxy: the current route table and what serves requests with it.
#[derive(Debug)]
pub struct Proxy {
    /// Requests held for a waking service wait for the next table.
    tables: watch::Sender<Arc<RouteTable>>,
    /// Counts table replacements, so a connection knows when its own
    /// reference is stale without reading `tables`.
    generation: AtomicU64,
    pub(crate) metrics: Arc<Metrics>,
    options: ProxyOptions,
    traffic: Arc<Traffic>,
    waker: OnceLock<Arc<dyn Wake>>,
}

impl Proxy {
    pub fn new(metrics: Arc<Metrics>, traffic: Arc<Traffic>, options: ProxyOptions) -> Self {
        Self {
            tables: watch::Sender::new(Arc::default()),
            generation: AtomicU64::new(0),
            metrics,
            options,
            traffic,
            waker: OnceLock::new(),
        }
    }

    /// Who wakes a service at zero (set once; without one, a target with
    /// no backend is answered 503 at once).
    pub fn set_waker(&self, waker: Arc<dyn Wake>) {
        let _ = self.waker.set(waker);
    }

    /// Serves `table` from the next request on.
    pub fn replace_table(&self, table: RouteTable) {
        self.tables.send_replace(Arc::new(table));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The table requests use now.
    pub fn table(&self) -> Arc<RouteTable> {
        Arc::clone(&self.tables.borrow())
    }

    fn snapshot(&self) -> Snapshot {
        // Read first: a table replaced in between is caught next time.
        let generation = self.generation.load(Ordering::Acquire);
        Snapshot {
            generation,
            table: self.table(),
        }
    }

    async fn serve(&self, request: Request<Body>, peer: &Peer) -> (Answer<Body>, Busy) {
        let busy = peer.activity.begin();
        (self.answer(request, peer).await, busy)
    }

    async fn answer(&self, request: Request<Body>, peer: &Peer) -> Answer<Body> {
        if request.method() == Method::CONNECT {
            // A gate routes requests to services; it is no tunnel to
            // wherever a client names.
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "the gate does not tunnel CONNECT requests\n".to_owned(),
            );
            response.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
            return response.into();
        }
        let started = Instant::now();
        let snapshot = peer.table();
        let table = &snapshot.table;
        let gate = forward::request_host(request.uri(), request.headers())
            .and_then(|host| table.gate_for(&host));
        let Some(gate) = gate else {
            self.metrics.unknown_host.inc();
            let host = forward::request_host(request.uri(), request.headers());
            let shown = host.as_deref().unwrap_or("(none)");
            return text(
                StatusCode::NOT_FOUND,
                format!("no gate serves the host \"{shown}\"\n"),
            )
            .into();
        };
        peer.activity
            .set_idle(Duration::from_millis(gate.spec.timeouts.idle.0));
        // What the access log needs of the request once it has been sent.
        let logged = self.options.access_log.then(|| {
            let host = forward::request_host(request.uri(), request.headers());
            (
                request.method().clone(),
                host.map(Cow::into_owned).unwrap_or_default(),
                request.uri().path().to_owned(),
            )
        });
        let answer = self.route(gate, request, peer).await;
        let status = answer.response.status().as_u16();
        gate.state.metrics.by_class[class_index(Some(status))].inc();
        let elapsed = started.elapsed();
        gate.state.metrics.seconds.observe(elapsed);
        if let Some((method, host, path)) = logged {
            tracing::info!(
                target: "cca_gate::access",
                gate = %gate.spec.name,
                client = %peer.client.ip(),
                method = %method,
                host = %host,
                path = %path,
                status,
                ms = elapsed.as_secs_f64() * 1e3,
                backend = answer
                    .response
                    .extensions()
                    .get::<Served>()
                    .map_or("", |served| served.0.as_str()),
            );
        }
        answer
    }

    async fn route(&self, gate: &GateRoutes, request: Request<Body>, peer: &Peer) -> Answer<Body> {
        let spec = &gate.spec;
        if !peer.tls && spec.redirect_https && spec.tls.is_some() {
            return redirect_to_https(request.uri(), request.headers(), self.options.https_port)
                .into();
        }
        if let Err(limited) = gate.state.admit(peer.client.ip()) {
            gate.state.metrics.rate_limited.inc();
            let mut response = text(
                StatusCode::TOO_MANY_REQUESTS,
                format!("gate \"{}\": too many requests; slow down\n", spec.name),
            );
            let seconds = limited.retry_after.as_secs_f64().ceil().max(1.0) as u64;
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            return response.into();
        }
        let cached = gate.state.cache.as_ref().and_then(|cache| {
            let host = forward::request_host(request.uri(), request.headers())?;
            let path = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
            let key = cache::request_key(request.method(), &host, path, request.headers())?;
            Some((cache, key))
        });
        if let Some((cache, key)) = &cached
            && let Some(hit) = cache.get(key, request.headers(), Instant::now())
        {
            gate.state.metrics.cache_hits.inc();
            return cache_hit(request.method() == Method::HEAD, hit).into();
        }
        let store = cached
            .filter(|_| request.method() == Method::GET)
            .map(|(_, key)| (key, request.headers().clone()));
        let mut pool: &Pool = gate.pool_for(request.uri().path());
        traffic::stamp(&pool.last_request);
        pool.requests.inc();
        let mut waited = None;
        let woken;
        if pool.backends.is_empty() && pool.wakeable {
            // Boxed: rare, and the common path's future stays small.
            let held = Box::pin(self.wake_and_hold(gate, pool, request.uri(), request.headers()));
            match held.await {
                Ok((new_pool, took)) => {
                    woken = new_pool;
                    pool = &woken;
                    waited = Some(took);
                }
                Err(refused) => return refused.into(),
            }
        }
        gate.state.count_request();
        let mut answer = self.forward(gate, pool, request, peer).await;
        if let Some(took) = waited {
            // In the map with the backend's fields, so that the gate's
            // value replaces any the backend sent (a cold start is rare).
            let mut response = answer.into_response();
            response
                .headers_mut()
                .insert("cca-cold-start", HeaderValue::from(took.as_millis() as u64));
            answer = response.into();
        }
        match store {
            Some((key, request_headers)) => {
                // The cache reads the fields: all of them in the map.
                let response = answer.into_response();
                store_when_complete(&gate.state, key, request_headers, response).into()
            }
            None => answer,
        }
    }

    /// Wakes `pool`'s service and holds the request until a route table
    /// gives the pool a backend: the new pool and how long it took, or the
    /// answer when the gate's queue is full or the wait times out.
    async fn wake_and_hold(
        &self,
        gate: &GateRoutes,
        pool: &Pool,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<(Arc<Pool>, Duration), Response<Body>> {
        let spec = &gate.spec;
        let Some(waker) = self.waker.get() else {
            return Err(no_backend(&spec.name, pool));
        };
        let Some(_held) = gate.state.hold(spec.queue) else {
            let mut response = text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "gate \"{}\": {} requests already wait for service \"{}\" to wake; try again shortly\n",
                    spec.name, spec.queue, pool.service
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            return Err(response);
        };
        let started = Instant::now();
        let host = forward::request_host(uri, headers)
            .map(Cow::into_owned)
            .unwrap_or_default();
        let path = uri.path().to_owned();
        let mut tables = self.tables.subscribe();
        let deadline = started + Duration::from_millis(spec.timeouts.wake.0);
        loop {
            if self.traffic.wake_due(&pool.service, Instant::now()) {
                waker.wake(&pool.service);
            }
            let table = Arc::clone(&tables.borrow_and_update());
            let woken = table
                .gate_for(&host)
                .map(|routes| Arc::clone(routes.pool_for(&path)))
                .filter(|woken| !woken.backends.is_empty());
            if let Some(woken) = woken {
                let took = started.elapsed();
                gate.state.metrics.cold_starts.inc();
                gate.state.metrics.cold_start_seconds.observe(took);
                return Ok((woken, took));
            }
            // Wake again each second: a lost call must not strand us.
            let next_wake = Instant::now() + Duration::from_secs(1);
            match tokio::time::timeout_at(deadline.min(next_wake), tables.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(no_backend(&spec.name, pool)),
                Err(_) if Instant::now() >= deadline => {
                    let mut response = text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "gate \"{}\": service \"{}\" did not wake within {}; try again shortly\n",
                            spec.name,
                            pool.service,
                            humanize(Duration::from_millis(spec.timeouts.wake.0))
                        ),
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
                    return Err(response);
                }
                Err(_) => {}
            }
        }
    }

    /// Sends `request` to a backend of `pool`, retrying elsewhere when it
    /// may.
    async fn forward(
        &self,
        gate: &GateRoutes,
        pool: &Pool,
        mut request: Request<Body>,
        peer: &Peer,
    ) -> Answer<Body> {
        let spec = &gate.spec;
        let upgrade =
            request.version() == Version::HTTP_11 && forward::is_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| ClientSide::of(&mut request));
        let (mut parts, body) = request.into_parts();
        let original_host = parts
            .headers
            .get(header::HOST)
            .cloned()
            .or_else(|| {
                let authority = parts.uri.authority()?;
                HeaderValue::from_str(authority.as_str()).ok()
            })
            .unwrap_or_else(|| HeaderValue::from_static(""));
        let cookie = spec
            .sticky
            .as_ref()
            .and_then(|sticky| forward::cookie(&parts.headers, &sticky.cookie))
            .map(str::to_owned);
        forward::strip_hop_by_hop(&mut parts.headers, upgrade);
        let forwarding = Forwarding::of(
            &parts.headers,
            Origin {
                client: &peer.address,
                scheme: if peer.tls { "https" } else { "http" },
                host: &original_host,
            },
        );
        let preference = Preference {
            sticky: cookie.as_deref(),
            affinity: match (&cookie, spec.balance) {
                (Some(cookie), _) => Some(hash64(cookie.as_bytes())),
                (None, cca_model::spec::Balance::SourceIp) => Some(peer.address_hash),
                (None, _) => None,
            },
        };
        let retryable = !upgrade && forward::is_idempotent(&parts.method) && body.is_end_stream();
        let mut body = Some(body);
        let head = RequestLine {
            method: &parts.method,
            target: parts.uri.path_and_query().map_or("/", PathAndQuery::as_str),
            headers: &parts.headers,
            forwarding: &forwarding,
        };
        let mut tried = Vec::new();
        let mut last_failure: Option<Answer<Body>> = None;
        loop {
            // One reading of the clock for the choice and the latency.
            let sent = Instant::now();
            let Some(lease) = pool.choose(spec.balance, preference, &tried, sent) else {
                return last_failure.unwrap_or_else(|| no_backend(spec.name.as_str(), pool).into());
            };
            let backend = Arc::clone(&lease.backend);
            let timeout = Duration::from_millis(spec.timeouts.response.0);
            let result = {
                let body = body.take().unwrap_or_else(empty);
                let sending =
                    std::pin::pin!(backend.upstream.send(head, body, gate.state.upstream));
                peer.activity.within(sent, timeout, sending).await
            };
            let answered = Instant::now();
            backend.metrics.seconds.observe(answered - sent);
            let failure = match result {
                Some(Ok(answer)) => {
                    let status = answer.response.status();
                    backend.metrics.by_class[class_index(Some(status.as_u16()))].inc();
                    let failed = matches!(status.as_u16(), 502..=504);
                    let outcome = if failed {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    pool.record(&backend, outcome, &spec.circuit_breaker, answered);
                    if !(failed && retryable && gate.state.may_retry(tried.len() as u32)) {
                        return self.respond(
                            gate,
                            lease,
                            answer,
                            cookie.as_deref(),
                            client_upgrade,
                        );
                    }
                    answer.map(BodyExt::boxed_unsync)
                }
                Some(Err(UpstreamError::RequestBody(error))) => {
                    // The client's fault, not the backend's.
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "gate \"{}\": the request's body could not be read: {error}\n",
                            spec.name
                        ),
                    )
                    .into();
                }
                Some(Err(error)) => {
                    backend.metrics.by_class[class_index(None)].inc();
                    pool.record(&backend, Outcome::Failure, &spec.circuit_breaker, answered);
                    tracing::debug!(gate = %spec.name, instance = %backend.target.instance, %error, "a gate backend failed");
                    text(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "gate \"{}\": the backend of service \"{}\" failed: {}\n",
                            spec.name, pool.service, error
                        ),
                    )
                    .into()
                }
                None => {
                    backend.metrics.by_class[class_index(None)].inc();
                    pool.record(&backend, Outcome::Failure, &spec.circuit_breaker, answered);
                    text(
                        StatusCode::GATEWAY_TIMEOUT,
                        format!(
                            "gate \"{}\": the backend of service \"{}\" sent no response within {}\n",
                            spec.name,
                            pool.service,
                            humanize(timeout)
                        ),
                    )
                    .into()
                }
            };
            drop(lease);
            tried.push(backend);
            if !(retryable && gate.state.may_retry(tried.len() as u32 - 1)) {
                return failure;
            }
            last_failure = Some(failure);
        }
    }

    /// The backend's response as the client gets it.
    fn respond(
        &self,
        gate: &GateRoutes,
        lease: Lease,
        answer: Answer<UpstreamBody>,
        cookie: Option<&str>,
        client_upgrade: Option<ClientSide>,
    ) -> Answer<Body> {
        let backend = Arc::clone(&lease.backend);
        let Answer {
            mut response,
            passed,
        } = answer;
        // The backend's hop-by-hop fields were left behind as its head was
        // read; a switch of protocols says so to the client.
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        if let Some(sticky) = &gate.spec.sticky
            && cookie != Some(backend.token.as_str())
            && let Some(set) = forward::sticky_cookie(sticky, &backend.token)
        {
            response.headers_mut().append(header::SET_COOKIE, set);
        }
        // Only the access log reads it.
        let served = self
            .options
            .access_log
            .then(|| Served(backend.target.instance.clone()));
        if switching && let Some(client_upgrade) = client_upgrade {
            let (mut parts, body) = response.into_parts();
            if let Some(backend) = body.into_upgraded() {
                tokio::spawn(tunnel(client_upgrade, backend, lease));
            }
            if let Some(served) = served {
                parts.extensions.insert(served);
            }
            return Answer {
                response: Response::from_parts(parts, empty()),
                passed,
            };
        }
        let (mut parts, body) = response.into_parts();
        if let Some(served) = served {
            parts.extensions.insert(served);
        }
        let body = Guarded {
            inner: body,
            _guard: lease,
        };
        Answer {
            response: Response::from_parts(parts, body.boxed_unsync()),
            passed,
        }
    }
}

/// A response from the cache, marked `cca-cache: hit`.
fn cache_hit(head: bool, hit: Stored) -> Response<Body> {
    let length = hit.body.len();
    let body = if head {
        empty()
    } else {
        Full::new(hit.body)
            .map_err(|never| match never {})
            .boxed_unsync()
    };
    let mut response = Response::new(body);
    *response.status_mut() = hit.status;
    *response.headers_mut() = hit.headers;
    if head {
        // What a GET would get; the stored fields carry no framing.
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    response
        .headers_mut()
        .insert("cca-cache", HeaderValue::from_static("hit"));
    response
}

/// Passes `response` on, storing it in the gate's cache once its body is
/// complete, if it may be stored.
fn store_when_complete(
    state: &Arc<GateState>,
    key: CacheKey,
    request: HeaderMap,
    response: Response<Body>,
) -> Response<Body> {
    let Some(cache) = &state.cache else {
        return response;
    };
    let Some(fresh) = cache::freshness(
        response.status(),
        response.headers(),
        cca_model::clock::system_now(),
    ) else {
        return response;
    };
    let too_big = response
        .body()
        .size_hint()
        .exact()
        .is_some_and(|size| size > cache.max_entry());
    if too_big {
        return response;
    }
    let (parts, body) = response.into_parts();
    let storing = Storing {
        inner: body,
        collector: Some(Collector::new(cache.max_entry())),
        state: Arc::clone(state),
        key: Some(key),
        request,
        status: parts.status,
        headers: parts.headers.clone(),
        fresh,
    };
    Response::from_parts(parts, storing.boxed_unsync())
}

/// A body that keeps a copy of what it passes on and stores it in the
/// gate's cache at its end.
struct Storing {
    inner: Body,
    collector: Option<Collector>,
    state: Arc<GateState>,
    key: Option<CacheKey>,
    request: HeaderMap,
    status: StatusCode,
    headers: HeaderMap,
    fresh: std::time::Duration,
}

impl hyper::body::Body for Storing {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(collector)) = (frame.data_ref(), self.collector.as_mut()) {
                    collector.push(data);
                }
                // hyper stops polling a body that says it has ended.
                if self.inner.is_end_stream() {
                    self.store();
                }
            }
            Poll::Ready(None) => self.store(),
            Poll::Ready(Some(Err(_))) => self.collector = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Storing {
    fn store(&mut self) {
        let (Some(collector), Some(key)) = (self.collector.take(), self.key.take()) else {
            return;
        };
        let (Some(cache), Some(body)) = (&self.state.cache, collector.finish()) else {
            return;
        };
        let stored = Stored {
            status: self.status,
            headers: std::mem::take(&mut self.headers),
            body,
        };
        cache.put(key, &self.request, stored, self.fresh, Instant::now());
    }
}

/// The instance that answered, for the access log.
#[derive(Clone, Debug)]
struct Served(String);

/// The client's side of an upgrade: its connection once the `101` is
/// written, from hyper (HTTP/1.1 over hyper) or from [`serve_h1`].
enum ClientSide {
    Hyper(hyper::upgrade::OnUpgrade),
    Own(tokio::sync::oneshot::Receiver<OwnUpgraded>),
}

impl ClientSide {
    fn of(request: &mut Request<Body>) -> Self {
        match request
            .extensions_mut()
            .remove::<UpgradeSlot>()
            .and_then(|slot| slot.take())
        {
            Some(slot) => Self::Own(slot),
            None => Self::Hyper(hyper::upgrade::on(request)),
        }
    }

    /// The connection and what the client sent after its request.
    async fn connection(self) -> Option<(Box<dyn ClientIo>, Bytes)> {
        match self {
            Self::Hyper(upgrade) => match upgrade.await {
                Ok(upgraded) => Some((Box::new(TokioIo::new(upgraded)), Bytes::new())),
                Err(error) => {
                    tracing::debug!(%error, "an upgrade through the gate did not complete");
                    None
                }
            },
            Self::Own(slot) => slot.await.ok().map(|own| (own.io, own.early)),
        }
    }
}

/// Copies bytes both ways between an upgraded client connection and its
/// backend until either closes.
async fn tunnel(client: ClientSide, backend: Upgraded, lease: Lease) {
    let Some((mut client, from_client)) = client.connection().await else {
        return;
    };
    let Upgraded {
        stream: mut backend,
        early: from_backend,
    } = backend;
    // What either side sent right after the handshake goes first.
    let copied = async {
        client.write_all(&from_backend).await?;
        backend.write_all(&from_client).await?;
        tokio::io::copy_bidirectional(&mut client, &mut backend).await
    };
    if let Err(error) = copied.await {
        tracing::debug!(%error, "an upgraded connection through the gate ended");
    }
    drop(lease);
}

/// A response body holding a guard until it is sent or dropped: its
/// backend's request counts as in flight, its connection as busy.
struct Guarded<B, G> {
    inner: B,
    _guard: G,
}

impl<B, G> hyper::body::Body for Guarded<B, G>
where
    B: hyper::body::Body<Data = Bytes, Error = BodyError> + Unpin,
    G: Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A plain-text answer from the gate itself.
pub fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn no_backend(gate: &str, pool: &Pool) -> Response<Body> {
    let reason = if pool.service_known {
        format!(
            "gate \"{gate}\": service \"{}\" has no ready instance on port {}; try again shortly\n",
            pool.service, pool.port
        )
    } else {
        format!(
            "gate \"{gate}\": service \"{}\" does not exist\n",
            pool.service
        )
    };
    let mut response = text(StatusCode::SERVICE_UNAVAILABLE, reason);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

fn redirect_to_https(
    uri: &Uri,
    headers: &hyper::HeaderMap,
    https_port: Option<u16>,
) -> Response<Body> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(ToString::to_string))
        .unwrap_or_default();
    let host = forward::strip_port(&host);
    let port = match https_port {
        Some(443) | None => String::new(),
        Some(port) => format!(":{port}"),
    };
    let target = format!(
        "https://{host}{port}{}",
        uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    let mut response = text(
        StatusCode::PERMANENT_REDIRECT,
        format!("moved to {target}\n"),
    );
    if let Ok(location) = HeaderValue::from_str(&target) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

fn humanize(duration: Duration) -> String {
    if duration.as_millis().is_multiple_of(1000) {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}
