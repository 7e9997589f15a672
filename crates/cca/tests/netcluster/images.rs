//! The lab's test images, built from the host's static busybox and glibc
//! `getent` as OCI layouts (`cca_image::testing`) and imported into every
//! node: a small
//! network image for clients and servers, and stand-ins for the images
//! `examples/airflow.cca` names (no registry is reachable here). The
//! stand-ins speak HTTP instead of the real protocols, which is enough to
//! prove a connection crossed the cluster network.

use std::path::{Path, PathBuf};

use cca_image::testing::{LayerBuilder, busybox_layer, getent_layer, write_oci_layout};

/// An image: busybox and glibc's `getent` (at `/usr/bin/getent`, with
/// the libraries and NSS modules it loads), plus `files` (path, content,
/// mode) in a layer of their own, run as `cmd` by default.
pub(crate) struct Image {
    pub(crate) name: &'static str,
    pub(crate) files: Vec<(&'static str, &'static str, u32)>,
    pub(crate) cmd: Vec<&'static str>,
}

/// `stand-in NAME PORT`: answers HTTP on PORT with `NAME INSTANCE`, as the
/// real server would answer its own protocol; stops at once on SIGTERM
/// (as PID 1, a shell ignores it unless it traps it).
const STAND_IN: &str = r#"#!/bin/sh
trap 'exit 0' TERM INT
mkdir -p /tmp/www
echo "$1 $CCA_INSTANCE" > /tmp/www/index.html
httpd -f -p "$2" -h /tmp/www &
wait
"#;

/// `idle`: a client that waits to be exec'd into.
const IDLE: &str = r#"#!/bin/sh
trap 'exit 0' TERM INT
sleep 1000000 &
wait
"#;

/// The network image: `stand-in` and `idle`, and busybox's `wget` and
/// glibc's `getent` as clients.
pub(crate) fn net() -> Image {
    Image {
        name: "cca.test/net:1",
        files: vec![("bin/stand-in", STAND_IN, 0o755), ("bin/idle", IDLE, 0o755)],
        cmd: vec!["idle"],
    }
}

/// Postgres's stand-in refuses to start without the password file the
/// example points it at (its secret), as the real image does.
const POSTGRES: &str = r#"#!/bin/sh
if [ ! -s "$POSTGRES_PASSWORD_FILE" ]; then
  echo "postgres stand-in: no password in POSTGRES_PASSWORD_FILE=$POSTGRES_PASSWORD_FILE" >&2
  exit 1
fi
exec stand-in postgres 5432
"#;

/// `pg_isready`: the health check's command; ready once the port answers
/// (tried for ~3 s: the probe's timeout is 5 s).
const PG_ISREADY: &str = r#"#!/bin/sh
for i in 1 2 3 4 5 6; do
  wget -q -O /dev/null http://127.0.0.1:5432/ && exit 0
  sleep 0.5
done
echo "no server on 5432" >&2
exit 2
"#;

/// `airflow`'s stand-in: each command reads the connection files the
/// cluster mounts (`/run/connections/NAME`), resolves their hosts through
/// the cluster DNS (glibc's `getent`, as Airflow's Python would) and
/// connects to their ports (through the services' VIPs), retrying for a
/// minute; what it reached goes to `/tmp/connections`. `db migrate`
/// reaches the database; `webserver` reaches both and only then serves
/// `/health` (the reached connections) on its port; `scheduler` and
/// `celery worker` reach both and stay up.
const AIRFLOW: &str = r#"#!/bin/sh
PATH=/bin:/usr/bin
trap 'exit 0' TERM INT
reach() {
  url=$(cat "/run/connections/$1") || return 1
  rest=${url#*://}
  rest=${rest#*@}
  hostport=${rest%%/*}
  host=${hostport%%:*}
  port=${hostport##*:}
  address=$(getent hosts "$host" | awk '{ print $1; exit }')
  if [ -z "$address" ]; then
    echo "$1: $host does not resolve" >&2
    return 1
  fi
  if ! body=$(timeout 3 wget -q -O - "http://$address:$port/"); then
    echo "$1: $host ($address:$port) does not answer" >&2
    return 1
  fi
  echo "$1 $host $address $port $body"
}
connect() {
  : > /tmp/connections.new
  for name in "$@"; do
    reach "$name" >> /tmp/connections.new || return 1
  done
  mv /tmp/connections.new /tmp/connections
}
wait_for() {
  for i in $(seq 1 120); do
    connect "$@" && return 0
    sleep 0.5
  done
  echo "airflow stand-in: gave up reaching $*" >&2
  return 1
}
case "${1:-} ${2:-}" in
  "db migrate")
    wait_for airflow_db ;;
  "webserver "*)
    wait_for airflow_db airflow_broker || exit 1
    mkdir -p /tmp/www
    cp /tmp/connections /tmp/www/health
    httpd -f -p "${3:-8080}" -h /tmp/www &
    wait ;;
  "scheduler "* | "celery worker")
    wait_for airflow_db airflow_broker || exit 1
    sleep 1000000 &
    wait ;;
  *)
    echo "airflow stand-in: no such command: $*" >&2
    exit 2 ;;
esac
"#;

/// The images `examples/airflow.cca` names, as stand-ins.
pub(crate) fn airflow() -> Vec<Image> {
    vec![
        Image {
            name: "postgres:16",
            files: vec![
                ("bin/stand-in", STAND_IN, 0o755),
                ("bin/postgres", POSTGRES, 0o755),
                ("bin/pg_isready", PG_ISREADY, 0o755),
            ],
            cmd: vec!["postgres"],
        },
        Image {
            name: "redis:7",
            files: vec![("bin/stand-in", STAND_IN, 0o755)],
            cmd: vec!["stand-in", "redis", "6379"],
        },
        Image {
            name: "apache/airflow:2.10.3",
            files: vec![("bin/airflow", AIRFLOW, 0o755)],
            cmd: vec!["airflow", "version"],
        },
    ]
}

/// Writes each image's OCI layout under `dir`; their paths, in order.
pub(crate) fn build_all(images: &[Image], dir: &Path) -> Vec<PathBuf> {
    let busybox = busybox_layer().expect("a busybox layer (busybox-static)");
    let getent = getent_layer().expect("a getent layer (glibc's libc-bin)");
    images
        .iter()
        .enumerate()
        .map(|(index, image)| {
            let mut layer = LayerBuilder::new().dir("bin").expect("a layer");
            for (path, content, mode) in &image.files {
                layer = layer
                    .file(path, content.as_bytes(), *mode)
                    .expect("a file in the layer");
            }
            let layers = vec![
                busybox.clone(),
                getent.clone(),
                layer.finish().expect("the layer's tar"),
            ];
            let layout = dir.join(index.to_string());
            write_oci_layout(&layout, "latest", &layers, &image.cmd).expect("an OCI layout");
            layout
        })
        .collect()
}
