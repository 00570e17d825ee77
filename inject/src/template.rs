//! What the injector adds to a pod: the chart's `<fullname>-injector-template` ConfigMap,
//! mounted as a directory. The chart renders it from the same sidecar partials that charts
//! including weir by hand use, so an injected sidecar and an included one are identical.
//!
//! Files (keys of the ConfigMap):
//! - `placement`: `initContainers` (native sidecar, inserted first) or `containers` (appended).
//!   The chart decides from `sidecar.native` and the cluster version it renders for
//!   (`auto`: native on Kubernetes >= 1.29); an AdmissionReview carries no cluster version.
//! - `container.yaml`: the weir container.
//! - `volumes.yaml`: the pod volumes it mounts.
//! - `pod-labels.yaml`, `pod-annotations.yaml`: added to the pod's metadata.
//! - `termination-grace-period-seconds`: the pod's grace period is raised to at least this.
//! - `egress-listen` (optional): the sidecar's egress listener address. Only when present
//!   does the `weir.dev/egress` annotation take effect (see [`crate::patch`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

/// Where the sidecar goes in the pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// First of `spec.initContainers`, with `restartPolicy: Always` (a native sidecar).
    InitContainers,
    /// Last of `spec.containers`.
    Containers,
}

/// A loaded, checked template.
#[derive(Debug, Clone)]
pub struct Template {
    pub placement: Placement,
    /// The container, as JSON (an object with a `name`).
    pub container: Value,
    /// Its `name`: a pod holding a container of this name is already injected.
    pub container_name: String,
    /// Pod volumes, each an object with a `name`.
    pub volumes: Vec<Value>,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    pub termination_grace_period_seconds: Option<i64>,
    pub egress_listen: Option<SocketAddr>,
}

/// A template problem, naming the file (key) it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {file}: {message}")]
pub struct TemplateError {
    pub file: String,
    pub message: String,
}

impl Template {
    /// Reads the template directory (a mounted ConfigMap).
    pub fn from_dir(dir: &Path) -> Result<Self, TemplateError> {
        if !dir.is_dir() {
            return Err(TemplateError {
                file: dir.display().to_string(),
                message: "not a directory (mount the injector template ConfigMap there)".into(),
            });
        }
        let read = |name: &str| -> Result<Option<String>, TemplateError> {
            match std::fs::read_to_string(dir.join(name)) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(TemplateError {
                    file: name.into(),
                    message: format!("cannot read {}: {e}", dir.join(name).display()),
                }),
            }
        };
        let mut files = BTreeMap::new();
        for name in FILES {
            if let Some(text) = read(name)? {
                files.insert(name.to_string(), text);
            }
        }
        Self::from_files(&files)
    }

    /// Builds a template from the ConfigMap's `data` (key -> text).
    pub fn from_files(files: &BTreeMap<String, String>) -> Result<Self, TemplateError> {
        let get = |name: &str| {
            files
                .get(name)
                .map(String::as_str)
                .ok_or_else(|| TemplateError { file: name.into(), message: "missing".into() })
        };
        let bad = |name: &str, message: String| TemplateError { file: name.into(), message };

        let placement = match get("placement")?.trim() {
            "initContainers" => Placement::InitContainers,
            "containers" => Placement::Containers,
            other => {
                return Err(bad(
                    "placement",
                    format!("want initContainers or containers, got {other:?}"),
                ))
            }
        };

        let container: Value =
            yaml(get("container.yaml")?).map_err(|m| bad("container.yaml", m))?;
        let container_name = container
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                bad("container.yaml", "a container mapping with a name is required".into())
            })?
            .to_string();
        let native = container.get("restartPolicy").and_then(Value::as_str) == Some("Always");
        if native != (placement == Placement::InitContainers) {
            return Err(bad(
                "container.yaml",
                "restartPolicy: Always must be set exactly when placement is initContainers".into(),
            ));
        }

        let volumes: Value = yaml(get("volumes.yaml")?).map_err(|m| bad("volumes.yaml", m))?;
        let volumes = match volumes {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            _ => return Err(bad("volumes.yaml", "want a list of volumes".into())),
        };
        for (i, v) in volumes.iter().enumerate() {
            if v.get("name").and_then(Value::as_str).is_none() {
                return Err(bad("volumes.yaml", format!("volume [{i}] has no name")));
            }
        }

        let map = |name: &str| -> Result<BTreeMap<String, String>, TemplateError> {
            match files.get(name) {
                None => Ok(BTreeMap::new()),
                Some(text) => match yaml(text).map_err(|m| bad(name, m))? {
                    Value::Null => Ok(BTreeMap::new()),
                    Value::Object(o) => o
                        .into_iter()
                        .map(|(k, v)| match v {
                            Value::String(s) => Ok((k, s)),
                            other => Ok((k, other.to_string())),
                        })
                        .collect(),
                    _ => Err(bad(name, "want a mapping of strings".into())),
                },
            }
        };
        let pod_labels = map("pod-labels.yaml")?;
        let pod_annotations = map("pod-annotations.yaml")?;

        let termination_grace_period_seconds = match files.get("termination-grace-period-seconds") {
            None => None,
            Some(text) if text.trim().is_empty() => None,
            Some(text) => {
                Some(text.trim().parse::<i64>().ok().filter(|s| *s >= 0).ok_or_else(|| {
                    bad(
                        "termination-grace-period-seconds",
                        format!("want seconds, got {:?}", text.trim()),
                    )
                })?)
            }
        };
        let egress_listen = match files.get("egress-listen").map(|t| t.trim()) {
            None | Some("") => None,
            Some(text) => Some(text.parse().map_err(|_| {
                bad("egress-listen", format!("want an address like 127.0.0.1:15102, got {text:?}"))
            })?),
        };

        Ok(Template {
            placement,
            container,
            container_name,
            volumes,
            pod_labels,
            pod_annotations,
            termination_grace_period_seconds,
            egress_listen,
        })
    }

    /// The container ports weir listens on (so an app cannot be pointed at them).
    pub fn container_ports(&self) -> Vec<u16> {
        self.container
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("containerPort").and_then(Value::as_u64))
            .filter_map(|p| u16::try_from(p).ok())
            .collect()
    }
}

/// The files a template directory may hold.
pub const FILES: [&str; 7] = [
    "placement",
    "container.yaml",
    "volumes.yaml",
    "pod-labels.yaml",
    "pod-annotations.yaml",
    "termination-grace-period-seconds",
    "egress-listen",
];

fn yaml(text: &str) -> Result<Value, String> {
    serde_yaml::from_str::<Value>(text).map_err(|e| e.to_string())
}
