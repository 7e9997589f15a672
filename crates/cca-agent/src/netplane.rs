//! The node's part of the cluster network, driven by its [`NetworkView`]:
//! once the view holds this node's subnet, the plane opens the node
//! network on it (the bridge with the subnet's gateway, instances' veths
//! and addresses, published ports) and the VXLAN overlay; on every view
//! after, it syncs the overlay's routes and forwarding entries to the
//! other nodes.
//!
//! [`NodeNet`] is what the rest of the agent sees of it: nothing until the
//! subnet is known, then the instance network containers attach to and
//! the resolver instances are given. Until then containers with a network
//! of their own, and every instance's first start, wait (they are not
//! failures: the subnet arrives a moment after the node registers, or at
//! once from the cached view after an agent restart).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use cca_model::net::{DNS_ZONE, Ipv4Net, NetworkMap, Touched};
use cca_net::dataplane::{DataPlane, DataPlaneConfig, PacketFilter};
use cca_net::ebpf::{EbpfPlane, LbMaps};
use cca_net::{
    HostNetwork, LocalNode, NetConfig, NodeNetwork, Overlay, OverlayConfig, OverlayHost, RangeRoute,
};
use cca_runtime::DnsConfig;
use tokio::sync::watch;

use crate::netmap::NetworkView;
use crate::network::{BalancedNetwork, InstanceNetwork};

/// A failed apply is tried again after this long even if no new view
/// arrives.
const RETRY: Duration = Duration::from_secs(5);

/// What instances get once the node's subnet is known.
#[derive(Clone, Debug)]
pub struct Ready {
    /// Where containers with their own network attach.
    pub network: Arc<dyn InstanceNetwork>,
    pub subnet: Ipv4Net,
    /// The resolver every instance is given: the node's cluster DNS on its
    /// bridge's gateway address.
    pub dns: DnsConfig,
}

/// The node network as the supervisor and the runtimes see it; see the
/// module docs.
#[derive(Debug, Default)]
pub struct NodeNet {
    ready: RwLock<Option<Ready>>,
    /// The instances this node's VIP rules send new flows to, as last
    /// synced.
    targets: RwLock<std::collections::HashSet<String>>,
    /// Each service's VIP, as last synced.
    vips: RwLock<std::collections::HashMap<String, Ipv4Addr>>,
}

impl NodeNet {
    /// The node network, once the subnet is known.
    pub fn ready(&self) -> Option<Ready> {
        self.ready
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether this node's VIP rules still send new flows to `instance`.
    pub fn is_target(&self, instance: &str) -> bool {
        self.targets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(instance)
    }

    /// Records the instances `map`'s VIP rules send new flows to (the
    /// plane, after each sync of the data plane).
    pub fn set_targets(&self, map: &NetworkMap) {
        let targets = map
            .services
            .values()
            .flat_map(|service| service.endpoints.values().flatten())
            .map(|target| target.instance.clone())
            .collect();
        *self.targets.write().unwrap_or_else(PoisonError::into_inner) = targets;
        let vips = map
            .services
            .iter()
            .filter_map(|(name, service)| Some((name.clone(), service.vip?)))
            .collect();
        *self.vips.write().unwrap_or_else(PoisonError::into_inner) = vips;
    }

    /// The VIP of `service` this node's rules serve, as last synced.
    pub fn vip(&self, service: &str) -> Option<Ipv4Addr> {
        self.vips
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
            .copied()
    }

    /// The node network is up (the plane, once it opened it).
    pub fn set(&self, ready: Ready) {
        *self.ready.write().unwrap_or_else(PoisonError::into_inner) = Some(ready);
    }

    /// Why an instance cannot start yet, while the subnet is unknown.
    pub fn waiting(&self) -> Option<&'static str> {
        self.ready()
            .is_none()
            .then_some("this node has no subnet yet: waiting for the control plane to allocate one")
    }
}

/// The resolver of a node whose bridge has `gateway`.
pub fn node_dns(gateway: Ipv4Addr) -> DnsConfig {
    DnsConfig {
        nameservers: vec![gateway],
        search: vec![DNS_ZONE.to_owned()],
        // `postgres` (no dot) tries `postgres.cca.local` first; any name
        // with a dot is asked as written first.
        ndots: 1,
    }
}

/// Where and how the plane builds the node's network.
#[derive(Clone, Debug)]
pub struct PlaneConfig {
    /// This node's name (its entry in the map).
    pub node: String,
    /// Where other nodes' tunnels reach this one.
    pub underlay: Ipv4Addr,
    /// Where the node network keeps its state (`network.json`).
    pub state_dir: PathBuf,
    pub overlay: OverlayConfig,
    /// The node's DNS server listens on the gateway address at this port
    /// (and the gateway's port 53 is redirected to it); `None`: no DNS.
    pub dns_port: Option<u16>,
}

/// Opens the node's eBPF maps (loads and attaches the socket programs; a
/// recording fake in tests). Called when the node network opens, again on
/// the next try if that failed.
pub type LbOpener = Arc<dyn Fn() -> cca_net::ebpf::Result<Box<dyn LbMaps + Send>> + Send + Sync>;

/// Which VIP data plane a node runs (`cca agent --dataplane`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VipDataPlane {
    /// nftables rules for every flow to a VIP.
    #[default]
    Nftables,
    /// The eBPF socket programs for the node's own processes besides the
    /// nftables rules (which still serve containers and other hosts).
    Ebpf,
    /// `Ebpf` where the kernel lets the programs load, else `Nftables`.
    Auto,
}

/// Whether the node balances its own processes' VIP connections with the
/// eBPF socket programs besides the nftables rules.
#[derive(Clone)]
pub struct EbpfChoice {
    pub open: LbOpener,
    /// The seed of the VIP ports' tables (the programs get theirs from
    /// `open`).
    pub seed: u64,
    /// `--dataplane ebpf`: failing to load is an error; `auto`: the node
    /// goes on with nftables alone and says why.
    pub required: bool,
    /// How long backends that leave keep the flows pinned to them (the
    /// agent's stop grace: a stopping instance is killed after it).
    pub drain: Duration,
}

impl std::fmt::Debug for EbpfChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfChoice")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// Where the names of a map are published: the node's DNS server (or a
/// recording in tests).
pub trait Names: Send + Sync + std::fmt::Debug {
    /// From now on, answer from `map`.
    fn publish(&self, map: Arc<NetworkMap>);
}

impl Names for cca_dns::DnsHandle {
    fn publish(&self, map: Arc<NetworkMap>) {
        self.set_map(map);
    }
}

/// The node's network plane over a kernel `H` and a packet filter `F`
/// (the real ones, or recording fakes in tests).
#[derive(Debug)]
pub struct Plane<H: HostNetwork + OverlayHost + Clone + 'static, F: PacketFilter + 'static> {
    config: PlaneConfig,
    host: H,
    node_net: Arc<NodeNet>,
    overlay: Option<Overlay<H>>,
    /// The packet filter until the data plane takes it at open.
    filter: Option<F>,
    dataplane: Option<DataPlane<F>>,
    /// The eBPF socket programs, when chosen and loaded.
    ebpf_choice: Option<EbpfChoice>,
    ebpf: Option<EbpfPlane<Box<dyn LbMaps + Send>>>,
    names: Option<Arc<dyn Names>>,
    /// Ends the node's DNS server when the plane goes.
    _dns_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Where the DNS server's tasks run (the agent's runtime).
    runtime: Option<tokio::runtime::Handle>,
    /// The node bridge's name, once the node network is open.
    bridge: String,
    /// The map the kernel was last synced to.
    applied: Option<NetworkMap>,
}

impl<H: HostNetwork + OverlayHost + Clone + 'static, F: PacketFilter + 'static> Plane<H, F> {
    pub fn new(config: PlaneConfig, host: H, filter: F, node_net: Arc<NodeNet>) -> Self {
        Self {
            config,
            host,
            node_net,
            overlay: None,
            filter: Some(filter),
            dataplane: None,
            ebpf_choice: None,
            ebpf: None,
            names: None,
            _dns_stop: None,
            runtime: tokio::runtime::Handle::try_current().ok(),
            bridge: String::new(),
            applied: None,
        }
    }

    /// Also balances the node's own processes with the eBPF socket
    /// programs (`--dataplane ebpf|auto`).
    #[must_use]
    pub fn with_ebpf(mut self, choice: EbpfChoice) -> Self {
        self.ebpf_choice = Some(choice);
        self
    }

    /// Publishes names to `names` instead of a DNS server of the plane's
    /// own (tests).
    #[must_use]
    pub fn with_names(mut self, names: Arc<dyn Names>) -> Self {
        self.names = Some(names);
        self
    }

    /// Brings the node in line with `view` (blocking: netlink and nft).
    pub fn apply(&mut self, view: &NetworkView) -> Result<(), String> {
        let Some(route) = view.map.nodes.get(&self.config.node) else {
            return Ok(());
        };
        if self.overlay.is_none() {
            self.open(route.subnet)?;
        } else if let Some(ready) = self.node_net.ready()
            && ready.subnet != route.subnet
        {
            // The controller never moves a live subnet; a node deleted and
            // registered again after its hold gets a new one, and its
            // instances' addresses would all change under them.
            return Err(format!(
                "this node's subnet changed from {} to {}: its instances keep their addresses \
                 on {}; restart the agent after removing {} to move them",
                ready.subnet,
                route.subnet,
                ready.subnet,
                self.config.state_dir.join(cca_net::STATE_FILE).display()
            ));
        }
        if self.applied.as_ref() == Some(&view.map) {
            return Ok(());
        }
        let touched = match &self.applied {
            Some(before) => view.map.touched_since(before),
            None => view.map.everything(),
        };
        if (self.applied.is_none() || !touched.nodes.is_empty())
            && let Some(overlay) = &self.overlay
        {
            let report = overlay
                .sync(view.map.nodes.values())
                .map_err(|error| format!("syncing the overlay: {error}"))?;
            tracing::debug!(?report, "overlay synced");
        }
        if (self.applied.is_none() || touched.ranges)
            && let (Some(ranges), Some(ready)) = (view.map.ranges, self.node_net.ready())
        {
            let route = RangeRoute {
                range: ranges.services,
                bridge: self.bridge.clone(),
                source: ready.subnet.gateway(),
            };
            self.host
                .ensure_range_route(&route)
                .map_err(|error| format!("routing the service range: {error}"))?;
        }
        // A name never leads to a VIP without rules: names whose VIP goes
        // or changes are withdrawn before the rules change, and new names
        // are published after.
        if let (Some(names), Some(before)) = (&self.names, &self.applied) {
            names.publish(Arc::new(withdrawn(before, &view.map, &touched)));
        }
        if let Some(dataplane) = &mut self.dataplane {
            let report = dataplane
                .sync(&view.map, &touched)
                .map_err(|error| format!("syncing the VIP data plane: {error}"))?;
            tracing::debug!(?report, "data plane synced");
            self.node_net.set_targets(&view.map);
        }
        if let Some(ebpf) = &mut self.ebpf {
            if let Some(seed) = view.map.ranges.and_then(|ranges| ranges.flow_hash_seed) {
                ebpf.set_seed(seed)
                    .map_err(|error| format!("setting the cluster's flow-hash seed: {error}"))?;
            }
            let report = ebpf
                .sync(&view.map, &touched)
                .map_err(|error| format!("syncing the eBPF data plane: {error}"))?;
            tracing::debug!(?report, "eBPF maps synced");
        }
        if let Some(names) = &self.names {
            names.publish(Arc::new(view.map.clone()));
        }
        self.applied = Some(view.map.clone());
        Ok(())
    }

    /// Starts the node's DNS server on `gateway`.
    fn start_dns(&mut self, gateway: Ipv4Addr, port: u16) -> Result<(), String> {
        let runtime = self
            .runtime
            .clone()
            .ok_or("the node's DNS server needs the agent's async runtime")?;
        let mut config = cca_dns::DnsConfig::new(vec![(gateway, port).into()]);
        config.also_self = vec![gateway.into()];
        let server = runtime
            .block_on(cca_dns::DnsServer::bind(config, Arc::default()))
            .map_err(|error| {
                format!("starting the node's DNS server on {gateway}:{port}: {error}")
            })?;
        let handle = server.handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = server.run(shutdown).await {
                tracing::error!(%error, "the node's DNS server stopped");
            }
        });
        tracing::info!(%gateway, port, "node DNS server listening");
        self.names = Some(Arc::new(handle));
        self._dns_stop = Some(stop);
        Ok(())
    }

    /// Loads the eBPF programs when they are chosen: an error when
    /// they are required and cannot load; with `auto`, a warning and
    /// nftables alone.
    fn open_ebpf(&mut self) -> Result<(), String> {
        let Some(choice) = &self.ebpf_choice else {
            return Ok(());
        };
        if self.ebpf.is_some() {
            return Ok(());
        }
        match (choice.open)() {
            Ok(maps) => {
                self.ebpf = Some(EbpfPlane::new(maps, choice.seed).with_drain(choice.drain));
                tracing::info!("eBPF load balancing on (socket and tc programs)");
                Ok(())
            }
            Err(error) if choice.required => Err(format!("opening the eBPF data plane: {error}")),
            Err(error) => {
                tracing::warn!(%error, "eBPF data plane unavailable; VIPs through nftables alone");
                self.ebpf_choice = None;
                Ok(())
            }
        }
    }

    /// Opens the overlay and the node network on `subnet`.
    fn open(&mut self, subnet: Ipv4Net) -> Result<(), String> {
        self.open_ebpf()?;
        let local = LocalNode {
            name: self.config.node.clone(),
            subnet,
            underlay: self.config.underlay,
        };
        let overlay = Overlay::open(local, self.config.overlay.clone(), self.host.clone())
            .map_err(|error| format!("opening the overlay on {subnet}: {error}"))?;
        let net_subnet = cca_net::Subnet::new(subnet.network(), subnet.prefix())
            .map_err(|error| format!("node subnet {subnet}: {error}"))?;
        let mut config = NetConfig::for_node(&self.config.node, net_subnet, &self.config.state_dir);
        config.mtu = Some(overlay.mtu());
        config.overlay = Some(self.config.overlay.device.clone());
        config.dns_port = self.config.dns_port;
        if let Some(bridge) = &self.config.overlay.bridge {
            config.bridge.clone_from(bridge);
        }
        self.bridge.clone_from(&config.bridge);
        let network = NodeNetwork::open(config, self.host.clone())
            .map_err(|error| format!("opening the node network on {subnet}: {error}"))?;
        let network: Arc<dyn InstanceNetwork> = match &self.ebpf {
            Some(ebpf) => Arc::new(BalancedNetwork::new(network, ebpf.veth_programs())),
            None => Arc::new(network),
        };
        tracing::info!(%subnet, mtu = overlay.mtu(), "node network open");
        if let Some(filter) = self.filter.take() {
            let config = DataPlaneConfig::new(&self.config.node);
            match DataPlane::new(config, filter) {
                Ok(dataplane) => self.dataplane = Some(dataplane),
                Err(error) => return Err(format!("opening the VIP data plane: {error}")),
            }
        }
        if self.names.is_none()
            && let Some(port) = self.config.dns_port
        {
            self.start_dns(subnet.gateway(), port)?;
        }
        self.overlay = Some(overlay);
        self.node_net.set(Ready {
            network,
            subnet,
            dns: node_dns(subnet.gateway()),
        });
        Ok(())
    }
}

/// What follows the network map on a node (a [`Plane`] over some kernel).
pub trait ApplyView: Send + std::fmt::Debug {
    /// Brings the node in line with `view` (blocking).
    fn apply(&mut self, view: &NetworkView) -> Result<(), String>;
    /// Ends what is due by now (the eBPF data plane's drains); when it
    /// wants to be called again.
    fn tick(&mut self) -> Option<std::time::Instant> {
        None
    }
}

impl<H: HostNetwork + OverlayHost + Clone + Send + 'static, F: PacketFilter + 'static> ApplyView
    for Plane<H, F>
{
    fn apply(&mut self, view: &NetworkView) -> Result<(), String> {
        Plane::apply(self, view)
    }

    fn tick(&mut self) -> Option<std::time::Instant> {
        let ebpf = self.ebpf.as_mut()?;
        match ebpf.expire(std::time::Instant::now()) {
            Ok(report) if report.ops > 0 => {
                tracing::debug!(?report, "eBPF drains ended");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "ending the eBPF data plane's drains failed"),
        }
        ebpf.next_drain_end()
    }
}

/// The agent's part of the cluster network: what instances see of it and
/// the plane that follows the map.
#[derive(Clone, Debug)]
pub struct AgentNetwork {
    pub node_net: Arc<NodeNet>,
    pub plane: Arc<Mutex<dyn ApplyView>>,
}

impl AgentNetwork {
    /// Applies `view` now, on the calling thread (blocking): the agent's
    /// start brings the node network up from the cached view before it
    /// cleans up what dead containers left.
    pub fn apply_now(&self, view: &NetworkView) -> Result<(), String> {
        self.plane
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .apply(view)
    }
}

/// `before` without the services whose VIP `after` removes or changes:
/// what may still be answered while the rules move from one to the other.
fn withdrawn(before: &NetworkMap, after: &NetworkMap, touched: &Touched) -> NetworkMap {
    let mut names = before.clone();
    for service in &touched.services {
        let vip = |map: &NetworkMap| map.services.get(service).and_then(|net| net.vip);
        if vip(before) != vip(after) {
            names.services.remove(service);
        }
    }
    names
}

/// Applies every view `views` publishes to `plane` until `stop`, on the
/// blocking pool; a failure is retried after [`RETRY`] or with the next
/// view.
pub(crate) async fn run_plane(
    plane: Arc<Mutex<dyn ApplyView>>,
    mut views: watch::Receiver<Arc<NetworkView>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failed = false;
    let mut view = Some(Arc::clone(&views.borrow_and_update()));
    loop {
        let plane_now = Arc::clone(&plane);
        let current = view.take();
        let applied = tokio::task::spawn_blocking(move || {
            let mut plane = plane_now.lock().unwrap_or_else(PoisonError::into_inner);
            let outcome = current.map(|view| plane.apply(&view));
            (outcome, plane.tick())
        })
        .await;
        let (outcome, next_tick) = applied
            .unwrap_or_else(|error| (Some(Err(format!("the apply panicked: {error}"))), None));
        // A tick alone (no view applied) leaves the retry as it was.
        if let Some(outcome) = outcome {
            match &outcome {
                Ok(()) if failed => tracing::info!("node network in line with the map again"),
                Ok(()) => {}
                Err(problem) => tracing::warn!(%problem, "applying the network map failed"),
            }
            failed = outcome.is_err();
        }
        let retry = async {
            if failed {
                tokio::time::sleep(RETRY).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let tick = async {
            match next_tick {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            changed = views.changed() => {
                if changed.is_err() { return }
                view = Some(Arc::clone(&views.borrow_and_update()));
            }
            () = retry => view = Some(Arc::clone(&views.borrow())),
            // Only the drains: the view is applied.
            () = tick => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use cca_model::net::{NetworkChange, NodeRoute, Touched};
    use cca_net::dataplane::fake::FakeFilter;
    use cca_net::ebpf::fake::SharedFakeMaps;
    use cca_net::fake::{Call, FakeHost};

    use super::*;

    fn route(node: &str, subnet: &str, underlay: [u8; 4]) -> NodeRoute {
        NodeRoute {
            node: node.into(),
            subnet: subnet.parse().expect("a prefix"),
            underlay: underlay.into(),
            ready: true,
        }
    }

    fn view(routes: &[NodeRoute]) -> NetworkView {
        let mut map = NetworkMap::default();
        let mut touched = Touched::default();
        for route in routes {
            map.apply(NetworkChange::Node(route.clone()), &mut touched);
        }
        NetworkView {
            revision: 1,
            map,
            ..NetworkView::default()
        }
    }

    type TestPlane = Plane<FakeHost, Arc<FakeFilter>>;

    fn plane(dir: &std::path::Path) -> (TestPlane, Arc<NodeNet>, FakeHost) {
        let (plane, node_net, host, _) = plane_with_filter(dir);
        (plane, node_net, host)
    }

    fn plane_with_filter(
        dir: &std::path::Path,
    ) -> (TestPlane, Arc<NodeNet>, FakeHost, Arc<FakeFilter>) {
        let host = FakeHost::default();
        let filter = Arc::new(FakeFilter::new());
        let node_net = Arc::new(NodeNet::default());
        let config = PlaneConfig {
            node: "n1".into(),
            underlay: [192, 168, 0, 1].into(),
            state_dir: dir.to_owned(),
            overlay: OverlayConfig {
                mtu: Some(1450),
                ..OverlayConfig::default()
            },
            dns_port: None,
        };
        let plane = Plane::new(
            config,
            host.clone(),
            Arc::clone(&filter),
            Arc::clone(&node_net),
        );
        (plane, node_net, host, filter)
    }

    #[test]
    fn the_node_network_opens_once_the_map_holds_the_subnet() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut plane, node_net, host) = plane(dir.path());
        assert!(node_net.waiting().is_some());
        plane.apply(&view(&[])).expect("nothing to do");
        assert!(node_net.ready().is_none());
        let n1 = route("n1", "10.42.1.0/24", [192, 168, 0, 1]);
        let n2 = route("n2", "10.42.2.0/24", [192, 168, 0, 2]);
        plane.apply(&view(&[n1.clone(), n2])).expect("opens");
        let ready = node_net.ready().expect("ready");
        assert_eq!(ready.subnet.to_string(), "10.42.1.0/24");
        assert_eq!(ready.dns.nameservers, vec![Ipv4Addr::new(10, 42, 1, 1)]);
        assert_eq!(ready.dns.search, vec!["cca.local".to_owned()]);
        let calls = host.calls();
        assert!(
            calls
                .iter()
                .any(|call| matches!(call, Call::EnsureBridge(bridge) if bridge.mtu == Some(1450))),
            "{calls:?}"
        );
        assert!(
            calls.iter().any(|call| matches!(call, Call::AddRoute(_, route) if route.subnet.to_string() == "10.42.2.0/24")),
            "{calls:?}"
        );
        // The service range is routed to the bridge.
        let mut ranged = view(std::slice::from_ref(&n1));
        let mut touched = Touched::default();
        ranged.map.apply(
            NetworkChange::Ranges(cca_model::net::AddressRanges {
                cluster: "10.42.0.0/16".parse().expect("a prefix"),
                services: "10.43.0.0/16".parse().expect("a prefix"),
                flow_hash_seed: None,
            }),
            &mut touched,
        );
        plane.apply(&ranged).expect("syncs");
        assert!(
            host.calls().iter().any(|call| matches!(
                call,
                Call::EnsureRangeRoute(route) if route.range.to_string() == "10.43.0.0/16"
                    && route.bridge == "cca0"
                    && route.source == Ipv4Addr::new(10, 42, 1, 1)
            )),
            "{:?}",
            host.calls()
        );
        // n2 leaves: its route goes.
        plane.apply(&view(&[n1])).expect("syncs");
        assert!(
            host.calls()
                .iter()
                .any(|call| matches!(call, Call::DeleteRoute(_, route) if route.subnet.to_string() == "10.42.2.0/24")),
        );
    }

    #[test]
    fn a_moved_subnet_is_refused_with_the_way_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut plane, node_net, _) = plane(dir.path());
        plane
            .apply(&view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]))
            .expect("opens");
        let error = plane
            .apply(&view(&[route("n1", "10.42.9.0/24", [192, 168, 0, 1])]))
            .expect_err("refused");
        assert!(
            error.contains("changed from 10.42.1.0/24 to 10.42.9.0/24"),
            "{error}"
        );
        assert_eq!(
            node_net.ready().map(|ready| ready.subnet.to_string()),
            Some("10.42.1.0/24".into())
        );
    }

    /// Checks, at every publication, that each name it answers leads to a
    /// VIP the filter has rules for.
    #[derive(Debug)]
    struct Checked {
        filter: Arc<FakeFilter>,
        published: std::sync::Mutex<Vec<Vec<String>>>,
    }

    impl Names for Checked {
        fn publish(&self, map: Arc<NetworkMap>) {
            let table = self.filter.table(cca_net::dataplane::DEFAULT_TABLE);
            let keys: Vec<String> = table
                .and_then(|table| table.sets.get("services").cloned())
                .map(|services| services.elements.keys().cloned().collect())
                .unwrap_or_default();
            let mut names = vec![];
            for service in map.services.values() {
                let Some(vip) = service.vip else { continue };
                assert!(
                    keys.iter().any(|key| key.contains(&format!("\"{vip}\""))),
                    "{} resolves to {vip}, which has no rules: {keys:?}",
                    service.name
                );
                names.push(format!("{}={vip}", service.name));
            }
            self.published.lock().expect("not poisoned").push(names);
        }
    }

    fn with_service(mut view: NetworkView, name: &str, vip: Option<[u8; 4]>) -> NetworkView {
        use cca_model::spec::PortSpec;
        let mut touched = Touched::default();
        view.map.apply(
            NetworkChange::Service(Arc::new(cca_model::net::ServiceNet {
                name: name.into(),
                vip: vip.map(Ipv4Addr::from),
                ports: vec![PortSpec::tcp("http", 8080)],
                affinity: cca_model::net::Affinity::None,
                endpoints: [("http".to_owned(), vec![])].into(),
                members: vec![],
                asleep: false,
                scale_to_zero: None,
            })),
            &mut touched,
        );
        view
    }

    fn ebpf_choice(maps: Option<SharedFakeMaps>, required: bool) -> EbpfChoice {
        EbpfChoice {
            open: Arc::new(move || match &maps {
                Some(maps) => Ok(Box::new(maps.clone()) as Box<dyn LbMaps + Send>),
                None => Err(cca_net::ebpf::Error::Unsupported("no BPF here".into())),
            }),
            seed: 7,
            required,
            drain: Duration::from_secs(10),
        }
    }

    #[test]
    fn the_ebpf_maps_follow_the_map_besides_nftables() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (plane, _, _, filter) = plane_with_filter(dir.path());
        let maps = SharedFakeMaps::default();
        let mut plane = plane.with_ebpf(ebpf_choice(Some(maps.clone()), true));
        let base = view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]);
        plane
            .apply(&with_service(base.clone(), "a", Some([10, 43, 0, 1])))
            .expect("opens and syncs");
        let fronts: Vec<String> = maps
            .get()
            .fronts
            .keys()
            .map(|key| key.address.to_string())
            .collect();
        assert_eq!(fronts, ["10.43.0.1:8080"]);
        assert!(
            filter.table(cca_net::dataplane::DEFAULT_TABLE).is_some(),
            "nftables still programmed"
        );
        plane.apply(&base).expect("syncs");
        assert!(maps.get().fronts.is_empty(), "the service went");
    }

    #[test]
    fn with_ebpf_instances_veths_get_the_tc_programs_and_the_clusters_seed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (plane, node_net, _, _) = plane_with_filter(dir.path());
        let maps = SharedFakeMaps::default();
        let veths = Arc::clone(&maps.get().veths);
        let mut plane = plane.with_ebpf(ebpf_choice(Some(maps.clone()), true));
        let mut base = view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]);
        base.map.apply(
            NetworkChange::Ranges(cca_model::net::AddressRanges {
                cluster: "10.42.0.0/16".parse().expect("a prefix"),
                services: "10.43.0.0/16".parse().expect("a prefix"),
                flow_hash_seed: Some(0x5eed),
            }),
            &mut Touched::default(),
        );
        plane.apply(&base).expect("opens");
        assert_eq!(maps.get().seed, Some(0x5eed), "the cluster's seed");
        assert_eq!(
            maps.get().service_range,
            Some(Some((Ipv4Addr::new(10, 43, 0, 0), 16)))
        );
        let network = node_net.ready().expect("open").network;
        network.attach("web-1").expect("attaches");
        let veth = NetConfig::new(
            cca_net::Subnet::new(Ipv4Addr::new(10, 42, 1, 0), 24).expect("subnet"),
            dir.path(),
        )
        .veth_name("web-1");
        assert_eq!(veths.attached(), [veth.clone()].into());
        network.detach("web-1").expect("detaches");
        assert!(veths.attached().is_empty());
        // A veth that cannot get the programs fails the attach: the
        // instance would start unbalanced.
        veths.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(network.attach("web-2").is_err());
    }

    #[test]
    fn ticks_end_the_ebpf_drains() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (plane, _, _, _) = plane_with_filter(dir.path());
        let maps = SharedFakeMaps::default();
        let mut choice = ebpf_choice(Some(maps.clone()), true);
        choice.drain = Duration::from_millis(1);
        let mut plane = plane.with_ebpf(choice);
        let base = view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]);
        let mut served = with_service(base.clone(), "a", Some([10, 43, 0, 1]));
        let mut a = (**served.map.services.get("a").expect("a")).clone();
        a.endpoints.insert(
            "http".into(),
            vec![cca_model::net::Target {
                instance: "a-1".into(),
                node: "n1".into(),
                address: Ipv4Addr::new(10, 42, 1, 2),
                port: 8080,
            }],
        );
        served
            .map
            .apply(NetworkChange::Service(Arc::new(a)), &mut Touched::default());
        plane.apply(&served).expect("opens and syncs");
        assert_eq!(plane.tick(), None, "nothing drains");
        assert_eq!(maps.get().backends.len(), 1);
        plane
            .apply(&with_service(base, "a", Some([10, 43, 0, 1])))
            .expect("the backend leaves");
        assert_eq!(maps.get().backends.len(), 1, "it drains");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(plane.tick(), None, "the drain ended");
        assert!(maps.get().backends.is_empty());
    }

    #[test]
    fn ebpf_that_cannot_load_fails_the_node_unless_auto() {
        let dir = tempfile::tempdir().expect("temp dir");
        let base = view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]);
        let (unloaded, node_net, _) = plane(dir.path());
        let mut required = unloaded.with_ebpf(ebpf_choice(None, true));
        let error = required.apply(&base).expect_err("required");
        assert!(error.contains("opening the eBPF data plane"), "{error}");
        assert!(error.contains("no BPF here"), "{error}");
        assert!(node_net.ready().is_none(), "nothing opened half");
        let dir = tempfile::tempdir().expect("temp dir");
        let (unloaded, node_net, _) = plane(dir.path());
        let mut auto = unloaded.with_ebpf(ebpf_choice(None, false));
        auto.apply(&base).expect("auto goes on with nftables");
        assert!(node_net.ready().is_some());
    }

    #[test]
    fn a_name_never_resolves_to_a_vip_without_rules() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (plane, _, _, filter) = plane_with_filter(dir.path());
        let names = Arc::new(Checked {
            filter: Arc::clone(&filter),
            published: std::sync::Mutex::default(),
        });
        let mut plane = plane.with_names(Arc::clone(&names) as Arc<dyn Names>);
        let base = view(&[route("n1", "10.42.1.0/24", [192, 168, 0, 1])]);
        let steps = [
            with_service(base.clone(), "a", Some([10, 43, 0, 1])),
            // a's VIP moves (a deleted and applied again after a hold).
            with_service(base.clone(), "a", Some([10, 43, 0, 5])),
            with_service(
                with_service(base.clone(), "a", Some([10, 43, 0, 5])),
                "b",
                Some([10, 43, 0, 1]),
            ),
            with_service(base.clone(), "b", Some([10, 43, 0, 1])),
            with_service(base, "b", None),
        ];
        for step in &steps {
            plane.apply(step).expect("applies");
        }
        let published = names.published.lock().expect("not poisoned").clone();
        assert_eq!(
            published,
            vec![
                vec!["a=10.43.0.1".to_owned()],
                // a's old name is withdrawn before its rules move.
                vec![],
                vec!["a=10.43.0.5".to_owned()],
                vec!["a=10.43.0.5".to_owned()],
                vec!["a=10.43.0.5".to_owned(), "b=10.43.0.1".to_owned()],
                vec!["b=10.43.0.1".to_owned()],
                vec!["b=10.43.0.1".to_owned()],
                vec![],
                vec![],
            ]
        );
    }
}
