//! The egress role's own responses: a local refusal exactly as the downstream would have
//! sent it, a rejection (a request it will not send at all, with a one-line reason), and
//! weir's own errors; each carries the downstream's cached level (fully open when none is
//! known).

use admission_core::{AdmissionLevel, Priority};
use http::header::CONTENT_TYPE;
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Response};

use super::service::EgressService;
use super::stats::{EgressOutcome, Rejection};
use crate::body::ResponseBody;
use crate::http::respond;
use crate::refusal::{ShedReason, WeirError};

const DOWNSTREAM_LEVEL: HeaderValue = HeaderValue::from_static("downstream-level");
const DOWNSTREAM_GRPC_MESSAGE: HeaderValue = HeaderValue::from_static(
    "weir: the downstream sheds this priority now, retry after the pushback",
);
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

impl EgressService {
    /// The downstream's fresh cached level, or fully open when nothing is known.
    pub(super) fn level_value(&self, authority: Option<&Authority>) -> HeaderValue {
        let level = authority
            .and_then(|a| self.levels.level(a.as_str()))
            .unwrap_or(AdmissionLevel::FULLY_OPEN);
        self.refusals.level_value(level)
    }

    /// Refuses locally, counted with `outcome` ([`EgressOutcome::ShedDeadline`] or
    /// [`EgressOutcome::ShedDownstream`]), exactly as the downstream would have refused it.
    pub(super) fn refuse(
        &self,
        authority: &Authority,
        grpc: bool,
        priority: Priority,
        outcome: EgressOutcome,
    ) -> Response<ResponseBody> {
        self.stats.record(priority.business, outcome);
        let (reason, wait) = match outcome {
            EgressOutcome::ShedDeadline => (ShedReason::Deadline, None),
            // The longer the downstream's level refuses this class, the longer the wait.
            _ => (ShedReason::Overload, Some(self.ages.refuse(priority.business))),
        };
        let (status, mut headers) = self.refusals.refusal_head_after(grpc, reason, wait);
        if outcome == EgressOutcome::ShedDownstream {
            headers.insert(self.names.shed.clone(), DOWNSTREAM_LEVEL);
            if grpc {
                headers.insert(GRPC_MESSAGE, DOWNSTREAM_GRPC_MESSAGE);
            }
        }
        headers.insert(self.names.level.clone(), self.level_value(Some(authority)));
        respond(status, headers)
    }

    /// Refuses to send the request at all (see [`Rejection`]), with a one-line reason.
    pub(super) fn reject(
        &self,
        rejection: Rejection,
        authority: Option<&Authority>,
        grpc: bool,
    ) -> Response<ResponseBody> {
        self.stats.reject(rejection);
        let (status, mut headers) = self.refusals.error_head(rejection.error(), grpc);
        headers.insert(self.names.level.clone(), self.level_value(authority));
        let message = rejection.message();
        if grpc {
            headers.insert(GRPC_STATUS, HeaderValue::from_static(rejection.grpc_status()));
            headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
            return respond(status, headers);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(message.len() + 1));
        let mut resp = respond(status, headers);
        *resp.body_mut() = ResponseBody::full(format!("{message}\n").into(), None);
        resp
    }

    pub(super) fn error(
        &self,
        authority: Option<&Authority>,
        error: WeirError,
        grpc: bool,
    ) -> Response<ResponseBody> {
        self.stats.error();
        let (status, mut headers) = self.refusals.error_head(error, grpc);
        headers.insert(self.names.level.clone(), self.level_value(authority));
        respond(status, headers)
    }
}
