//! The API's one error type: a status code and a message, always answered
//! as JSON `{"error": "..."}` (with `"problems": [...]` for a program that
//! breaks the model's rules). Store errors map to statuses here (store
//! trouble is 503, never 500); request extractors here turn axum's plain
//! text rejections (bad JSON, wrong types, oversized bodies, bad query
//! strings) into the same JSON shape. An error that asks the client to
//! come back later (a shed request, 429; a full stream bound, 503)
//! carries `Retry-After`.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cca_model::validity::Problem;
use cca_store::StoreError;
use serde::de::DeserializeOwned;

use crate::types::ErrorBody;

/// A failed request: what to answer and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// What is wrong with a refused program, each problem on its own.
    pub problems: Vec<Problem>,
    /// How long the client should wait before trying again, sent as
    /// `Retry-After` in whole seconds (rounded up, at least 1).
    pub retry_after: Option<Duration>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            problems: Vec::new(),
            retry_after: None,
        }
    }

    /// The same error, listing `problems` in its body.
    pub fn with_problems(mut self, problems: Vec<Problem>) -> Self {
        self.problems = problems;
        self
    }

    /// The same error, telling the client to wait `after` before retrying.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The request is malformed (400).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// The request is well-formed but asks for something invalid (422).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    /// A named thing does not exist (404).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// The request conflicts with the current state (409).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// The server cannot serve now; retrying later may work (503).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// A bug or a broken fact on our side (500); never caused by input.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The error's body as JSON, with its status as `status`: what a
    /// stream sends when it cannot answer with a status of its own.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::json!({
            "status": self.status.as_u16(),
            "error": self.message,
            "problems": self.problems,
        })
        .to_string()
        .into_bytes()
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let status = match &error {
            StoreError::Unavailable { .. }
            | StoreError::OutcomeUnknown { .. }
            | StoreError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::LeaseNotFound(_) => StatusCode::CONFLICT,
            StoreError::Compacted { .. } => StatusCode::GONE,
            StoreError::InvalidRequest(_) | StoreError::FutureRevision { .. } => {
                StatusCode::BAD_REQUEST
            }
            StoreError::InvalidUrl(_)
            | StoreError::DataFile { .. }
            | StoreError::Write { .. }
            | StoreError::Backend(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, error = %self.message, "request failed");
        }
        let retry_after = self.retry_after.map(retry_after_seconds);
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: self.message,
                problems: self.problems,
            }),
        )
            .into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// `Retry-After` is whole seconds: rounded up, so a client never comes
/// back earlier than asked, and at least 1.
pub(crate) fn retry_after_seconds(after: Duration) -> u64 {
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    seconds.max(1)
}

/// A JSON request body whose every rejection is a JSON error: 400 for
/// syntax, 422 for wrong types or missing fields, 413 past the body limit,
/// 415 without `Content-Type: application/json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection(&rejection)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> ApiError {
    let status = rejection.status();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "request body is larger than the server accepts".into(),
        _ => rejection.body_text(),
    };
    ApiError::new(status, message)
}

/// Query parameters whose rejection is a JSON 400.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryArgs<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|rejection: QueryRejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// Answers routes that do not exist.
pub(crate) async fn no_route() -> ApiError {
    ApiError::not_found("no such endpoint; see docs/api.md")
}

/// Answers known paths called with the wrong method.
pub(crate) async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_trouble_is_503_and_keeps_the_message() {
        let error = ApiError::from(StoreError::Unavailable {
            reason: "etcd down".into(),
        });
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.message, "store unavailable: etcd down");
        let error = ApiError::from(StoreError::OutcomeUnknown {
            reason: "cut".into(),
        });
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let response = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy")
            .with_retry_after(Duration::from_millis(1500))
            .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(5)), 5);
        let plain = ApiError::unavailable("store down").into_response();
        assert!(!plain.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn lost_leases_are_conflicts() {
        let error = ApiError::from(StoreError::LeaseNotFound(7));
        assert_eq!(error.status, StatusCode::CONFLICT);
        assert_eq!(
            error.to_string(),
            "409 Conflict: lease 7 not found: it expired or was revoked"
        );
    }
}
