//! A console page's live feed: server-sent events of the page's view,
//! sent again only when it changed. The feed follows the cache's views
//! (no store watch of its own), sends a change at once but at most one
//! message per [`COALESCE`] (a burst of changes is one message), and a
//! comment after [`KEEP_ALIVE`] of quiet so that proxies keep the
//! connection. A view that cannot
//! be built (its object is gone) is a `problem` event, and the feed goes
//! on: the page shows the object again if it comes back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::{Builder, EventFeed, render};
use crate::error::ApiResult;
use crate::routes::watch::{LineSender, streamed};
use crate::state::ApiState;

/// The least time between two messages of a feed: at most one a second
/// per page, whatever the rate of changes.
pub(crate) const COALESCE: Duration = Duration::from_secs(1);
/// How often an idle feed sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Starts the live feed of `build`'s view.
pub(super) fn stream<T: Serialize + Send + 'static>(
    state: &ApiState,
    feed: EventFeed,
    build: Builder<T>,
) -> ApiResult<Response> {
    let permit = state.stream_permit()?;
    let producer_state = state.clone();
    Ok(streamed(state, permit, "text/event-stream", move |lines| {
        follow(producer_state, feed, build, lines)
    })
    .into_response())
}

async fn follow<T: Serialize + Send + 'static>(
    state: ApiState,
    feed: EventFeed,
    build: Builder<T>,
    lines: LineSender,
) {
    let mut views = state.cache().views();
    let mut last: Option<Vec<u8>> = None;
    let mut sent_at = Instant::now();
    loop {
        let view = views.borrow_and_update().clone();
        let (name, content) = match render(&state, &view, &feed, build.clone()).await {
            Ok(content) => ("view", content),
            Err(error) => ("problem", error.to_json()),
        };
        let sent = if last.as_ref() != Some(&content) {
            Some(message(name, view.revision, &content))
        } else if sent_at.elapsed() >= KEEP_ALIVE {
            // A quiet spell: a comment keeps the line open.
            Some(Bytes::from_static(b": keep-alive\n\n"))
        } else {
            None
        };
        if let Some(sent) = sent {
            if !lines.send_encoded(sent).await {
                return;
            }
            sent_at = Instant::now();
        }
        last = Some(content);
        if !next_change(&mut views, &lines, sent_at).await {
            return;
        }
    }
}

/// Waits for the next change, or [`KEEP_ALIVE`] (events are read again
/// then too: they are not in the cache's view), and then until
/// [`COALESCE`] has passed since the last message (a change after a quiet
/// spell goes at once; a burst, once a second); false when the client is
/// gone or the server stops.
async fn next_change(
    views: &mut tokio::sync::watch::Receiver<Arc<cca_control::View>>,
    lines: &LineSender,
    sent_at: Instant,
) -> bool {
    tokio::select! {
        changed = views.changed() => {
            if changed.is_err() {
                return false;
            }
        }
        () = tokio::time::sleep(KEEP_ALIVE) => {}
        () = lines.stopped() => return false,
    }
    tokio::select! {
        () = tokio::time::sleep_until((sent_at + COALESCE).into()) => true,
        () = lines.stopped() => false,
    }
}

/// One server-sent event: its name, the revision as its id, the JSON as
/// its data (JSON has no raw newlines, so one `data:` line holds it).
fn message(name: &str, revision: cca_model::Revision, content: &[u8]) -> Bytes {
    let mut bytes = Vec::with_capacity(content.len() + 48);
    bytes.extend_from_slice(format!("event: {name}\nid: {revision}\ndata: ").as_bytes());
    bytes.extend_from_slice(content);
    bytes.extend_from_slice(b"\n\n");
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_event_with_its_revision() {
        let sent = message("view", 42, br#"{"a":1}"#);
        assert_eq!(&sent[..], b"event: view\nid: 42\ndata: {\"a\":1}\n\n");
    }
}
