//! The resolver files of an instance whose spec has a [`DnsConfig`]: its
//! `resolv.conf` (the node's cluster DNS, the search domains and `ndots`)
//! and, for containers, an `/etc/hosts` in which the container's hostname
//! and `localhost` resolve without asking any server. Both runtimes write
//! them into the instance's directory at `create` and bind them read-only
//! over the instance's `/etc/resolv.conf` (and `/etc/hosts` in a
//! container), so the host's own files are never written. The content is
//! a function of the spec alone, so it is the same for an instance, its
//! init steps and every restart.

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::DnsConfig;

/// The instance's generated `resolv.conf`, in its directory.
pub(crate) const RESOLV_CONF_FILE: &str = "resolv.conf";
/// The container's generated `hosts`, in its directory.
pub(crate) const HOSTS_FILE: &str = "hosts";

/// Where the resolver looks, in every instance and on the host.
pub(crate) const ETC_RESOLV_CONF: &str = "/etc/resolv.conf";
pub(crate) const ETC_HOSTS: &str = "/etc/hosts";

/// `resolv.conf` naming the cluster DNS. Nothing of the host's file is
/// kept: the cluster DNS forwards every name it does not own to the
/// host's resolvers, so nothing is lost and the answers agree.
pub(crate) fn resolv_conf(dns: &DnsConfig) -> String {
    let mut text = String::from("# Written by cca: the node's cluster DNS.\n");
    for server in &dns.nameservers {
        text.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.search.is_empty() {
        text.push_str(&format!("search {}\n", dns.search.join(" ")));
    }
    text.push_str(&format!("options ndots:{}\n", dns.ndots));
    text
}

/// `/etc/hosts` of a container named `hostname`: `localhost` on both
/// loopbacks and the hostname on the container's own address (with its
/// own network) or `127.0.1.1` (sharing the host's, as Debian names a
/// host), so `hostname -i` and programs looking themselves up do not
/// depend on the DNS server knowing instance ids.
pub(crate) fn hosts(hostname: &str, address: Option<Ipv4Addr>) -> String {
    let own = address.unwrap_or(Ipv4Addr::new(127, 0, 1, 1));
    format!(
        "# Written by cca.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}\t{hostname}\n"
    )
}

/// Writes `content` to `path`, mode 0644 whatever the umask (a workload
/// that is not root must read it), through a temporary and a rename so a
/// reader never sees half a file. Written at `create` only: a bind mount
/// holds the inode it was made from, so a later rewrite would not reach a
/// running instance anyway.
pub(crate) fn write(path: &Path, content: &str) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(content.as_bytes())?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_names_the_servers_the_search_domains_and_ndots() {
        let dns = DnsConfig {
            nameservers: vec![Ipv4Addr::new(10, 42, 3, 1)],
            search: vec!["cca.local".into(), "example.org".into()],
            ndots: 1,
        };
        assert_eq!(
            resolv_conf(&dns),
            "# Written by cca: the node's cluster DNS.\nnameserver 10.42.3.1\n\
             search cca.local example.org\noptions ndots:1\n"
        );
        let bare = DnsConfig {
            search: Vec::new(),
            ..dns
        };
        assert!(
            !resolv_conf(&bare).contains("search"),
            "no empty search line"
        );
    }

    #[test]
    fn hosts_names_localhost_and_the_container_on_its_address() {
        let own = hosts("web-1", Some(Ipv4Addr::new(10, 42, 3, 7)));
        assert!(own.contains("127.0.0.1\tlocalhost\n"), "{own}");
        assert!(own.ends_with("10.42.3.7\tweb-1\n"), "{own}");
        assert!(hosts("web-1", None).ends_with("127.0.1.1\tweb-1\n"));
    }

    #[test]
    fn written_files_are_world_readable_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(RESOLV_CONF_FILE);
        std::fs::write(&path, "old").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        write(&path, "nameserver 10.0.0.1\n").expect("write");
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "nameserver 10.0.0.1\n"
        );
        assert!(!path.with_extension("tmp").exists());
    }
}
