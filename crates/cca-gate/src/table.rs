//! The route table: which gate serves a host, which target serves a path,
//! and the backends each target has now, built from the network map. A
//! table is immutable; a map change builds a new one ([`Routing::build`])
//! and the proxy swaps it in, so a request keeps the table (and backends)
//! it started with while new requests see the new one. What must outlive a
//! rebuild — a backend's requests in flight and its ejection state, a
//! gate's rate limiters and retry budget — lives in objects the builder
//! hands on to the next table when they are still wanted.
//!
//! Hosts are exact or one-label wildcards (`*.example.com` serves
//! `a.example.com`, as a wildcard certificate does); an exact host wins. Two
//! gates claiming a host (the API refuses it; a race between two applies is
//! the only way) resolve to the gate whose name sorts first.

use std::collections::HashMap;
use std::sync::Arc;

use cca_model::net::{NetworkMap, ServiceNet, Target};
use cca_model::spec::GateSpec;

use crate::balance::{Backend, Pool};
use crate::gate_state::GateState;
use crate::metrics::Metrics;
use crate::traffic::Traffic;

/// One gate as the proxy serves it.
#[derive(Debug)]
pub struct GateRoutes {
    pub spec: Arc<GateSpec>,
    /// Every path no `paths` prefix matches.
    pub default: Arc<Pool>,
    /// Longest prefix first.
    pub paths: Vec<(String, Arc<Pool>)>,
    pub state: Arc<GateState>,
}

impl GateRoutes {
    /// The pool serving `path`.
    pub fn pool_for(&self, path: &str) -> &Arc<Pool> {
        self.paths
            .iter()
            .find(|(prefix, _)| path_matches(prefix, path))
            .map_or(&self.default, |(_, pool)| pool)
    }

    /// Closes the idle backend connections past the gate's idle timeout.
    pub fn sweep_idle_connections(&self) {
        let idle = self.state.upstream.idle;
        let pools = std::iter::once(&self.default).chain(self.paths.iter().map(|(_, pool)| pool));
        for pool in pools {
            for backend in &pool.backends {
                backend.upstream.sweep(idle);
            }
        }
    }
}

/// Whether `path` is under `prefix` by whole segments: `/api` matches
/// `/api` and `/api/x`, not `/apix`.
pub fn path_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

/// Every gate by host.
#[derive(Debug, Default)]
pub struct RouteTable {
    exact: HashMap<String, Arc<GateRoutes>>,
    /// `*.example.com` is held as `example.com`.
    wildcard: HashMap<String, Arc<GateRoutes>>,
    gates: Vec<Arc<GateRoutes>>,
}

impl RouteTable {
    /// The gate serving `host` (lowercase, without a port).
    pub fn gate_for(&self, host: &str) -> Option<&Arc<GateRoutes>> {
        if let Some(gate) = self.exact.get(host) {
            return Some(gate);
        }
        let (_, parent) = host.split_once('.')?;
        self.wildcard.get(parent)
    }

    /// Every gate, by name.
    pub fn gates(&self) -> &[Arc<GateRoutes>] {
        &self.gates
    }
}

/// Builds tables, handing state on from one to the next.
#[derive(Debug)]
pub struct Routing {
    metrics: Arc<Metrics>,
    traffic: Arc<Traffic>,
    backends: HashMap<Target, Arc<Backend>>,
    gates: HashMap<String, Arc<GateState>>,
}

impl Routing {
    pub fn new(metrics: Arc<Metrics>, traffic: Arc<Traffic>) -> Self {
        Self {
            metrics,
            traffic,
            backends: HashMap::new(),
            gates: HashMap::new(),
        }
    }

    /// The table for `map`.
    pub fn build(&mut self, map: &NetworkMap) -> RouteTable {
        let mut backends = HashMap::new();
        let mut states = HashMap::new();
        let mut table = RouteTable::default();
        for (name, spec) in map.gates.iter() {
            let state = match self.gates.get(name) {
                Some(state) if state.serves(spec) => Arc::clone(state),
                _ => Arc::new(GateState::new(spec, &self.metrics)),
            };
            states.insert(name.clone(), Arc::clone(&state));
            let mut pool =
                |service: &str, port: u16| Arc::new(self.pool(map, service, port, &mut backends));
            let default = pool(&spec.service, spec.port);
            let mut paths: Vec<(String, Arc<Pool>)> = spec
                .paths
                .iter()
                .map(|path| (path.prefix.clone(), pool(&path.service, path.port)))
                .collect();
            paths.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
            let routes = Arc::new(GateRoutes {
                spec: Arc::clone(spec),
                default,
                paths,
                state,
            });
            for host in &spec.hosts {
                let host = host.to_ascii_lowercase();
                let (hosts, key) = match host.strip_prefix("*.") {
                    Some(parent) => (&mut table.wildcard, parent.to_owned()),
                    None => (&mut table.exact, host),
                };
                // Gates come in name order: the first claim stands.
                hosts.entry(key).or_insert_with(|| Arc::clone(&routes));
            }
            table.gates.push(routes);
        }
        self.backends = backends;
        self.gates = states;
        table
    }

    /// The pool of `service`'s `port`, reusing the backends it already had.
    fn pool(
        &self,
        map: &NetworkMap,
        service: &str,
        port: u16,
        backends: &mut HashMap<Target, Arc<Backend>>,
    ) -> Pool {
        let net = map.services.get(service);
        let targets = net.map_or(&[][..], |net| targets_of(net, port));
        let members = targets
            .iter()
            .map(|target| {
                let backend = self.backends.get(target).cloned().unwrap_or_else(|| {
                    Arc::new(Backend::new(target.clone(), service, &self.metrics))
                });
                backends.insert(target.clone(), Arc::clone(&backend));
                backend
            })
            .collect();
        let mut pool = Pool::new(service, port, members, net.is_some());
        pool.wakeable = net.is_some_and(|net| net.scale_to_zero.is_some());
        pool.last_request = self.traffic.clock(service);
        pool.requests = self.traffic.counter(service);
        pool
    }
}

/// The ready targets of `net`'s port numbered `port`.
fn targets_of(net: &ServiceNet, port: u16) -> &[Target] {
    net.ports
        .iter()
        .find(|spec| spec.number == port)
        .map_or(&[], |spec| net.targets(spec))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use cca_model::net::Affinity;
    use cca_model::spec::{GatePath, PortSpec};

    use super::*;

    pub(crate) fn service(name: &str, port: u16, instances: &[&str]) -> Arc<ServiceNet> {
        let targets = instances
            .iter()
            .enumerate()
            .map(|(k, instance)| Target {
                instance: (*instance).to_owned(),
                node: "n1".into(),
                address: Ipv4Addr::new(10, 0, 0, k as u8 + 1),
                port,
            })
            .collect();
        Arc::new(ServiceNet {
            name: name.into(),
            vip: None,
            ports: vec![PortSpec::tcp("http", port)],
            affinity: Affinity::default(),
            endpoints: [("http".to_owned(), targets)].into(),
            members: vec![],
            asleep: false,
            scale_to_zero: None,
        })
    }

    fn gate(name: &str, hosts: &[&str], service: &str) -> Arc<GateSpec> {
        Arc::new(GateSpec {
            name: name.into(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            service: service.into(),
            port: 8080,
            ..GateSpec::default()
        })
    }

    fn map(gates: &[Arc<GateSpec>], services: &[Arc<ServiceNet>]) -> NetworkMap {
        let mut map = NetworkMap::default();
        for gate in gates {
            map.gates.insert(gate.name.clone(), Arc::clone(gate));
        }
        for service in services {
            map.services
                .insert(service.name.clone(), Arc::clone(service));
        }
        map
    }

    #[test]
    fn hosts_route_exactly_or_by_one_label_wildcard() {
        let mut routing = Routing::new(Arc::default(), Arc::default());
        let table = routing.build(&map(
            &[
                gate("shop", &["shop.example.com"], "web"),
                gate("wild", &["*.example.com"], "web"),
            ],
            &[service("web", 8080, &["web-a"])],
        ));
        let name = |host: &str| table.gate_for(host).map(|g| g.spec.name.clone());
        assert_eq!(name("shop.example.com").as_deref(), Some("shop"));
        assert_eq!(name("other.example.com").as_deref(), Some("wild"));
        assert_eq!(name("a.b.example.com"), None);
        assert_eq!(name("example.com"), None);
        assert_eq!(name("elsewhere.org"), None);
    }

    #[test]
    fn the_longest_path_prefix_wins_by_whole_segments() {
        let mut spec = GateSpec::clone(&gate("shop", &["shop.example.com"], "web"));
        spec.paths = vec![
            GatePath {
                prefix: "/api".into(),
                service: "api".into(),
                port: 9000,
            },
            GatePath {
                prefix: "/api/admin".into(),
                service: "admin".into(),
                port: 9000,
            },
        ];
        let mut routing = Routing::new(Arc::default(), Arc::default());
        let table = routing.build(&map(
            &[Arc::new(spec)],
            &[
                service("web", 8080, &["web-a"]),
                service("api", 9000, &["api-a"]),
                service("admin", 9000, &["admin-a"]),
            ],
        ));
        let gate = table.gate_for("shop.example.com").expect("gate");
        let service = |path: &str| gate.pool_for(path).service.clone();
        assert_eq!(service("/"), "web");
        assert_eq!(service("/apix"), "web");
        assert_eq!(service("/api"), "api");
        assert_eq!(service("/api/users"), "api");
        assert_eq!(service("/api/admin/x"), "admin");
    }

    #[test]
    fn backends_keep_their_state_across_rebuilds() {
        let mut routing = Routing::new(Arc::default(), Arc::default());
        let gates = [gate("shop", &["shop.example.com"], "web")];
        let first = routing.build(&map(&gates, &[service("web", 8080, &["web-a"])]));
        let held = Arc::clone(
            &first
                .gate_for("shop.example.com")
                .expect("gate")
                .default
                .backends[0],
        );
        let second = routing.build(&map(&gates, &[service("web", 8080, &["web-a", "web-b"])]));
        let pool = &second.gate_for("shop.example.com").expect("gate").default;
        assert_eq!(pool.backends.len(), 2);
        assert!(
            Arc::ptr_eq(&held, &pool.backends[0]),
            "web-a is the same backend"
        );
    }

    #[test]
    fn a_gate_to_a_missing_service_or_port_has_no_backends() {
        let mut routing = Routing::new(Arc::default(), Arc::default());
        let table = routing.build(&map(
            &[gate("shop", &["shop.example.com"], "web")],
            &[service("web", 9999, &["web-a"])],
        ));
        let pool = &table.gate_for("shop.example.com").expect("gate").default;
        assert!(pool.backends.is_empty());
        assert!(pool.service_known);
    }

    #[test]
    fn path_prefixes_match_whole_segments() {
        assert!(path_matches("/api", "/api"));
        assert!(path_matches("/api", "/api/"));
        assert!(path_matches("/api/", "/api/v1"));
        assert!(!path_matches("/api", "/apix"));
        assert!(!path_matches("/api", "/"));
    }
}
