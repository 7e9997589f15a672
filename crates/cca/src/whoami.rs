//! `cca whoami [--port N]`: the built-in workload of the quick start and the
//! tests — a tiny HTTP service answering every GET with who it is (hostname,
//! `CCA_INSTANCE`, `CCA_SERVICE`, `CCA_NODE`, its port) and the request path,
//! as plain text or, with `Accept: application/json`, as JSON; on `/ws` a
//! WebSocket that echoes every message. It listens on
//! `--bind` (default `$CCA_ADDRESS`, else 0.0.0.0), on `--port`, else `$PORT`, else 8080, and exits cleanly on
//! SIGTERM or Ctrl-C. It logs to stdout, where a workload's log goes (what
//! `cca logs` shows): one line when it listens, one per request (method,
//! path, status, peer).

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::Args;
use serde::Serialize;
use tokio::net::TcpListener;

#[derive(Debug, Args)]
pub(crate) struct WhoamiArgs {
    /// The port to listen on.
    #[arg(long, env = "PORT", default_value_t = 8080)]
    port: u16,
    /// The address to listen on: the node's address when run by an agent
    /// (so instances on nodes sharing a host do not collide), else every
    /// address.
    #[arg(long, env = "CCA_ADDRESS", default_value = "0.0.0.0")]
    bind: std::net::IpAddr,
}

/// Who this process is; the same in every answer.
#[derive(Clone, Debug, Serialize)]
struct Identity {
    hostname: String,
    instance: Option<String>,
    service: Option<String>,
    node: Option<String>,
    port: u16,
}

#[derive(Debug, Serialize)]
struct Answer<'a> {
    #[serde(flatten)]
    identity: &'a Identity,
    path: &'a str,
}

pub(crate) fn run(args: WhoamiArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = TcpListener::bind((args.bind, args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.bind, args.port))?;
        let address = listener.local_addr().context("reading the bound address")?;
        log(&format!("whoami listening on {address}"));
        let port = address.port();
        serve(
            listener,
            Identity::from_env(port),
            crate::server_cmd::shutdown_signal(),
        )
        .await
        .context("serving HTTP")?;
        Ok(ExitCode::SUCCESS)
    })
}

impl Identity {
    fn from_env(port: u16) -> Self {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "unknown".to_owned());
        let var = |name| std::env::var(name).ok().filter(|value| !value.is_empty());
        Self {
            hostname,
            instance: var("CCA_INSTANCE"),
            service: var("CCA_SERVICE"),
            node: var("CCA_NODE"),
            port,
        }
    }
}

async fn serve(
    listener: TcpListener,
    identity: Identity,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/ws", axum::routing::get(echo))
        .fallback(answer)
        .with_state(Arc::new(identity))
        .layer(axum::middleware::from_fn(log_request));
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// One line per answered request: `GET /path 200 from 10.0.0.5:41234`.
async fn log_request(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    log(&format!(
        "{method} {path} {} from {peer}",
        response.status().as_u16()
    ));
    response
}

/// A workload's log is its stdout (line-buffered, so each line reaches
/// the runtime's log file as it is written).
#[allow(clippy::print_stdout, reason = "a workload logs to stdout")]
fn log(line: &str) {
    println!("{line}");
}

async fn answer(
    State(identity): State<Arc<Identity>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "only GET\n").into_response();
    }
    let answer = Answer {
        identity: &identity,
        path: uri.path(),
    };
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json"));
    if wants_json {
        axum::Json(answer).into_response()
    } else {
        as_text(&answer).into_response()
    }
}

/// Upgrades to a WebSocket that sends back every text and binary message.
async fn echo(upgrade: axum::extract::ws::WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket| async move {
        use axum::extract::ws::Message;
        while let Some(Ok(message)) = socket.recv().await {
            let reply = match message {
                Message::Text(_) | Message::Binary(_) => message,
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if socket.send(reply).await.is_err() {
                break;
            }
        }
    })
}

fn as_text(answer: &Answer<'_>) -> String {
    let identity = answer.identity;
    let or_dash = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".to_owned());
    format!(
        "hostname: {}\ninstance: {}\nservice: {}\nnode: {}\nport: {}\npath: {}\n",
        identity.hostname,
        or_dash(&identity.instance),
        or_dash(&identity.service),
        or_dash(&identity.node),
        identity.port,
        answer.path
    )
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(port: u16, path: &str, accept: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn answers_with_identity_and_path_in_text_and_json_then_shuts_down() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let identity = Identity {
            hostname: "host-a".into(),
            instance: Some("web-1".into()),
            service: Some("web".into()),
            node: None,
            port,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, identity, async move {
            let _ = stopped.await;
        }));

        let text = get(port, "/some/path?q=1", "*/*").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let expected = format!(
            "hostname: host-a\ninstance: web-1\nservice: web\nnode: -\nport: {port}\npath: /some/path\n"
        );
        assert!(text.ends_with(&expected), "{text}");

        let json = get(port, "/", "application/json").await;
        let body = json.split("\r\n\r\n").nth(1).expect("body");
        let value: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(value["instance"], "web-1");
        assert_eq!(value["node"], serde_json::Value::Null);
        assert_eq!(value["port"], port);
        assert_eq!(value["path"], "/");

        stop.send(()).expect("stop");
        server.await.expect("join").expect("clean exit");
    }
}
