//! Pulls from a real `docker-registry` on loopback, fed by `skopeo` with a
//! busybox-static image built in the test: by tag, by digest, garbage
//! collection; and each bad input — missing image, wrong digest, corrupt
//! layer, unreachable registry, HTTPS to a plain-HTTP registry, invalid
//! reference — fails with a clear error and nothing half-written.

use std::collections::HashSet;

use cca_image::testing::{
    TestRegistry, busybox_layer, commands_available, free_port, write_oci_layout,
};
use cca_image::{Digest, Error, ImageRef, ImageStore, Puller, RegistrySettings};

/// A registry holding `test/busybox:1`, with its manifest digest.
struct Fixture {
    registry: TestRegistry,
    digest: Digest,
    _layout: tempfile::TempDir,
}

fn fixture(test: &str) -> Option<Fixture> {
    if !commands_available(test, &["docker-registry", "skopeo", "busybox"]) {
        return None;
    }
    let layout = tempfile::tempdir().expect("tempdir");
    let layer = busybox_layer().expect("busybox layer");
    let digest = write_oci_layout(layout.path(), "1", &[layer], &["httpd", "-f"]).expect("layout");
    let registry = TestRegistry::start().expect("registry starts");
    registry
        .push(layout.path(), "1", "test/busybox")
        .expect("skopeo pushes");
    Some(Fixture {
        registry,
        digest,
        _layout: layout,
    })
}

fn new_puller(registry: &TestRegistry) -> (Puller, ImageStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path()).expect("store opens");
    let puller = Puller::new(store.clone(), RegistrySettings::plain_http(&registry.host));
    (puller, store, dir)
}

fn reference(text: &str) -> ImageRef {
    text.parse().expect("valid reference")
}

/// Nothing was recorded and nothing is left in `tmp/`.
fn assert_nothing_half_written(store: &ImageStore) {
    assert!(
        store.images().expect("images listed").is_empty(),
        "an image was recorded"
    );
    let tmp: Vec<_> = std::fs::read_dir(store.root().join("tmp"))
        .expect("tmp listed")
        .collect();
    assert!(tmp.is_empty(), "tmp holds {tmp:?}");
}

#[tokio::test]
async fn pulls_by_tag_then_by_digest_and_unpacks_the_layers() {
    let Some(fixture) = fixture("pulls_by_tag_then_by_digest") else {
        return;
    };
    let (puller, store, _dir) = new_puller(&fixture.registry);
    let by_tag = reference(&format!("{}/test/busybox:1", fixture.registry.host));

    let image = puller.pull(&by_tag).await.expect("pull by tag");
    assert_eq!(
        image.digest, fixture.digest,
        "skopeo kept the manifest as written"
    );
    assert_eq!(image.config.default_args(), ["httpd", "-f"]);
    let layers = store.layer_dirs(&image);
    assert_eq!(layers.len(), 1);
    assert!(layers[0].join("bin/busybox").is_file());
    assert_eq!(
        std::fs::read_link(layers[0].join("bin/sh")).expect("sh is a link"),
        std::path::Path::new("busybox")
    );

    let by_digest = by_tag.with_digest(fixture.digest.clone());
    assert!(image.names.contains(&by_digest.to_string()));
    assert_eq!(store.image(&by_tag).expect("found by tag"), image);

    let (fresh, fresh_store, _fresh_dir) = new_puller(&fixture.registry);
    let again = fresh.pull(&by_digest).await.expect("pull by digest");
    assert_eq!(
        (again.digest, again.layers),
        (image.digest.clone(), image.layers.clone())
    );
    assert!(fresh_store.image(&by_digest).is_ok());
}

#[tokio::test]
async fn garbage_collection_keeps_images_in_use_and_removes_the_rest() {
    let Some(fixture) = fixture("garbage_collection") else {
        return;
    };
    let (puller, store, _dir) = new_puller(&fixture.registry);
    let by_tag = reference(&format!("{}/test/busybox:1", fixture.registry.host));
    let image = puller.pull(&by_tag).await.expect("pull");

    for name in image.names.iter().map(|n| reference(n)) {
        store.remove(&name).expect("name removed");
    }
    let missing = store
        .image(&by_tag)
        .expect_err("no longer named")
        .to_string();
    assert_eq!(missing, format!("image {by_tag}: not in the store"));

    let report = store.gc(&HashSet::new()).expect("gc runs");
    assert!(
        report.images.is_empty(),
        "the record went with its last name"
    );
    assert_eq!(report.layers, image.layers);
    assert_eq!(report.blobs.len(), 2, "config and layer blobs: {report:?}");
    assert!(!store.blob_path(&image.layers[0]).exists());

    let image = puller.pull(&by_tag).await.expect("pull again");
    store.remove(&by_tag).expect("tag removed");
    let in_use = HashSet::from([image.digest.clone()]);
    let report = store.gc(&in_use).expect("gc runs");
    assert!(
        report.blobs.is_empty() && report.layers.is_empty(),
        "{report:?}"
    );
    assert!(store.layer_path(&image.layers[0]).is_dir());
}

#[tokio::test]
async fn a_missing_image_or_a_wrong_digest_is_a_registry_error() {
    let Some(fixture) = fixture("missing_image") else {
        return;
    };
    let (puller, store, _dir) = new_puller(&fixture.registry);
    let host = &fixture.registry.host;
    let wrong_digest = format!("{host}/test/busybox@sha256:{}", "0".repeat(64));
    for text in [
        format!("{host}/test/nothere:1"),
        format!("{host}/test/busybox:2"),
        wrong_digest,
    ] {
        let error = puller.pull(&reference(&text)).await.expect_err("must fail");
        assert!(matches!(error, Error::Registry { .. }), "{text}: {error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("image {text}: registry {host}: ")),
            "{message}"
        );
        assert!(message.to_lowercase().contains("unknown"), "{message}");
    }
    assert_nothing_half_written(&store);
}

#[tokio::test]
async fn a_corrupt_layer_is_refused_and_not_stored() {
    let Some(fixture) = fixture("corrupt_layer") else {
        return;
    };
    let (puller, store, _dir) = new_puller(&fixture.registry);
    let by_tag = reference(&format!("{}/test/busybox:1", fixture.registry.host));
    let (probe, probe_store, _probe_dir) = new_puller(&fixture.registry);
    let layer = probe.pull(&by_tag).await.expect("intact pull").layers[0].clone();
    drop(probe_store);

    let data = fixture.registry.blob_data_path(&layer);
    let mut bytes = std::fs::read(&data).expect("registry blob");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&data, &bytes).expect("blob corrupted");

    let error = puller.pull(&by_tag).await.expect_err("must fail");
    assert!(matches!(error, Error::DigestMismatch { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "image {by_tag}: layer {layer}: the content's digest is sha256:"
        )),
        "{message}"
    );
    assert_nothing_half_written(&store);
    assert!(!store.blob_path(&layer).exists() && !store.layer_path(&layer).exists());
}

#[tokio::test]
async fn an_unreachable_registry_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path()).expect("store opens");
    let host = format!("127.0.0.1:{}", free_port().expect("free port"));
    let puller = Puller::new(store.clone(), RegistrySettings::plain_http(&host));
    let error = puller
        .pull(&reference(&format!("{host}/a/b:1")))
        .await
        .expect_err("must fail");
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("image {host}/a/b:1: registry {host}: ")),
        "{message}"
    );
    assert!(message.to_lowercase().contains("connect"), "{message}");
    assert_nothing_half_written(&store);
}

#[tokio::test]
async fn plain_http_is_used_only_when_configured() {
    let Some(fixture) = fixture("plain_http_only_when_configured") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(dir.path()).expect("store opens");
    let puller = Puller::new(store.clone(), RegistrySettings::default());
    let by_tag = reference(&format!("{}/test/busybox:1", fixture.registry.host));
    let error = puller
        .pull(&by_tag)
        .await
        .expect_err("HTTPS to an HTTP registry fails");
    assert!(matches!(error, Error::Registry { .. }), "{error:?}");
    assert_nothing_half_written(&store);
}

#[test]
fn an_invalid_reference_is_refused_before_any_request() {
    let error = "127.0.0.1:5000/Test/BusyBox:1"
        .parse::<ImageRef>()
        .expect_err("invalid");
    assert_eq!(
        error.to_string(),
        "invalid image reference \"127.0.0.1:5000/Test/BusyBox:1\": repository component \"Test\" \
         must be lowercase letters, digits and '.', '_', '-' inside"
    );
}
