//! nginx's two roles in the gate benchmark, as configuration text: the
//! backends (`return 200` server blocks, one per port, in a process of
//! their own) and the peer proxy (an upstream with keep-alive to the same
//! backends, the forwarding headers the gate adds, access log off).
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
fn common(dir: &Path, name: &str, workers: usize, connections: usize) -> String {
    let dir = dir.display();
    format!(
        "daemon off;\n\
         worker_processes {workers};\n\
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
    let mut text = common(dir, "backends", workers, connections);
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

/// The peer proxy: plain HTTP/1.1 on `http1`, HTTP/2 without TLS (prior
/// knowledge, which nginx serves only on a listener of its own) on
/// `http2`, both to `backends` over kept-alive HTTP/1.1 connections.
pub(crate) fn proxy(
    dir: &Path,
    workers: usize,
    connections: usize,
    http1: SocketAddr,
    http2: Option<SocketAddr>,
    backends: &[SocketAddr],
) -> String {
    let mut text = common(dir, "proxy", workers, connections);
    text.push_str("  upstream backends {\n");
    for backend in backends {
        let _ = writeln!(text, "    server {backend};");
    }
    let _ = write!(
        text,
        "    keepalive {UPSTREAM_KEEPALIVE};\n    keepalive_requests 1000000;\n  }}\n  server {{\n    listen {http1};\n"
    );
    if let Some(http2) = http2 {
        let _ = writeln!(text, "    listen {http2} http2;");
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
        let text = proxy(Path::new("/tmp/x"), 2, 500, front, Some(h2), &[a, b]);
        for wanted in [
            "daemon off;",
            "worker_processes 2;",
            "worker_connections 500;",
            "pid /tmp/x/proxy.pid;",
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
        let backends = backends(Path::new("/tmp/x"), 1, 100, &[a, b]);
        assert_eq!(backends.matches("return 200").count(), 2, "{backends}");
        assert!(backends.contains("listen 127.0.0.1:1002;"));
        assert!(backends.contains(r#""hello from a gate benchmark backend\n""#));
    }
}
