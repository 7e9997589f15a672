//! Streams of newline-delimited JSON: the plumbing shared by `watch` and
//! the agents' assignment stream (a producer task writes lines into a
//! channel the response body reads; it stops when the client goes away or
//! the server shuts down), and `GET /v1/watch` itself.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use cca_store::{Revision, WatchEvent, WatchMessage, WatchStream};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use crate::error::{ApiResult, QueryArgs};
use crate::state::ApiState;
use crate::types::WatchLine;

/// Lines buffered between a producer and a slow client.
const LINE_BUFFER: usize = 256;

/// The producer's end of an NDJSON response.
#[derive(Debug)]
pub(crate) struct LineSender {
    lines: mpsc::Sender<Bytes>,
    shutdown: watch::Receiver<bool>,
}

impl LineSender {
    /// Sends one line; false once the client is gone.
    pub(crate) async fn send<T: Serialize>(&self, line: &T) -> bool {
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return false;
        };
        bytes.push(b'\n');
        self.lines.send(Bytes::from(bytes)).await.is_ok()
    }

    /// Sends one line already encoded (with its newline); false once the
    /// client is gone.
    pub(crate) async fn send_encoded(&self, line: Bytes) -> bool {
        self.lines.send(line).await.is_ok()
    }

    /// Resolves when the client is gone or the server is shutting down:
    /// the producer should stop.
    pub(crate) async fn stopped(&self) {
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = self.lines.closed() => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }

    /// The next watch message, or `None` when the producer should stop.
    pub(crate) async fn next_message(
        &self,
        stream: &mut WatchStream,
    ) -> Option<cca_store::Result<WatchMessage>> {
        tokio::select! {
            message = stream.next() => message,
            () = self.stopped() => None,
        }
    }
}

/// Starts `produce` and answers with the lines it sends.
pub(crate) fn ndjson<F, Fut>(state: &ApiState, permit: OwnedSemaphorePermit, produce: F) -> Response
where
    F: FnOnce(LineSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    streamed(state, permit, "application/x-ndjson", produce)
}

/// Starts `produce` and answers with what it sends, as `content_type`.
pub(crate) fn streamed<F, Fut>(
    state: &ApiState,
    permit: OwnedSemaphorePermit,
    content_type: &'static str,
    produce: F,
) -> Response
where
    F: FnOnce(LineSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (lines, mut receiver) = mpsc::channel::<Bytes>(LINE_BUFFER);
    let sender = LineSender {
        lines,
        shutdown: state.shutdown_signal(),
    };
    let producer = produce(sender);
    tokio::spawn(async move {
        producer.await;
        drop(permit);
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        receiver
            .poll_recv(cx)
            .map(|line| line.map(Ok::<_, Infallible>))
    });
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Query of `GET /v1/watch`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WatchQuery {
    /// Only keys under this prefix (default: every key).
    #[serde(default)]
    prefix: String,
    /// Replay from this revision on (inclusive); 0 or absent: from now.
    #[serde(default)]
    from: Revision,
}

/// Streams changes under a prefix as [`WatchLine`]s.
pub(crate) async fn watch(
    State(state): State<ApiState>,
    QueryArgs(query): QueryArgs<WatchQuery>,
) -> ApiResult<Response> {
    let permit = state.stream_permit()?;
    // Open the watch before answering so a compacted or invalid start is
    // an error status, not a broken stream.
    let mut stream = state
        .store()
        .watch(&query.prefix, query.from.max(0))
        .await?;
    Ok(ndjson(&state, permit, |lines| async move {
        while let Some(message) = lines.next_message(&mut stream).await {
            let Ok(message) = message else { return };
            for line in watch_lines(message) {
                if !lines.send(&line).await {
                    return;
                }
            }
        }
    }))
}

/// One line per event; a compaction becomes a `compacted` line.
fn watch_lines(message: WatchMessage) -> Vec<WatchLine> {
    match message {
        WatchMessage::Events { revision, events } => events
            .into_iter()
            .map(|event| match event {
                WatchEvent::Put(kv) => WatchLine::Put {
                    revision,
                    value: json_or_text(&kv.value),
                    key: kv.key,
                },
                WatchEvent::Delete { key, .. } => WatchLine::Delete { revision, key },
            })
            .collect(),
        WatchMessage::Compacted { compact_revision } => {
            vec![WatchLine::Compacted { compact_revision }]
        }
    }
}

/// Facts are JSON; anything else is shown as (lossy) text.
fn json_or_text(value: &[u8]) -> serde_json::Value {
    serde_json::from_slice(value)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(value).into_owned()))
}
