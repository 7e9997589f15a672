//! The tc programs on instances' veths (`bpf/tc_lb.bpf.c`): balancing for
//! containers. [`VethPrograms`] is the seam the agent attaches them
//! through when it gives an instance its veth; [`TcPrograms`] is the real
//! one — each host veth end gets the programs at its ingress (from the
//! instance) and egress (to it) as TCX links pinned beside the maps
//! (`tc-{veth}-in`, `tc-{veth}-out`), so they keep working while the agent
//! restarts, and a new agent swaps its programs into the same links in
//! place (one link update each: no packet meets a veth without them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};

use super::error::{Error, Result};
use super::kernel::{chain, detach_links};

/// The tc programs (`bpf/tc_lb.bpf.c`, built by `scripts/bpf`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../bpf/tc_lb.bpf.o");

const FROM_INSTANCE: &str = "cca_tc_from_instance";
const TO_INSTANCE: &str = "cca_tc_to_instance";

/// Attaches the container programs to instances' host veth ends.
pub trait VethPrograms: Send + Sync + std::fmt::Debug {
    /// Attaches the programs to `veth` (or swaps the running ones for
    /// these): before the instance starts, so its first packet is
    /// balanced.
    fn attach(&self, veth: &str) -> Result<()>;
    /// Detaches them from `veth` (it is going); nothing attached is fine.
    fn detach(&self, veth: &str) -> Result<()>;
    /// Detaches them from every veth but `keep` (those an earlier agent
    /// attached to that are gone).
    fn retain(&self, keep: &BTreeSet<String>) -> Result<()>;
}

/// The programs loaded for one network namespace, sharing the socket
/// programs' pinned maps.
#[derive(Debug)]
pub struct TcPrograms {
    pin_dir: PathBuf,
    ebpf: Mutex<Ebpf>,
}

impl TcPrograms {
    /// Loads the programs against the maps pinned in `pin_dir` (the socket
    /// programs' loader made them).
    pub(crate) fn load(pin_dir: &Path) -> Result<Self> {
        require_tcx()?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_dir)
            .load(OBJECT)
            .map_err(|error| Error::Load(chain(&error)))?;
        for name in [FROM_INSTANCE, TO_INSTANCE] {
            program(&mut ebpf, name)?
                .load()
                .map_err(program_error(name))?;
        }
        Ok(Self {
            pin_dir: pin_dir.to_owned(),
            ebpf: Mutex::new(ebpf),
        })
    }

    fn attach_one(
        &self,
        ebpf: &mut Ebpf,
        veth: &str,
        name: &'static str,
        direction: TcAttachType,
    ) -> Result<()> {
        let pin = self.pin_dir.join(pin_name(veth, direction));
        let program = program(ebpf, name)?;
        if pin.exists() {
            match replace_in(program, &pin) {
                Ok(()) => return Ok(()),
                Err(error) => {
                    // The veth the link was made for is gone (a new one
                    // has its name): a new link.
                    tracing::debug!(veth, %error, "a pinned tc link is stale; attaching anew");
                    detach_links(&self.pin_dir, |file| {
                        file == pin.file_name().unwrap_or_default()
                    })?;
                }
            }
        }
        let id = program
            .attach_with_options(
                veth,
                direction,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(|error| Error::Program {
                program: name,
                error: format!("attaching to {veth}: {}", chain(&error)),
            })?;
        let link: FdLink = program
            .take_link(id)
            .map_err(program_error(name))?
            .try_into()
            .map_err(program_error(name))?;
        link.pin(&pin).map_err(program_error(name))?;
        Ok(())
    }
}

/// The first kernel with TCX links: the only tc attachment that can be
/// pinned, so the programs outlive the agent and are swapped in place.
const TCX_KERNEL: KernelVersion = KernelVersion::new(6, 6, 0);

/// Fails (so `--dataplane auto` chooses nftables) on a kernel without
/// TCX links, before anything is attached.
fn require_tcx() -> Result<()> {
    match KernelVersion::current() {
        Ok(running) if running >= TCX_KERNEL => Ok(()),
        Ok(running) => Err(Error::Unsupported(format!(
            "the containers' tc programs need TCX links (Linux {TCX_KERNEL} or later); \
             this kernel is {running}"
        ))),
        Err(error) => Err(Error::Unsupported(format!(
            "reading the kernel's version (the containers' tc programs need Linux \
             {TCX_KERNEL} or later): {error}"
        ))),
    }
}

/// Swaps `program` into the link pinned at `pin`.
fn replace_in(program: &mut SchedClassifier, pin: &Path) -> std::result::Result<(), String> {
    let pinned = PinnedLink::from_pin(pin).map_err(|error| chain(&error))?;
    let link =
        SchedClassifierLink::try_from(FdLink::from(pinned)).map_err(|error| chain(&error))?;
    let id = program
        .attach_to_link(link)
        .map_err(|error| chain(&error))?;
    // The pin holds the link; this process's descriptor is not needed.
    drop(program.take_link(id).map_err(|error| chain(&error))?);
    Ok(())
}

impl VethPrograms for TcPrograms {
    fn attach(&self, veth: &str) -> Result<()> {
        let mut ebpf = self.ebpf.lock().unwrap_or_else(PoisonError::into_inner);
        self.attach_one(&mut ebpf, veth, FROM_INSTANCE, TcAttachType::Ingress)?;
        self.attach_one(&mut ebpf, veth, TO_INSTANCE, TcAttachType::Egress)
    }

    fn detach(&self, veth: &str) -> Result<()> {
        let _held = self.ebpf.lock().unwrap_or_else(PoisonError::into_inner);
        detach_links(&self.pin_dir, |file| veth_of(file) == Some(veth))
    }

    fn retain(&self, keep: &BTreeSet<String>) -> Result<()> {
        let _held = self.ebpf.lock().unwrap_or_else(PoisonError::into_inner);
        detach_links(&self.pin_dir, |file| {
            veth_of(file).is_some_and(|veth| !keep.contains(veth))
        })
    }
}

fn pin_name(veth: &str, direction: TcAttachType) -> String {
    let end = if direction == TcAttachType::Ingress {
        "in"
    } else {
        "out"
    };
    format!("tc-{veth}-{end}")
}

/// The veth a tc link pin is for.
fn veth_of(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("tc-")?;
    rest.strip_suffix("-in")
        .or_else(|| rest.strip_suffix("-out"))
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or(Error::Program {
            program: name,
            error: "not in the object".to_owned(),
        })?
        .try_into()
        .map_err(program_error(name))
}

fn program_error<E: std::error::Error>(program: &'static str) -> impl Fn(E) -> Error {
    move |error| Error::Program {
        program,
        error: chain(&error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_name_their_veth_and_direction() {
        assert_eq!(
            pin_name("vcca1234abcd", TcAttachType::Ingress),
            "tc-vcca1234abcd-in"
        );
        assert_eq!(veth_of("tc-vcca1234abcd-in"), Some("vcca1234abcd"));
        assert_eq!(veth_of("tc-v-1-out"), Some("v-1"));
        assert_eq!(veth_of("link-cca_connect4-00ff"), None);
        assert_eq!(veth_of("cca_ct_v1"), None);
    }
}
