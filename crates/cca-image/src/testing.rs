//! Test support (feature `testing`): a `docker-registry` on a free
//! loopback port with its storage in a temporary directory (killed when
//! dropped), tar layer building, OCI image layouts written by hand, a
//! busybox-static image, a layer with the host's glibc `getent` and the
//! libraries it needs, `skopeo` to push a layout to the registry, and a
//! way to make the registry serve a blob that does not match its digest.
//! Everything here returns `std::io::Result` with a message saying what
//! failed: it runs in tests only.

use std::io::{Error, ErrorKind, Result, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Digest;

/// Whether the tests run as root (the effective uid): how `scripts/test`
/// runs them, after installing every tool they use.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether every command is on `PATH`. When one is missing, a test run as
/// root fails here, naming it (`scripts/test` installs them, so a missing
/// tool is a broken setup, never a reason to pass); otherwise it prints
/// why `test` skips and answers false.
///
/// # Panics
///
/// As root, when a command is missing.
pub fn commands_available(test: &str, commands: &[&str]) -> bool {
    let missing: Vec<&str> = commands
        .iter()
        .copied()
        .filter(|c| find_command(c).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !is_root(),
        "{test} runs as root, so it must run, but {} is not on PATH: install it (scripts/test does)",
        missing.join(", ")
    );
    skip(test, &format!("{} not installed", missing.join(", ")));
    false
}

/// Whether a root-only test can run: as root it needs every command
/// (see [`commands_available`]: a missing one fails the test); otherwise
/// it prints why `test` skips (`needs_root` says what needs root) and
/// answers false.
///
/// # Panics
///
/// As root, when a command is missing.
pub fn root_test(test: &str, needs_root: &str, commands: &[&str]) -> bool {
    if !is_root() {
        skip(test, &format!("{needs_root} need root"));
        return false;
    }
    commands_available(test, commands)
}

#[allow(clippy::print_stderr, reason = "a skipped test says why")]
fn skip(test: &str, reason: &str) {
    eprintln!("skipping {test}: {reason} (scripts/test runs as root with every tool)");
}

/// The first `name` on `PATH`.
pub fn find_command(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A `docker-registry` serving from a temporary directory on loopback.
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    /// `127.0.0.1:PORT`, as written in references.
    pub host: String,
    dir: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts the registry and waits until `/v2/` answers.
    pub fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(&config, registry_config(&dir.path().join("storage"), &host))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log"))?)
            .spawn()
            .map_err(|e| Error::new(e.kind(), format!("spawning docker-registry: {e}")))?;
        let registry = Self { child, host, dir };
        registry.wait_ready()?;
        Ok(registry)
    }

    /// Pushes the OCI layout at `layout` (tag `tag`) as `REPO:TAG` with skopeo.
    pub fn push(&self, layout: &Path, tag: &str, repository: &str) -> Result<()> {
        let source = format!("oci:{}:{tag}", layout.display());
        let target = format!("docker://{}/{repository}:{tag}", self.host);
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(&source)
            .arg(&target))
    }

    /// Where the registry keeps a blob's bytes (to corrupt it in tests).
    pub fn blob_data_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Tampers with the registry's copy of the blob `digest` (one byte
    /// flipped in the middle): the registry goes on serving it under its
    /// digest, with content that no longer matches, as a corrupted disk or
    /// a broken proxy would.
    pub fn corrupt_blob(&self, digest: &Digest) -> Result<()> {
        let data = self.blob_data_path(digest);
        let mut bytes = std::fs::read(&data)
            .map_err(|e| Error::new(e.kind(), format!("reading {}: {e}", data.display())))?;
        let middle = bytes.len() / 2;
        let byte = bytes.get_mut(middle).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidData,
                format!("{} is empty", data.display()),
            )
        })?;
        *byte ^= 0xff;
        std::fs::write(&data, &bytes)
            .map_err(|e| Error::new(e.kind(), format!("writing {}: {e}", data.display())))
    }

    fn wait_ready(&self) -> Result<()> {
        let address: SocketAddr = self
            .host
            .parse()
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("{e}")))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        Err(Error::new(
            ErrorKind::TimedOut,
            format!("docker-registry on {} not ready in 10 s: {log}", self.host),
        ))
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry_config(storage: &Path, host: &str) -> String {
    format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
        storage.display()
    )
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run(command: &mut Command) -> Result<()> {
    let output = command.stdin(Stdio::null()).output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::other(format!(
        "{command:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    )))
}

/// Builds one layer as an uncompressed tar.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder").finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    pub fn dir(mut self, path: &str) -> Result<Self> {
        let mut header = header(tar::EntryType::Directory, 0o755, 0);
        self.tar.append_data(&mut header, path, std::io::empty())?;
        Ok(self)
    }

    pub fn file(mut self, path: &str, content: &[u8], mode: u32) -> Result<Self> {
        let mut header = header(tar::EntryType::Regular, mode, content.len() as u64);
        self.tar.append_data(&mut header, path, content)?;
        Ok(self)
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Result<Self> {
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar.append_link(&mut header, path, target)?;
        Ok(self)
    }

    /// A regular file whose name is written as is, bypassing the tar
    /// crate's checks (to test that unpacking refuses `../x`).
    pub fn raw_file(mut self, name: &str, content: &[u8]) -> Result<Self> {
        let mut header = header(tar::EntryType::Regular, 0o644, content.len() as u64);
        let bytes = name.as_bytes();
        let field = &mut header.as_old_mut().name;
        if bytes.len() >= field.len() {
            return Err(Error::new(ErrorKind::InvalidInput, "raw name too long"));
        }
        field[..bytes.len()].copy_from_slice(bytes);
        header.set_cksum();
        self.tar.append(&header, content)?;
        Ok(self)
    }

    /// The uncompressed tar.
    pub fn finish(self) -> Result<Vec<u8>> {
        self.tar.into_inner()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(1_700_000_000);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Gzip-compresses a tar.
pub fn gzip(tar: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(tar)?;
    encoder.finish()
}

/// A layer with a static busybox at `/bin/busybox`, a symlink per applet
/// (what `busybox --install -s` makes), and `/tmp`, `/etc`, `/www`.
pub fn busybox_layer() -> Result<Vec<u8>> {
    let busybox = find_command("busybox")
        .ok_or_else(|| Error::new(ErrorKind::NotFound, "busybox is not installed"))?;
    let output = Command::new(&busybox).arg("--list").output()?;
    let applets = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut layer = LayerBuilder::new()
        .dir("bin")?
        .dir("etc")?
        .dir("tmp")?
        .dir("www")?
        .dir("proc")?
        .dir("sys")?
        .dir("dev")?;
    layer = layer.file("bin/busybox", &std::fs::read(&busybox)?, 0o755)?;
    layer = layer.file("www/index.html", b"hello from busybox\n", 0o644)?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    layer.finish()
}

/// The NSS modules and resolver library `getent hosts` loads at run time
/// (through `dlopen`, so `ldd` does not list them). Since glibc 2.34 the
/// first two are built into libc and ship as stubs; a host without them
/// has them built in.
const NSS_LIBRARIES: [&str; 3] = ["libnss_files.so.2", "libnss_dns.so.2", "libresolv.so.2"];

/// A layer with the host's glibc `getent` at `/usr/bin/getent`, every
/// shared library `ldd` lists for it and for glibc's NSS modules for files
/// and DNS (`libnss_files`, `libnss_dns`, `libresolv`, found beside libc),
/// each at the path `ldd` names (the dynamic loader too), and an
/// `/etc/nsswitch.conf` saying `hosts: files dns`. Put it above
/// [`busybox_layer`]: `/usr/bin/getent hosts NAME` in the container then
/// resolves as any glibc program does — the container's `/etc/hosts`,
/// then the nameservers and search domains of its `/etc/resolv.conf`.
pub fn getent_layer() -> Result<Vec<u8>> {
    let getent = find_command("getent").ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            "getent (glibc, Debian's libc-bin) is not on PATH",
        )
    })?;
    let mut libraries = std::collections::BTreeSet::new();
    libraries.extend(shared_libraries(&getent)?);
    let libc = libraries
        .iter()
        .find(|path| path.file_name().is_some_and(|name| name == "libc.so.6"))
        .cloned()
        .ok_or_else(|| {
            Error::other(format!(
                "ldd {} lists no libc.so.6: is it glibc's getent?",
                getent.display()
            ))
        })?;
    let libc_dir = libc.parent().unwrap_or(Path::new("/"));
    for name in NSS_LIBRARIES {
        let module = libc_dir.join(name);
        if module.exists() {
            libraries.extend(shared_libraries(&module)?);
            libraries.insert(module);
        }
    }
    let mut files: Vec<(PathBuf, u32)> = vec![(PathBuf::from("/usr/bin/getent"), 0o755)];
    files.extend(libraries.iter().map(|path| (path.clone(), 0o755)));
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _) in &files {
        dirs.extend(path.ancestors().skip(1).map(Path::to_path_buf));
    }
    let mut layer = LayerBuilder::new().dir("etc")?;
    for dir in dirs.iter().filter_map(|dir| layer_path(dir)) {
        layer = layer.dir(&dir)?;
    }
    layer = layer.file("usr/bin/getent", &read(&getent)?, 0o755)?;
    for library in &libraries {
        if let Some(name) = layer_path(library) {
            // Read through symlinks: the layer holds the file itself at
            // the name the loader looks for.
            layer = layer.file(&name, &read(library)?, 0o755)?;
        }
    }
    layer = layer.file(
        "etc/nsswitch.conf",
        b"passwd: files
group: files
hosts: files dns
",
        0o644,
    )?;
    layer.finish()
}

/// The absolute paths `ldd` prints for `binary`'s libraries and loader.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(e.kind(), format!("running ldd {}: {e}", binary.display())))?;
    if !output.status.success() {
        return Err(Error::other(format!(
            "ldd {} failed ({}): {}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x…)` give their paths; the vDSO
/// (`linux-vdso.so.1 (0x…)`) has none.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = line.split_once("=>").map_or(line, |(_, path)| path.trim());
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// An absolute host path as a layer entry name (no leading `/`); `None`
/// for `/` itself.
fn layer_path(path: &Path) -> Option<String> {
    let relative = path.strip_prefix("/").ok()?;
    let name = relative.to_str()?;
    (!name.is_empty()).then(|| name.to_owned())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::new(e.kind(), format!("reading {}: {e}", path.display())))
}

/// The digest a layer tar has in a layout [`write_oci_layout`] writes (its
/// gzip-compressed blob's), to find it in a registry.
pub fn layer_blob_digest(tar: &[u8]) -> Result<Digest> {
    Ok(Digest::of_bytes(&gzip(tar)?))
}

/// Writes an OCI image layout at `dir` with the given uncompressed layer
/// tars (gzip-compressed in the layout), default command `cmd`, tagged
/// `tag`. Returns the manifest digest.
pub fn write_oci_layout(dir: &Path, tag: &str, layers: &[Vec<u8>], cmd: &[&str]) -> Result<Digest> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    for tar in layers {
        diff_ids.push(Digest::of_bytes(tar).to_string());
        let compressed = gzip(tar)?;
        descriptors.push(write_blob(
            &blobs,
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &compressed,
        )?);
    }
    let config = serde_json::json!({
        "architecture": crate::node_architecture(), "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = write_blob(
        &blobs,
        "application/vnd.oci.image.config.v1+json",
        &serde_json::to_vec(&config)?,
    )?;
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": descriptors,
    });
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let mut manifest = write_blob(
        &blobs,
        "application/vnd.oci.image.manifest.v1+json",
        &manifest_bytes,
    )?;
    manifest["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(Digest::of_bytes(&manifest_bytes))
}

fn write_blob(blobs: &Path, media_type: &str, bytes: &[u8]) -> Result<serde_json::Value> {
    let digest = Digest::of_bytes(bytes);
    std::fs::write(blobs.join(digest.hex()), bytes)?;
    Ok(
        serde_json::json!({"mediaType": media_type, "digest": digest.to_string(), "size": bytes.len()}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_library_and_loader_paths_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fc4)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007fc5)\n\
                    \tlibgone.so.1 => not found\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn the_getent_layer_holds_getent_its_libraries_nss_and_nsswitch() {
        if find_command("getent").is_none() || find_command("ldd").is_none() {
            skip(
                "the_getent_layer_holds",
                "no glibc getent or ldd on this host",
            );
            return;
        }
        let tar = getent_layer().expect("getent layer");
        let mut archive = tar::Archive::new(tar.as_slice());
        let names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let entry = entry.expect("entry");
                entry.path().expect("path").display().to_string()
            })
            .collect();
        for expected in ["usr/bin/getent", "etc/nsswitch.conf"] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
        for library in [
            "libc.so.6",
            "ld-linux",
            "libnss_dns.so.2",
            "libnss_files.so.2",
        ] {
            assert!(
                names.iter().any(|n| n.contains(library)),
                "{library} in {names:?}"
            );
        }
    }
}
