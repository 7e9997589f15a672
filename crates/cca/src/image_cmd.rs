//! `cca image pull|import|ls|rm|gc`: a node's image store (`DATA/images` of
//! `cca agent --data-dir DATA`) operated directly, an operator's tool like
//! `cca store`. Wiring only — the store, pulls and garbage collection live
//! in `cca-image`; which images containers use, in `cca_runtime::oci`.

#![allow(clippy::print_stdout, reason = "the command's output goes to stdout")]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use cca_image::{
    Digest, ImageRecord, ImageRef, ImageStore, PullProgress, Puller, RegistrySettings,
};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub(crate) struct ImageArgs {
    /// The agent's data directory; its images are in `DIR/images`.
    #[arg(long, default_value = ".cca-agent", global = true)]
    data_dir: PathBuf,

    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Pull an image (`[REGISTRY/]REPO[:TAG][@DIGEST]`) into the node's store.
    Pull {
        reference: String,
        /// A registry (`HOST:PORT`) reached over plain HTTP; may repeat.
        #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
        insecure_registries: Vec<String>,
        /// Per-registry settings and credentials, as `cca agent
        /// --registry-config FILE` takes them (to test that file).
        #[arg(long, value_name = "FILE")]
        registry_config: Option<PathBuf>,
    },
    /// Import an image from FILE: an OCI image layout (directory or tar)
    /// or a `docker save` archive (tar, gzip-compressed or not).
    Import {
        file: PathBuf,
        /// The name to record it under (default: the name in the archive).
        #[arg(long, value_name = "REF")]
        name: Option<String>,
    },
    /// List the images in the store.
    Ls,
    /// Remove one name of an image (by digest: the whole image); its files
    /// go with the next `cca image gc`.
    Rm { reference: String },
    /// Delete images without names that no container uses, and every blob
    /// and layer no image needs.
    Gc,
}

pub(crate) fn run(args: ImageArgs) -> Result<ExitCode> {
    let images_dir = cca_agent::node::images_dir(&args.data_dir);
    // A bad --registry-config stops `pull` before the store is touched.
    let settings = match &args.command {
        ImageCommand::Pull {
            insecure_registries,
            registry_config,
            ..
        } => Some(cca_agent::node::registry_settings(
            registry_config.as_deref(),
            insecure_registries,
        )?),
        _ => None,
    };
    let store = ImageStore::open(&images_dir)
        .with_context(|| format!("opening the image store {}", images_dir.display()))?;
    match args.command {
        ImageCommand::Pull { reference, .. } => {
            pull(store, &reference, settings.unwrap_or_default())
        }
        ImageCommand::Import { file, name } => import(&store, &file, name.as_deref()),
        ImageCommand::Ls => {
            list(&store.images()?);
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Rm { reference } => {
            let parsed = parse(&reference)?;
            store.remove(&parsed)?;
            println!("removed {parsed}");
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Gc => {
            let oci_dir = cca_agent::node::oci_dir(&args.data_dir);
            let in_use: HashSet<_> = cca_runtime::oci::images_in_use(&oci_dir)
                .with_context(|| format!("reading the containers in {}", oci_dir.display()))?;
            let report = store.gc(&in_use)?;
            println!(
                "removed {} images, {} blobs, {} layers; kept {} in use",
                report.images.len(),
                report.blobs.len(),
                report.layers.len(),
                in_use.len()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parse(reference: &str) -> Result<ImageRef> {
    Ok(reference.parse::<ImageRef>()?)
}

fn pull(store: ImageStore, reference: &str, settings: RegistrySettings) -> Result<ExitCode> {
    let reference = parse(reference)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let bars = LayerBars::default();
    let pulled =
        runtime.block_on(Puller::new(store, settings).pull_with_progress(&reference, &bars));
    bars.bars.clear().ok();
    let image = pulled?;
    println!(
        "pulled {reference}: {} ({} layers, {})",
        image.digest,
        image.layers.len(),
        human_size(image.size_bytes)
    );
    Ok(ExitCode::SUCCESS)
}

fn import(store: &ImageStore, file: &Path, name: Option<&str>) -> Result<ExitCode> {
    let spinner =
        indicatif::ProgressBar::new_spinner().with_message(format!("importing {}", file.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let imported = store.import(file, name);
    spinner.finish_and_clear();
    let image = imported?;
    let names: Vec<&str> = image
        .names
        .iter()
        .filter(|name| !name.contains('@'))
        .map(String::as_str)
        .collect();
    println!(
        "imported {}: {} ({} layers, {})",
        names.join(", "),
        image.digest,
        image.layers.len(),
        human_size(image.size_bytes)
    );
    Ok(ExitCode::SUCCESS)
}

/// One progress bar per layer of a pull: bytes downloaded, then done once
/// the layer is verified and unpacked.
#[derive(Default)]
struct LayerBars {
    bars: indicatif::MultiProgress,
    layers: Mutex<HashMap<Digest, indicatif::ProgressBar>>,
}

impl LayerBars {
    fn bar(&self, digest: &Digest) -> Option<indicatif::ProgressBar> {
        let layers = self
            .layers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        layers.get(digest).cloned()
    }
}

impl PullProgress for LayerBars {
    fn layer_started(&self, digest: &Digest, size: u64, cached: bool) {
        let style = indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        let bar = self.bars.add(indicatif::ProgressBar::new(size));
        bar.set_style(style);
        let text = digest.to_string();
        bar.set_prefix(text.get(..19).unwrap_or(&text).to_owned());
        if cached {
            bar.set_position(size);
            bar.set_message("in the store");
        }
        let mut layers = self
            .layers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        layers.insert(digest.clone(), bar);
    }

    fn layer_bytes(&self, digest: &Digest, bytes: u64) {
        if let Some(bar) = self.bar(digest) {
            bar.inc(bytes);
        }
    }

    fn layer_done(&self, digest: &Digest) {
        if let Some(bar) = self.bar(digest) {
            bar.set_position(bar.length().unwrap_or(bar.position()));
            bar.finish_with_message("done");
        }
    }
}

fn list(images: &[ImageRecord]) {
    let rows = images
        .iter()
        .map(|image| {
            // `name@digest` repeats the digest column; tags say more.
            let tagged: Vec<&str> = image
                .names
                .iter()
                .filter(|name| !name.contains('@'))
                .map(String::as_str)
                .collect();
            let names = if tagged.is_empty() {
                "<none>".to_owned()
            } else {
                tagged.join(", ")
            };
            let digest = image.digest.to_string();
            let short = digest.get(..19).unwrap_or(&digest).to_owned();
            vec![
                names,
                short,
                image.layers.len().to_string(),
                human_size(image.size_bytes),
            ]
        })
        .collect();
    crate::cluster_cmd::output::table(&["name", "digest", "layers", "size"], rows);
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{size:.1} {}", UNITS[unit])
    }
}
