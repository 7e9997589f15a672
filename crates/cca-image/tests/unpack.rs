//! Layer unpacking through the store: whiteouts and opaque directories end
//! up in overlayfs form (checked by mounting the layers), and entries that
//! would land outside the layer — `..` paths, writes through a symlink
//! pointing out — are refused with nothing left in the store. Needs root
//! (whiteouts are device nodes, overlay mounts).

use cca_image::testing::{LayerBuilder, root_test};
use cca_image::{Digest, ImageStore};

/// Whiteouts are device nodes and the check mounts an overlay.
const NEEDS_ROOT: &str = "mknod and overlay mounts";

fn store_layer(store: &ImageStore, tar: &[u8]) -> Digest {
    let digest = Digest::of_bytes(tar);
    store
        .put_blob(&digest, tar, "test layer")
        .expect("blob stored");
    digest
}

fn assert_no_leftovers(store: &ImageStore, layer: &Digest) {
    assert!(!store.layer_path(layer).exists(), "a failed layer was kept");
    let tmp: Vec<_> = std::fs::read_dir(store.root().join("tmp"))
        .expect("tmp listed")
        .collect();
    assert!(tmp.is_empty(), "tmp holds {tmp:?}");
}

#[test]
fn whiteouts_and_opaque_dirs_hide_lower_files_in_an_overlay() {
    if !root_test(
        "whiteouts_and_opaque_dirs_hide_lower_files_in_an_overlay",
        NEEDS_ROOT,
        &[],
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("store")).expect("store opens");
    let base = LayerBuilder::new()
        .dir("a")
        .and_then(|l| l.file("a/keep", b"k", 0o644))
        .and_then(|l| l.file("a/gone", b"g", 0o644))
        .and_then(|l| l.dir("o"))
        .and_then(|l| l.file("o/old", b"o", 0o644))
        .and_then(LayerBuilder::finish)
        .expect("base layer");
    let top = LayerBuilder::new()
        .file("a/.wh.gone", b"", 0o644)
        .and_then(|l| l.file("o/.wh..wh..opq", b"", 0o644))
        .and_then(|l| l.file("o/new", b"n", 0o644))
        .and_then(|l| l.file("./b/.wh.never-existed", b"", 0o644))
        .and_then(LayerBuilder::finish)
        .expect("top layer");
    let lower = store
        .unpack_layer(&store_layer(&store, &base))
        .expect("base unpacks");
    let upper = store
        .unpack_layer(&store_layer(&store, &top))
        .expect("top unpacks");

    let merged = dir.path().join("merged");
    std::fs::create_dir(&merged).expect("mountpoint");
    let options =
        std::ffi::CString::new(format!("lowerdir={}:{}", upper.display(), lower.display()))
            .expect("no NUL in paths");
    rustix::mount::mount(
        "overlay",
        &merged,
        "overlay",
        rustix::mount::MountFlags::RDONLY,
        Some(options.as_c_str()),
    )
    .expect("overlay mounts");
    let seen = |path: &str| merged.join(path).exists();
    let checks = (
        seen("a/keep"),
        seen("a/gone"),
        seen("o/old"),
        seen("o/new"),
        seen("b/never-existed"),
    );
    rustix::mount::unmount(&merged, rustix::mount::UnmountFlags::empty())
        .expect("overlay unmounts");
    assert_eq!(checks, (true, false, false, true, false));
}

#[test]
fn parent_dir_entries_are_refused_and_nothing_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path().join("store")).expect("store opens");
    let tar = LayerBuilder::new()
        .file("ok", b"fine", 0o644)
        .and_then(|l| l.raw_file("../evil", b"x"))
        .and_then(LayerBuilder::finish)
        .expect("layer");
    let digest = store_layer(&store, &tar);
    let error = store
        .unpack_layer(&digest)
        .expect_err("must be refused")
        .to_string();
    assert_eq!(
        error,
        format!("layer {digest}: entry ../evil escapes the layer with '..'")
    );
    assert!(!store.root().join("evil").exists() && !store.root().join("tmp/evil").exists());
    assert_no_leftovers(&store, &digest);
}

#[test]
fn writes_through_a_symlink_out_of_the_layer_are_refused() {
    if !root_test(
        "writes_through_a_symlink_out_of_the_layer_are_refused",
        NEEDS_ROOT,
        &[],
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).expect("outside dir");
    let store = ImageStore::open(dir.path().join("store")).expect("store opens");
    for victim in ["out/pwned", "out/.wh.pwned", "out/sub/pwned"] {
        let tar = LayerBuilder::new()
            .symlink("out", &outside.display().to_string())
            .and_then(|l| l.file(victim, b"x", 0o644))
            .and_then(LayerBuilder::finish)
            .expect("layer");
        let digest = store_layer(&store, &tar);
        let error = store
            .unpack_layer(&digest)
            .expect_err("must be refused")
            .to_string();
        assert!(error.contains("outside the layer"), "{victim}: {error}");
        assert_no_leftovers(&store, &digest);
    }
    assert_eq!(
        std::fs::read_dir(&outside).expect("listed").count(),
        0,
        "something was written outside"
    );
}
