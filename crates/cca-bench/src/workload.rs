//! The benchmark's workload: `M` instances split over a few services of
//! the `sim` kind, each reserving a little CPU and memory, one of them
//! restricted to nodes labelled `tier=gold` (so placement verification has
//! a hard constraint to check). Generated as `.cca` text and compiled by
//! the real compiler, so it is applied exactly as a user's file would be.

use cca_dsl::compile::compile_str;
use cca_dsl::template::Values;
use cca_model::spec::Program;

use crate::BenchError;

/// Services the instances are spread over.
pub const SERVICES: usize = 10;
/// The label key and value the first service is restricted to.
pub const GOLD_LABEL: (&str, &str) = ("tier", "gold");
/// What each instance reserves, in millicores and MiB.
pub const INSTANCE_CPU_MILLIS: u64 = 100;
pub const INSTANCE_MEMORY_MIB: u64 = 64;

/// Replicas per service, summing to the requested instance count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub replicas: Vec<(String, u32)>,
}

impl Workload {
    /// `instances` spread as evenly as possible over [`SERVICES`] services
    /// (fewer when there are fewer instances).
    pub fn new(instances: usize) -> Self {
        let services = SERVICES.min(instances.max(1));
        let replicas = (0..services)
            .map(|index| {
                let share = instances / services + usize::from(index < instances % services);
                (
                    service_name(index),
                    u32::try_from(share).unwrap_or(u32::MAX),
                )
            })
            .collect();
        Self { replicas }
    }

    /// The same services, each scaled by `factor` (rounded), e.g. 1.5.
    pub fn scaled(&self, factor: f64) -> Self {
        let replicas = self
            .replicas
            .iter()
            .map(|(name, count)| (name.clone(), (f64::from(*count) * factor).round() as u32))
            .collect();
        Self { replicas }
    }

    /// Total instances asked for.
    pub fn instances(&self) -> usize {
        self.replicas.iter().map(|(_, count)| *count as usize).sum()
    }

    /// The service whose instances may only run on gold nodes.
    pub fn restricted_service(&self) -> Option<&str> {
        self.replicas.first().map(|(name, _)| name.as_str())
    }

    /// The workload as `.cca` text.
    pub fn source(&self) -> String {
        let mut text = String::new();
        for (index, (name, replicas)) in self.replicas.iter().enumerate() {
            text.push_str(&format!(
                "service {name} {{\n  run = \"sim\"\n  replicas = {replicas}\n  resources {{\n    cpu = {INSTANCE_CPU_MILLIS}m\n    memory = {INSTANCE_MEMORY_MIB}Mi\n  }}\n"
            ));
            if index == 0 {
                let (key, value) = GOLD_LABEL;
                text.push_str(&format!(
                    "  placement {{\n    restrict {{\n      {key} = \"{value}\"\n    }}\n  }}\n"
                ));
            }
            text.push_str("}\n\n");
        }
        text
    }

    /// The workload compiled by the real `.cca` compiler.
    pub fn program(&self) -> Result<Program, BenchError> {
        let compilation = compile_str(&self.source(), &Values::default());
        if compilation.has_errors() {
            let messages: Vec<String> = compilation
                .diagnostics
                .iter()
                .map(|diagnostic| format!("{diagnostic:?}"))
                .collect();
            return Err(BenchError::Workload(messages.join("; ")));
        }
        Ok(compilation.program)
    }
}

fn service_name(index: usize) -> String {
    format!("bench{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_split_evenly_and_the_source_compiles() {
        let workload = Workload::new(1_003);
        assert_eq!(workload.instances(), 1_003);
        assert_eq!(workload.replicas[0].1, 101);
        assert_eq!(workload.replicas[9].1, 100);
        assert_eq!(
            workload.scaled(1.5).instances(),
            1_506,
            "each service rounds"
        );
        let program = workload.program().expect("compiles");
        assert_eq!(program.services.len(), SERVICES);
        assert_eq!(Workload::new(3).replicas.len(), 3);
    }
}
