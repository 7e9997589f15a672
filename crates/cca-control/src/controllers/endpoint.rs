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
//!
//! A service's endpoints follow from its spec, its placements and their
//! statuses alone, so a pass after a few such changes looks at the
//! services they touch, not at all of them: at 10,000 services a status
//! change costs one service's work, not ten thousand comparisons (what
//! bounds how fast a backend change reaches every node). A node's
//! condition or the pause may touch any service: a full pass.

use std::collections::BTreeSet;

use cca_model::cluster::{Backend, Endpoints, Instance, InstanceState, NodeCondition};
use cca_model::spec::PortSpec;
use cca_model::{Kind, keys};

use crate::controller::{Changes, Context, Controller, Plan, Write};
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
        let mut services: BTreeSet<&str> = view.services.keys().map(String::as_str).collect();
        services.extend(view.endpoints.keys().map(String::as_str));
        plan_services(view, services)
    }

    /// One service's endpoints depend only on its spec, its instances,
    /// their statuses and its endpoint facts, so a pass after a few such
    /// changes looks at those services alone. A node's condition or the
    /// disruption pause may move any service's backends: everything.
    fn reconcile_changes(&self, view: &View, context: &Context, changes: &Changes) -> Plan {
        match changes {
            Changes::Facts(facts) => match super::services_touched(view, facts) {
                Some(services) => plan_services(view, services.iter().map(String::as_str)),
                None => self.reconcile(view, context),
            },
            Changes::Everything => self.reconcile(view, context),
        }
    }
}

/// The writes that bring the endpoints of `services` in line.
fn plan_services<'a>(view: &View, services: impl IntoIterator<Item = &'a str>) -> Plan {
    let mut plan = Plan::default();
    for service in services {
        plan_service(view, service, &mut plan);
    }
    plan
}

/// One endpoint fact per port of the service (none once it is gone),
/// written only where it differs from what the view holds.
fn plan_service(view: &View, service: &str, plan: &mut Plan) {
    let ports = view
        .services
        .get(service)
        .map_or(&[][..], |spec| spec.ports.as_slice());
    let held = view.endpoints.get(service);
    let instances: Vec<&Instance> = view
        .instances_of(service)
        .map(|held| &*held.value)
        .collect();
    for port in ports {
        let port_name = port_key(port);
        let endpoints = Endpoints {
            service: service.to_owned(),
            port: port_name.clone(),
            backends: backends(view, &instances, port),
        };
        let current = held.and_then(|ports| ports.get(&port_name));
        if current.map(|current| &*current.value) != Some(&endpoints) {
            let key = keys::derived_endpoint(service, &port_name);
            plan.writes.push(Write::put_json(key, &endpoints));
        }
    }
    for port in held.into_iter().flat_map(|held| held.keys()) {
        if !ports.iter().any(|declared| port_key(declared) == *port) {
            plan.writes
                .push(Write::delete(keys::derived_endpoint(service, port)));
        }
    }
}

/// The name a port goes by in host-port maps and endpoint keys: its name,
/// or its number when it has none.
pub(crate) fn port_key(port: &PortSpec) -> String {
    port.name.clone().unwrap_or_else(|| port.number.to_string())
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

/// A pass told which facts changed plans exactly what a full pass would,
/// over any sequence of changes to specs, placements, statuses, node
/// conditions, the pause and the endpoint facts themselves, when each
/// pass's plan is committed and its writes come back as changes (as the
/// runner's own commits do).
#[cfg(test)]
mod incremental {
    use cca_model::cluster::{Disruption, NodeStatus};
    use proptest::prelude::*;

    use super::*;
    use crate::controllers::fixtures::{context, instance, service, status};
    use crate::view::FactChange;

    const SERVICES: usize = 3;
    const NODES: usize = 3;

    #[derive(Clone, Debug)]
    enum Step {
        Status {
            service: usize,
            instance: usize,
            node: usize,
            running: bool,
            healthy: Option<bool>,
            port: u16,
        },
        StatusGone {
            service: usize,
            instance: usize,
        },
        Placed {
            service: usize,
            instance: usize,
            node: usize,
            stopping: bool,
        },
        PlacementGone {
            service: usize,
            instance: usize,
        },
        Ports {
            service: usize,
            ports: usize,
        },
        ServiceGone {
            service: usize,
        },
        Condition {
            node: usize,
            unreachable: bool,
        },
        Paused(bool),
        EndpointGone {
            service: usize,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        let at = (0..SERVICES, 0..3usize);
        prop_oneof![
            4 => (at.clone(), 0..NODES, any::<bool>(), prop::option::of(any::<bool>()), 1..4u16)
                .prop_map(|((service, instance), node, running, healthy, port)| Step::Status {
                    service, instance, node, running, healthy, port,
                }),
            1 => at.clone().prop_map(|(service, instance)| Step::StatusGone { service, instance }),
            3 => (at.clone(), 0..NODES, any::<bool>()).prop_map(|((service, instance), node, stopping)| {
                Step::Placed { service, instance, node, stopping }
            }),
            1 => at.prop_map(|(service, instance)| Step::PlacementGone { service, instance }),
            1 => (0..SERVICES, 0..3usize).prop_map(|(service, ports)| Step::Ports { service, ports }),
            1 => (0..SERVICES).prop_map(|service| Step::ServiceGone { service }),
            1 => (0..NODES, any::<bool>()).prop_map(|(node, unreachable)| Step::Condition { node, unreachable }),
            1 => any::<bool>().prop_map(Step::Paused),
            1 => (0..SERVICES).prop_map(|service| Step::EndpointGone { service }),
        ]
    }

    /// A view and the changes the runner would have gathered for the
    /// endpoint controller since its last pass.
    struct Cluster {
        view: View,
        gathered: Vec<FactChange>,
    }

    impl Cluster {
        fn put<T: serde::Serialize>(&mut self, key: &str, value: &T) {
            let bytes = serde_json::to_vec(value).expect("encodes");
            let revision = self.view.revision + 1;
            let changes = self.view.put(key, &bytes, revision);
            self.gather(revision, changes);
        }

        fn delete(&mut self, key: &str) {
            let revision = self.view.revision + 1;
            let changes = self.view.delete(key, revision);
            self.gather(revision, changes);
        }

        fn gather(&mut self, revision: i64, changes: Vec<FactChange>) {
            self.view.revision = revision;
            let interests = EndpointController.interests();
            self.gathered.extend(
                changes
                    .into_iter()
                    .filter(|change| interests.contains(&change.kind())),
            );
        }

        fn commit(&mut self, plan: &Plan) {
            for write in &plan.writes {
                match write {
                    Write::Put { key, value } => {
                        let value: serde_json::Value = serde_json::from_slice(value).expect("json");
                        self.put(key, &value);
                    }
                    Write::Delete { key } => self.delete(key),
                }
            }
        }

        fn apply(&mut self, step: &Step) {
            let name = |service: usize| format!("s{service}");
            let id = |service: usize, instance: usize| format!("s{service}-{instance}");
            let node = |node: usize| format!("n{node}");
            match *step {
                Step::Status {
                    service,
                    instance,
                    node: at,
                    running,
                    healthy,
                    port,
                } => {
                    let state = if running {
                        InstanceState::Running
                    } else {
                        InstanceState::Failed
                    };
                    let mut report =
                        status(&id(service, instance), &name(service), &node(at), state);
                    report.healthy = healthy;
                    report.host_ports.insert("http".into(), port);
                    report.host_ports.insert("metrics".into(), port + 100);
                    self.put(&keys::observed_instance(&id(service, instance)), &report);
                }
                Step::StatusGone { service, instance } => {
                    self.delete(&keys::observed_instance(&id(service, instance)));
                }
                Step::Placed {
                    service,
                    instance: n,
                    node: at,
                    stopping,
                } => {
                    let mut placed = instance(&id(service, n), &name(service), &node(at));
                    placed.stopping = stopping;
                    self.put(&keys::derived_instance(&name(service), &placed.id), &placed);
                }
                Step::PlacementGone { service, instance } => {
                    self.delete(&keys::derived_instance(
                        &name(service),
                        &id(service, instance),
                    ));
                }
                Step::Ports { service: n, ports } => {
                    let mut spec = service(&name(n), 3);
                    spec.ports = [PortSpec::tcp("http", 8080), PortSpec::tcp("metrics", 9090)]
                        .into_iter()
                        .take(ports)
                        .collect();
                    self.put(&keys::desired_service(&spec.name), &spec);
                }
                Step::ServiceGone { service } => {
                    self.delete(&keys::desired_service(&name(service)))
                }
                Step::Condition {
                    node: at,
                    unreachable,
                } => {
                    let condition = if unreachable {
                        NodeCondition::Unreachable
                    } else {
                        NodeCondition::Ready
                    };
                    self.put(
                        &keys::derived_node(&node(at)),
                        &NodeStatus {
                            condition,
                            since: 0,
                        },
                    );
                }
                Step::Paused(paused) => {
                    let disruption = Disruption {
                        paused,
                        since: 0,
                        missing: 0,
                        nodes: 3,
                        resumed_by: None,
                    };
                    self.put(&keys::derived_disruption(), &disruption);
                }
                Step::EndpointGone { service } => {
                    self.delete(&keys::derived_endpoint(&name(service), "http"));
                }
            }
        }
    }

    fn sorted(plan: &Plan) -> Vec<&Write> {
        let mut writes: Vec<&Write> = plan.writes.iter().collect();
        writes.sort_by(|a, b| a.key().cmp(b.key()));
        writes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn a_pass_over_what_changed_plans_what_a_full_pass_plans(
            passes in prop::collection::vec(prop::collection::vec(step(), 1..4), 1..24),
        ) {
            let mut cluster = Cluster { view: View::default(), gathered: Vec::new() };
            for service in 0..SERVICES {
                cluster.apply(&Step::Ports { service, ports: 1 });
            }
            let first = EndpointController.reconcile(&cluster.view, &context(0));
            cluster.commit(&first);
            cluster.gathered.clear();
            for steps in &passes {
                for step in steps {
                    cluster.apply(step);
                }
                let changes = Changes::Facts(std::mem::take(&mut cluster.gathered));
                let scoped = EndpointController.reconcile_changes(&cluster.view, &context(0), &changes);
                let full = EndpointController.reconcile(&cluster.view, &context(0));
                prop_assert_eq!(sorted(&scoped), sorted(&full), "after {:?}", steps);
                cluster.commit(&scoped);
            }
        }
    }
}
