//! Admission lanes over a real socket: with the `user` lane full (a user
//! write held in the store, one more request queued), a heartbeat is
//! still served at once, and another user request is shed with 429 and
//! `Retry-After` — as `curl` and the typed client see it — while the
//! queued one is served once the held write finishes; a request that
//! waits its lane's whole queue timeout is shed too. The lane gauges and
//! shed counters on `/metrics` follow.

mod support;

use std::sync::Arc;
use std::time::Duration;

use cca_api::{ApiConfig, LaneLimits};
use cca_store::Op;
use cca_store::decorate::{Call, Decorated, Hook};
use cca_wire::Client;
use serde_json::Value;
use support::{Harness, harness_wrapping, node_request};
use tokio::sync::watch;

/// Long enough for anything that is not stuck.
const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_heartbeat_is_served_at_once_while_the_user_lane_is_full() {
    let (h, held) = held_harness(Duration::from_secs(60)).await;
    let (address, _stop) = h.listen().await;
    let base = format!("http://{address}");
    let client = Client::new(&base);
    let node = client
        .register(&node_request("n1"))
        .await
        .expect("registers");

    let holder = held.hold(&client).await;
    let queued = tokio::spawn({
        let client = client.clone();
        async move { client.status().await }
    });
    wait_for_metric(&client, "cca_api_lane_queued{lane=\"user\"} 1").await;

    let (status, retry_after, body) = curl_get(&format!("{base}/v1/status")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("60"), "{body}");
    let error = body["error"].as_str().expect("a JSON error");
    assert!(
        error.starts_with("server busy: the `user` lane is full"),
        "{error}"
    );

    let shed = client.status().await.expect_err("the user lane is full");
    assert_eq!(shed.status(), Some(429), "{shed}");
    assert_eq!(shed.retry_after(), Some(Duration::from_secs(60)), "{shed}");

    tokio::time::timeout(WAIT, client.heartbeat("n1", node.lease_id))
        .await
        .expect("the heartbeat waits behind nothing")
        .expect("the heartbeat is served");

    held.release();
    holder.await.expect("joins").expect("the held write lands");
    queued
        .await
        .expect("joins")
        .expect("the queued request is served once the lane frees");
    let text = client.metrics().await.expect("metrics");
    for line in [
        "cca_api_requests_shed_total{lane=\"user\",reason=\"queue_full\"} 2",
        "cca_api_requests_shed_total{lane=\"user\",reason=\"timed_out\"} 0",
        "cca_api_requests_shed_total{lane=\"liveness\",reason=\"queue_full\"} 0",
        "cca_api_lane_in_flight{lane=\"user\"} 0",
        "cca_api_lane_queued{lane=\"user\"} 0",
        "cca_api_requests_total{route=\"/v1/status\",method=\"GET\",status=\"429\"} 2",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
}

#[tokio::test]
async fn a_request_that_waits_its_lane_timeout_is_shed() {
    let (h, held) = held_harness(Duration::from_millis(300)).await;
    let (client, _stop) = h.serve().await;
    client
        .register(&node_request("n1"))
        .await
        .expect("registers");
    let holder = held.hold(&client).await;

    let shed = tokio::time::timeout(WAIT, client.status())
        .await
        .expect("shed after its queue timeout, not held")
        .expect_err("no permit came free");
    assert_eq!(shed.status(), Some(429), "{shed}");
    assert_eq!(shed.retry_after(), Some(Duration::from_secs(1)), "{shed}");
    assert!(
        shed.to_string()
            .contains("no request finished within 300 ms"),
        "{shed}"
    );

    held.release();
    holder.await.expect("joins").expect("the held write lands");
    let text = client.metrics().await.expect("metrics");
    assert!(
        text.contains("cca_api_requests_shed_total{lane=\"user\",reason=\"timed_out\"} 1"),
        "{text}"
    );
}

/// A harness whose `user` lane serves one request and queues one, each
/// waiting up to `queue_timeout`, over a store that holds node-control
/// writes until released.
async fn held_harness(queue_timeout: Duration) -> (Harness, Held) {
    let mut config = ApiConfig::default();
    config.lanes.user = LaneLimits {
        in_flight: 1,
        queued: 1,
        queue_timeout,
    };
    let (gate, opened) = watch::channel(false);
    let (entered, arrived) = watch::channel(0_usize);
    let h = harness_wrapping(config, move |inner| {
        Arc::new(Decorated::wrap(
            inner,
            NodeControlHold {
                gate: opened,
                entered,
            },
        ))
    })
    .await;
    let held = Held { gate, arrived };
    (h, held)
}

/// The test's side of a [`NodeControlHold`].
struct Held {
    gate: watch::Sender<bool>,
    arrived: watch::Receiver<usize>,
}

impl Held {
    /// Starts a user write (disabling node `n1`) and returns once the store
    /// holds it: the `user` lane's one permit is taken until `release`.
    async fn hold(
        &self,
        client: &Client,
    ) -> tokio::task::JoinHandle<cca_wire::ClientResult<cca_wire::types::NodeControlReport>> {
        let writer = tokio::spawn({
            let client = client.clone();
            async move { client.disable_node("n1").await }
        });
        tokio::time::timeout(WAIT, self.arrived.clone().wait_for(|held| *held >= 1))
            .await
            .expect("the write reaches the store")
            .expect("the store is alive");
        writer
    }

    fn release(&self) {
        self.gate.send_replace(true);
    }
}

/// Holds transactions writing a node control (`desired/node/…`) until the
/// gate opens; everything else goes straight through.
struct NodeControlHold {
    gate: watch::Receiver<bool>,
    entered: watch::Sender<usize>,
}

fn writes_node_control(txn: &cca_store::Txn) -> bool {
    txn.ops.iter().any(|op| match op {
        Op::Put { key, .. } | Op::Delete { key } => key.starts_with("desired/node/"),
        Op::DeletePrefix { .. } => false,
    })
}

#[async_trait::async_trait]
impl Hook for NodeControlHold {
    async fn before(&self, call: Call<'_>) -> cca_store::Result<()> {
        if let Call::Txn { txn } = call
            && writes_node_control(txn)
        {
            self.entered.send_modify(|held| *held += 1);
            let _ = self.gate.clone().wait_for(|open| *open).await;
        }
        Ok(())
    }
}

/// Polls `/metrics` (the `bulk` lane, free meanwhile) until it has `line`.
async fn wait_for_metric(client: &Client, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = client.metrics().await.expect("metrics");
        if text.contains(line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {line} in:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `curl -i` of `url`: the status, the `Retry-After` header and the JSON
/// body, as a client outside Rust sees them.
async fn curl_get(url: &str) -> (u16, Option<String>, Value) {
    let output = tokio::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10", url])
        .output()
        .await
        .expect("curl runs (scripts/test expects it on the PATH)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "curl: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let retry_after = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .map(|(_, value)| value.trim().to_owned());
    let body = serde_json::from_str(body).expect("a JSON body");
    (status, retry_after, body)
}
