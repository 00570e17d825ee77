//! Routing and the endpoint handlers (docs/design.md, "Control API").

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::Serialize;

use crate::error::ControlError;
use crate::metrics::{render, Scrape};
use crate::response::{body_response, etag, json_response};
use crate::server::ControlPlane;
use crate::status::StatusDoc;

pub(crate) const TABLE: &str = "/v1/priority-table";
const VALIDATE: &str = "/v1/priority-table/validate";

// === impl ControlPlane (routes) ===

impl ControlPlane {
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        public: bool,
    ) -> Response<Full<Bytes>> {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let result = match (&method, path.as_str()) {
            (&Method::GET, "/live") => Ok(body_response(StatusCode::OK, "text/plain", "live\n")),
            (&Method::GET, "/ready") => Ok(self.ready()),
            (&Method::GET, "/metrics") => Ok(self.metrics()),
            _ if public => Err(ControlError::NotFound),
            (&Method::GET, "/v1/status") => self.status(),
            (&Method::GET, "/v1/audit") => to_json(StatusCode::OK, &self.audit_report()),
            (&Method::GET, TABLE) => self.get_table(req.headers()),
            (&Method::PUT, TABLE) => self.put_table(req).await,
            (&Method::POST, VALIDATE) => self.validate_table(req).await,
            (_, "/live" | "/ready" | "/metrics" | "/v1/status" | "/v1/audit") => {
                Err(ControlError::MethodNotAllowed { allow: "GET" })
            }
            (_, TABLE) => Err(ControlError::MethodNotAllowed { allow: "GET, PUT" }),
            (_, VALIDATE) => Err(ControlError::MethodNotAllowed { allow: "POST" }),
            _ => Err(ControlError::NotFound),
        };
        result.unwrap_or_else(|e| {
            // Busy is back-pressure working as intended, not a failure to page about.
            let busy = matches!(e, ControlError::Busy(_) | ControlError::WriteBusy(_));
            if e.status().is_server_error() && !busy {
                tracing::error!(%method, path, error = %e, "admin request failed");
            } else {
                tracing::debug!(%method, path, error = %e, "admin request refused");
            }
            e.to_response()
        })
    }

    fn ready(&self) -> Response<Full<Bytes>> {
        if self.view.ready() {
            body_response(StatusCode::OK, "text/plain", "ready\n")
        } else {
            body_response(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
        }
    }

    fn metrics(&self) -> Response<Full<Bytes>> {
        let status = self.view.status();
        let counters = self.audit.snapshot();
        let egress = self.view.egress_counters();
        let audit = self.audit_report();
        let table = self.table.load_full();
        let text = render(&Scrape {
            recorder: self.metrics.render(),
            status: &status,
            table_version: table.version(),
            table_digest: crate::metrics::table_digest(table.source()),
            counters: &counters,
            egress: egress.as_ref(),
            last_minute: &audit.last_1m,
            table_file_rejections: self.table_file_rejections.load(Ordering::Relaxed),
            table_file_unreadable: self.table_file_unreadable.load(Ordering::Relaxed),
        });
        body_response(StatusCode::OK, "text/plain; version=0.0.4", text)
    }

    fn status(&self) -> Result<Response<Full<Bytes>>, ControlError> {
        to_json(StatusCode::OK, &StatusDoc::new(&self.view.status(), self.table.version()))
    }
}

pub(crate) fn to_json(
    status: StatusCode,
    value: &impl Serialize,
) -> Result<Response<Full<Bytes>>, ControlError> {
    let body =
        serde_json::to_vec_pretty(value).map_err(|e| ControlError::Internal(e.to_string()))?;
    Ok(json_response(status, body))
}

pub(crate) fn insert_etag(headers: &mut HeaderMap, version: u64) {
    if let Ok(v) = HeaderValue::from_str(&etag(version)) {
        headers.insert(header::ETAG, v);
    }
}

mod headers;
mod table;
