//! `GET /v1/backup`: the store as a backup payload (see
//! [`cca_store::backup::payload`]), streamed from a consistent snapshot
//! while the cluster goes on writing. `cca backup` seals it into a file with
//! the operator's key, which never reaches the server. A stream that fails
//! midway ends without its end record, so the client cannot mistake it for
//! a whole one.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use cca_store::backup::payload::{PAYLOAD_FORMAT, PayloadHeader, Record};
use tokio::sync::mpsc;

use crate::error::ApiResult;
use crate::state::ApiState;

/// Keys per snapshot page, and so per chunk of the response.
const PAGE: usize = 1024;

pub(crate) async fn backup(State(state): State<ApiState>) -> ApiResult<Response> {
    let mut snapshot = state.shared_store().snapshot(PAGE).await?;
    let store = state
        .cache()
        .view()
        .store_identity
        .as_ref()
        .map(|identity| identity.value.id.clone());
    let header = PayloadHeader {
        format: PAYLOAD_FORMAT,
        revision: snapshot.revision,
        keys: snapshot.count,
        store,
    };
    let (chunks, mut receiver) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        if chunks.send(Bytes::from(header.encode())).await.is_err() {
            return;
        }
        let mut keys = 0u64;
        while let Some(page) = snapshot.pages.recv().await {
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "a backup's snapshot failed midway; the stream ends without its end record");
                    return;
                }
            };
            let mut bytes = Vec::new();
            for kv in page {
                Record::Key { kv }.encode(&mut bytes);
                keys += 1;
            }
            if chunks.send(Bytes::from(bytes)).await.is_err() {
                return;
            }
        }
        let mut end = Vec::new();
        Record::End { keys, files: 0 }.encode(&mut end);
        let _ = chunks.send(Bytes::from(end)).await;
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        receiver
            .poll_recv(cx)
            .map(|chunk| chunk.map(Ok::<_, Infallible>))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}
