//! Both ends the benchmark itself provides: the gate it measures, run in
//! a process of its own by `cca benchmark gate --serve-gate` on a network
//! map with one gate for [`HOST`] and one service whose endpoints are the
//! backends — the same `cca_gate::Gate::serve` a gate node runs, access
//! log off — and the client side of the idle-connection figure, which
//! opens keep-alive connections, sends one request on each and holds them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cca_gate::{Gate, Listener, ProxyOptions, ServerOptions};
use cca_model::net::{Affinity, NetworkMap, ServiceNet, Target};
use cca_model::spec::{GateSpec, PortSpec};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::nginx::HOST;
use crate::BenchError;

/// The service behind the benchmark's gate.
const SERVICE: &str = "backend";
/// Its port's number (the backends' own ports are in the endpoints).
const SERVICE_PORT: u16 = 8080;
/// Connections opened at once while filling the idle set (a SYN flood
/// of thousands would overflow the listen backlogs and time out).
const OPEN_AT_ONCE: usize = 200;
/// Longest wait for one connection and its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The gate of `cca benchmark gate --serve-gate`, bound and not yet
/// serving.
#[derive(Debug)]
pub struct BenchGate {
    gate: Arc<Gate>,
    socket: TcpListener,
}

impl BenchGate {
    /// Binds `listen` and routes [`HOST`] to `backends`.
    pub async fn bind(listen: SocketAddr, backends: &[SocketAddr]) -> Result<Self, BenchError> {
        let socket = TcpListener::bind(listen)
            .await
            .map_err(BenchError::io(format!("binding the gate to {listen}")))?;
        let gate = Arc::new(Gate::new(ProxyOptions {
            access_log: false,
            https_port: None,
        }));
        gate.update(&network_map(backends));
        Ok(Self { gate, socket })
    }

    pub fn address(&self) -> Result<SocketAddr, BenchError> {
        self.socket
            .local_addr()
            .map_err(BenchError::io("reading the gate's address"))
    }

    /// Serves on `workers` worker threads (each kept to a CPU of its own
    /// when `pin_workers`) until `stop` resolves, then drains as a gate
    /// node does.
    pub async fn serve(
        self,
        workers: usize,
        pin_workers: bool,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), BenchError> {
        let (stopping, stopped) = watch::channel(false);
        let listeners = vec![Listener {
            socket: self.socket,
            tls: None,
        }];
        let options = ServerOptions {
            drain: Duration::from_secs(2),
            workers,
            pin_workers,
            ..ServerOptions::default()
        };
        let served = self.gate.serve(listeners, options, stopped);
        tokio::pin!(served);
        let served = tokio::select! {
            served = &mut served => served,
            () = stop => {
                let _ = stopping.send(true);
                served.await
            }
        };
        served.map_err(|error| BenchError::Config(error.to_string()))
    }
}

/// One gate for [`HOST`], every setting defaulted, to a service whose
/// endpoints are `backends`.
fn network_map(backends: &[SocketAddr]) -> NetworkMap {
    let targets = backends
        .iter()
        .enumerate()
        .map(|(index, backend)| Target {
            instance: format!("{SERVICE}-{index}"),
            node: "bench".into(),
            address: match backend.ip() {
                std::net::IpAddr::V4(v4) => v4,
                std::net::IpAddr::V6(_) => Ipv4Addr::LOCALHOST,
            },
            port: backend.port(),
        })
        .collect();
    let service = ServiceNet {
        name: SERVICE.into(),
        vip: None,
        ports: vec![PortSpec::tcp("http", SERVICE_PORT)],
        affinity: Affinity::default(),
        endpoints: [("http".to_owned(), targets)].into(),
        members: vec![],
        asleep: false,
        scale_to_zero: None,
    };
    let gate = GateSpec {
        name: "bench".into(),
        hosts: vec![HOST.into()],
        service: SERVICE.into(),
        port: SERVICE_PORT,
        ..GateSpec::default()
    };
    let mut map = NetworkMap::default();
    map.gates.insert(gate.name.clone(), Arc::new(gate));
    map.services.insert(SERVICE.into(), Arc::new(service));
    map
}

/// Sends `GET /` for [`HOST`] on `stream` and reads the response;
/// returns its status.
pub(crate) async fn get(stream: &mut BufReader<TcpStream>) -> Result<u16, String> {
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nUser-Agent: cca-bench\r\n\r\n");
    stream
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .map_err(|error| format!("sending a request: {error}"))?;
    let mut line = String::new();
    stream
        .read_line(&mut line)
        .await
        .map_err(|error| format!("reading the status line: {error}"))?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP status line: {line:?}"))?;
    let mut length = None;
    loop {
        line.clear();
        let read = stream
            .read_line(&mut line)
            .await
            .map_err(|error| format!("reading the headers: {error}"))?;
        if read == 0 {
            return Err("the connection closed in the headers".into());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err("a chunked response (the backends send a length)".into());
            }
        }
    }
    let mut body = vec![0; length.unwrap_or(0)];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|error| format!("reading the body: {error}"))?;
    Ok(status)
}

/// One connection to `at` with one request answered; `Err` says why not.
pub(crate) async fn connect_and_get(at: SocketAddr) -> Result<(BufReader<TcpStream>, u16), String> {
    let attempt = async {
        let stream = TcpStream::connect(at)
            .await
            .map_err(|error| format!("connecting to {at}: {error}"))?;
        let _ = stream.set_nodelay(true);
        let mut stream = BufReader::new(stream);
        let status = get(&mut stream).await?;
        Ok((stream, status))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, attempt)
        .await
        .map_err(|_| format!("no answer from {at} within {REQUEST_TIMEOUT:?}"))?
}

/// Connections held open, and how many of their requests got a 2xx.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) streams: Vec<BufReader<TcpStream>>,
    pub(crate) answered_2xx: usize,
    /// The first failure, if any, and how many there were.
    pub(crate) failures: (usize, Option<String>),
}

/// Opens `count` keep-alive connections to `at` with one request on each
/// and keeps them open (idle) in the result.
pub(crate) async fn hold(at: SocketAddr, count: usize) -> Held {
    let mut held = Held::default();
    let mut opening = JoinSet::new();
    let mut started = 0;
    while started < count || !opening.is_empty() {
        while started < count && opening.len() < OPEN_AT_ONCE {
            opening.spawn(connect_and_get(at));
            started += 1;
        }
        let Some(joined) = opening.join_next().await else {
            break;
        };
        match joined.map_err(|error| error.to_string()).and_then(|r| r) {
            Ok((stream, status)) => {
                if (200..300).contains(&status) {
                    held.answered_2xx += 1;
                }
                held.streams.push(stream);
            }
            Err(error) => {
                held.failures.0 += 1;
                held.failures.1.get_or_insert(error);
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_bench_gate_routes_its_host_to_the_backends_and_holds_connections() {
        let backend = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let backend_address = backend.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((stream, _)) = backend.accept().await {
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match stream.read_line(&mut line).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => {
                                let answer = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";
                                if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                        }
                    }
                });
            }
        });
        let gate = BenchGate::bind((Ipv4Addr::LOCALHOST, 0).into(), &[backend_address])
            .await
            .expect("bind the gate");
        let address = gate.address().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(gate.serve(2, true, async {
            let _ = stopped.await;
        }));
        let held = hold(address, 20).await;
        assert_eq!(held.failures, (0, None));
        assert_eq!((held.streams.len(), held.answered_2xx), (20, 20));
        // A kept connection still serves.
        let mut streams = held.streams;
        assert_eq!(get(&mut streams[0]).await, Ok(200));
        drop(streams);
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .expect("the gate stops")
            .expect("no panic")
            .expect("the gate served");
    }
}
