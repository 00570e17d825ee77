//! admission.k8s.io/v1 AdmissionReview: decoding a request body and answering it.
//!
//! One function from a body to a reply ([`review`]); the server only adds HTTP. A body that
//! is not a usable v1 review is an HTTP 400 with a one-line reason (the API server logs it
//! and applies the webhook's failurePolicy). A usable review is always answered
//! `allowed: true`: the injector never blocks a pod, it only fails to add the sidecar, and
//! says so in a warning.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::patch::{self, Decision, Exclusions, Outcome, Scope};
use crate::template::Template;

pub const API_VERSION: &str = "admission.k8s.io/v1";

/// The fields of an AdmissionReview request the injector reads. Unknown fields are
/// ignored: the API server adds fields over time.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<Request>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    kind: Option<GroupVersionKind>,
    resource: Option<GroupVersionResource>,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    object: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct GroupVersionResource {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    resource: String,
}

/// A body that is not a v1 AdmissionReview request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("not a JSON AdmissionReview: {0}")]
    Malformed(String),
    #[error("unsupported AdmissionReview {api_version}/{kind}: weir inject speaks admission.k8s.io/v1 (set admissionReviewVersions: [v1])")]
    WrongVersion { api_version: String, kind: String },
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request has an empty uid")]
    NoUid,
}

/// The answer to one review: the response body, and what happened.
#[derive(Debug, Clone)]
pub struct Reply {
    pub body: Value,
    pub decision: Decision,
    pub uid: String,
    pub namespace: String,
    /// `generateName` or `name` of the pod, for logs.
    pub pod: String,
}

/// Decodes `body` and decides. Pure apart from allocation.
pub fn review(
    body: &[u8],
    scope: Scope,
    template: &Template,
    exclusions: &Exclusions,
) -> Result<Reply, ReviewError> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| ReviewError::Malformed(e.to_string()))?;
    let api_version = review.api_version.unwrap_or_default();
    let kind = review.kind.unwrap_or_default();
    if api_version != API_VERSION || kind != "AdmissionReview" {
        return Err(ReviewError::WrongVersion { api_version, kind });
    }
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    let namespace = request
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            let ns = request.object.as_ref()?.pointer("/metadata/namespace")?.as_str()?;
            Some(ns.to_string())
        })
        .unwrap_or_default();
    let pod = request
        .object
        .as_ref()
        .and_then(|o| {
            let meta = o.get("metadata")?;
            meta.get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .or_else(|| meta.get("generateName").and_then(Value::as_str))
        })
        .unwrap_or("")
        .to_string();

    let decision = decide(&request, &namespace, scope, template, exclusions);
    let body = respond(&request.uid, &decision);
    Ok(Reply { body, decision, uid: request.uid, namespace, pod })
}

fn decide(
    request: &Request,
    namespace: &str,
    scope: Scope,
    template: &Template,
    exclusions: &Exclusions,
) -> Decision {
    let ignored = |reason: String| Decision {
        outcome: Outcome::Ignored,
        patch: Vec::new(),
        warnings: vec![format!("weir inject: {reason}; check the webhook's rules")],
        reason,
    };
    let is_pod_resource = request
        .resource
        .as_ref()
        .is_some_and(|r| r.group.is_empty() && r.version == "v1" && r.resource == "pods");
    let is_pod_kind = request
        .kind
        .as_ref()
        .is_some_and(|k| k.group.is_empty() && k.version == "v1" && k.kind == "Pod");
    if !is_pod_resource
        || !is_pod_kind
        || request.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
    {
        return ignored("the review is not about a v1 Pod".into());
    }
    if request.operation.as_deref() != Some("CREATE") {
        return ignored(format!(
            "operation {} is not CREATE",
            request.operation.as_deref().unwrap_or("(none)")
        ));
    }
    let Some(object) = &request.object else {
        return ignored("the review carries no object".into());
    };
    if !object.is_object() {
        return ignored("the review's object is not a mapping".into());
    }
    if namespace.is_empty() {
        return ignored("the review names no namespace".into());
    }
    patch::plan(object, namespace, scope, template, exclusions)
}

/// The AdmissionReview response for `decision`.
pub fn respond(uid: &str, decision: &Decision) -> Value {
    let mut response = json!({ "uid": uid, "allowed": true });
    if !decision.patch.is_empty() {
        // Serialising plain strings and JSON values cannot fail.
        let patch = serde_json::to_vec(&decision.patch).unwrap_or_default();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    if !decision.warnings.is_empty() {
        response["warnings"] = json!(decision.warnings);
    }
    json!({ "apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response })
}
