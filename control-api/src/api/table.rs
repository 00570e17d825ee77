//! The table endpoints: get, put (If-Match, persist, swap) and the validate dry run.

use std::sync::Arc;

use admission_core::table::{CompiledTable, PriorityTable};
use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;

use super::headers::{accepted_format, body_format, if_match, Format};
use super::{insert_etag, to_json};
use crate::error::ControlError;
use crate::response::{body_response, etag, json_response};
use crate::server::ControlPlane;

/// The answer to an accepted PUT or validate.
#[derive(Serialize)]
struct Accepted {
    version: u64,
    rules: usize,
    least_important_business: u8,
}

// === impl ControlPlane (table endpoints) ===

impl ControlPlane {
    pub(super) fn get_table(
        &self,
        headers: &HeaderMap,
    ) -> Result<Response<Full<Bytes>>, ControlError> {
        let table = self.table.load_full();
        let tag = etag(table.version());
        let mut response = if headers.get(header::IF_NONE_MATCH).is_some_and(|v| v == tag.as_str())
        {
            body_response(StatusCode::NOT_MODIFIED, "text/plain", Bytes::new())
        } else {
            match accepted_format(headers) {
                Format::Json => json_response(StatusCode::OK, table.source().to_json_pretty()),
                Format::Yaml => {
                    body_response(StatusCode::OK, "application/yaml", table.source().to_yaml())
                }
            }
        };
        insert_etag(response.headers_mut(), table.version());
        Ok(response)
    }

    pub(super) async fn put_table(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, ControlError> {
        self.authorize(req.headers()).await?;
        let format = body_format(req.headers())?;
        let if_match = if_match(req.headers())?;
        let body = self.read_body(req).await?;
        let committed = self
            .write_table(move |plane| plane.commit(parse(&body, format)?, if_match, None))
            .await?;
        tracing::info!(version = committed.version(), "priority table replaced through the API");
        let mut response = to_json(StatusCode::OK, &accepted(&committed))?;
        insert_etag(response.headers_mut(), committed.version());
        Ok(response)
    }

    /// Dry run of a PUT: parse and validate, change nothing. Needs no token.
    pub(super) async fn validate_table(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, ControlError> {
        let format = body_format(req.headers())?;
        let permit = self.table_check_permit().await?;
        let body = self.read_body(req).await?;
        // The answer is made on the check thread, which frees the parsed table too.
        let answer = self
            .check_table(permit, move |plane| {
                Ok(accepted(&plane.table.load().compile_next(&parse(&body, format)?)?))
            })
            .await?;
        to_json(StatusCode::OK, &answer)
    }

    /// The whole body, within `max_body_bytes` and `timeouts.body_read`.
    async fn read_body(&self, req: Request<Incoming>) -> Result<Bytes, ControlError> {
        let limit = self.cfg.max_body_bytes;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ControlError::PayloadTooLarge { limit });
        }
        let timeout = self.cfg.timeouts.body_read;
        let collect = Limited::new(req.into_body(), limit).collect();
        let body = tokio::time::timeout(timeout, collect)
            .await
            .map_err(|_| {
                ControlError::Timeout(format!(
                    "the request body did not arrive within admin.timeouts.body_read ({})",
                    humantime_serde::re::humantime::format_duration(timeout)
                ))
            })?
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ControlError::PayloadTooLarge { limit }
                } else {
                    ControlError::BadRequest(format!("could not read the request body: {e}"))
                }
            })?;
        Ok(body.to_bytes())
    }
}

/// A table document (blocking: runs inside [`ControlPlane::check_table`]).
fn parse(body: &[u8], format: Format) -> Result<PriorityTable, ControlError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ControlError::BadRequest(format!("request body is not UTF-8: {e}")))?;
    let parsed = match format {
        Format::Yaml => PriorityTable::from_yaml(text),
        Format::Json => PriorityTable::from_json(text),
    };
    Ok(parsed?)
}

fn accepted(t: &CompiledTable) -> Accepted {
    Accepted {
        version: t.version(),
        rules: t.source().rules.len(),
        least_important_business: t.least_important_business(),
    }
}
