//! What a node's eBPF data plane holds, read from its pinned maps with
//! `bpftool` (the tool a user inspects it with; `scripts/test` installs
//! it): which backends each VIP's live table sends flows to, and the
//! programs' counters. The field names are those of `cca-net/bpf/lb.h`,
//! which bpftool prints from the maps' BTF.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `bpftool -j map dump pinned DIR/MAP`: each entry's formatted key and
/// value; empty when the map is not pinned (yet).
fn dump(pins: &Path, map: &str) -> Vec<Value> {
    let output = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(pins.join(map))
        .output()
        .expect("bpftool runs (scripts/test installs it)");
    let entries: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    entries
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.get("formatted").cloned())
        .collect()
}

/// The IPv4 address of a 16-byte map address (IPv4-mapped IPv6, each
/// 32-bit word in network order as bpftool prints it).
fn ipv4(words: &Value) -> Option<Ipv4Addr> {
    let last = words.as_array()?.get(3)?.as_u64()?;
    let word = u32::try_from(last).ok()?;
    Some(Ipv4Addr::from(word.to_le_bytes()))
}

/// A port in network order as bpftool prints it.
fn port(value: &Value) -> Option<u16> {
    let raw = u16::try_from(value.as_u64()?).ok()?;
    Some(u16::from_be(raw))
}

/// Every IPv4 front's live table as `VIP:PORT -> BACKEND:PORT` lines
/// (one per backend it holds, sorted): where new flows to the VIP go.
/// Draining backends, still in the backend map for their flows, are in no
/// live table.
pub(crate) fn live_targets(pins: &Path) -> String {
    let backends: std::collections::BTreeMap<u64, String> = dump(pins, "cca_backend_v1")
        .iter()
        .filter_map(|entry| {
            let address = ipv4(&entry["value"]["addr"])?;
            let port = port(&entry["value"]["port"])?;
            Some((entry["key"].as_u64()?, format!("{address}:{port}")))
        })
        .collect();
    let tables: Vec<Value> = ["cca_table_v1", "cca_tsmall_v1"]
        .iter()
        .flat_map(|map| dump(pins, map))
        .collect();
    let mut lines = std::collections::BTreeSet::new();
    for front in dump(pins, "cca_front_v1") {
        let (key, value) = (&front["key"], &front["value"]);
        let (Some(vip), Some(vip_port)) = (ipv4(&key["addr"]), port(&key["port"])) else {
            continue;
        };
        let table = tables.iter().find(|table| {
            table["key"]["front"] == value["id"] && table["key"]["gen"] == value["gen"]
        });
        let slots = table.and_then(|table| table["value"]["backend"].as_array());
        for id in slots.into_iter().flatten().filter_map(Value::as_u64) {
            if let Some(backend) = backends.get(&id) {
                lines.insert(format!("{vip}:{vip_port} -> {backend}"));
            }
        }
    }
    lines.into_iter().collect::<Vec<_>>().join("\n")
}

/// Counter `index` of the per-CPU counter map `map`, summed over CPUs.
pub(crate) fn counter(pins: &Path, map: &str, index: u64) -> u64 {
    dump(pins, map)
        .iter()
        .find(|entry| entry["key"].as_u64() == Some(index))
        .and_then(|entry| entry["values"].as_array())
        .map_or(0, |cpus| {
            cpus.iter().filter_map(|cpu| cpu["value"].as_u64()).sum()
        })
}

/// Connects and datagrams of host processes the socket programs sent to
/// a backend (`LB_STAT_TRANSLATED`).
pub(crate) fn socket_translations(pins: &Path) -> u64 {
    counter(pins, "cca_stats_v1", 0)
}

/// Container flows the tc programs sent to a backend (`LB_TC_FLOWS`).
pub(crate) fn container_flows(pins: &Path) -> u64 {
    counter(pins, "cca_tcstats_v1", 0)
}
