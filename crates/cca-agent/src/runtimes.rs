//! The runtimes of one node behind one [`Runtime`]: [`RuntimeSet`] sends
//! image workloads to the container runtime and `run` workloads to the
//! process runtime, routes every later call by instance id (ids are unique
//! across both), and merges their lists. Before a container is created its
//! image is pulled into the node's image store (unless the store already
//! has it), and the container is created from the image pinned to the
//! pulled digest, so a tag moving later never changes what an instance
//! runs and garbage collection knows exactly which images are in use.
//! After a container is removed, images no instance uses are collected;
//! after a failed pull, whatever it stored that no image uses goes too.
//!
//! With a node network (`Containers::with_network`, or the cluster
//! network's, below) a container is attached before it is created — its own
//! namespace and address, its host ports published to its declared ports —
//! and detached after it is removed; a spec that already names a network
//! (an init step joining its instance's namespace) is left as it is. Every
//! start attaches a container with a namespace of its own again (a no-op
//! when intact), so one restarted after a host reboot, which took its
//! namespace and veth, gets them back with its address and ports.
//! Without one, containers share the host's network. With the cluster
//! network (`Containers::with_node_net`) the node network exists once the
//! node has a subnet; a container with a network of its own created or
//! started before that fails with `Error::NotYet`, which the supervisor
//! retries rather than counts. A service that asked for the host's
//! network (`network = "host"`) is never attached.
//!
//! A node without a usable container runtime (no runc or crun, crun on
//! hybrid cgroups, not root) still runs processes; its image workloads fail
//! at create with the reason, and nothing is created.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use cca_image::{Digest, ImageRef, ImageStore, Puller, RegistrySettings};
use cca_runtime::{
    Error, ExecOutput, ExecRequest, InstanceSpec, InstanceStatus, LogOptions, LogStream, Operation,
    Result, Runtime, Usage,
};

use crate::netplane::NodeNet;
use crate::network::{self, InstanceNetwork};

/// Which runtime an instance lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Process,
    Container,
}

/// The node's runtimes; share it as `Arc<dyn Runtime>`.
#[derive(Debug)]
pub struct RuntimeSet {
    process: Arc<dyn Runtime>,
    /// The container runtime, or why this node has none.
    containers: std::result::Result<Containers, String>,
    /// Where each known instance lives; refreshed by `list`, filled in by
    /// `create`, probed with `inspect` on a miss.
    routes: Mutex<HashMap<String, Route>>,
}

/// A container runtime with the image store it creates containers from
/// and the puller that fills it.
#[derive(Debug)]
pub struct Containers {
    runtime: Arc<dyn Runtime>,
    images: ImageStore,
    puller: Puller,
    /// One pull per reference at a time: instances of one service starting
    /// together wait for the first pull instead of fetching it again.
    pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// A collection was refused because a pull was under way; it runs
    /// when the next pull ends.
    gc_pending: AtomicBool,
    /// The node network containers are attached to; `None`: the host's.
    network: Option<NetSource>,
}

/// Where the node network comes from.
#[derive(Clone, Debug)]
enum NetSource {
    /// Given at start (tests, a fixed subnet).
    Fixed(Arc<dyn InstanceNetwork>),
    /// The cluster network's, once the node's subnet is known.
    Node(Arc<NodeNet>),
}

impl NetSource {
    fn current(&self) -> Option<Arc<dyn InstanceNetwork>> {
        match self {
            NetSource::Fixed(network) => Some(Arc::clone(network)),
            NetSource::Node(node_net) => node_net.ready().map(|ready| ready.network),
        }
    }

    /// The network, or why a container with a network of its own cannot
    /// be created or started yet.
    fn require(&self, id: &str, operation: Operation) -> Result<Arc<dyn InstanceNetwork>> {
        self.current().ok_or_else(|| Error::NotYet {
            id: id.to_owned(),
            operation,
            reason: match self {
                NetSource::Node(node_net) => node_net.waiting().unwrap_or_default().to_owned(),
                NetSource::Fixed(_) => String::new(),
            },
        })
    }
}

impl Containers {
    /// `runtime` runs containers from `images`; pulls use `registries`.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        images: ImageStore,
        registries: RegistrySettings,
    ) -> Self {
        Self {
            puller: Puller::new(images.clone(), registries),
            runtime,
            images,
            pulls: Mutex::default(),
            gc_pending: AtomicBool::new(false),
            network: None,
        }
    }

    /// Containers get their own network from `network` instead of sharing
    /// the host's.
    #[must_use]
    pub fn with_network(mut self, network: Arc<dyn InstanceNetwork>) -> Self {
        self.network = Some(NetSource::Fixed(network));
        self
    }

    /// Containers get their own network on the node's subnet, once the
    /// cluster network gives the node one; until then they wait.
    #[must_use]
    pub fn with_node_net(mut self, node_net: Arc<NodeNet>) -> Self {
        self.network = Some(NetSource::Node(node_net));
        self
    }

    /// The image of `spec` in the store, pulled first when missing, as a
    /// reference pinned to its manifest digest.
    async fn pinned_image(&self, id: &str, text: &str) -> Result<String> {
        let failed = |message: String| Error::Failed {
            id: id.to_owned(),
            operation: Operation::Create,
            message,
        };
        let reference: ImageRef = text
            .parse()
            .map_err(|e: cca_image::Error| failed(e.to_string()))?;
        let lock = Arc::clone(
            self.pulls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(reference.to_string())
                .or_default(),
        );
        let pulled = {
            let _one_pull = lock.lock().await;
            match self.images.image(&reference) {
                Ok(record) => Ok(record),
                Err(cca_image::Error::NotFound { .. }) => {
                    tracing::info!(instance = id, image = %reference, "pulling");
                    let pulled = self.puller.pull(&reference).await;
                    if pulled.is_err() {
                        // The puller discards what it stored unless another
                        // pull held the store; then the collection below,
                        // or the one after the last pull under way, does.
                        self.gc_pending.store(true, Ordering::SeqCst);
                    }
                    pulled.map_err(|e| failed(format!("pulling the image failed: {e}")))
                }
                Err(error) => Err(failed(error.to_string())),
            }
        };
        if self.gc_pending.load(Ordering::SeqCst) {
            self.collect_garbage().await;
        }
        Ok(reference.with_digest(pulled?.digest).to_string())
    }

    /// Collects the images no container uses (and unreferenced blobs and
    /// layers); deferred when a pull holds the store.
    async fn collect_garbage(&self) {
        let in_use = match self.images_in_use().await {
            Ok(in_use) => in_use,
            Err(problem) => {
                // Never collect without knowing what is in use.
                tracing::warn!(%problem, "image garbage collection skipped");
                return;
            }
        };
        let images = self.images.clone();
        match tokio::task::spawn_blocking(move || images.gc(&in_use)).await {
            Ok(Ok(report)) => {
                self.gc_pending.store(false, Ordering::SeqCst);
                if report != cca_image::GcReport::default() {
                    tracing::info!(
                        images = report.images.len(),
                        blobs = report.blobs.len(),
                        layers = report.layers.len(),
                        "collected unused images"
                    );
                }
            }
            Ok(Err(cca_image::Error::Busy { .. })) => self.gc_pending.store(true, Ordering::SeqCst),
            Ok(Err(error)) => tracing::warn!(%error, "image garbage collection failed"),
            Err(error) => tracing::warn!(%error, "image garbage collection panicked"),
        }
    }

    /// The manifest digests of every container's image.
    async fn images_in_use(&self) -> std::result::Result<HashSet<Digest>, String> {
        let containers = self.runtime.list().await.map_err(|e| e.to_string())?;
        let mut in_use = HashSet::new();
        for status in containers {
            let Some(text) = &status.spec.image else {
                continue;
            };
            let reference: ImageRef = text
                .parse()
                .map_err(|e| format!("instance {}: {e}", status.id))?;
            let digest = match reference.digest {
                Some(digest) => digest,
                None => {
                    self.images
                        .image(&reference)
                        .map_err(|e| format!("instance {}: {e}", status.id))?
                        .digest
                }
            };
            in_use.insert(digest);
        }
        Ok(in_use)
    }
}

impl RuntimeSet {
    /// Processes only; image workloads fail with `reason` (why this node
    /// has no container runtime).
    pub fn processes_only(process: Arc<dyn Runtime>, reason: impl Into<String>) -> Self {
        Self {
            process,
            containers: Err(reason.into()),
            routes: Mutex::default(),
        }
    }

    /// Processes and containers.
    pub fn new(process: Arc<dyn Runtime>, containers: Containers) -> Self {
        Self {
            process,
            containers: Ok(containers),
            routes: Mutex::default(),
        }
    }

    /// Removes the network namespaces, veths, leases and published ports
    /// that belong to no container the runtime still has (left by a crash
    /// or a removal whose detach failed). The agent calls this once at
    /// start; `Ok(None)` when containers have no node network.
    pub async fn cleanup_network_orphans(
        &self,
    ) -> std::result::Result<Option<cca_net::CleanupReport>, String> {
        let Ok(containers) = &self.containers else {
            return Ok(None);
        };
        let Some(net) = containers.network.as_ref().and_then(NetSource::current) else {
            return Ok(None);
        };
        // Never clean up without knowing every live container.
        let known = containers
            .runtime
            .list()
            .await
            .map_err(|e| format!("listing the containers: {e}"))?
            .into_iter()
            .map(|status| status.id)
            .collect();
        network::cleanup_orphans(&net, known).await.map(Some)
    }

    /// Why image workloads cannot run here, `None` when they can.
    pub fn containers_unavailable(&self) -> Option<&str> {
        self.containers.as_ref().err().map(String::as_str)
    }

    fn runtime(&self, route: Route) -> Option<&Arc<dyn Runtime>> {
        match route {
            Route::Process => Some(&self.process),
            Route::Container => self.containers.as_ref().ok().map(|c| &c.runtime),
        }
    }

    fn remember(&self, id: &str, route: Route) {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), route);
    }

    /// Where `id` lives: remembered, else whichever runtime knows it.
    async fn route(&self, id: &str) -> Result<(Route, &Arc<dyn Runtime>)> {
        let known = self
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied();
        if let Some(route) = known
            && let Some(runtime) = self.runtime(route)
        {
            return Ok((route, runtime));
        }
        for route in [Route::Process, Route::Container] {
            let Some(runtime) = self.runtime(route) else {
                continue;
            };
            match runtime.inspect(id).await {
                Ok(_) => {
                    self.remember(id, route);
                    return Ok((route, runtime));
                }
                Err(Error::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Err(Error::NotFound { id: id.to_owned() })
    }
}

#[async_trait]
impl Runtime for RuntimeSet {
    fn kind(&self) -> &'static str {
        "node"
    }

    async fn create(&self, mut spec: InstanceSpec) -> Result<String> {
        spec.validate()?;
        // Ids are unique across the runtimes, not only within each.
        if self.route(&spec.id).await.is_ok() {
            return Err(Error::AlreadyExists { id: spec.id });
        }
        let Some(image) = spec.image.clone() else {
            let id = self.process.create(spec).await?;
            self.remember(&id, Route::Process);
            return Ok(id);
        };
        let containers = self.containers.as_ref().map_err(|reason| Error::Failed {
            id: spec.id.clone(),
            operation: Operation::Create,
            message: format!(
                "image `{image}` needs a container runtime, and this node has none: {reason}"
            ),
        })?;
        spec.image = Some(containers.pinned_image(&spec.id, &image).await?);
        let attached = match &containers.network {
            Some(source) if spec.network.is_none() && !spec.host_network => {
                let net = source.require(&spec.id, Operation::Create)?;
                let attachment =
                    network::attach(&net, &spec)
                        .await
                        .map_err(|message| Error::Failed {
                            id: spec.id.clone(),
                            operation: Operation::Create,
                            message,
                        })?;
                spec.network = Some(attachment);
                Some(net)
            }
            _ => None,
        };
        let id = spec.id.clone();
        match containers.runtime.create(spec).await {
            Ok(id) => {
                self.remember(&id, Route::Container);
                Ok(id)
            }
            Err(error) => {
                // Nothing half-created: the namespace goes with the failure.
                if let Some(net) = attached
                    && let Err(problem) = network::detach(&net, &id).await
                {
                    tracing::warn!(instance = %id, %problem, "detaching after a failed create");
                }
                Err(error)
            }
        }
    }

    async fn start(&self, id: &str) -> Result<()> {
        let (route, runtime) = self.route(id).await?;
        if route == Route::Container
            && let Ok(containers) = &self.containers
            && let Some(source) = &containers.network
        {
            reattach(source, runtime, id).await?;
        }
        runtime.start(id).await
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<InstanceStatus> {
        self.route(id).await?.1.stop(id, grace).await
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let (route, runtime) = self.route(id).await?;
        runtime.remove(id).await?;
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if route == Route::Container
            && let Ok(containers) = &self.containers
        {
            // Detaching an instance that was never attached (an init step
            // in its instance's namespace) removes nothing. A failure is
            // only logged: the container is gone, and the agent's next
            // start removes what is left.
            if let Some(net) = containers.network.as_ref().and_then(NetSource::current)
                && let Err(problem) = network::detach(&net, id).await
            {
                tracing::warn!(instance = %id, %problem, "detaching from the node network failed");
            }
            containers.collect_garbage().await;
        }
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<InstanceStatus> {
        self.route(id).await?.1.inspect(id).await
    }

    async fn list(&self) -> Result<Vec<InstanceStatus>> {
        let mut routes = HashMap::new();
        let mut statuses = self.process.list().await?;
        routes.extend(statuses.iter().map(|s| (s.id.clone(), Route::Process)));
        if let Ok(containers) = &self.containers {
            let listed = containers.runtime.list().await?;
            for status in listed {
                if routes.insert(status.id.clone(), Route::Container).is_some() {
                    // Only a hand-made id clash gets here; the process
                    // instance keeps the id so nothing is routed twice.
                    tracing::warn!(instance = %status.id, "the id is both a process and a container");
                    routes.insert(status.id.clone(), Route::Process);
                    continue;
                }
                statuses.push(status);
            }
        }
        statuses.sort_by(|a, b| a.id.cmp(&b.id));
        *self.routes.lock().unwrap_or_else(PoisonError::into_inner) = routes;
        Ok(statuses)
    }

    async fn logs(&self, id: &str, options: LogOptions) -> Result<LogStream> {
        self.route(id).await?.1.logs(id, options).await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecOutput> {
        self.route(id).await?.1.exec(id, request).await
    }

    async fn usage(&self, id: &str) -> Result<Usage> {
        self.route(id).await?.1.usage(id).await
    }

    async fn resize(&self, id: &str, limits: cca_runtime::Limits) -> Result<()> {
        self.route(id).await?.1.resize(id, limits).await
    }
}

/// Attaches container `id` to the node network again before a start when
/// it has a namespace of its own: after a host reboot its namespace, veth
/// and nftables rules are gone while its record still names them. Attaching
/// is idempotent (an intact attachment is left as it is) and keeps the
/// instance's leased address, so the container comes back at the address
/// and with the published ports it was created with. An instance that
/// joins another's namespace (an init step) is left alone.
async fn reattach(source: &NetSource, runtime: &Arc<dyn Runtime>, id: &str) -> Result<()> {
    let spec = runtime.inspect(id).await?.spec;
    let Some(created) = &spec.network else {
        return Ok(());
    };
    if !owns_namespace(id, created) {
        return Ok(());
    }
    let net = &source.require(id, Operation::Start)?;
    let failed = |message: String| Error::Failed {
        id: id.to_owned(),
        operation: Operation::Start,
        message,
    };
    let attachment = network::attach(net, &spec).await.map_err(failed)?;
    if attachment != *created {
        // The lease was lost (the network's state file went): the
        // container's environment and reported address name the old one.
        if let Err(problem) = network::detach(net, id).await {
            tracing::warn!(instance = %id, %problem, "detaching after a changed address");
        }
        return Err(failed(format!(
            "the node network now gives it {} at {}, it was created with {} at {}: \
             remove the instance so it is created again",
            attachment.address,
            attachment.netns_path.display(),
            created.address,
            created.netns_path.display()
        )));
    }
    Ok(())
}

/// Whether `attachment` is `id`'s own namespace rather than one it joins:
/// the node network names each instance's namespace `{prefix}{id}`, and an
/// init step's id (`{id}.init-{step}`) is longer than its instance's.
fn owns_namespace(id: &str, attachment: &cca_runtime::NetworkAttachment) -> bool {
    attachment
        .netns_path
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.ends_with(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_owns_the_namespace_named_after_it_and_its_init_steps_join_it() {
        let attachment = cca_runtime::NetworkAttachment {
            netns_path: "/run/netns/cca-web-1".into(),
            address: std::net::Ipv4Addr::new(10, 88, 0, 2),
        };
        assert!(owns_namespace("web-1", &attachment));
        assert!(!owns_namespace("web-1.init-migrate", &attachment));
        assert!(!owns_namespace("api-1", &attachment));
    }
}
