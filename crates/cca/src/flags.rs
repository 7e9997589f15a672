//! clap value parsers for the flags that are not plain strings: every
//! duration flag is parsed here, once, into a `std::time::Duration` (the
//! one type for spans), so a bad value is a usage error (exit 2) naming
//! the flag and the accepted forms before anything runs.

use std::time::Duration;

use cca_api::{Lane, LaneLimits};
use cca_runtime::sim::StartLatency;

/// The forms a duration flag accepts, for error messages.
const DURATION_FORMS: &str = "a duration is a number with a unit: 500ms, 1.5s, 5m, 1h, 1d";

/// A span: `500ms`, `10s`, `5m`, `1h`, `1d` (the `.cca` files' syntax).
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    text.parse::<cca_model::spec::Duration>()
        .map(Duration::from)
        .map_err(|error| format!("{error} ({DURATION_FORMS})"))
}

/// A span, or `never`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanOrNever(pub(crate) Option<Duration>);

/// `never`, or a span as [`duration`] reads it.
pub(crate) fn duration_or_never(text: &str) -> Result<SpanOrNever, String> {
    if text == "never" {
        return Ok(SpanOrNever(None));
    }
    duration(text)
        .map(|span| SpanOrNever(Some(span)))
        .map_err(|error| format!("{error}, or `never`"))
}

/// `--start-latency`: `50ms`, `uniform:MIN..MAX` or `normal:MEAN,STDDEV`.
pub(crate) fn start_latency(text: &str) -> Result<StartLatency, String> {
    let forms = "expected DURATION, uniform:MIN..MAX or normal:MEAN,STDDEV \
                 (e.g. uniform:5ms..50ms; a duration is 500ms, 1.5s, 5m, 1h, 1d)";
    let span = |part: &str| duration(part.trim());
    if let Some(range) = text.strip_prefix("uniform:") {
        let (min, max) = range
            .split_once("..")
            .ok_or_else(|| format!("`{text}` has no `..`; {forms}"))?;
        return Ok(StartLatency::Uniform {
            min: span(min)?,
            max: span(max)?,
        });
    }
    if let Some(shape) = text.strip_prefix("normal:") {
        let (mean, std_dev) = shape
            .split_once(',')
            .ok_or_else(|| format!("`{text}` has no `,`; {forms}"))?;
        return Ok(StartLatency::Normal {
            mean: span(mean)?,
            std_dev: span(std_dev)?,
        });
    }
    span(text).map(StartLatency::Fixed)
}

/// `--api-lane LANE=IN_FLIGHT,QUEUED,TIMEOUT`: one admission lane's
/// limits, e.g. `liveness=5000,10000,2s`.
pub(crate) fn api_lane(text: &str) -> Result<(Lane, LaneLimits), String> {
    let form = "expected LANE=IN_FLIGHT,QUEUED,TIMEOUT, e.g. liveness=5000,10000,2s \
                (lanes: liveness, reports, user, bulk)";
    let (name, limits) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` has no `=`; {form}"))?;
    let lane = Lane::from_name(name.trim())
        .ok_or_else(|| format!("unknown lane `{}`; {form}", name.trim()))?;
    let parts: Vec<&str> = limits.split(',').map(str::trim).collect();
    let [in_flight, queued, timeout] = parts[..] else {
        return Err(format!("`{limits}` is not three values; {form}"));
    };
    let count = |what: &str, value: &str| {
        value
            .parse::<usize>()
            .map_err(|_| format!("{what} `{value}` is not a whole number; {form}"))
    };
    let in_flight = count("IN_FLIGHT", in_flight)?;
    if in_flight == 0 {
        return Err(format!("IN_FLIGHT must be at least 1; {form}"));
    }
    Ok((
        lane,
        LaneLimits {
            in_flight,
            queued: count("QUEUED", queued)?,
            queue_timeout: duration(timeout)?,
        },
    ))
}

/// `--host-ports FIRST-LAST`: the host ports the scheduler hands out,
/// e.g. `20000-32767`.
pub(crate) fn port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let form = "expected FIRST-LAST, two ports from 1 to 65535, e.g. 20000-32767";
    let (first, last) = text
        .split_once('-')
        .ok_or_else(|| format!("`{text}` has no `-`; {form}"))?;
    let port = |value: &str| {
        value
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("`{}` is not a port; {form}", value.trim()))
    };
    let (first, last) = (port(first)?, port(last)?);
    if first > last {
        return Err(format!("{first} comes after {last}; {form}"));
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_are_first_dash_last() {
        assert_eq!(port_range("20000-32767"), Ok(20_000..=32_767));
        assert_eq!(port_range("41000 - 41000"), Ok(41_000..=41_000));
        let refused = |text| port_range(text).expect_err(text);
        assert!(refused("20000").starts_with("`20000` has no `-`"));
        assert!(refused("0-10").starts_with("`0` is not a port"));
        assert!(refused("1-70000").starts_with("`70000` is not a port"));
        assert!(refused("30-20").starts_with("30 comes after 20"));
    }

    #[test]
    fn durations_need_a_known_unit() {
        assert_eq!(duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(
            duration("5"),
            Err(
                "unknown unit `(none)`; expected one of: ms, s, m, h, d (a duration is a \
                 number with a unit: 500ms, 1.5s, 5m, 1h, 1d)"
                    .to_owned()
            )
        );
    }

    #[test]
    fn api_lanes_take_three_limits() {
        assert_eq!(
            api_lane("liveness=5000,10000,2s"),
            Ok((
                Lane::Liveness,
                LaneLimits {
                    in_flight: 5000,
                    queued: 10_000,
                    queue_timeout: Duration::from_secs(2),
                }
            ))
        );
        assert_eq!(
            api_lane("bulk = 4, 0, 500ms").map(|(lane, limits)| (lane, limits.queued)),
            Ok((Lane::Bulk, 0))
        );
        let refused = |text| api_lane(text).expect_err(text);
        assert!(refused("heartbeat=1,1,1s").starts_with("unknown lane `heartbeat`"));
        assert!(refused("user=1,1").starts_with("`1,1` is not three values"));
        assert!(refused("user=0,1,1s").starts_with("IN_FLIGHT must be at least 1"));
        assert!(refused("user=1,-1,1s").starts_with("QUEUED `-1` is not a whole number"));
        assert!(refused("user=1,1,5").starts_with("unknown unit"));
        assert!(refused("user").starts_with("`user` has no `=`"));
    }

    #[test]
    fn start_latencies_have_three_shapes() {
        assert_eq!(
            start_latency("50ms"),
            Ok(StartLatency::Fixed(Duration::from_millis(50)))
        );
        assert_eq!(
            start_latency("uniform:5ms..50ms"),
            Ok(StartLatency::Uniform {
                min: Duration::from_millis(5),
                max: Duration::from_millis(50)
            })
        );
        assert_eq!(
            start_latency("normal:50ms, 20ms"),
            Ok(StartLatency::Normal {
                mean: Duration::from_millis(50),
                std_dev: Duration::from_millis(20)
            })
        );
        assert!(start_latency("uniform:5ms").is_err_and(|e| e.contains("no `..`")));
    }
}

/// How to reach etcd over TLS: `cca server` and `cca store` share them.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct EtcdTlsArgs {
    /// CA certificate the etcd members' certificates chain to; talks TLS
    /// to etcd (the `etcd://` hosts are then reached over https).
    #[arg(long, env = "CCA_ETCD_CACERT", value_name = "FILE")]
    etcd_cacert: Option<std::path::PathBuf>,
    /// Client certificate to present to etcd (for its
    /// `--client-cert-auth`); needs --etcd-key and --etcd-cacert.
    #[arg(
        long,
        env = "CCA_ETCD_CERT",
        value_name = "FILE",
        requires = "etcd_cacert"
    )]
    etcd_cert: Option<std::path::PathBuf>,
    /// The key of --etcd-cert.
    #[arg(
        long,
        env = "CCA_ETCD_KEY",
        value_name = "FILE",
        requires = "etcd_cacert"
    )]
    etcd_key: Option<std::path::PathBuf>,
}

impl EtcdTlsArgs {
    /// Opens the store `url` names with these settings.
    pub(crate) async fn open(
        &self,
        url: &cca_store::StoreUrl,
    ) -> Result<std::sync::Arc<dyn cca_store::Store>, cca_store::StoreError> {
        let tls = match &self.etcd_cacert {
            Some(ca) => Some(cca_store::etcd::Tls::from_files(
                ca,
                self.etcd_cert.as_deref(),
                self.etcd_key.as_deref(),
            )?),
            None => None,
        };
        cca_store::open_with(url, tls).await
    }
}
