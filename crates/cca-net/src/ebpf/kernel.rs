//! The kernel side of the eBPF data plane: [`LbMaps`], the seam the
//! planner's operations go through, and [`Attached`], the real one — the
//! socket programs loaded from the checked-in object, attached to the root
//! of the cgroup v2 hierarchy with their maps and links pinned under
//! `/sys/fs/bpf/cca/netns-{inode}/`, so traffic keeps flowing while the
//! agent restarts and a new agent takes the maps over; and the tc
//! programs loaded against the same maps, for instances' veths
//! ([`super::tc`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aya::maps::{Array, HashMap, MapData, MapInfo, PerCpuArray};
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSockAddr, links::PinnedLink};
use aya::{Ebpf, EbpfLoader};

use super::error::{Error, Result};
use super::layout::{
    self, BACKEND_MAP, BackendBytes, CONFIG_MAP, CT_MAP, Config, ConfigBytes, CtEntryBytes,
    CtKeyBytes, FRONT_MAP, Front, FrontBytes, FrontKey, FrontKeyBytes, REJECT_MAP, SMALL_TABLE_MAP,
    SOCK_REV_MAP, STATS, STATS_MAP, SmallTableBytes, SockRevKeyBytes, TABLE_MAP, TC_CONFIG_MAP,
    TC_STATS, TC_STATS_MAP, TableBytes, TableKey, TableKeyBytes, TcConfigBytes,
};
use super::plan::Op;
use super::tc::{TcPrograms, VethPrograms};

/// The socket programs (`bpf/sock_lb.bpf.c`, built by `scripts/bpf`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../bpf/sock_lb.bpf.o");

/// The programs of the object, by function name.
const PROGRAMS: [&str; 8] = [
    "cca_connect4",
    "cca_connect6",
    "cca_sendmsg4",
    "cca_sendmsg6",
    "cca_recvmsg4",
    "cca_recvmsg6",
    "cca_getpeername4",
    "cca_getpeername6",
];

/// What the maps hold that this process did not write (a previous
/// agent's entries, found at start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    pub fronts: BTreeMap<FrontKey, Front>,
    pub tables: BTreeSet<TableKey>,
    pub backends: BTreeMap<u32, SocketAddr>,
}

/// The programs' counters, summed over CPUs, by `layout::STATS` and
/// `layout::TC_STATS` name.
pub type Stats = BTreeMap<&'static str, u64>;

/// The maps as the planner changes them.
pub trait LbMaps: std::fmt::Debug {
    /// What the maps hold now.
    fn existing(&self) -> Result<Existing>;
    /// Applies `ops` in order; stops at the first failure.
    fn apply(&mut self, ops: &[Op]) -> Result<()>;
    /// Deletes the sockets' reverse entries and the flows to `backends`;
    /// how many entries.
    fn sweep(&mut self, backends: &BTreeSet<SocketAddr>) -> Result<usize>;
    /// The service range (network, prefix) the tc programs look flows up
    /// in; `None`: every address.
    fn set_service_range(&mut self, range: Option<(Ipv4Addr, u8)>) -> Result<()>;
    /// Where instances' veths get the tc programs.
    fn veth_programs(&self) -> Arc<dyn VethPrograms>;
    /// The seed the programs hash flows with from now on.
    fn set_seed(&mut self, seed: u64) -> Result<()>;
    fn stats(&self) -> Result<Stats>;
    /// Detaches the programs and removes the maps (the data plane is
    /// turned off or the node leaves).
    fn remove(&mut self) -> Result<()>;
}

impl<T: LbMaps + ?Sized> LbMaps for Box<T> {
    fn existing(&self) -> Result<Existing> {
        (**self).existing()
    }

    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        (**self).apply(ops)
    }

    fn sweep(&mut self, backends: &BTreeSet<SocketAddr>) -> Result<usize> {
        (**self).sweep(backends)
    }

    fn set_service_range(&mut self, range: Option<(Ipv4Addr, u8)>) -> Result<()> {
        (**self).set_service_range(range)
    }

    fn veth_programs(&self) -> Arc<dyn VethPrograms> {
        (**self).veth_programs()
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        (**self).set_seed(seed)
    }

    fn stats(&self) -> Result<Stats> {
        (**self).stats()
    }

    fn remove(&mut self) -> Result<()> {
        (**self).remove()
    }
}

/// Where the programs attach and pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachConfig {
    /// A mounted BPF file system (`/sys/fs/bpf`: mounted there if not).
    pub bpffs: PathBuf,
    /// The root of the cgroup v2 hierarchy; `None`: found in
    /// `/proc/self/mountinfo`.
    pub cgroup: Option<PathBuf>,
    /// The cluster-wide flow-hash seed.
    pub seed: u64,
}

/// The programs attached for this network namespace, and their maps.
pub struct Attached {
    pin_dir: PathBuf,
    fronts: HashMap<MapData, FrontKeyBytes, FrontBytes>,
    tables: HashMap<MapData, TableKeyBytes, TableBytes>,
    small_tables: HashMap<MapData, TableKeyBytes, SmallTableBytes>,
    backends: HashMap<MapData, u32, BackendBytes>,
    sock_rev: HashMap<MapData, SockRevKeyBytes, [u8; 20]>,
    stats: PerCpuArray<MapData, u64>,
    config: Array<MapData, ConfigBytes>,
    flows: HashMap<MapData, CtKeyBytes, CtEntryBytes>,
    tc_config: Array<MapData, TcConfigBytes>,
    tc_stats: PerCpuArray<MapData, u64>,
    veths: Arc<TcPrograms>,
    /// Keeps the programs loaded while this value lives (the links are
    /// pinned, so they outlive it).
    _ebpf: Ebpf,
}

impl Attached {
    /// Loads and attaches the programs for the calling thread's network
    /// namespace, taking over the maps (and replacing the links) a
    /// previous agent pinned for it.
    pub fn open(config: &AttachConfig) -> Result<Self> {
        ensure_bpffs(&config.bpffs)?;
        let cgroup = match &config.cgroup {
            Some(path) => path.clone(),
            None => cgroup2_root()?,
        };
        let pin_dir = pin_dir_of(&config.bpffs)?;
        fs::create_dir_all(&pin_dir).map_err(|error| Error::Io {
            what: "creating the pin directory",
            path: pin_dir.clone(),
            error,
        })?;
        drop_mismatched_pins(&pin_dir)?;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .load(OBJECT)
            .map_err(|error| Error::Load(chain(&error)))?;
        let mut config_map: Array<MapData, ConfigBytes> = take(&mut ebpf, CONFIG_MAP)?;
        let nonce = learn_nonce();
        let before = Config::from_bytes(&config_map.get(&0, 0).map_err(map_error(CONFIG_MAP))?);
        let learning = Config {
            netns_cookie: before.netns_cookie,
            seed: config.seed,
            learn: nonce,
            learned: 0,
        };
        config_map
            .set(0, learning.bytes(), 0)
            .map_err(map_error(CONFIG_MAP))?;
        attach_all(&mut ebpf, &cgroup, &pin_dir)?;
        // An unconnected UDP socket's connect sends nothing; the address
        // is never routed, so the connect itself may fail after the hook.
        let probe = UdpSocket::bind("[::]:0").map_err(|error| Error::Io {
            what: "opening the probe socket in",
            path: pin_dir.clone(),
            error,
        })?;
        let _ = probe.connect(SocketAddr::from((nonce, 9)));
        let learned = Config::from_bytes(&config_map.get(&0, 0).map_err(map_error(CONFIG_MAP))?);
        if learned.learned == 0 {
            return Err(Error::NotLearned { cgroup });
        }
        let running = Config {
            netns_cookie: learned.learned,
            seed: config.seed,
            learn: [0; 16],
            learned: 0,
        };
        config_map
            .set(0, running.bytes(), 0)
            .map_err(map_error(CONFIG_MAP))?;
        let veths = Arc::new(TcPrograms::load(&pin_dir)?);
        Ok(Self {
            config: config_map,
            flows: take(&mut ebpf, CT_MAP)?,
            tc_config: take(&mut ebpf, TC_CONFIG_MAP)?,
            tc_stats: take(&mut ebpf, TC_STATS_MAP)?,
            veths,
            fronts: take(&mut ebpf, FRONT_MAP)?,
            tables: take(&mut ebpf, TABLE_MAP)?,
            small_tables: take(&mut ebpf, SMALL_TABLE_MAP)?,
            backends: take(&mut ebpf, BACKEND_MAP)?,
            sock_rev: take(&mut ebpf, SOCK_REV_MAP)?,
            stats: take(&mut ebpf, STATS_MAP)?,
            pin_dir,
            _ebpf: ebpf,
        })
    }

    fn put_table(&mut self, key: &TableKey, slots: &[u32]) -> Result<()> {
        let wrong_size = |map| Error::Map {
            map,
            error: format!("a table of {} slots", slots.len()),
        };
        if key.small {
            let table: SmallTableBytes =
                slots.try_into().map_err(|_| wrong_size(SMALL_TABLE_MAP))?;
            self.small_tables
                .insert(key.bytes(), table, 0)
                .map_err(map_error(SMALL_TABLE_MAP))
        } else {
            let table: TableBytes = slots.try_into().map_err(|_| wrong_size(TABLE_MAP))?;
            self.tables
                .insert(key.bytes(), table, 0)
                .map_err(map_error(TABLE_MAP))
        }
    }

    /// Where the maps and links are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The kernel memory each map uses now (`memlock` of its fdinfo), by
    /// name.
    pub fn memory(&self) -> Result<BTreeMap<&'static str, u64>> {
        let mut memory = BTreeMap::new();
        for (name, ..) in SHAPES {
            let map = MapData::from_pin(self.pin_dir.join(name)).map_err(map_error(name))?;
            let fd = map.fd().as_fd().as_raw_fd();
            let path = PathBuf::from(format!("/proc/self/fdinfo/{fd}"));
            let info = fs::read_to_string(&path).map_err(|error| Error::Io {
                what: "reading",
                path: path.clone(),
                error,
            })?;
            let bytes = info
                .lines()
                .find_map(|line| line.strip_prefix("memlock:"))
                .and_then(|value| value.trim().parse().ok())
                .ok_or_else(|| Error::Map {
                    map: name,
                    error: format!("no memlock line in {}", path.display()),
                })?;
            memory.insert(name, bytes);
        }
        Ok(memory)
    }
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("pin_dir", &self.pin_dir)
            .finish_non_exhaustive()
    }
}

impl LbMaps for Attached {
    fn existing(&self) -> Result<Existing> {
        let mut existing = Existing::default();
        for entry in self.fronts.iter() {
            let (key, front) = entry.map_err(map_error(FRONT_MAP))?;
            existing
                .fronts
                .insert(FrontKey::from_bytes(&key), Front::from_bytes(&front));
        }
        for key in self.tables.keys() {
            let key = key.map_err(map_error(TABLE_MAP))?;
            existing.tables.insert(TableKey::from_bytes(&key, false));
        }
        for key in self.small_tables.keys() {
            let key = key.map_err(map_error(SMALL_TABLE_MAP))?;
            existing.tables.insert(TableKey::from_bytes(&key, true));
        }
        for entry in self.backends.iter() {
            let (id, backend) = entry.map_err(map_error(BACKEND_MAP))?;
            existing.backends.insert(id, layout::socket_of(&backend));
        }
        Ok(existing)
    }

    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        for op in ops {
            match op {
                Op::PutBackend { id, address } => self
                    .backends
                    .insert(id, layout::backend_bytes(*address), 0)
                    .map_err(map_error(BACKEND_MAP))?,
                Op::PutTable { key, slots } => self.put_table(key, slots)?,
                Op::PutFront { key, front } => self
                    .fronts
                    .insert(key.bytes(), front.bytes(), 0)
                    .map_err(map_error(FRONT_MAP))?,
                Op::DeleteFront { key } => {
                    remove_present(&mut self.fronts, &key.bytes(), FRONT_MAP)?;
                }
                Op::DeleteTable { key } if key.small => {
                    remove_present(&mut self.small_tables, &key.bytes(), SMALL_TABLE_MAP)?;
                }
                Op::DeleteTable { key } => {
                    remove_present(&mut self.tables, &key.bytes(), TABLE_MAP)?;
                }
                Op::DeleteBackend { id } => remove_present(&mut self.backends, id, BACKEND_MAP)?,
            }
        }
        Ok(())
    }

    fn sweep(&mut self, backends: &BTreeSet<SocketAddr>) -> Result<usize> {
        if backends.is_empty() {
            return Ok(0);
        }
        let sockets: Vec<SockRevKeyBytes> = self
            .sock_rev
            .keys()
            .filter_map(std::result::Result::ok)
            .filter(|key| backends.contains(&layout::sock_rev_backend(key)))
            .collect();
        for key in &sockets {
            remove_present(&mut self.sock_rev, key, SOCK_REV_MAP)?;
        }
        let flows: Vec<CtKeyBytes> = self
            .flows
            .iter()
            .filter_map(std::result::Result::ok)
            .filter(|(key, entry)| backends.contains(&layout::ct_backend(key, entry)))
            .map(|(key, _)| key)
            .collect();
        for key in &flows {
            remove_present(&mut self.flows, key, CT_MAP)?;
        }
        Ok(sockets.len() + flows.len())
    }

    fn set_service_range(&mut self, range: Option<(Ipv4Addr, u8)>) -> Result<()> {
        self.tc_config
            .set(0, layout::tc_config_bytes(range), 0)
            .map_err(map_error(TC_CONFIG_MAP))
    }

    fn veth_programs(&self) -> Arc<dyn VethPrograms> {
        self.veths.clone()
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        let current = Config::from_bytes(&self.config.get(&0, 0).map_err(map_error(CONFIG_MAP))?);
        let seeded = Config { seed, ..current };
        self.config
            .set(0, seeded.bytes(), 0)
            .map_err(map_error(CONFIG_MAP))
    }

    fn stats(&self) -> Result<Stats> {
        let mut stats = Stats::new();
        for (map, names, name) in [
            (&self.stats, &STATS[..], STATS_MAP),
            (&self.tc_stats, &TC_STATS[..], TC_STATS_MAP),
        ] {
            for (index, stat) in names.iter().enumerate() {
                let values = map.get(&(index as u32), 0).map_err(map_error(name))?;
                stats.insert(*stat, values.iter().sum());
            }
        }
        Ok(stats)
    }

    fn remove(&mut self) -> Result<()> {
        detach_links(&self.pin_dir, |_| true)?;
        fs::remove_dir_all(&self.pin_dir).map_err(|error| Error::Io {
            what: "removing the pins in",
            path: self.pin_dir.clone(),
            error,
        })
    }
}

fn map_error<E: std::error::Error>(map: &'static str) -> impl Fn(E) -> Error {
    move |error| Error::Map {
        map,
        error: chain(&error),
    }
}

fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T> {
    let map = ebpf.take_map(name).ok_or(Error::Map {
        map: name,
        error: "not in the object".to_owned(),
    })?;
    T::try_from(map).map_err(map_error(name))
}

/// Removes `key`; already gone is fine.
fn remove_present<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    key: &K,
    name: &'static str,
) -> Result<()> {
    match map.remove(key) {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(error) => Err(map_error(name)(error)),
    }
}

/// A random address in 2001:db8::/32 (documentation: never routed).
fn learn_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    nonce[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    for chunk in nonce[4..].chunks_mut(4) {
        chunk.copy_from_slice(&fastrand::u32(1..).to_ne_bytes());
    }
    nonce
}

/// Attaches every program to `cgroup` and pins its link; then the links
/// a previous agent pinned (attached meanwhile beside the new ones, so no
/// socket goes unbalanced) are unpinned, which detaches them.
fn attach_all(ebpf: &mut Ebpf, cgroup: &Path, pin_dir: &Path) -> Result<()> {
    let cgroup_dir = fs::File::open(cgroup).map_err(|error| Error::Io {
        what: "opening the cgroup",
        path: cgroup.to_owned(),
        error,
    })?;
    let stamp = format!("{:016x}", fastrand::u64(..));
    for name in PROGRAMS {
        let program: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or(Error::Program {
                program: name,
                error: "not in the object".to_owned(),
            })?
            .try_into()
            .map_err(program_error(name))?;
        program.load().map_err(program_error(name))?;
        // As a BPF link (kernel 5.7+) the attachment is always one of
        // many, beside other links and other nodes' programs; the link
        // call refuses any flag, and `Single` passes none.
        let link = program
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .map_err(program_error(name))?;
        let link: FdLink = program
            .take_link(link)
            .map_err(program_error(name))?
            .try_into()
            .map_err(program_error(name))?;
        link.pin(pin_dir.join(format!("link-{name}-{stamp}")))
            .map_err(program_error(name))?;
    }
    detach_links(pin_dir, |file| {
        file.starts_with("link-") && !file.ends_with(stamp.as_str())
    })
}

/// Detaches the links pinned in `pin_dir` (socket programs' `link-*`,
/// tc programs' `tc-*`) whose file name `doomed` picks. Each is opened
/// before it is unpinned, so closing it is the last reference and
/// detaches at once (a pin's reference alone is released later, by a
/// kernel worker).
pub(crate) fn detach_links(pin_dir: &Path, doomed: impl Fn(&str) -> bool) -> Result<()> {
    for entry in read_dir(pin_dir)? {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let link = file.starts_with("link-") || file.starts_with("tc-");
        if !link || !doomed(&file) {
            continue;
        }
        let link = PinnedLink::from_pin(entry.path()).map_err(|error| Error::Io {
            what: "opening the pinned link",
            path: entry.path(),
            error: std::io::Error::other(chain(&error)),
        })?;
        let link = link.unpin().map_err(|error| Error::Io {
            what: "unpinning the link",
            path: entry.path(),
            error,
        })?;
        drop(link);
    }
    Ok(())
}

fn program_error<E: std::error::Error>(program: &'static str) -> impl Fn(E) -> Error {
    move |error| Error::Program {
        program,
        error: chain(&error),
    }
}

/// An error and its sources, as one line (aya's name the syscall, their
/// sources the errno).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let entries = fs::read_dir(dir).map_err(|error| Error::Io {
        what: "reading",
        path: dir.to_owned(),
        error,
    })?;
    Ok(entries.filter_map(std::result::Result::ok).collect())
}

/// The shapes the object defines (layout 1): a pinned map of another shape
/// (an edited layout that kept its name) is deleted so the loader creates
/// it anew, rather than the programs reading it wrongly.
const SHAPES: [(&str, u32, u32, u32, u32); 11] = [
    (CONFIG_MAP, 4, 48, 1, 0),
    (FRONT_MAP, 20, 8, 65_536, NO_PREALLOC),
    (
        TABLE_MAP,
        8,
        4 * super::maglev::TABLE_SIZE as u32,
        131_072,
        NO_PREALLOC,
    ),
    (
        SMALL_TABLE_MAP,
        8,
        4 * super::maglev::SMALL_TABLE_SIZE as u32,
        131_072,
        NO_PREALLOC,
    ),
    (BACKEND_MAP, 4, 20, 262_144, NO_PREALLOC),
    (SOCK_REV_MAP, 32, 20, 65_536, 0),
    (STATS_MAP, 4, 8, 5, 0),
    (CT_MAP, 40, 32, 65_536, 0),
    (TC_CONFIG_MAP, 4, 64, 1, 0),
    (TC_STATS_MAP, 4, 8, 9, 0),
    (REJECT_MAP, 4, 8, 1, 0),
];

/// `BPF_F_NO_PREALLOC`.
const NO_PREALLOC: u32 = 1;

fn drop_mismatched_pins(pin_dir: &Path) -> Result<()> {
    for (name, key, value, entries, flags) in SHAPES {
        let path = pin_dir.join(name);
        if !path.exists() {
            continue;
        }
        let fits = MapInfo::from_pin(&path).is_ok_and(|info| {
            info.key_size() == key
                && info.value_size() == value
                && info.max_entries() == entries
                && info.map_flags() == flags
        });
        if !fits {
            tracing::warn!(map = name, path = %path.display(), "a pinned map of another shape is replaced: flows through it start afresh");
            fs::remove_file(&path).map_err(|error| Error::Io {
                what: "removing the pinned map",
                path,
                error,
            })?;
        }
    }
    Ok(())
}

/// Where the calling thread's network namespace pins its maps and links
/// under the BPF file system `bpffs`.
fn pin_dir_of(bpffs: &Path) -> Result<PathBuf> {
    let netns = fs::metadata("/proc/thread-self/ns/net").map_err(|error| Error::Io {
        what: "reading the network namespace of",
        path: "/proc/thread-self/ns/net".into(),
        error,
    })?;
    Ok(bpffs.join("cca").join(format!("netns-{}", netns.ino())))
}

/// Detaches and removes what an earlier run pinned for the calling
/// thread's network namespace (the node went back to nftables alone):
/// whether there was anything.
pub fn remove_pinned(bpffs: &Path) -> Result<bool> {
    let pin_dir = pin_dir_of(bpffs)?;
    if !pin_dir.is_dir() {
        return Ok(false);
    }
    detach_links(&pin_dir, |_| true)?;
    fs::remove_dir_all(&pin_dir).map_err(|error| Error::Io {
        what: "removing the pins in",
        path: pin_dir,
        error,
    })?;
    Ok(true)
}

/// `statfs(2)`'s magic of the BPF file system.
const BPF_FS_MAGIC: i128 = 0xcafe_4a11;

fn ensure_bpffs(path: &Path) -> Result<()> {
    let mounted =
        rustix::fs::statfs(path).is_ok_and(|stat| i128::from(stat.f_type) == BPF_FS_MAGIC);
    if mounted {
        return Ok(());
    }
    fs::create_dir_all(path).map_err(|error| Error::Io {
        what: "creating the BPF file system's mount point",
        path: path.to_owned(),
        error,
    })?;
    rustix::mount::mount("bpf", path, "bpf", rustix::mount::MountFlags::empty(), None).map_err(
        |error| {
            Error::Unsupported(format!(
                "mounting the BPF file system on {}: {error}",
                path.display()
            ))
        },
    )
}

/// The cgroup v2 hierarchy's mount point, from `/proc/self/mountinfo`.
fn cgroup2_root() -> Result<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|error| Error::Io {
        what: "reading",
        path: "/proc/self/mountinfo".into(),
        error,
    })?;
    cgroup2_in(&mountinfo).ok_or_else(|| {
        Error::Unsupported(
            "no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo)".to_owned(),
        )
    })
}

/// The first cgroup2 mount point of a `mountinfo` text.
fn cgroup2_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let fstype = fs.split_whitespace().next()?;
        let point = mount.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let hybrid = "25 30 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            cgroup2_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_in("27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw\n"),
            None
        );
    }

    #[test]
    fn the_nonce_is_a_documentation_address() {
        let nonce = learn_nonce();
        assert_eq!(&nonce[..4], &[0x20, 0x01, 0x0d, 0xb8]);
        assert_ne!(nonce, learn_nonce());
    }
}
