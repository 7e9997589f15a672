//! The endpoint controller: for every port of every service, the backends
//! that can take traffic now. A backend is an instance the scheduler has
//! not asked to stop (a stopping instance drains: no new flows reach it,
//! established ones finish), whose agent reports it running on the node it
//! was placed on and not unhealthy, on a node not held unreachable. Its
//! address and port are where it answers: its own address and the declared
//! port for an instance with its own network, else the node's address and
//! the host port the agent bound.
//!
//! Backends of an unreachable node leave at once, not after the
//! scheduler's replacement grace: a node that missed its lease is likelier
//! dead than slow, and every flow sent to it until its replacement runs
//! would be lost. Except while lost-node replacement is paused
//! (`derived/disruption`): many nodes missing at once points at the control
//! plane, not at them, and dropping a third of every service's backends on
//! that guess would do the harm the pause exists to prevent.
//!
//! The data plane and DNS read these facts; the order of backends is
//! deterministic so an unchanged set never rewrites the fact.

use std::collections::{BTreeMap, BTreeSet};

use cca_model::cluster::{Backend, Endpoints, Instance, InstanceState, NodeCondition};
use cca_model::spec::PortSpec;
use cca_model::{Kind, keys};

use crate::controller::{Context, Controller, Plan, Write};
use crate::view::View;

/// Writes `derived/endpoint/{svc}/{port}`; see the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub struct EndpointController;

impl Controller for EndpointController {
    fn name(&self) -> &'static str {
        "endpoint"
    }

    fn interests(&self) -> &'static [Kind] {
        &[
            Kind::Service,
            Kind::Instance,
            Kind::InstanceStatus,
            Kind::Endpoint,
            Kind::NodeStatus,
            Kind::Disruption,
        ]
    }

    fn reconcile(&self, view: &View, _context: &Context) -> Plan {
        let mut plan = Plan::default();
        let by_service = instances_by_service(view);
        let mut wanted = BTreeSet::new();
        for (service, spec) in view.services.iter() {
            let instances = by_service
                .get(service.as_str())
                .map_or(&[][..], Vec::as_slice);
            for port in &spec.ports {
                let port_name = port_key(port);
                let endpoints = Endpoints {
                    service: service.clone(),
                    port: port_name.clone(),
                    backends: backends(view, instances, port),
                };
                let held = view
                    .endpoints
                    .get(service)
                    .and_then(|ports| ports.get(&port_name));
                if held.map(|held| &*held.value) != Some(&endpoints) {
                    let key = keys::derived_endpoint(service, &port_name);
                    plan.writes.push(Write::put_json(key, &endpoints));
                }
                wanted.insert((service.as_str(), port_name));
            }
        }
        for (service, ports) in view.endpoints.iter() {
            for port in ports.keys() {
                if !wanted.contains(&(service.as_str(), port.clone())) {
                    let key = keys::derived_endpoint(service, port);
                    plan.writes.push(Write::delete(key));
                }
            }
        }
        plan
    }
}

/// The name a port goes by in host-port maps and endpoint keys: its name,
/// or its number when it has none.
pub(crate) fn port_key(port: &PortSpec) -> String {
    port.name.clone().unwrap_or_else(|| port.number.to_string())
}

fn instances_by_service(view: &View) -> BTreeMap<&str, Vec<&Instance>> {
    let mut by_service: BTreeMap<&str, Vec<&Instance>> = BTreeMap::new();
    for (_, instance) in view.instances.iter() {
        by_service
            .entry(instance.service.as_str())
            .or_default()
            .push(&instance.value);
    }
    by_service
}

fn backends(view: &View, instances: &[&Instance], port: &PortSpec) -> Vec<Backend> {
    let paused = view
        .disruption
        .as_ref()
        .is_some_and(|disruption| disruption.paused);
    let mut backends: Vec<Backend> = instances
        .iter()
        .filter(|instance| !instance.stopping)
        .filter(|instance| paused || !unreachable(view, &instance.node))
        .filter_map(|instance| backend(view, instance, port))
        .collect();
    backends.sort();
    backends
}

fn unreachable(view: &View, node: &str) -> bool {
    view.node_statuses
        .get(node)
        .is_some_and(|status| status.condition == NodeCondition::Unreachable)
}

fn backend(view: &View, instance: &Instance, port: &PortSpec) -> Option<Backend> {
    let status = view.statuses.get(&instance.id)?;
    // A status from another node is a stale report of an earlier placement.
    let serving = status.state == InstanceState::Running
        && status.healthy != Some(false)
        && status.node == instance.node;
    if !serving {
        return None;
    }
    let port = if status.own_network {
        port.number
    } else {
        *status.host_ports.get(&port_key(port))?
    };
    Some(Backend {
        instance: instance.id.clone(),
        node: instance.node.clone(),
        address: status.address.clone()?,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::fixtures::{ViewBuilder, context, instance, service, status};

    fn running(id: &str, node: &str, port: u16) -> cca_model::cluster::InstanceStatus {
        let mut status = status(id, "web", node, InstanceState::Running);
        status.address = Some(format!("10.0.0.{port}"));
        status.host_ports.insert("http".into(), port);
        status
    }

    fn backends_of(plan: &Plan) -> Vec<(String, Vec<String>)> {
        plan.writes
            .iter()
            .map(|write| match write {
                Write::Put { key, value } => {
                    let endpoints: Endpoints = serde_json::from_slice(value).expect("decodes");
                    let ids = endpoints
                        .backends
                        .iter()
                        .map(|b| b.instance.clone())
                        .collect();
                    (key.clone(), ids)
                }
                Write::Delete { key } => (key.clone(), vec!["<deleted>".into()]),
            })
            .collect()
    }

    #[test]
    fn only_running_healthy_instances_on_their_node_are_backends() {
        let mut unhealthy = running("web-c", "n1", 3);
        unhealthy.healthy = Some(false);
        let mut moved = running("web-d", "n2", 4);
        moved.node = "n9".into();
        let mut stopping = instance("web-e", "web", "n1");
        stopping.stopping = true;
        let mut unknown_health = running("web-f", "n1", 6);
        unknown_health.healthy = None;
        let view = ViewBuilder::new()
            .service(service("web", 5))
            .instance(instance("web-a", "web", "n1"))
            .status(running("web-a", "n1", 1))
            .instance(instance("web-b", "web", "n1"))
            .status(status("web-b", "web", "n1", InstanceState::Starting))
            .instance(instance("web-c", "web", "n1"))
            .status(unhealthy)
            .instance(instance("web-d", "web", "n2"))
            .status(moved)
            .instance(stopping)
            .status(running("web-e", "n1", 5))
            .instance(instance("web-f", "web", "n1"))
            .status(unknown_health)
            .build();
        let plan = EndpointController.reconcile(&view, &context(0));
        assert_eq!(
            backends_of(&plan),
            vec![(
                "derived/endpoint/web/http".to_owned(),
                vec!["web-a".to_owned(), "web-f".to_owned()]
            )]
        );
        let backend = {
            let Write::Put { value, .. } = &plan.writes[0] else {
                panic!("expected a put")
            };
            serde_json::from_slice::<Endpoints>(value)
                .expect("decodes")
                .backends[0]
                .clone()
        };
        assert_eq!(backend.address, "10.0.0.1");
        assert_eq!(backend.port, 1);
    }

    #[test]
    fn own_network_backends_answer_on_their_declared_port() {
        let mut own = running("web-a", "n1", 20000);
        own.own_network = true;
        own.address = Some("10.42.0.5".into());
        let view = ViewBuilder::new()
            .service(service("web", 1))
            .instance(instance("web-a", "web", "n1"))
            .status(own)
            .build();
        let plan = EndpointController.reconcile(&view, &context(0));
        let Write::Put { value, .. } = &plan.writes[0] else {
            panic!("expected a put")
        };
        let endpoints: Endpoints = serde_json::from_slice(value).expect("decodes");
        assert_eq!(endpoints.backends[0].address, "10.42.0.5");
        assert_eq!(endpoints.backends[0].port, 8080, "the declared port");
    }

    #[test]
    fn an_unreachable_node_loses_its_backends_at_once_unless_replacement_is_paused() {
        use cca_model::cluster::{Disruption, NodeStatus};
        let lost = NodeStatus {
            condition: NodeCondition::Unreachable,
            since: 5,
        };
        let view = ViewBuilder::new()
            .service(service("web", 2))
            .instance(instance("web-a", "web", "n1"))
            .status(running("web-a", "n1", 1))
            .instance(instance("web-b", "web", "n2"))
            .status(running("web-b", "n2", 2))
            .node_status("n2", &lost)
            .build();
        let plan = EndpointController.reconcile(&view, &context(10));
        assert_eq!(
            backends_of(&plan),
            vec![(
                "derived/endpoint/web/http".to_owned(),
                vec!["web-a".to_owned()]
            )]
        );
        let paused = ViewBuilder::from(view)
            .put(
                &cca_model::keys::derived_disruption(),
                &Disruption {
                    paused: true,
                    since: 5,
                    missing: 2,
                    nodes: 3,
                    resumed_by: None,
                },
            )
            .build();
        let plan = EndpointController.reconcile(&paused, &context(10));
        assert_eq!(
            backends_of(&plan),
            vec![(
                "derived/endpoint/web/http".to_owned(),
                vec!["web-a".to_owned(), "web-b".to_owned()]
            )]
        );
    }

    #[test]
    fn removed_services_lose_their_endpoints_and_converged_views_are_noops() {
        let view = ViewBuilder::new()
            .service(service("web", 1))
            .instance(instance("web-a", "web", "n1"))
            .status(running("web-a", "n1", 1))
            .build();
        let plan = EndpointController.reconcile(&view, &context(0));
        let converged = ViewBuilder::from(view).apply(&plan).build();
        assert!(
            EndpointController
                .reconcile(&converged, &context(0))
                .is_noop()
        );

        let removed = ViewBuilder::from(converged).remove_service("web").build();
        let plan = EndpointController.reconcile(&removed, &context(0));
        assert_eq!(
            backends_of(&plan),
            vec![(
                "derived/endpoint/web/http".to_owned(),
                vec!["<deleted>".to_owned()]
            )]
        );
    }

    #[test]
    fn a_service_without_backends_still_has_an_empty_endpoint() {
        let view = ViewBuilder::new().service(service("web", 1)).build();
        let plan = EndpointController.reconcile(&view, &context(0));
        assert_eq!(
            backends_of(&plan),
            vec![("derived/endpoint/web/http".to_owned(), vec![])]
        );
    }
}
