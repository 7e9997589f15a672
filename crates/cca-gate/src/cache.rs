//! A gate's response cache (`cache { }`, off by default): a small shared
//! cache of GET responses in memory, per gate node. It stores only what
//! HTTP lets a shared cache store without revalidation (RFC 9111): a 200
//! to a GET without `Authorization`, whose `Cache-Control` says how long it
//! stays fresh (`s-maxage`, `max-age`, `public`) or which has `Expires`,
//! never `no-store`, `private` or `no-cache`, no `Set-Cookie`, and no
//! `Vary` beyond `Accept-Encoding` (which then joins the key). Freshness is
//! capped at the gate's `ttl`; bodies larger than `max_entry` are never
//! kept, and the least recently used entries go when the total passes
//! `size`. A request that says `no-cache` or `no-store` goes to a backend.
//! HEAD is answered from a GET's entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use cca_model::spec::ResponseCache;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, StatusCode};
use tokio::time::Instant;

/// A response as the cache holds and returns it.
#[derive(Clone, Debug)]
pub struct Stored {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// What a cached response is found by.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct CacheKey {
    host: String,
    path_and_query: String,
    /// The request's `Accept-Encoding` when the response varies on it.
    encoding: Option<String>,
}

/// One stored response.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    stored: Instant,
    fresh_until: Instant,
    varies_on_encoding: bool,
    tick: u64,
}

impl Entry {
    /// Seconds since it was stored, for the `Age` header.
    pub fn age(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.stored).as_secs()
    }
}

/// A gate's cache; see the module documentation.
#[derive(Debug)]
pub struct Cache {
    settings: ResponseCache,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<CacheKey, Entry>,
    /// Least recently used first.
    by_use: BTreeMap<u64, CacheKey>,
    /// Keys without the encoding whose response varies on it.
    varying: HashMap<CacheKey, ()>,
    bytes: u64,
    tick: u64,
}

/// Whether a request may be answered from (and its response stored in)
/// the cache, and under which key.
pub fn request_key(
    method: &Method,
    host: &str,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Option<CacheKey> {
    if *method != Method::GET && *method != Method::HEAD {
        return None;
    }
    if headers.contains_key(header::AUTHORIZATION) {
        return None;
    }
    let directives = cache_control(headers);
    if directives
        .iter()
        .any(|(name, _)| name == "no-cache" || name == "no-store")
    {
        return None;
    }
    Some(CacheKey {
        host: host.to_owned(),
        path_and_query: path_and_query.to_owned(),
        encoding: None,
    })
}

fn cache_control(headers: &HeaderMap) -> Vec<(String, Option<String>)> {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|directive| {
            let directive = directive.trim();
            match directive.split_once('=') {
                Some((name, value)) => (
                    name.trim().to_ascii_lowercase(),
                    Some(value.trim().trim_matches('"').to_owned()),
                ),
                None => (directive.to_ascii_lowercase(), None),
            }
        })
        .collect()
}

/// How long a response may be served from the cache; `None`: it may not
/// be stored.
pub fn freshness(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if status != StatusCode::OK || headers.contains_key(header::SET_COOKIE) {
        return None;
    }
    if let Some(vary) = headers.get(header::VARY).and_then(|v| v.to_str().ok())
        && vary
            .split(',')
            .any(|field| !field.trim().eq_ignore_ascii_case("accept-encoding"))
    {
        return None;
    }
    let directives = cache_control(headers);
    let has = |name: &str| directives.iter().any(|(n, _)| n == name);
    if has("no-store") || has("private") || has("no-cache") {
        return None;
    }
    let seconds = |name: &str| {
        directives
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, value)| value.as_deref()?.parse::<u64>().ok())
    };
    if let Some(age) = seconds("s-maxage").or_else(|| seconds("max-age")) {
        return (age > 0).then(|| Duration::from_secs(age));
    }
    let expires = headers
        .get(header::EXPIRES)
        .and_then(|v| v.to_str().ok())
        // The three forms RFC 9110 §5.6.7 has recipients accept.
        .and_then(|v| httpdate::parse_http_date(v).ok());
    if let Some(expires) = expires {
        return expires.duration_since(now).ok().filter(|d| !d.is_zero());
    }
    // `public` alone: fresh for the gate's ttl.
    has("public").then_some(Duration::MAX)
}

impl Cache {
    pub fn new(settings: ResponseCache) -> Self {
        Self {
            settings,
            state: Mutex::default(),
        }
    }

    /// The largest body that may be stored.
    pub fn max_entry(&self) -> u64 {
        self.settings.max_entry.0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh stored response for `key` (asked with `request` headers),
    /// its headers with `Age`.
    pub fn get(&self, key: &CacheKey, request: &HeaderMap, now: Instant) -> Option<Stored> {
        let mut state = self.lock();
        let key = if state.varying.contains_key(key) {
            CacheKey {
                encoding: Some(encoding_of(request)),
                ..key.clone()
            }
        } else {
            key.clone()
        };
        let tick = state.next_tick();
        let entry = state.entries.get_mut(&key)?;
        if entry.fresh_until <= now {
            let stale = state.remove(&key);
            drop(stale);
            return None;
        }
        let old_tick = std::mem::replace(&mut entry.tick, tick);
        let mut headers = entry.headers.clone();
        headers.insert(header::AGE, HeaderValue::from(entry.age(now)));
        let answer = Stored {
            status: entry.status,
            headers,
            body: entry.body.clone(),
        };
        state.by_use.remove(&old_tick);
        state.by_use.insert(tick, key);
        Some(answer)
    }

    /// Stores a response that [`freshness`] allowed for `fresh`.
    pub fn put(
        &self,
        key: CacheKey,
        request: &HeaderMap,
        response: Stored,
        fresh: Duration,
        now: Instant,
    ) {
        let Stored {
            status,
            headers,
            body,
        } = response;
        let size = body.len() as u64;
        if size > self.settings.max_entry.0 || size > self.settings.size.0 {
            return;
        }
        // Kept long: values sharing a connection's read buffer would keep
        // all of it.
        let headers = crate::h1::owned(&headers);
        let varies_on_encoding = headers
            .get(header::VARY)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("accept-encoding"));
        let ttl = Duration::from_millis(self.settings.ttl.0);
        let mut state = self.lock();
        let key = if varies_on_encoding {
            state.varying.insert(key.clone(), ());
            CacheKey {
                encoding: Some(encoding_of(request)),
                ..key
            }
        } else {
            key
        };
        state.remove(&key);
        while state.bytes + size > self.settings.size.0 {
            let Some((_, oldest)) = state.by_use.pop_first() else {
                break;
            };
            state.remove(&oldest);
        }
        let tick = state.next_tick();
        state.bytes += size;
        state.by_use.insert(tick, key.clone());
        state.entries.insert(
            key,
            Entry {
                status,
                headers,
                body,
                stored: now,
                fresh_until: now + fresh.min(ttl),
                varies_on_encoding,
                tick,
            },
        );
    }

    /// Bytes of bodies held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}

impl State {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn remove(&mut self, key: &CacheKey) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.by_use.remove(&entry.tick);
        self.bytes -= entry.body.len() as u64;
        if entry.varies_on_encoding
            && !self
                .entries
                .keys()
                .any(|k| k.host == key.host && k.path_and_query == key.path_and_query)
        {
            self.varying.remove(&CacheKey {
                encoding: None,
                ..key.clone()
            });
        }
        Some(entry)
    }
}

fn encoding_of(request: &HeaderMap) -> String {
    request
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Collects a body up to a limit, for storing once it is complete.
#[derive(Debug)]
pub struct Collector {
    limit: u64,
    buffer: Option<BytesMut>,
}

impl Collector {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            buffer: Some(BytesMut::new()),
        }
    }

    /// Adds a chunk; past the limit the collector gives up.
    pub fn push(&mut self, chunk: &[u8]) {
        if let Some(buffer) = &mut self.buffer {
            if buffer.len() as u64 + chunk.len() as u64 > self.limit {
                self.buffer = None;
            } else {
                buffer.extend_from_slice(chunk);
            }
        }
    }

    /// The whole body, unless it outgrew the limit.
    pub fn finish(self) -> Option<Bytes> {
        self.buffer.map(BytesMut::freeze)
    }
}

#[cfg(test)]
mod tests {
    use cca_model::spec::{Duration as SpecDuration, Memory};

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    fn key(path: &str) -> CacheKey {
        request_key(&Method::GET, "shop.example.com", path, &HeaderMap::new()).expect("cacheable")
    }

    fn ok(headers: HeaderMap, body: &'static [u8]) -> Stored {
        Stored {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(body),
        }
    }

    fn cache(size: u64, max_entry: u64) -> Cache {
        Cache::new(ResponseCache {
            size: Memory(size),
            max_entry: Memory(max_entry),
            ttl: SpecDuration(60_000),
        })
    }

    #[test]
    fn only_explicitly_fresh_shared_responses_are_stored() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let fresh =
            |pairs: &[(&'static str, &str)]| freshness(StatusCode::OK, &headers(pairs), now);
        assert_eq!(
            fresh(&[("cache-control", "max-age=30")]),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            fresh(&[("cache-control", "public, max-age=30, s-maxage=5")]),
            Some(Duration::from_secs(5))
        );
        assert_eq!(fresh(&[]), None, "no freshness said");
        assert_eq!(fresh(&[("cache-control", "private, max-age=30")]), None);
        assert_eq!(fresh(&[("cache-control", "no-store")]), None);
        assert_eq!(
            fresh(&[("cache-control", "max-age=30"), ("set-cookie", "a=1")]),
            None
        );
        assert_eq!(
            fresh(&[("cache-control", "max-age=30"), ("vary", "Cookie")]),
            None
        );
        assert!(fresh(&[("cache-control", "max-age=30"), ("vary", "Accept-Encoding")]).is_some());
        assert_eq!(
            fresh(&[("expires", "Sun, 09 Sep 2001 01:47:00 GMT")]),
            Some(Duration::from_secs(20)),
            "Expires 20 s after now"
        );
        assert_eq!(
            fresh(&[("expires", "Sunday, 09-Sep-01 01:47:00 GMT")]),
            Some(Duration::from_secs(20)),
            "the obsolete RFC 850 form is read too"
        );
        assert_eq!(
            fresh(&[("expires", "tomorrow")]),
            None,
            "not a date: not fresh"
        );
        assert_eq!(
            freshness(
                StatusCode::NOT_FOUND,
                &headers(&[("cache-control", "max-age=30")]),
                now
            ),
            None
        );
    }

    #[test]
    fn requests_that_refuse_the_cache_bypass_it() {
        let host = "shop.example.com";
        assert!(request_key(&Method::POST, host, "/", &HeaderMap::new()).is_none());
        let auth = headers(&[("authorization", "Bearer x")]);
        assert!(request_key(&Method::GET, host, "/", &auth).is_none());
        let no_cache = headers(&[("cache-control", "no-cache")]);
        assert!(request_key(&Method::GET, host, "/", &no_cache).is_none());
        assert!(request_key(&Method::HEAD, host, "/", &HeaderMap::new()).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_at_the_lesser_of_their_freshness_and_the_ttl() {
        let cache = cache(1 << 20, 1 << 10);
        let now = Instant::now();
        let none = HeaderMap::new();
        cache.put(
            key("/a"),
            &none,
            ok(HeaderMap::new(), b"a"),
            Duration::MAX,
            now,
        );
        cache.put(
            key("/b"),
            &none,
            ok(HeaderMap::new(), b"b"),
            Duration::from_secs(5),
            now,
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        let later = Instant::now();
        let hit = cache
            .get(&key("/a"), &none, later)
            .expect("fresh for the ttl");
        assert_eq!(hit.body, "a");
        assert_eq!(hit.headers["age"], "6");
        assert!(
            cache.get(&key("/b"), &none, later).is_none(),
            "its own 5 s passed"
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(
            cache.get(&key("/a"), &none, Instant::now()).is_none(),
            "the 60 s ttl passed"
        );
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn the_least_recently_used_go_first_and_large_bodies_never_come() {
        let cache = cache(10, 4);
        let now = Instant::now();
        let none = HeaderMap::new();
        let put = |path: &str, body: &'static [u8]| {
            cache.put(
                key(path),
                &none,
                ok(HeaderMap::new(), body),
                Duration::from_secs(60),
                now,
            );
        };
        put("/big", b"12345");
        assert!(cache.get(&key("/big"), &none, now).is_none());
        put("/1", b"aaaa");
        put("/2", b"bbbb");
        assert!(
            cache.get(&key("/1"), &none, now).is_some(),
            "/1 is now the most recent"
        );
        put("/3", b"cccc");
        assert!(
            cache.get(&key("/2"), &none, now).is_none(),
            "/2 was least recently used"
        );
        assert!(cache.get(&key("/1"), &none, now).is_some());
        assert!(cache.get(&key("/3"), &none, now).is_some());
        assert_eq!(cache.bytes(), 8);
    }

    #[test]
    fn a_response_varying_on_encoding_is_kept_per_encoding() {
        let cache = cache(1 << 10, 1 << 10);
        let now = Instant::now();
        let gzip = headers(&[("accept-encoding", "gzip")]);
        let plain = HeaderMap::new();
        let vary = headers(&[("vary", "Accept-Encoding")]);
        cache.put(
            key("/"),
            &gzip,
            ok(vary, b"zipped"),
            Duration::from_secs(60),
            now,
        );
        assert_eq!(
            cache.get(&key("/"), &gzip, now).expect("hit").body,
            "zipped"
        );
        assert!(cache.get(&key("/"), &plain, now).is_none());
    }

    #[test]
    fn a_collector_gives_up_past_its_limit() {
        let mut small = Collector::new(4);
        small.push(b"ab");
        small.push(b"cd");
        assert_eq!(small.finish().expect("whole"), "abcd");
        let mut big = Collector::new(4);
        big.push(b"abc");
        big.push(b"de");
        assert!(big.finish().is_none());
    }
}
