//! Every failure of the control plane, and the one place that turns it into HTTP.

use std::path::PathBuf;

use admission_core::table::TableErrors;
use admission_core::FieldError;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("missing or malformed `Authorization: Bearer <token>` header")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("no such endpoint")]
    NotFound,
    #[error("method not allowed; allowed: {allow}")]
    MethodNotAllowed { allow: &'static str },
    #[error("request body larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("unsupported content type `{got}`; send application/yaml or application/json")]
    UnsupportedMediaType { got: String },
    #[error("`If-Match: \"<version>\"` is required; GET the table first and send its ETag")]
    PreconditionRequired,
    #[error("the table changed: If-Match names version {expected}, current is {current}")]
    PreconditionFailed { expected: u64, current: u64 },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    InvalidTable(TableErrors),
    #[error("could not persist the table to {path}: {source}; the table was not changed")]
    Persist { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A setting or a start-up source, named by its field.
    #[error("{0}")]
    Config(FieldError),
    /// Too many table checks at once or waiting; try again shortly.
    #[error("busy: {0} table checks are already running; retry shortly")]
    Busy(usize),
    /// Another table write held the write permit for all of `admin.timeouts.write_wait`.
    #[error("busy: another table write is still running after admin.timeouts.write_wait ({0}); retry shortly")]
    WriteBusy(String),
    /// A client too slow to send its request.
    #[error("{0}")]
    Timeout(String),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: String,
    fields: &'a [admission_core::table::TableError],
}

// === impl ControlError ===

impl ControlError {
    pub fn status(&self) -> StatusCode {
        match self {
            ControlError::Unauthorized => StatusCode::UNAUTHORIZED,
            ControlError::Forbidden(_) => StatusCode::FORBIDDEN,
            ControlError::NotFound => StatusCode::NOT_FOUND,
            ControlError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ControlError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ControlError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ControlError::PreconditionRequired => StatusCode::PRECONDITION_REQUIRED,
            ControlError::PreconditionFailed { .. } => StatusCode::PRECONDITION_FAILED,
            ControlError::BadRequest(_) | ControlError::InvalidTable(_) => StatusCode::BAD_REQUEST,
            ControlError::Busy(_) | ControlError::WriteBusy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ControlError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ControlError::Persist { .. }
            | ControlError::Io { .. }
            | ControlError::Config(_)
            | ControlError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The HTTP answer: `{"error": "...", "fields": [{"path", "message"}...]}`.
    pub fn to_response(&self) -> Response<Full<Bytes>> {
        let fields = match self {
            ControlError::InvalidTable(errors) => errors.0.as_slice(),
            _ => &[],
        };
        let error = match self {
            ControlError::InvalidTable(errors) if is_malformed(errors) => {
                "malformed request body".to_owned()
            }
            ControlError::InvalidTable(errors) => {
                format!("invalid priority table ({} errors)", errors.len())
            }
            other => other.to_string(),
        };
        let body = serde_json::to_vec(&ErrorBody { error, fields }).unwrap_or_default();
        let mut response = crate::response::json_response(self.status(), body);
        let headers = response.headers_mut();
        match self {
            ControlError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ControlError::MethodNotAllowed { allow } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ControlError::Busy(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                // Its body was never read: the connection cannot carry another request.
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            ControlError::WriteBusy(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ControlError::PreconditionFailed { current, .. } => {
                if let Ok(v) = HeaderValue::from_str(&crate::response::etag(*current)) {
                    headers.insert(header::ETAG, v);
                }
            }
            _ => {}
        }
        response
    }
}

fn is_malformed(errors: &TableErrors) -> bool {
    errors.iter().any(|e| e.message.starts_with("malformed"))
}

impl From<TableErrors> for ControlError {
    fn from(errors: TableErrors) -> Self {
        ControlError::InvalidTable(errors)
    }
}
