//! Request headers of the admin API: the bearer token, body and response formats, If-Match.

use http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use super::TABLE;
use crate::error::ControlError;
use crate::server::ControlPlane;

/// Body formats of the table endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Yaml,
    Json,
}

// === impl ControlPlane (auth) ===

impl ControlPlane {
    /// `Authorization: Bearer <token>` against the token file, re-read each time so a
    /// rotated Secret takes effect without a restart.
    pub(super) async fn authorize(&self, headers: &HeaderMap) -> Result<(), ControlError> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or(ControlError::Unauthorized)?;
        let Some(path) = &self.cfg.token_file else {
            return Err(ControlError::Forbidden(
                "mutations are disabled: no admin.token_file is configured",
            ));
        };
        let expected = match tokio::fs::read_to_string(path).await {
            Ok(t) => t.trim().to_owned(),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot read the admin token file");
                return Err(ControlError::Forbidden(
                    "mutations are disabled: the token file is unreadable",
                ));
            }
        };
        if expected.is_empty() {
            return Err(ControlError::Forbidden("mutations are disabled: the token file is empty"));
        }
        if bool::from(presented.as_bytes().ct_eq(expected.as_bytes())) {
            Ok(())
        } else {
            Err(ControlError::Forbidden("wrong token"))
        }
    }
}

/// The body format from `Content-Type`; anything else is 415.
pub(super) fn body_format(headers: &HeaderMap) -> Result<Format, ControlError> {
    let raw = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence =
        raw.as_deref().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(Format::Json),
        "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" => Ok(Format::Yaml),
        _ if essence.ends_with("+json") => Ok(Format::Json),
        _ if essence.ends_with("+yaml") => Ok(Format::Yaml),
        _ => {
            Err(ControlError::UnsupportedMediaType { got: raw.unwrap_or_else(|| "(none)".into()) })
        }
    }
}

/// The response format from `Accept`: the first of JSON or YAML it names, else YAML.
pub(super) fn accepted_format(headers: &HeaderMap) -> Format {
    let accept = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok());
    for item in accept.flat_map(|v| v.split(',')) {
        let essence = item.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if essence == "application/json" || essence.ends_with("+json") {
            return Format::Json;
        }
        if essence.contains("yaml") {
            return Format::Yaml;
        }
    }
    Format::Yaml
}

/// `If-Match: "12"` (or `12`) -> `Some(12)`; `*` -> `None` (any version). Missing -> 428.
pub(super) fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ControlError> {
    let value = headers.get(header::IF_MATCH).ok_or(ControlError::PreconditionRequired)?;
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(None);
    }
    text.trim_matches('"').parse::<u64>().map(Some).map_err(|_| {
        ControlError::BadRequest(format!(
            "If-Match `{text}` is not a table version such as \"12\" (from the ETag of GET {TABLE})"
        ))
    })
}
