//! The gate's Prometheus metrics: per gate and per backend, requests by
//! status class and their latency, plus ejections, retries, rate-limited
//! and cached answers, cold starts, and open connections. A request updates
//! handles its gate and backend resolved once (no label lookup per
//! request), and what every request updates is [`crate::sharded`] (no
//! cache line shared by the worker threads); a backend's series go when
//! the backend leaves every pool.

use std::sync::Mutex;

use cca_model::net::Target;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::sharded::{self, Histogram};

/// The classes a status is counted under; "error" is a request that got
/// no response from the backend at all.
pub const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabel {
    pub gate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateClass {
    pub gate: String,
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub service: String,
    pub instance: String,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendClass {
    pub service: String,
    pub instance: String,
    pub node: String,
    pub class: &'static str,
}

type Histograms<L> = Family<L, Histogram>;

/// Every gate metric of one gate node.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<GateClass, sharded::Counter>,
    request_seconds: Histograms<GateLabel>,
    retries: Family<GateLabel, Counter>,
    rate_limited: Family<GateLabel, Counter>,
    cache_hits: Family<GateLabel, Counter>,
    cold_starts: Family<GateLabel, Counter>,
    cold_start_seconds: Histograms<GateLabel>,
    backend_requests: Family<BackendClass, sharded::Counter>,
    backend_seconds: Histograms<BackendLabel>,
    ejections: Family<BackendLabel, Counter>,
    pub unknown_host: Counter,
    pub connections: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Mutex::new(Registry::with_prefix("cca_gate")),
            requests: Family::default(),
            request_seconds: Family::default(),
            retries: Family::default(),
            rate_limited: Family::default(),
            cache_hits: Family::default(),
            cold_starts: Family::default(),
            cold_start_seconds: Family::default(),
            backend_requests: Family::default(),
            backend_seconds: Family::default(),
            ejections: Family::default(),
            unknown_host: Counter::default(),
            connections: Gauge::default(),
        };
        metrics.register_all();
        metrics
    }
}

impl Metrics {
    fn register_all(&self) {
        let mut registry = self.lock();
        registry.register(
            "requests",
            "Requests answered, per gate and status class (error: no response)",
            self.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's headers to its response's headers, per gate",
            self.request_seconds.clone(),
        );
        registry.register(
            "retries",
            "Requests retried on another backend, per gate",
            self.retries.clone(),
        );
        registry.register(
            "rate_limited",
            "Requests refused with 429 by a rate limit, per gate",
            self.rate_limited.clone(),
        );
        registry.register(
            "cache_hits",
            "Requests answered from the response cache, per gate",
            self.cache_hits.clone(),
        );
        registry.register(
            "cold_starts",
            "Requests held while their service woke from zero, per gate",
            self.cold_starts.clone(),
        );
        registry.register(
            "cold_start_duration_seconds",
            "How long requests were held for a service to wake, per gate",
            self.cold_start_seconds.clone(),
        );
        registry.register(
            "backend_requests",
            "Requests sent to a backend, per backend and status class",
            self.backend_requests.clone(),
        );
        registry.register(
            "backend_duration_seconds",
            "Time from sending a request to a backend to its response's headers",
            self.backend_seconds.clone(),
        );
        registry.register(
            "backend_ejections",
            "Times a backend was ejected by the circuit breaker",
            self.ejections.clone(),
        );
        registry.register(
            "unknown_host",
            "Requests for a host no gate serves (answered 404)",
            self.unknown_host.clone(),
        );
        registry.register(
            "connections",
            "Client connections open",
            self.connections.clone(),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The handles of one gate.
    pub(crate) fn gate(&self, gate: &str) -> GateMetrics {
        let label = GateLabel {
            gate: gate.to_owned(),
        };
        GateMetrics {
            by_class: CLASSES.map(|class| {
                self.requests
                    .get_or_create(&GateClass {
                        gate: gate.to_owned(),
                        class,
                    })
                    .clone()
            }),
            seconds: self.request_seconds.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            rate_limited: self.rate_limited.get_or_create(&label).clone(),
            cache_hits: self.cache_hits.get_or_create(&label).clone(),
            cold_starts: self.cold_starts.get_or_create(&label).clone(),
            cold_start_seconds: self.cold_start_seconds.get_or_create(&label).clone(),
        }
    }

    /// The handles of one backend; its series go when they are dropped.
    pub(crate) fn backend(&self, service: &str, target: &Target) -> BackendMetrics {
        let label = BackendLabel {
            service: service.to_owned(),
            instance: target.instance.clone(),
            node: target.node.clone(),
        };
        let class_label = |class| BackendClass {
            service: label.service.clone(),
            instance: label.instance.clone(),
            node: label.node.clone(),
            class,
        };
        BackendMetrics {
            by_class: CLASSES.map(|class| {
                self.backend_requests
                    .get_or_create(&class_label(class))
                    .clone()
            }),
            seconds: self.backend_seconds.get_or_create(&label).clone(),
            ejections: self.ejections.get_or_create(&label).clone(),
            families: (
                self.backend_requests.clone(),
                self.backend_seconds.clone(),
                self.ejections.clone(),
            ),
            label,
        }
    }

    /// Prometheus text exposition (0.0.4) of every gate metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &self.lock());
        cca_model::exposition::openmetrics_to_text_format(&text)
    }
}

/// The index of a status's class in [`CLASSES`]; `None`: no response.
pub fn class_index(status: Option<u16>) -> usize {
    match status {
        Some(code) if (100..600).contains(&code) => usize::from(code / 100) - 1,
        _ => CLASSES.len() - 1,
    }
}

/// One gate's handles.
#[derive(Clone, Debug)]
pub(crate) struct GateMetrics {
    pub by_class: [sharded::Counter; 6],
    pub seconds: Histogram,
    pub retries: Counter,
    pub rate_limited: Counter,
    pub cache_hits: Counter,
    pub cold_starts: Counter,
    pub cold_start_seconds: Histogram,
}

/// One backend's handles.
#[derive(Debug)]
pub(crate) struct BackendMetrics {
    pub by_class: [sharded::Counter; 6],
    pub seconds: Histogram,
    pub ejections: Counter,
    label: BackendLabel,
    families: (
        Family<BackendClass, sharded::Counter>,
        Histograms<BackendLabel>,
        Family<BackendLabel, Counter>,
    ),
}

impl Drop for BackendMetrics {
    fn drop(&mut self) {
        let (requests, seconds, ejections) = &self.families;
        for class in CLASSES {
            requests.remove(&BackendClass {
                service: self.label.service.clone(),
                instance: self.label.instance.clone(),
                node: self.label.node.clone(),
                class,
            });
        }
        seconds.remove(&self.label);
        ejections.remove(&self.label);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_backend_s_series_go_with_it() {
        let metrics = Metrics::default();
        let target = Target {
            instance: "web-a".into(),
            node: "n1".into(),
            address: Ipv4Addr::LOCALHOST,
            port: 80,
        };
        let backend = metrics.backend("web", &target);
        backend.by_class[1].inc();
        assert!(metrics.render().contains(
            "cca_gate_backend_requests_total{service=\"web\",instance=\"web-a\",node=\"n1\",class=\"2xx\"} 1"
        ));
        drop(backend);
        assert!(!metrics.render().contains("web-a"));
    }

    #[test]
    fn statuses_fall_in_their_class() {
        assert_eq!(CLASSES[class_index(Some(204))], "2xx");
        assert_eq!(CLASSES[class_index(Some(503))], "5xx");
        assert_eq!(CLASSES[class_index(Some(101))], "1xx");
        assert_eq!(CLASSES[class_index(None)], "error");
    }
}
