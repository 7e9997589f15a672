//! The benchmark's workload: `M` instances split over a few services of
//! the `sim` kind, each reserving a little CPU and memory, one of them
//! restricted to nodes labelled `tier=gold` (so placement verification has
//! a hard constraint to check). Generated as `.cca` text and compiled by
//! the real compiler, so it is applied exactly as a user's file would be.
//! A [`Shape`] adds what the lifecycle scenarios need: a version (an
//! environment variable, so each is a new spec), a share of instances
//! that crash (the simulated runtime's `CCA_SIM_CRASH_SHARE`), a rolling
//! update's surge, horizontal autoscaling.

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

/// Replicas per service, summing to the requested instance count, and
/// what every service adds to the plain shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub replicas: Vec<(String, u32)>,
    pub shape: Shape,
}

/// What the lifecycle scenarios add to every service (`Default`: nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// `CCA_BENCH_VERSION` in the environment (0: none).
    pub version: u32,
    /// Per mille of instances that crash soon after every start.
    pub crash_per_mille: u32,
    /// `update { max_surge }` as a share of the replicas (rounded up), with
    /// `max_unavailable = 0`.
    pub surge_percent: Option<u32>,
    /// `autoscale { min = replicas  max = replicas × max_factor  cpu }`.
    pub autoscale: Option<AutoscaleShape>,
}

/// Horizontal autoscaling of every service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoscaleShape {
    pub max_factor: u32,
    pub cpu_percent: u32,
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
        Self {
            replicas,
            shape: Shape::default(),
        }
    }

    /// The same services with `shape`.
    pub fn shaped(&self, shape: Shape) -> Self {
        Self {
            replicas: self.replicas.clone(),
            shape,
        }
    }

    /// The same services, each scaled by `factor` (rounded), e.g. 1.5.
    pub fn scaled(&self, factor: f64) -> Self {
        let replicas = self
            .replicas
            .iter()
            .map(|(name, count)| (name.clone(), (f64::from(*count) * factor).round() as u32))
            .collect();
        Self {
            replicas,
            shape: self.shape.clone(),
        }
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
            text.push_str(&self.shape.source(*replicas));
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

impl Shape {
    /// The lines it adds to a service of `replicas`.
    fn source(&self, replicas: u32) -> String {
        let mut text = String::new();
        let mut env = Vec::new();
        if self.version > 0 {
            env.push(format!("CCA_BENCH_VERSION = \"{}\"", self.version));
        }
        if self.crash_per_mille > 0 {
            let share = f64::from(self.crash_per_mille) / 1_000.0;
            env.push(format!(
                "{} = \"{share}\"",
                cca_runtime::sim::CRASH_SHARE_ENV
            ));
        }
        if !env.is_empty() {
            text.push_str(&format!("  env {{\n    {}\n  }}\n", env.join("\n    ")));
        }
        if let Some(percent) = self.surge_percent {
            let surge = (replicas * percent).div_ceil(100).max(1);
            text.push_str(&format!(
                "  update {{\n    max_surge = {surge}\n    max_unavailable = 0\n  }}\n"
            ));
        }
        if let Some(autoscale) = self.autoscale {
            text.push_str(&format!(
                "  autoscale {{\n    min = {replicas}\n    max = {}\n    cpu = {}%\n  }}\n",
                replicas * autoscale.max_factor,
                autoscale.cpu_percent
            ));
        }
        text
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

    #[test]
    fn a_shaped_workload_compiles_with_its_version_update_and_autoscale() {
        let shape = Shape {
            version: 3,
            crash_per_mille: 100,
            surge_percent: Some(25),
            autoscale: Some(AutoscaleShape {
                max_factor: 2,
                cpu_percent: 50,
            }),
        };
        let program = Workload::new(200)
            .shaped(shape)
            .program()
            .expect("compiles");
        let spec = &program.services["bench1"];
        assert_eq!(spec.env["CCA_BENCH_VERSION"], "3");
        assert_eq!(spec.env[cca_runtime::sim::CRASH_SHARE_ENV], "0.1");
        assert_eq!((spec.update.max_surge, spec.update.max_unavailable), (5, 0));
        let horizontal = spec
            .autoscale
            .as_ref()
            .and_then(|autoscale| autoscale.horizontal.as_ref())
            .expect("autoscaled");
        assert_eq!((horizontal.min, horizontal.max), (20, 40));
    }
}
