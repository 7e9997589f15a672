//! `ImageStore::import`: the busybox test image as an OCI layout
//! directory and as a tar of one, a `docker save`-shaped archive built
//! here (layer tars named by a link, as docker writes shared layers), and
//! bad input — a corrupted blob, a file that is not an archive, a tar with
//! neither manifest, a `..` entry — refused with the file and the problem
//! named and nothing recorded or left in `tmp/`.

use std::path::Path;

use cca_image::testing::{LayerBuilder, busybox_layer, commands_available, write_oci_layout};
use cca_image::{Digest, Error, ImageStore};

fn store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("store")).expect("store");
    (dir, store)
}

fn assert_nothing_left(store: &ImageStore) {
    assert!(
        store.images().expect("images").is_empty(),
        "an image was recorded"
    );
    let tmp: Vec<_> = std::fs::read_dir(store.root().join("tmp"))
        .expect("tmp listed")
        .collect();
    assert!(tmp.is_empty(), "tmp holds {tmp:?}");
    let layers: Vec<_> = std::fs::read_dir(store.root().join("layers/sha256"))
        .expect("layers listed")
        .collect();
    assert!(layers.is_empty(), "layers hold {layers:?}");
}

/// A tar of `dir`'s content, entries named `./…` as `tar -C DIR .` writes.
fn tar_dir(dir: &Path, out: &Path) {
    let mut builder = tar::Builder::new(std::fs::File::create(out).expect("tar file"));
    builder.append_dir_all(".", dir).expect("tar the layout");
    builder.into_inner().expect("tar written");
}

fn small_layout(dir: &Path) -> Digest {
    let layer = LayerBuilder::new()
        .dir("etc")
        .and_then(|l| l.file("etc/hello", b"hi\n", 0o644))
        .and_then(LayerBuilder::finish)
        .expect("layer");
    write_oci_layout(dir, "local/small:1", &[layer], &["sh"]).expect("layout")
}

#[test]
fn busybox_imports_from_an_oci_layout_directory_and_tar() {
    if !commands_available("busybox import", &["busybox"]) {
        return;
    }
    let (dir, store) = store();
    let layout = dir.path().join("layout");
    let layer = busybox_layer().expect("busybox layer");
    let digest = write_oci_layout(&layout, "busybox:1", &[layer], &["sh"]).expect("layout");

    let image = store.import(&layout, None).expect("directory imports");
    assert_eq!(image.digest, digest);
    assert!(
        image.names.contains("docker.io/library/busybox:1"),
        "{:?}",
        image.names
    );
    assert!(
        image
            .names
            .contains(&format!("docker.io/library/busybox@{digest}")),
        "{:?}",
        image.names
    );
    assert_eq!(image.config.default_args(), ["sh"]);
    let layer_dir = store.layer_path(&image.layers[0]);
    assert!(layer_dir.join("bin/busybox").is_file(), "layer unpacked");
    assert!(store.blob_path(&image.config_digest).is_file());

    let archive = dir.path().join("busybox.tar");
    tar_dir(&layout, &archive);
    let fresh = ImageStore::open(dir.path().join("other")).expect("store");
    let image = fresh
        .import(&archive, Some("local/bb:2"))
        .expect("tar imports");
    assert_eq!(image.digest, digest);
    let names: Vec<&str> = image.names.iter().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "docker.io/local/bb:2".to_owned(),
            format!("docker.io/local/bb@{digest}")
        ]
    );
    assert!(fresh.layer_path(&image.layers[0]).join("bin/sh").exists());
    let tmp = std::fs::read_dir(fresh.root().join("tmp"))
        .expect("tmp")
        .count();
    assert_eq!(tmp, 0, "the extracted archive is gone");
}

#[test]
fn a_docker_save_archive_imports_with_its_repo_tags() {
    let (dir, store) = store();
    let base = LayerBuilder::new()
        .dir("bin")
        .and_then(|l| l.file("bin/tool", b"#!/bin/sh\n", 0o755))
        .and_then(LayerBuilder::finish)
        .expect("base");
    let top = LayerBuilder::new()
        .dir("etc")
        .and_then(|l| l.file("etc/motd", b"hello\n", 0o644))
        .and_then(LayerBuilder::finish)
        .expect("top");
    let (base_id, top_id) = (Digest::of_bytes(&base), Digest::of_bytes(&top));
    let config = serde_json::json!({
        "architecture": cca_image::node_architecture(), "os": "linux",
        "config": {"Cmd": ["/bin/tool"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [base_id.to_string(), top_id.to_string()]},
    });
    let config = serde_json::to_vec(&config).expect("config");
    let config_digest = Digest::of_bytes(&config);
    let manifest = serde_json::json!([{
        "Config": format!("{}.json", config_digest.hex()),
        "RepoTags": ["team/app:1"],
        "Layers": ["aaa/layer.tar", "bbb/layer.tar"],
    }]);
    // The second layer's tar is a link to a file elsewhere in the archive.
    let mut builder = LayerBuilder::new()
        .file(
            "manifest.json",
            &serde_json::to_vec(&manifest).expect("json"),
            0o644,
        )
        .and_then(|l| l.file(&format!("{}.json", config_digest.hex()), &config, 0o644))
        .and_then(|l| l.dir("aaa"))
        .and_then(|l| l.file("aaa/layer.tar", &base, 0o644))
        .and_then(|l| l.dir("ccc"))
        .and_then(|l| l.file("ccc/layer.tar", &top, 0o644))
        .and_then(|l| l.dir("bbb"))
        .and_then(|l| l.symlink("bbb/layer.tar", "../ccc/layer.tar"))
        .expect("archive");
    builder = builder
        .file("repositories", b"{}", 0o644)
        .expect("repositories");
    let archive = dir.path().join("app.tar");
    std::fs::write(&archive, builder.finish().expect("tar")).expect("write");

    let image = store.import(&archive, None).expect("docker save imports");
    assert!(
        image.names.contains("docker.io/team/app:1"),
        "{:?}",
        image.names
    );
    assert_eq!(image.layers, [base_id.clone(), top_id.clone()]);
    assert_eq!(image.config_digest, config_digest);
    assert_eq!(image.config.default_args(), ["/bin/tool"]);
    assert!(store.layer_path(&base_id).join("bin/tool").is_file());
    assert!(store.layer_path(&top_id).join("etc/motd").is_file());
    assert_eq!(
        std::fs::read(store.blob_path(&top_id)).expect("blob"),
        top,
        "the uncompressed tar is the layer blob"
    );
    let again = store.import(&archive, None).expect("imports twice");
    assert_eq!(again.digest, image.digest, "the identity is stable");
    assert_eq!(store.images().expect("images").len(), 1);
}

#[test]
fn a_corrupted_blob_is_refused_naming_the_file_and_layer() {
    let (dir, store) = store();
    let layout = dir.path().join("layout");
    small_layout(&layout);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index"))
            .expect("json");
    let manifest_digest: Digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("digest")
        .parse()
        .expect("digest");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(manifest_digest.hex())).expect("manifest"),
    )
    .expect("json");
    let layer: Digest = manifest["layers"][0]["digest"]
        .as_str()
        .expect("digest")
        .parse()
        .expect("digest");
    let blob = layout.join("blobs/sha256").join(layer.hex());
    let mut bytes = std::fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).expect("corrupt");

    let error = store.import(&layout, None).expect_err("refused");
    assert!(matches!(error, Error::DigestMismatch { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&layout.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("layer blobs/sha256/{}", layer.hex())),
        "{message}"
    );
    assert!(!store.blob_path(&layer).exists());
    assert_nothing_left(&store);
}

#[test]
fn a_file_that_is_not_an_archive_is_refused() {
    let (dir, store) = store();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "just some text\n".repeat(100)).expect("write");
    let error = store.import(&file, None).expect_err("refused").to_string();
    assert!(
        error.contains(&format!("import {}", file.display())),
        "{error}"
    );
    assert!(error.contains("not a tar archive"), "{error}");
    assert_nothing_left(&store);
}

#[test]
fn a_tar_without_a_manifest_or_with_a_dotdot_entry_is_refused() {
    let (dir, store) = store();
    let plain = dir.path().join("plain.tar");
    let tar = LayerBuilder::new()
        .file("hello.txt", b"hi", 0o644)
        .and_then(LayerBuilder::finish)
        .expect("tar");
    std::fs::write(&plain, tar).expect("write");
    let error = store.import(&plain, None).expect_err("refused").to_string();
    assert!(error.contains("no index.json"), "{error}");
    assert!(error.contains("no manifest.json"), "{error}");

    let evil = dir.path().join("evil.tar");
    let tar = LayerBuilder::new()
        .raw_file("../escaped", b"x")
        .and_then(LayerBuilder::finish)
        .expect("tar");
    std::fs::write(&evil, tar).expect("write");
    let error = store.import(&evil, None).expect_err("refused").to_string();
    assert!(error.contains(&evil.display().to_string()), "{error}");
    assert!(
        error.contains("\"../escaped\" escapes the archive"),
        "{error}"
    );
    assert!(!dir.path().join("escaped").exists());
    assert!(!store.root().join("escaped").exists());
    assert_nothing_left(&store);
}

#[test]
fn an_archive_without_a_name_needs_one() {
    let (dir, store) = store();
    let layout = dir.path().join("layout");
    small_layout(&layout);
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).expect("index")).expect("json");
    index["manifests"][0]
        .as_object_mut()
        .expect("descriptor")
        .remove("annotations");
    std::fs::write(&index_path, serde_json::to_vec(&index).expect("json")).expect("write");
    let error = store
        .import(&layout, None)
        .expect_err("refused")
        .to_string();
    assert!(error.contains("give one with --name"), "{error}");
    let image = store.import(&layout, Some("local/x:1")).expect("named");
    assert!(image.names.contains("docker.io/local/x:1"));
}
