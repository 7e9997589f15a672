//! The layering the dependency graph must enforce: a node agent cannot
//! reach the store (nor the server that owns it) because nothing it links
//! does, and the wire crate it talks through carries no server (axum
//! comes only with `cca-tls`, whose TLS listener the agent's own API
//! serves on). Checked on `cargo metadata`, over normal and build
//! dependencies (tests may run a server; the shipped agent may not link
//! one).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Every package `root` links, by name (normal and build edges, transitively).
fn linked_by(metadata: &Value, root: &str) -> BTreeSet<String> {
    linked_by_except(metadata, root, &[])
}

/// What `root` links through packages other than `skipped` (which are
/// listed, but not followed).
fn linked_by_except(metadata: &Value, root: &str, skipped: &[&str]) -> BTreeSet<String> {
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            (
                package["id"].as_str().expect("id"),
                package["name"].as_str().expect("name"),
            )
        })
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|node| (node["id"].as_str().expect("id"), node))
        .collect();
    let start = names
        .iter()
        .find(|(_, name)| **name == root)
        .map(|(id, _)| *id)
        .expect("the root package is in the workspace");
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || (id != start && skipped.contains(&names[id])) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().expect("deps") {
            let linked = dep["dep_kinds"]
                .as_array()
                .expect("dep kinds")
                .iter()
                .any(|kind| kind["kind"].is_null() || kind["kind"] == "build");
            if linked {
                todo.push(dep["pkg"].as_str().expect("pkg"));
            }
        }
    }
    seen.iter().map(|id| names[id].to_owned()).collect()
}

/// The host's target triple: the graph is resolved for it alone, so no
/// other platform's crates need downloading.
fn host() -> String {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

fn metadata() -> Value {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

fn assert_links_none(linked: &BTreeSet<String>, root: &str, forbidden: &[&str]) {
    let found: Vec<&&str> = forbidden
        .iter()
        .filter(|name| linked.contains(**name))
        .collect();
    assert!(found.is_empty(), "{root} links {found:?}");
}

#[test]
fn the_agent_cannot_reach_the_store() {
    let metadata = metadata();
    let agent = linked_by(&metadata, "cca-agent");
    assert!(
        agent.contains("cca-wire"),
        "the agent talks through cca-wire"
    );
    assert_links_none(
        &agent,
        "cca-agent",
        &["cca-store", "redb", "etcd-client", "cca-api", "cca-control"],
    );
}

#[test]
fn the_wire_crate_carries_no_server() {
    let metadata = metadata();
    let wire = linked_by(&metadata, "cca-wire");
    assert!(wire.contains("reqwest"), "the client is reqwest");
    assert_links_none(&wire, "cca-wire", &["cca-store", "cca-api", "cca-control"]);
    let wire = linked_by_except(&metadata, "cca-wire", &["cca-tls"]);
    assert_links_none(
        &wire,
        "cca-wire",
        &[
            "axum",
            "cca-store",
            "redb",
            "etcd-client",
            "cca-api",
            "cca-control",
        ],
    );
}
