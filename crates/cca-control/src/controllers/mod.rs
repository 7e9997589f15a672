//! The control plane's pure controllers. Each one turns a [`View`] and a
//! [`Context`] into a [`Plan`] and does nothing else: no IO, no clock, no
//! randomness. [`NodeController`] derives node conditions from heartbeats
//! (and pauses lost-node replacement when too many go missing at once),
//! [`SchedulerController`] turns desired replicas into placed instances
//! (and moves, replaces and stops them), [`EndpointController`] publishes
//! the ready backends of every service port, [`NetworkController`]
//! gives nodes their subnets and services their VIPs, [`ScaleController`]
//! puts idle `scale_to_zero` services to sleep, [`LifecycleController`]
//! decides which version each service rolls to (and rolls back by itself
//! when new instances fail). Every controller writes only
//! what differs from the view, so a converged cluster yields empty plans.
//!
//! [`View`]: crate::view::View
//! [`Context`]: crate::controller::Context
//! [`Plan`]: crate::controller::Plan

mod endpoint;
pub mod lifecycle;
mod network;
mod node;
mod scale;
pub mod scheduler;

#[cfg(test)]
pub(crate) mod fixtures;

use std::sync::Arc;

pub use endpoint::EndpointController;
pub use lifecycle::{LifecycleConfig, LifecycleController};
pub use network::{NetworkConfig, NetworkController, PlanError};
pub use node::{DisruptionConfig, MIN_MISSING, NodeConfig, NodeController};
pub use scale::ScaleController;
pub use scheduler::{SchedulerConfig, SchedulerController};

use std::collections::BTreeSet;

use cca_model::{Key, Value};

use crate::controller::Controller;
use crate::view::{FactChange, View};

/// Every controller of the control plane, in the order the runner starts
/// them: the one list every server (and the benchmark) runs.
pub fn all(
    node: &NodeConfig,
    scheduler: &SchedulerConfig,
    network: &NetworkConfig,
    lifecycle: &LifecycleConfig,
) -> Vec<Arc<dyn Controller>> {
    vec![
        Arc::new(NodeController {
            config: node.clone(),
        }),
        Arc::new(SchedulerController {
            config: scheduler.clone(),
        }),
        Arc::new(EndpointController),
        Arc::new(NetworkController {
            config: network.clone(),
        }),
        Arc::new(ScaleController),
        Arc::new(LifecycleController {
            config: lifecycle.clone(),
        }),
    ]
}

/// The services `facts` are about, for a controller whose work splits by
/// service; `None` when one of them is about something else (a node, the
/// disruption pause), which may touch any service. An instance's status
/// counts for the service it names and for its placement's.
pub(crate) fn services_touched(view: &View, facts: &[FactChange]) -> Option<BTreeSet<String>> {
    let mut services = BTreeSet::new();
    for fact in facts {
        if let Some(service) = fact.key.service() {
            services.insert(service.to_owned());
            continue;
        }
        let Key::InstanceStatus { id } = &fact.key else {
            return None;
        };
        for value in [&fact.old, &fact.new].into_iter().flatten() {
            if let Value::InstanceStatus(status) = value {
                services.insert(status.service.clone());
            }
        }
        if let Some(instance) = view.instances.get(id) {
            services.insert(instance.service.clone());
        }
    }
    Some(services)
}
