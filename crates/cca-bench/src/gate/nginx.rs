//! nginx's two roles in the gate benchmark, as configuration text: the
//! backends (`return 200` server blocks, one per port, in a process of
//! their own) and the peer proxy (an upstream with keep-alive to the same
//! backends, the forwarding headers the gate adds, access log off), as
//! Debian's nginx runs it by default and tuned for many cores.
//! Everything nginx writes (pid, error log, temp files) stays in the
//! benchmark's temp directory.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// The host every benchmark request names (the gate routes by it).
pub(crate) const HOST: &str = "bench.test";
/// What a backend answers: a small fixed body.
pub(crate) const BODY: &str = "hello from a gate benchmark backend\n";
/// Idle keep-alive connections nginx keeps per worker to its upstream,
/// as the gate keeps per backend (`gate_state::IDLE_PER_BACKEND`).
const UPSTREAM_KEEPALIVE: usize = 64;

/// The directives every nginx of the benchmark shares: foreground, files
/// under `dir`, enough connections per worker, no access log, and
/// keep-alive connections that are not closed after 1,000 requests (the
/// gate has no such limit, and h2load would otherwise reconnect).
fn common(dir: &Path, name: &str, workers: usize, connections: usize, tuning: Tuning) -> String {
    let dir = dir.display();
    let affinity = match tuning {
        Tuning::Defaults => "",
        Tuning::ManyCores => "worker_cpu_affinity auto;\n",
    };
    format!(
        "daemon off;\n\
         worker_processes {workers};\n\
         {affinity}\
         pid {dir}/{name}.pid;\n\
         error_log {dir}/{name}-error.log warn;\n\
         events {{\n  worker_connections {connections};\n}}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 keepalive_timeout 75s;\n\
         \x20 keepalive_requests 1000000;\n\
         \x20 client_body_temp_path {dir}/{name}-body;\n\
         \x20 proxy_temp_path {dir}/{name}-proxy;\n\
         \x20 fastcgi_temp_path {dir}/{name}-fastcgi;\n\
         \x20 uwsgi_temp_path {dir}/{name}-uwsgi;\n\
         \x20 scgi_temp_path {dir}/{name}-scgi;\n"
    )
}

/// The backends: one server block per address answering [`BODY`].
pub(crate) fn backends(
    dir: &Path,
    workers: usize,
    connections: usize,
    at: &[SocketAddr],
) -> String {
    let mut text = common(dir, "backends", workers, connections, Tuning::Defaults);
    text.push_str("  default_type text/plain;\n");
    for address in at {
        let _ = write!(
            text,
            "  server {{\n    listen {address};\n    location / {{\n      return 200 \"{}\";\n    }}\n  }}\n",
            BODY.escape_default()
        );
    }
    text.push_str("}\n");
    text
}

/// How the peer proxy is set up beyond its reverse-proxy directives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tuning {
    /// nginx's defaults: the workers share the listening sockets, and the
    /// one woken first accepts what is waiting, so most connections of a
    /// burst land on one worker; the kernel places workers where it likes.
    Defaults,
    /// What nginx's documentation suggests for many cores: a listening
    /// socket per worker (`reuseport`, the kernel spreads connections
    /// evenly) and each worker kept to a CPU of its own
    /// (`worker_cpu_affinity auto`), as the gate does by default.
    ManyCores,
}

impl Tuning {
    /// The files and target the proxy is known by.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Tuning::Defaults => "nginx",
            Tuning::ManyCores => "nginx-tuned",
        }
    }
}

/// Where one peer proxy listens.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProxyAt {
    /// Plain HTTP/1.1.
    pub(crate) http1: SocketAddr,
    /// HTTP/2 without TLS (prior knowledge, which nginx serves only on a
    /// listener of its own).
    pub(crate) http2: Option<SocketAddr>,
}

/// The peer proxy on `at`, to `backends` over kept-alive HTTP/1.1
/// connections.
pub(crate) fn proxy(
    dir: &Path,
    workers: usize,
    connections: usize,
    at: ProxyAt,
    tuning: Tuning,
    backends: &[SocketAddr],
) -> String {
    let ProxyAt { http1, http2 } = at;
    let mut text = common(dir, tuning.name(), workers, connections, tuning);
    text.push_str("  upstream backends {\n");
    for backend in backends {
        let _ = writeln!(text, "    server {backend};");
    }
    let reuseport = match tuning {
        Tuning::Defaults => "",
        Tuning::ManyCores => " reuseport",
    };
    let _ = write!(
        text,
        "    keepalive {UPSTREAM_KEEPALIVE};\n    keepalive_requests 1000000;\n  }}\n  server {{\n    listen {http1}{reuseport};\n"
    );
    if let Some(http2) = http2 {
        let _ = writeln!(text, "    listen {http2} http2{reuseport};");
    }
    // The headers `cca_gate::forward::Forwarding` writes.
    text.push_str(
        "    location / {\n\
         \x20     proxy_pass http://backends;\n\
         \x20     proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n\
         \x20     proxy_set_header Host $http_host;\n\
         \x20     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
         \x20     proxy_set_header X-Forwarded-Proto $scheme;\n\
         \x20     proxy_set_header X-Forwarded-Host $http_host;\n\
         \x20     proxy_set_header Forwarded \"for=$remote_addr;proto=$scheme;host=$http_host\";\n\
         \x20   }\n  }\n}\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_keeps_upstream_connections_and_forwards_like_the_gate() {
        let a: SocketAddr = "127.0.0.1:1001".parse().expect("address");
        let b: SocketAddr = "127.0.0.1:1002".parse().expect("address");
        let front: SocketAddr = "127.0.0.1:2000".parse().expect("address");
        let h2: SocketAddr = "127.0.0.1:2001".parse().expect("address");
        let at = ProxyAt {
            http1: front,
            http2: Some(h2),
        };
        let text = proxy(Path::new("/tmp/x"), 2, 500, at, Tuning::Defaults, &[a, b]);
        for wanted in [
            "daemon off;",
            "worker_processes 2;",
            "worker_connections 500;",
            "pid /tmp/x/nginx.pid;",
            "access_log off;",
            "server 127.0.0.1:1001;",
            "server 127.0.0.1:1002;",
            "keepalive 64;",
            "listen 127.0.0.1:2000;",
            "listen 127.0.0.1:2001 http2;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "X-Forwarded-For $proxy_add_x_forwarded_for;",
            "X-Forwarded-Proto $scheme;",
            "X-Forwarded-Host $http_host;",
        ] {
            assert!(text.contains(wanted), "{wanted} missing in:\n{text}");
        }
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert!(!text.contains("reuseport") && !text.contains("affinity"));
        let tuned = proxy(Path::new("/tmp/x"), 2, 500, at, Tuning::ManyCores, &[a, b]);
        for wanted in [
            "worker_cpu_affinity auto;",
            "listen 127.0.0.1:2000 reuseport;",
            "listen 127.0.0.1:2001 http2 reuseport;",
            "pid /tmp/x/nginx-tuned.pid;",
        ] {
            assert!(tuned.contains(wanted), "{wanted} missing in:\n{tuned}");
        }
        let backends = backends(Path::new("/tmp/x"), 1, 100, &[a, b]);
        assert_eq!(backends.matches("return 200").count(), 2, "{backends}");
        assert!(backends.contains("listen 127.0.0.1:1002;"));
        assert!(backends.contains(r#""hello from a gate benchmark backend\n""#));
    }
}
