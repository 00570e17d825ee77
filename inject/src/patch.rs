//! The injection decision, as a pure function: a pod (as the API server sends it), the
//! template and where the review came from -> an RFC 6902 JSON Patch, or a reason not to.
//!
//! Opt-in and opt-out, strongest first:
//! 1. never: namespaces in the exclusion list (kube-system, ...) and the injector's own
//!    namespace; `hostNetwork` pods (weir's ports would be the node's); pods that are meant
//!    to finish (`restartPolicy` Never/OnFailure) when the template is a regular container.
//! 2. the pod annotation `weir.dev/inject: "false"` (opt-out wins over every opt-in); any
//!    value other than `"true"` or `"false"` means no injection too, with a warning. The pod
//!    label `weir.dev/inject: disabled` (or `"false"`) is filtered by the webhook's
//!    objectSelector and never reaches the server; it is honoured here too.
//! 3. the namespace label `weir.dev/inject=enabled`: the webhook's namespaceSelector sends
//!    such pods to `/inject/namespace` ([`Scope::Namespace`]). The server has no API access
//!    (no RBAC), so the namespace's labels reach it only through that choice of path.
//! 4. the pod label `weir.dev/inject: "true"` (or `enabled`), for pods elsewhere
//!    (`/inject/pod`): the webhook's objectSelector sends only such pods, so the API server
//!    calls the injector for no pod that did not ask. The annotation `weir.dev/inject:
//!    "true"` is honoured on `/inject/pod` too, but alone it never gets a pod there.
//!
//! A pod that asked for weir and cannot have it ([`Outcome::CannotInject`]) is admitted
//! without the sidecar, and says why: the patch adds only the annotation
//! `weir.dev/inject-status: "skipped: <reason>"` (an injected pod gets `injected`), the
//! review carries a warning, and the server logs it at WARN.
//!
//! A pod that already holds a container named like the template's is left alone (empty
//! patch): re-invocation and re-submission of an injected pod change nothing.
//!
//! Per-pod overrides (annotations, each checked; a bad value means no injection and a
//! warning naming the annotation, never a sidecar that crash-loops):
//! `weir.dev/app-port` (`--app 127.0.0.1:PORT`), `weir.dev/max-inflight` (`--max-inflight`),
//! `weir.dev/entry` (`--entry`), `weir.dev/egress` (`--egress ADDR` and `HTTP_PROXY` on the
//! app containers; only when the template names an egress listener).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::template::{Placement, Template};

pub const INJECT: &str = "weir.dev/inject";
pub const INJECTED: &str = "weir.dev/injected";
/// `injected`, or `skipped: <reason>` on a pod that asked for weir and could not have it.
pub const INJECT_STATUS: &str = "weir.dev/inject-status";
pub const APP_PORT: &str = "weir.dev/app-port";
pub const MAX_INFLIGHT: &str = "weir.dev/max-inflight";
pub const ENTRY: &str = "weir.dev/entry";
pub const EGRESS: &str = "weir.dev/egress";
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
/// `NO_PROXY` set with the egress proxy: loopback stays direct.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Which webhook sent the review (the URL path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `/inject/namespace`: the namespace carries `weir.dev/inject=enabled`.
    Namespace,
    /// `/inject/pod`: inject only if the pod asks (label `weir.dev/inject: "true"`).
    Pod,
}

/// Namespaces the injector never touches.
#[derive(Debug, Clone, Default)]
pub struct Exclusions {
    pub namespaces: BTreeSet<String>,
}

impl Exclusions {
    /// kube-system, kube-public, kube-node-lease, plus `own` (the injector's namespace).
    pub fn defaults(own: Option<&str>) -> Self {
        let mut namespaces: BTreeSet<String> =
            ["kube-system", "kube-public", "kube-node-lease"].map(String::from).into();
        namespaces.extend(own.map(String::from));
        Exclusions { namespaces }
    }
}

/// One RFC 6902 operation. The injector only ever adds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchOp {
    pub op: &'static str,
    pub path: String,
    pub value: Value,
}

/// Why a pod was or was not injected; one Prometheus counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Injected,
    AlreadyInjected,
    NotOptedIn,
    OptedOut,
    ExcludedNamespace,
    /// Not a pod CREATE (the webhook's rules should prevent it).
    Ignored,
    /// Opted in, but injecting would break the pod; admitted without, with a warning.
    CannotInject,
    /// The review itself was unusable (HTTP error response).
    BadReview,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Injected,
        Outcome::AlreadyInjected,
        Outcome::NotOptedIn,
        Outcome::OptedOut,
        Outcome::ExcludedNamespace,
        Outcome::Ignored,
        Outcome::CannotInject,
        Outcome::BadReview,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::AlreadyInjected => "already_injected",
            Outcome::NotOptedIn => "not_opted_in",
            Outcome::OptedOut => "opted_out",
            Outcome::ExcludedNamespace => "excluded_namespace",
            Outcome::Ignored => "ignored",
            Outcome::CannotInject => "cannot_inject",
            Outcome::BadReview => "bad_review",
        }
    }
}

/// The result of [`plan`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// Empty unless injected.
    pub patch: Vec<PatchOp>,
    /// Why (for logs), always set.
    pub reason: String,
    /// Shown to the user by kubectl (only when something the user asked for did not happen).
    pub warnings: Vec<String>,
}

impl Decision {
    fn skip(outcome: Outcome, reason: impl Into<String>) -> Self {
        Decision { outcome, patch: Vec::new(), reason: reason.into(), warnings: Vec::new() }
    }

    fn cannot(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        let warnings = vec![format!("weir sidecar not injected: {reason}")];
        Decision { outcome: Outcome::CannotInject, patch: Vec::new(), reason, warnings }
    }
}

/// Decides what to do with `pod` (the review's `request.object`), created in `namespace`.
pub fn plan(
    pod: &Value,
    namespace: &str,
    scope: Scope,
    template: &Template,
    exclusions: &Exclusions,
) -> Decision {
    let mut decision = decide(pod, namespace, scope, template, exclusions);
    if decision.outcome == Outcome::CannotInject {
        decision.patch = skipped_status(pod, &decision.reason);
    }
    decision
}

/// The patch of a pod admitted without the sidecar it asked for: only its status
/// annotation, so `kubectl get pod -o yaml` (and the WeirInjectionSkipped alert's
/// description) shows why.
fn skipped_status(pod: &Value, reason: &str) -> Vec<PatchOp> {
    let meta = pod.get("metadata").and_then(Value::as_object);
    let exists = meta.and_then(|m| m.get("annotations")).is_some_and(Value::is_object);
    let status = [(INJECT_STATUS.to_string(), format!("skipped: {reason}"))].into();
    let mut ops = Vec::new();
    if meta.is_none() {
        ops.push(PatchOp { op: "add", path: "/metadata".into(), value: json!({}) });
    }
    let mut add = |path: String, value: Value| ops.push(PatchOp { op: "add", path, value });
    add_entries(&mut add, "/metadata/annotations", exists, &status);
    ops
}

fn decide(
    pod: &Value,
    namespace: &str,
    scope: Scope,
    template: &Template,
    exclusions: &Exclusions,
) -> Decision {
    let Some(spec) = pod.get("spec").and_then(Value::as_object) else {
        return Decision::cannot("the pod has no spec");
    };
    let meta = pod.get("metadata").and_then(Value::as_object);
    let annotations = meta.and_then(|m| m.get("annotations")).and_then(Value::as_object);
    let labels = meta.and_then(|m| m.get("labels")).and_then(Value::as_object);
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);

    if exclusions.namespaces.contains(namespace) {
        return Decision::skip(
            Outcome::ExcludedNamespace,
            format!("namespace {namespace} is excluded"),
        );
    }
    let containers = array(spec, "containers");
    let init_containers = array(spec, "initContainers");
    let named =
        |c: &Value| c.get("name").and_then(Value::as_str) == Some(template.container_name.as_str());
    if containers.iter().chain(init_containers).any(named) {
        return Decision::skip(
            Outcome::AlreadyInjected,
            format!("the pod already has a {} container", template.container_name),
        );
    }
    let label = labels.and_then(|l| l.get(INJECT)).and_then(Value::as_str).map(str::trim);
    let mut via = match scope {
        Scope::Namespace => "namespace label",
        Scope::Pod => "pod label",
    };
    match annotation(INJECT).map(str::trim) {
        Some(v) if is_false(v) => {
            return Decision::skip(Outcome::OptedOut, format!("annotation {INJECT}: {v:?}"));
        }
        _ if label.is_some_and(is_false) => {
            let v = label.unwrap_or_default();
            return Decision::skip(Outcome::OptedOut, format!("label {INJECT}: {v}"));
        }
        _ if label.is_some_and(is_true) => {}
        Some(v) if is_true(v) && scope == Scope::Pod => via = "pod annotation",
        Some(v) if is_true(v) => {}
        Some(v) => {
            // The user meant something: say that it was not understood, and do not inject
            // (in a labelled namespace too: `False`, `0`, `no`, `off` are opt-outs).
            let outcome = if scope == Scope::Pod { Outcome::NotOptedIn } else { Outcome::OptedOut };
            let mut d = Decision::skip(outcome, format!("annotation {INJECT}: {v:?}"));
            d.warnings.push(format!(
                "weir sidecar not injected: {INJECT}: want \"true\" or \"false\", got {v:?}"
            ));
            return d;
        }
        _ if scope == Scope::Pod => {
            return Decision::skip(
                Outcome::NotOptedIn,
                "neither the namespace nor the pod opts in",
            );
        }
        _ => {}
    }
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        return Decision::cannot("hostNetwork pods share the node's ports");
    }
    // A regular sidecar never exits, so a pod meant to finish (a Job's) would run forever.
    // A native sidecar is stopped by the kubelet once the app containers are done.
    let restart = spec.get("restartPolicy").and_then(Value::as_str).unwrap_or("Always");
    if restart != "Always" && template.placement == Placement::Containers {
        return Decision::cannot(format!(
            "restartPolicy {restart} pods (Jobs) need a native sidecar (Kubernetes >= 1.29, sidecar.native)"
        ));
    }

    // Per-pod overrides, all checked before anything is patched.
    let mut weir_ports = template.container_ports();
    // The egress listener is loopback-only (no container port) but still weir's.
    weir_ports.extend(template.egress_listen.map(|a| a.port()));
    let mut extra_args: Vec<String> = Vec::new();
    if let Some(v) = annotation(APP_PORT) {
        match v.trim().parse::<u16>() {
            Ok(p) if p > 0 && !weir_ports.contains(&p) => {
                extra_args.extend(["--app".into(), format!("127.0.0.1:{p}")]);
            }
            Ok(p) if p > 0 => {
                return Decision::cannot(format!("{APP_PORT}: {p} is a port weir listens on"))
            }
            _ => return Decision::cannot(format!("{APP_PORT}: want a port 1-65535, got {v:?}")),
        }
    }
    if let Some(v) = annotation(MAX_INFLIGHT) {
        match v.trim().parse::<u32>() {
            Ok(n) if (1..=1_000_000).contains(&n) => {
                extra_args.extend(["--max-inflight".into(), n.to_string()])
            }
            _ => return Decision::cannot(format!("{MAX_INFLIGHT}: want 1-1000000, got {v:?}")),
        }
    }
    let mut entry = false;
    match annotation(ENTRY).map(str::trim) {
        None => {}
        Some(v) if is_true(v) => {
            extra_args.push("--entry".into());
            entry = true;
        }
        Some(v) if is_false(v) => {}
        Some(v) => {
            return Decision::cannot(format!("{ENTRY}: want \"true\" or \"false\", got {v:?}"))
        }
    }
    let mut warnings = Vec::new();
    let egress = match annotation(EGRESS).map(str::trim) {
        None => None,
        Some(v) if is_false(v) => None,
        Some(v) if is_true(v) => match template.egress_listen {
            Some(addr) => {
                extra_args.extend(["--egress".into(), addr.to_string()]);
                Some(addr)
            }
            None => {
                warnings.push(format!(
                    "{EGRESS} ignored: this weir has no egress listener (the injector template names none)"
                ));
                None
            }
        },
        Some(v) => {
            return Decision::cannot(format!("{EGRESS}: want \"true\" or \"false\", got {v:?}"))
        }
    };

    // Conflicts the API server would reject, or that would make weir fail to bind.
    for c in containers.iter().chain(init_containers) {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
        for p in c.get("ports").and_then(Value::as_array).into_iter().flatten() {
            let port = p.get("containerPort").and_then(Value::as_u64).unwrap_or(0);
            if weir_ports.iter().any(|w| u64::from(*w) == port) {
                return Decision::cannot(format!(
                    "container {name} uses port {port}, which weir listens on"
                ));
            }
        }
    }
    let existing_volumes: BTreeSet<&str> = array(spec, "volumes")
        .iter()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    for v in &template.volumes {
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if existing_volumes.contains(name) {
            return Decision::cannot(format!("the pod already has a volume named {name}"));
        }
    }

    // The patch. Paths into arrays that may be absent are created whole.
    let mut ops = Vec::new();
    let mut add = |path: String, value: Value| ops.push(PatchOp { op: "add", path, value });

    let mut container = template.container.clone();
    if !extra_args.is_empty() {
        if let Some(args) = container.get_mut("args").and_then(Value::as_array_mut) {
            args.extend(extra_args.iter().cloned().map(Value::String));
        } else if let Some(c) = container.as_object_mut() {
            let mut args = vec![Value::from("run")];
            args.extend(extra_args.iter().cloned().map(Value::String));
            c.insert("args".into(), Value::Array(args));
        }
    }
    match template.placement {
        Placement::InitContainers if spec.contains_key("initContainers") => {
            add("/spec/initContainers/0".into(), container)
        }
        Placement::InitContainers => add("/spec/initContainers".into(), json!([container])),
        Placement::Containers if spec.contains_key("containers") => {
            add("/spec/containers/-".into(), container)
        }
        Placement::Containers => add("/spec/containers".into(), json!([container])),
    }
    if spec.contains_key("volumes") {
        for v in &template.volumes {
            add("/spec/volumes/-".into(), v.clone());
        }
    } else if !template.volumes.is_empty() {
        add("/spec/volumes".into(), Value::Array(template.volumes.clone()));
    }
    if let Some(addr) = egress {
        let proxy = format!("http://{addr}");
        for (i, c) in containers.iter().enumerate() {
            let env = c.get("env").and_then(Value::as_array);
            let set: BTreeSet<&str> = env
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("name").and_then(Value::as_str))
                .collect();
            // The app's own proxy settings win, as a pair: clients differ in which spelling
            // they read first, so a container that names either keeps its own proxy.
            let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
            if set.contains("HTTP_PROXY") || set.contains("http_proxy") {
                warnings.push(format!(
                    "{EGRESS}: container {name} sets its own HTTP proxy; its calls bypass weir's egress"
                ));
                continue;
            }
            let mut pairs = vec![("HTTP_PROXY", proxy.as_str()), ("http_proxy", proxy.as_str())];
            // Calls to the pod itself (the sidecar's admin API, the app's own ports) stay direct.
            if !set.contains("NO_PROXY") && !set.contains("no_proxy") {
                pairs.extend([("NO_PROXY", NO_PROXY), ("no_proxy", NO_PROXY)]);
            }
            let wanted: Vec<Value> =
                pairs.into_iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
            if env.is_some() {
                for e in wanted {
                    add(format!("/spec/containers/{i}/env/-"), e);
                }
            } else if !wanted.is_empty() {
                add(format!("/spec/containers/{i}/env"), Value::Array(wanted));
            }
        }
    }
    if let Some(grace) = template.termination_grace_period_seconds {
        let current = spec.get("terminationGracePeriodSeconds").and_then(Value::as_i64);
        if current.is_none_or(|c| c < grace) {
            // "add" replaces an existing member (RFC 6902 4.1).
            add("/spec/terminationGracePeriodSeconds".into(), json!(grace));
        }
    }
    let mut new_labels = template.pod_labels.clone();
    // The entry label the chart's NetworkPolicy selects on (entries are reachable from
    // outside the mesh; inner hops only from weir pods), as the chart's own pods carry it.
    if entry {
        new_labels.insert(ENTRY.into(), "true".into());
    }
    new_labels
        .retain(|k, v| labels.and_then(|l| l.get(k)).and_then(Value::as_str) != Some(v.as_str()));
    add_entries(&mut add, "/metadata/labels", labels.is_some(), &new_labels);
    let mut new_annotations = template.pod_annotations.clone();
    new_annotations.insert(INJECTED.into(), "true".into());
    new_annotations.insert(INJECT_STATUS.into(), "injected".into());
    // `kubectl logs/exec` without -c pick this container: the app's, not weir's.
    if annotation(DEFAULT_CONTAINER).is_none() {
        if let Some(first) = containers.first().and_then(|c| c.get("name")).and_then(Value::as_str)
        {
            new_annotations.insert(DEFAULT_CONTAINER.into(), first.into());
        }
    }
    add_entries(&mut add, "/metadata/annotations", annotations.is_some(), &new_annotations);
    if meta.is_none() {
        // Not reachable for a real pod (metadata is required); keeps the patch applicable.
        ops.insert(0, PatchOp { op: "add", path: "/metadata".into(), value: json!({}) });
    }

    Decision {
        outcome: Outcome::Injected,
        patch: ops,
        reason: format!("opted in by {via}"),
        warnings,
    }
}

fn add_entries(
    add: &mut impl FnMut(String, Value),
    path: &str,
    exists: bool,
    entries: &std::collections::BTreeMap<String, String>,
) {
    if entries.is_empty() {
        return;
    }
    if exists {
        for (k, v) in entries {
            add(format!("{path}/{}", escape(k)), Value::String(v.clone()));
        }
    } else {
        let map: Map<String, Value> =
            entries.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        add(path.into(), Value::Object(map));
    }
}

fn array<'a>(spec: &'a Map<String, Value>, key: &str) -> &'a [Value] {
    spec.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// RFC 6901: `~` -> `~0`, `/` -> `~1`.
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn is_true(v: &str) -> bool {
    matches!(v, "true" | "enabled")
}

fn is_false(v: &str) -> bool {
    matches!(v, "false" | "disabled")
}

#[cfg(test)]
mod tests;
