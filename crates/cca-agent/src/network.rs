//! Per-instance networking of containers: the narrow [`InstanceNetwork`]
//! trait the [`crate::RuntimeSet`] drives (implemented by
//! [`cca_net::NodeNetwork`] over any host), and the async wrappers that run
//! its blocking calls (netlink, `nft`, the state file) on the blocking pool.
//!
//! A container gets its own namespace, address and published host ports at
//! create, and loses them after remove; the agent removes what crashed
//! instances left behind at start (`cleanup_orphans`). A node without a
//! subnet has no `InstanceNetwork`, and its containers keep the host's
//! network.

use std::fmt;
use std::sync::Arc;

pub use cca_net::CleanupReport;
use cca_net::ebpf::VethPrograms;
use cca_net::{Attachment, HostNetwork, NodeNetwork, Proto};
use cca_runtime::{InstanceSpec, NetworkAttachment, Protocol};

/// What the agent needs of the node network.
pub trait InstanceNetwork: Send + Sync + fmt::Debug {
    /// Gives `id` its namespace, veth and address (idempotent).
    fn attach(&self, id: &str) -> cca_net::Result<Attachment>;
    /// Publishes `host_port` on every local address to `id`'s `container_port`.
    fn publish(
        &self,
        id: &str,
        host_port: u16,
        container_port: u16,
        proto: Proto,
    ) -> cca_net::Result<()>;
    /// Removes `id`'s ports, veth and namespace and releases its address;
    /// an unknown id is fine.
    fn detach(&self, id: &str) -> cca_net::Result<()>;
    /// Removes everything belonging to no instance in `known`.
    fn cleanup_orphans(&self, known: &[String]) -> cca_net::Result<CleanupReport>;
}

impl<H: HostNetwork> InstanceNetwork for NodeNetwork<H> {
    fn attach(&self, id: &str) -> cca_net::Result<Attachment> {
        NodeNetwork::attach(self, id)
    }

    fn publish(
        &self,
        id: &str,
        host_port: u16,
        container_port: u16,
        proto: Proto,
    ) -> cca_net::Result<()> {
        NodeNetwork::publish(self, id, host_port, container_port, proto).map(|_| ())
    }

    fn detach(&self, id: &str) -> cca_net::Result<()> {
        NodeNetwork::detach(self, id)
    }

    fn cleanup_orphans(&self, known: &[String]) -> cca_net::Result<CleanupReport> {
        NodeNetwork::cleanup_orphans(self, known.iter().map(String::as_str))
    }
}

/// The node network with the eBPF data plane's tc programs on every
/// instance's veth (`--dataplane ebpf`): attached before the instance
/// starts, so its first packet to a VIP is balanced, and detached before
/// the veth goes.
#[derive(Debug)]
pub struct BalancedNetwork<H: HostNetwork> {
    net: NodeNetwork<H>,
    veths: Arc<dyn VethPrograms>,
}

impl<H: HostNetwork> BalancedNetwork<H> {
    /// Takes `net` over, giving the veths of the instances it already has
    /// the programs (an agent restart swaps its own in) and taking them off
    /// veths of instances it has not.
    pub fn new(net: NodeNetwork<H>, veths: Arc<dyn VethPrograms>) -> Self {
        let mut attached = std::collections::BTreeSet::new();
        for instance in net.leases().keys() {
            let veth = net.config().veth_name(instance);
            match veths.attach(&veth) {
                Ok(()) => {
                    attached.insert(veth);
                }
                Err(error) => {
                    tracing::warn!(instance, veth, %error, "no eBPF programs on an instance's veth")
                }
            }
        }
        if let Err(error) = veths.retain(&attached) {
            tracing::warn!(%error, "could not detach the eBPF programs of gone instances");
        }
        Self { net, veths }
    }
}

impl<H: HostNetwork> InstanceNetwork for BalancedNetwork<H> {
    fn attach(&self, id: &str) -> cca_net::Result<Attachment> {
        let attachment = self.net.attach(id)?;
        self.veths.attach(&self.net.config().veth_name(id))?;
        Ok(attachment)
    }

    fn publish(
        &self,
        id: &str,
        host_port: u16,
        container_port: u16,
        proto: Proto,
    ) -> cca_net::Result<()> {
        InstanceNetwork::publish(&self.net, id, host_port, container_port, proto)
    }

    fn detach(&self, id: &str) -> cca_net::Result<()> {
        let veth = self.net.config().veth_name(id);
        if let Err(error) = self.veths.detach(&veth) {
            tracing::warn!(instance = id, veth, %error, "could not detach the eBPF programs");
        }
        self.net.detach(id)
    }

    fn cleanup_orphans(&self, known: &[String]) -> cca_net::Result<CleanupReport> {
        let report = InstanceNetwork::cleanup_orphans(&self.net, known)?;
        let veths = known
            .iter()
            .map(|id| self.net.config().veth_name(id))
            .collect();
        self.veths.retain(&veths)?;
        Ok(report)
    }
}

/// Runs `call` on the blocking pool; a panic is reported as an error.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> cca_net::Result<T> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(|error| error.to_string()),
        Err(error) => Err(format!("the node network call panicked: {error}")),
    }
}

/// Attaches the instance of `spec` and publishes each of its host ports to
/// its declared port, for the port's declared protocol only (the nftables
/// map then holds no UDP rule for a TCP port, nor the other way round). On
/// failure everything is detached again.
pub(crate) async fn attach(
    network: &Arc<dyn InstanceNetwork>,
    spec: &InstanceSpec,
) -> Result<NetworkAttachment, String> {
    let id = spec.id.clone();
    let ports: Vec<(u16, u16, Proto)> = spec
        .ports
        .iter()
        .map(|port| {
            (
                port.host_port,
                port.container_port.unwrap_or(port.host_port),
                proto(port.protocol),
            )
        })
        .collect();
    let net = Arc::clone(network);
    let attached = blocking(move || {
        let attachment = net.attach(&id)?;
        for (host_port, container_port, proto) in ports {
            net.publish(&id, host_port, container_port, proto)?;
        }
        Ok(attachment)
    })
    .await;
    match attached {
        Ok(attachment) => Ok(NetworkAttachment {
            netns_path: attachment.netns_path,
            address: attachment.address,
        }),
        Err(problem) => {
            if let Err(undo) = detach(network, &spec.id).await {
                tracing::warn!(instance = %spec.id, problem = %undo, "detaching after a failed attach");
            }
            Err(format!("attaching to the node network: {problem}"))
        }
    }
}

/// The node network's name for a port's protocol.
fn proto(protocol: Protocol) -> Proto {
    match protocol {
        Protocol::Tcp => Proto::Tcp,
        Protocol::Udp => Proto::Udp,
    }
}

/// Detaches `id` from the node network.
pub(crate) async fn detach(network: &Arc<dyn InstanceNetwork>, id: &str) -> Result<(), String> {
    let net = Arc::clone(network);
    let id = id.to_owned();
    blocking(move || net.detach(&id)).await
}

/// Removes what belongs to no instance in `known`.
pub(crate) async fn cleanup_orphans(
    network: &Arc<dyn InstanceNetwork>,
    known: Vec<String>,
) -> Result<CleanupReport, String> {
    let net = Arc::clone(network);
    blocking(move || net.cleanup_orphans(&known)).await
}

/// The real node network for `subnet` (`10.88.0.0/24`): bridge `cca0`,
/// nftables table `ip cca`, namespaces `cca-{id}`, state in
/// `state_dir/network.json`. Opening creates the bridge and table and
/// restores published ports (blocking; call it at agent start).
pub fn node_network(
    subnet: &str,
    state_dir: impl Into<std::path::PathBuf>,
) -> Result<Arc<dyn InstanceNetwork>, String> {
    let subnet: cca_net::Subnet = subnet
        .parse()
        .map_err(|e: cca_net::Error| format!("pod subnet `{subnet}`: {e}"))?;
    let config = cca_net::NetConfig::new(subnet, state_dir);
    let network = NodeNetwork::open(config, cca_net::KernelNetwork::new())
        .map_err(|e| format!("opening the node network on {subnet}: {e}"))?;
    Ok(Arc::new(network))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use cca_runtime::PortBinding;

    use super::*;

    /// Records what is published; attaches everything at one address.
    #[derive(Debug, Default)]
    struct Recording {
        published: Mutex<Vec<(String, u16, u16, Proto)>>,
    }

    impl InstanceNetwork for Recording {
        fn attach(&self, _id: &str) -> cca_net::Result<Attachment> {
            Ok(Attachment {
                netns_path: "/run/netns/cca-test".into(),
                address: std::net::Ipv4Addr::new(10, 88, 0, 2),
                prefix: 24,
                gateway: std::net::Ipv4Addr::new(10, 88, 0, 1),
            })
        }

        fn publish(
            &self,
            id: &str,
            host: u16,
            container: u16,
            proto: Proto,
        ) -> cca_net::Result<()> {
            let mut published = self.published.lock().expect("not poisoned");
            published.push((id.to_owned(), host, container, proto));
            Ok(())
        }

        fn detach(&self, _id: &str) -> cca_net::Result<()> {
            Ok(())
        }

        fn cleanup_orphans(&self, _known: &[String]) -> cca_net::Result<CleanupReport> {
            Ok(CleanupReport::default())
        }
    }

    #[tokio::test]
    async fn each_port_is_published_for_its_declared_protocol_only() {
        let recording = Arc::new(Recording::default());
        let network: Arc<dyn InstanceNetwork> = recording.clone();
        let mut spec = InstanceSpec::new("dns-0", "dns", "true");
        spec.ports = vec![
            PortBinding {
                name: "http".into(),
                host_port: 31000,
                container_port: Some(80),
                protocol: Protocol::Tcp,
            },
            PortBinding {
                name: "dns".into(),
                host_port: 31053,
                container_port: Some(53),
                protocol: Protocol::Udp,
            },
        ];
        let attachment = attach(&network, &spec).await.expect("attaches");
        assert_eq!(attachment.address, std::net::Ipv4Addr::new(10, 88, 0, 2));
        let published = recording.published.lock().expect("not poisoned").clone();
        assert_eq!(
            published,
            vec![
                ("dns-0".to_owned(), 31000, 80, Proto::Tcp),
                ("dns-0".to_owned(), 31053, 53, Proto::Udp),
            ]
        );
    }
}
