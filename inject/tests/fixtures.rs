//! AdmissionReview fixtures, shaped as a real API server sends them, through the review
//! code with the templates the chart renders; the JSON Patch applied with the `json-patch`
//! crate; compared with golden files (`UPDATE_GOLDEN=1` rewrites them).
//!
//! The templates under `tests/fixtures/templates/` are the chart's rendered
//! `<fullname>-injector-template` ConfigMaps (`scripts/test-chart` checks they still match
//! the chart and rewrites them with `UPDATE_GOLDEN=1`). The same script applies every golden
//! patch with a second JSON-Patch implementation (Python's `jsonpatch`) and validates the
//! patched pods against the Kubernetes 1.29-1.33 schemas.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{json, Value};
use weir_inject::patch::{Exclusions, Outcome, Scope};
use weir_inject::review;
use weir_inject::template::{Placement, Template};

fn dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn templates() -> Vec<(&'static str, Template)> {
    ["native", "regular"]
        .into_iter()
        .map(|name| {
            let t = Template::from_dir(&dir(&format!("tests/fixtures/templates/{name}")))
                .expect("template loads");
            (name, t)
        })
        .collect()
}

/// (file stem, scope, body)
fn reviews() -> Vec<(String, Scope, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir("tests/fixtures/reviews")).expect("fixtures") {
        let path = entry.expect("entry").path();
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("name").to_string();
        let scope = match stem.split_once("__").map(|(s, _)| s) {
            Some("namespace") => Scope::Namespace,
            Some("pod") => Scope::Pod,
            _ => panic!("{stem}: fixture names start with namespace__ or pod__"),
        };
        out.push((stem, scope, std::fs::read(&path).expect("read")));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn expected_outcome(template: &str, stem: &str) -> Outcome {
    match stem {
        // A Job's pod must finish: only a native sidecar lets it.
        "namespace__job-pod" if template == "native" => Outcome::Injected,
        "namespace__job-pod" => Outcome::CannotInject,
        "namespace__deployment-pod"
        | "pod__bare-pod"
        // Opted in by the pod label the webhook's objectSelector selects.
        | "pod__labelled-pod"
        | "namespace__init-and-several-containers" => Outcome::Injected,
        "namespace__already-injected" => Outcome::AlreadyInjected,
        "namespace__opted-out" => Outcome::OptedOut,
        "pod__excluded-namespace" => Outcome::ExcludedNamespace,
        "namespace__bad-override" => Outcome::CannotInject,
        "pod__not-opted-in" => Outcome::NotOptedIn,
        other => panic!("{other}: add its expected outcome here"),
    }
}

fn exclusions() -> Exclusions {
    Exclusions::defaults(Some("weir-system"))
}

/// The review's response with the patch decoded, and the patched pod.
fn run(
    body: &[u8],
    scope: Scope,
    template: &Template,
) -> (Outcome, Value, Vec<Value>, Option<Value>) {
    let reply = review::review(body, scope, template, &exclusions()).expect("a valid review");
    let response = reply.body["response"].clone();
    let review: Value = serde_json::from_slice(body).expect("json");
    assert_eq!(response["uid"], review["request"]["uid"], "uid echoed");
    assert_eq!(response["allowed"], json!(true), "always allowed");
    assert_eq!(reply.body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(reply.body["kind"], "AdmissionReview");
    let Some(patch64) = response["patch"].as_str() else {
        assert!(response.get("patchType").is_none());
        return (reply.decision.outcome, response, Vec::new(), None);
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD.decode(patch64).expect("base64 patch");
    let ops: Vec<Value> = serde_json::from_slice(&bytes).expect("patch is a JSON array");
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).expect("patch parses as RFC 6902");
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).expect("patch applies");
    (reply.decision.outcome, response, ops, Some(pod))
}

/// What an injected pod must carry, whatever else the golden file says.
fn check_injected(name: &str, template: &Template, original: &Value, pod: &Value) {
    let spec = &pod["spec"];
    let names = |key: &str| -> Vec<String> {
        spec[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let (init, regular) = (names("initContainers"), names("containers"));
    let sidecar = &template.container_name;
    let all: Vec<&String> = init.iter().chain(&regular).collect();
    assert_eq!(
        all.iter().filter(|n| *n == &sidecar).count(),
        1,
        "{name}: sidecar exactly once in {all:?}"
    );
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "{name}: duplicate container names {all:?}");
    match template.placement {
        Placement::InitContainers => {
            assert_eq!(&init[0], sidecar, "{name}: native sidecar goes first");
            assert_eq!(spec["initContainers"][0]["restartPolicy"], "Always");
        }
        Placement::Containers => {
            assert_eq!(regular.last(), Some(sidecar), "{name}: regular sidecar goes last");
            assert!(spec["containers"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .get("restartPolicy")
                .is_none());
        }
    }
    // The app's containers are untouched (apart from egress env), in order.
    let before: Vec<&str> = original["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        regular.iter().map(String::as_str).filter(|n| n != sidecar).collect::<Vec<_>>(),
        before
    );
    // Every mount of the sidecar has exactly one pod volume; every template volume is there.
    let volumes: Vec<&str> =
        spec["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    let container = spec["initContainers"]
        .as_array()
        .into_iter()
        .chain(spec["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == json!(sidecar))
        .unwrap();
    for m in container["volumeMounts"].as_array().unwrap() {
        let v = m["name"].as_str().unwrap();
        assert_eq!(volumes.iter().filter(|n| **n == v).count(), 1, "{name}: volume {v} for mount");
    }
    for v in &template.volumes {
        assert!(volumes.contains(&v["name"].as_str().unwrap()), "{name}: template volume {v}");
    }
    // Probes, ports and resources come through from the template.
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(container[probe]["httpGet"]["path"].is_string(), "{name}: {probe}");
    }
    assert_eq!(container["ports"], template.container["ports"]);
    assert_eq!(container["resources"], template.container["resources"]);
    for (k, v) in &template.pod_labels {
        assert_eq!(pod["metadata"]["labels"][k], json!(v), "{name}: label {k}");
    }
    for (k, v) in &template.pod_annotations {
        assert_eq!(pod["metadata"]["annotations"][k], json!(v), "{name}: annotation {k}");
    }
    assert_eq!(pod["metadata"]["annotations"]["weir.dev/injected"], "true");
    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap();
    assert!(
        grace >= template.termination_grace_period_seconds.unwrap_or(0),
        "{name}: grace {grace}"
    );
}

#[test]
fn fixtures_match_golden_and_carry_the_sidecar() {
    let update = std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1");
    let mut failures = Vec::new();
    for (tname, template) in templates() {
        for (stem, scope, body) in reviews() {
            let name = format!("{tname}/{stem}");
            let (outcome, response, ops, pod) = run(&body, scope, &template);
            assert_eq!(outcome, expected_outcome(tname, &stem), "{name}: outcome");
            let review: Value = serde_json::from_slice(&body).unwrap();
            let original = &review["request"]["object"];
            if outcome == Outcome::CannotInject {
                // Admitted without the sidecar: the only change is the status annotation.
                let pod = pod.as_ref().expect("a skipped pod is annotated");
                let mut without = pod.clone();
                let annotations = without["metadata"]["annotations"].as_object_mut().unwrap();
                let status = annotations.remove("weir.dev/inject-status").unwrap();
                assert!(status.as_str().unwrap().starts_with("skipped: "), "{name}: {status}");
                if annotations.is_empty() && original["metadata"].get("annotations").is_none() {
                    without["metadata"].as_object_mut().unwrap().remove("annotations");
                }
                assert_eq!(&without, original, "{name}: a skipped pod changed beyond its status");
            } else if let Some(pod) = &pod {
                check_injected(&name, &template, original, pod);
                assert_eq!(pod["metadata"]["annotations"]["weir.dev/inject-status"], "injected");
                // Idempotent: the injected pod, reviewed again (reinvocation), changes nothing.
                let mut again = review.clone();
                again["request"]["object"] = pod.clone();
                let again = serde_json::to_vec(&again).unwrap();
                let (outcome, response, ops, _) = run(&again, scope, &template);
                assert_eq!(outcome, Outcome::AlreadyInjected, "{name}: re-review");
                assert!(
                    ops.is_empty() && response.get("patch").is_none(),
                    "{name}: re-review patched"
                );
            } else {
                assert!(ops.is_empty(), "{name}: patch without injection");
            }
            if outcome == Outcome::CannotInject {
                assert!(
                    response["warnings"].as_array().is_some_and(|w| !w.is_empty()),
                    "{name}: warning"
                );
            }
            let mut shown = response.clone();
            if let Some(r) = shown.as_object_mut() {
                r.remove("patch");
            }
            let golden = json!({
                "outcome": outcome.label(),
                "response": shown,
                "patch": ops,
                "patchedPod": pod,
            });
            let text = serde_json::to_string_pretty(&golden).unwrap() + "\n";
            let path = dir(&format!("tests/golden/{tname}/{stem}.json"));
            if update {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, text).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(expected) if expected == text => {}
                Ok(_) => failures.push(format!(
                    "{name}: differs from {} (UPDATE_GOLDEN=1 to accept)",
                    path.display()
                )),
                Err(_) => failures.push(format!(
                    "{name}: missing {} (UPDATE_GOLDEN=1 writes it)",
                    path.display()
                )),
            }
        }
    }
    assert!(failures.is_empty(), "golden mismatches:\n  {}", failures.join("\n  "));
}

#[test]
fn no_stale_golden_files() {
    let wanted: BTreeMap<String, ()> = templates()
        .iter()
        .flat_map(|(t, _)| {
            reviews().into_iter().map(move |(s, _, _)| (format!("{t}/{s}.json"), ()))
        })
        .collect();
    for t in ["native", "regular"] {
        let Ok(entries) = std::fs::read_dir(dir(&format!("tests/golden/{t}"))) else { continue };
        for e in entries {
            let name = format!("{t}/{}", e.unwrap().file_name().to_string_lossy());
            assert!(
                wanted.contains_key(&name),
                "stale golden file tests/golden/{name}: no fixture produces it"
            );
        }
    }
}
