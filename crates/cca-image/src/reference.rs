//! Image references — `[registry/]repository[:tag][@sha256:…]` — parsed
//! and validated with Docker's defaults: no registry means `docker.io`, a
//! one-part repository there means `library/NAME`, no tag and no digest
//! means `latest`. A digest, when given, is what gets pulled.

use std::fmt;
use std::str::FromStr;

use crate::{Digest, Error, Result};

/// Docker Hub, the registry of references that name none.
pub const DEFAULT_REGISTRY: &str = "docker.io";

const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A parsed, validated image reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// Host, optionally with a port: `docker.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// Slash-separated lowercase path: `library/busybox`.
    pub repository: String,
    /// `None` only when a digest is given without a tag.
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl ImageRef {
    /// `registry/repository`, the part tags and digests hang off.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same image pinned to `digest` (tag dropped): what a pull records
    /// so that the image can be found again by digest.
    pub fn with_digest(&self, digest: Digest) -> Self {
        Self {
            tag: None,
            digest: Some(digest),
            ..self.clone()
        }
    }

    pub(crate) fn to_oci(&self) -> oci_client::Reference {
        let (registry, repository) = (self.registry.clone(), self.repository.clone());
        match (&self.tag, &self.digest) {
            (_, Some(digest)) => {
                oci_client::Reference::with_digest(registry, repository, digest.to_string())
            }
            (Some(tag), None) => oci_client::Reference::with_tag(registry, repository, tag.clone()),
            (None, None) => oci_client::Reference::with_tag(registry, repository, "latest".into()),
        }
    }
}

impl FromStr for ImageRef {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidReference {
            reference: text.to_owned(),
            reason,
        };
        let (rest, digest) = match text.rsplit_once('@') {
            Some((rest, digest)) => (
                rest,
                Some(
                    digest
                        .parse::<Digest>()
                        .map_err(|e| invalid(e.to_string()))?,
                ),
            ),
            None => (text, None),
        };
        let (name, tag) = split_tag(rest);
        let (registry, repository) = split_registry(name);
        validate_registry(&registry).map_err(&invalid)?;
        validate_repository(&repository).map_err(&invalid)?;
        if let Some(tag) = tag {
            validate_tag(tag).map_err(&invalid)?;
        }
        let tag = match (tag, &digest) {
            (None, None) => Some("latest".to_owned()),
            (tag, _) => tag.map(str::to_owned),
        };
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// A tag is after the last `:` of the last path segment (a `:` before a
/// `/` is a registry port).
fn split_tag(text: &str) -> (&str, Option<&str>) {
    let last_segment_start = text.rfind('/').map_or(0, |slash| slash + 1);
    match text[last_segment_start..].rfind(':') {
        Some(colon) => {
            let at = last_segment_start + colon;
            (&text[..at], Some(&text[at + 1..]))
        }
        None => (text, None),
    }
}

/// The first segment is a registry when it looks like a host (a dot, a
/// port, or `localhost`); otherwise the reference is on Docker Hub.
fn split_registry(name: &str) -> (String, String) {
    if let Some((first, rest)) = name.split_once('/')
        && (first.contains('.') || first.contains(':') || first == "localhost")
    {
        return (first.to_owned(), rest.to_owned());
    }
    let repository = if name.contains('/') {
        name.to_owned()
    } else {
        format!("library/{name}")
    };
    (DEFAULT_REGISTRY.to_owned(), repository)
}

pub(crate) fn validate_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
    if !host_ok {
        return Err(format!("registry {registry:?} is not a host name"));
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(format!(
            "registry port {port:?} is not a number up to 65535"
        ));
    }
    Ok(())
}

fn validate_repository(repository: &str) -> Result<(), String> {
    if repository.is_empty() {
        return Err("the repository name is empty".into());
    }
    if repository.len() > MAX_NAME_LEN {
        return Err(format!(
            "the repository name is longer than {MAX_NAME_LEN} characters"
        ));
    }
    for component in repository.split('/') {
        let edges_ok = component.starts_with(|c: char| c.is_ascii_alphanumeric())
            && component.ends_with(|c: char| c.is_ascii_alphanumeric());
        let chars_ok = component
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
        if !edges_ok || !chars_ok {
            return Err(format!(
                "repository component {component:?} must be lowercase letters, digits and '.', '_', '-' inside"
            ));
        }
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), String> {
    let first_ok = tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
    let chars_ok = tag
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if tag.len() > MAX_TAG_LEN || !first_ok || !chars_ok {
        return Err(format!(
            "tag {tag:?} must be 1-{MAX_TAG_LEN} letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &str) {
        let reference: ImageRef = text.parse().expect("reference should parse");
        assert_eq!(reference.to_string(), expected);
    }

    fn check_invalid(text: &str, reason: &str) {
        let error = text
            .parse::<ImageRef>()
            .expect_err("should be rejected")
            .to_string();
        assert!(error.contains(reason), "{error:?} lacks {reason:?}");
        assert!(error.starts_with(&format!("invalid image reference {text:?}")));
    }

    #[test]
    fn docker_hub_defaults_apply() {
        check("busybox", "docker.io/library/busybox:latest");
        check("busybox:1.36", "docker.io/library/busybox:1.36");
        check("acme/web", "docker.io/acme/web:latest");
        check("localhost/web", "localhost/web:latest");
    }

    #[test]
    fn registries_with_ports_tags_and_digests_parse() {
        let digest = format!("sha256:{}", "a".repeat(64));
        check(
            "127.0.0.1:5000/test/busybox:1",
            "127.0.0.1:5000/test/busybox:1",
        );
        check(
            &format!("ghcr.io/a/b@{digest}"),
            &format!("ghcr.io/a/b@{digest}"),
        );
        check(
            &format!("ghcr.io/a/b:v2@{digest}"),
            &format!("ghcr.io/a/b:v2@{digest}"),
        );
        let reference: ImageRef = "127.0.0.1:5000/x".parse().expect("parses");
        assert_eq!(reference.registry, "127.0.0.1:5000");
        assert_eq!(reference.tag.as_deref(), Some("latest"));
    }

    #[test]
    fn invalid_references_say_what_is_wrong() {
        check_invalid("", "repository component \"\"");
        check_invalid("Busybox", "lowercase");
        check_invalid("a/-b", "must be lowercase");
        check_invalid("busybox:-x", "tag \"-x\"");
        check_invalid("busybox@sha256:12", "64 lowercase hex");
        check_invalid("busybox@md5:12", "only sha256");
        check_invalid("host:99999/a", "port \"99999\"");
        check_invalid("ex ample.com/a", "not a host name");
    }
}
