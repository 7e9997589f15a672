//! The consumer end of a watch, shared by every backend: an ordered stream
//! of [`WatchMessage`]s fed by a backend task through a bounded channel.
//! Dropping the stream cancels the watch.

use tokio::sync::mpsc;

use crate::error::{Result, StoreError};
use crate::types::WatchMessage;

/// Messages buffered per watcher before the backend applies back-pressure.
pub(crate) const WATCH_BUFFER: usize = 1024;

/// An ordered stream of changes under one prefix.
#[derive(Debug)]
pub struct WatchStream {
    receiver: mpsc::Receiver<Result<WatchMessage>>,
}

impl WatchStream {
    /// A stream and the sender a backend feeds it through.
    pub(crate) fn channel() -> (mpsc::Sender<Result<WatchMessage>>, Self) {
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        (sender, Self { receiver })
    }

    /// The next message; `None` once the watch has ended (after a
    /// [`WatchMessage::Compacted`], an error, or the store closing).
    pub async fn next(&mut self) -> Option<Result<WatchMessage>> {
        self.receiver.recv().await
    }

    /// Like [`next`](Self::next) but fails with [`StoreError::Closed`]
    /// instead of returning `None`.
    pub async fn next_message(&mut self) -> Result<WatchMessage> {
        self.next().await.unwrap_or(Err(StoreError::Closed))
    }
}
