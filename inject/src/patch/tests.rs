use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::template::Template;

fn template(placement: &str, egress: Option<&str>) -> Template {
    let native = placement == "initContainers";
    let container = format!(
        "name: weir-proxy\nimage: weir:0.1.0\n{}args: [run, --config, /etc/weir/config.yaml]\n\
         ports:\n  - {{name: weir-inbound, containerPort: 15101}}\n  - {{name: weir-metrics, containerPort: 15120}}\n",
        if native { "restartPolicy: Always\n" } else { "" }
    );
    let mut files: BTreeMap<String, String> = [
        ("placement", placement.to_string()),
        ("container.yaml", container),
        ("volumes.yaml", "- {name: weir-config, configMap: {name: weir-config}}\n".into()),
        ("pod-labels.yaml", "weir.dev/sidecar: weir\n".into()),
        ("pod-annotations.yaml", "checksum/weir-config: abc\n".into()),
        ("termination-grace-period-seconds", "35".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(e) = egress {
        files.insert("egress-listen".into(), e.into());
    }
    Template::from_files(&files).expect("test template")
}

fn pod(annotations: Value) -> Value {
    json!({
        "metadata": {"generateName": "app-", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    })
}

fn plan_ns(pod: &Value, t: &Template) -> Decision {
    plan(pod, "shop", Scope::Namespace, t, &Exclusions::defaults(Some("weir-system")))
}

fn paths(d: &Decision) -> Vec<&str> {
    d.patch.iter().map(|o| o.path.as_str()).collect()
}

fn container_args(d: &Decision) -> Vec<String> {
    let c = &d.patch[0].value;
    let c = if c.is_array() { &c[0] } else { c };
    c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

#[test]
fn missing_arrays_and_maps_are_created_whole() {
    let t = template("initContainers", None);
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}});
    let d = plan_ns(&pod, &t);
    assert_eq!(d.outcome, Outcome::Injected);
    assert_eq!(
        paths(&d),
        [
            "/spec/initContainers",
            "/spec/volumes",
            "/spec/terminationGracePeriodSeconds",
            "/metadata/labels",
            "/metadata/annotations"
        ]
    );
    assert_eq!(
        d.patch[4].value,
        json!({
            "checksum/weir-config": "abc",
            "kubectl.kubernetes.io/default-container": "app",
            "weir.dev/inject-status": "injected",
            "weir.dev/injected": "true"
        })
    );
}

#[test]
fn keys_are_escaped_and_existing_arrays_appended() {
    let t = template("containers", None);
    let mut p = pod(json!({"a/b~c": "x"}));
    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    p["metadata"]["labels"] = json!({"app": "x"});
    p["spec"]["terminationGracePeriodSeconds"] = json!(60);
    let d = plan_ns(&p, &t);
    assert_eq!(
        paths(&d),
        [
            "/spec/containers/-",
            "/spec/volumes/-",
            "/metadata/labels/weir.dev~1sidecar",
            "/metadata/annotations/checksum~1weir-config",
            "/metadata/annotations/kubectl.kubernetes.io~1default-container",
            "/metadata/annotations/weir.dev~1inject-status",
            "/metadata/annotations/weir.dev~1injected"
        ],
        "a longer grace period is kept"
    );
    assert_eq!(escape("a/b~c"), "a~1b~0c");
}

#[test]
fn opt_out_wins_over_every_opt_in() {
    let t = template("initContainers", None);
    for scope in [Scope::Namespace, Scope::Pod] {
        let excl = Exclusions::defaults(None);
        let d = plan(&pod(json!({"weir.dev/inject": "false"})), "shop", scope, &t, &excl);
        assert_eq!(d.outcome, Outcome::OptedOut);
        for label in ["disabled", "false"] {
            let mut labelled = pod(json!({"weir.dev/inject": "true"}));
            labelled["metadata"]["labels"] = json!({"weir.dev/inject": label});
            assert_eq!(plan(&labelled, "shop", scope, &t, &excl).outcome, Outcome::OptedOut);
        }
        // The pod's label opts in, its annotation out: out.
        let mut both = pod(json!({"weir.dev/inject": "false"}));
        both["metadata"]["labels"] = json!({"weir.dev/inject": "true"});
        assert_eq!(plan(&both, "shop", scope, &t, &excl).outcome, Outcome::OptedOut);
    }
}

#[test]
fn the_pod_webhook_needs_the_label_or_the_annotation() {
    let t = template("initContainers", None);
    let excl = Exclusions::defaults(None);
    assert_eq!(plan(&pod(json!({})), "shop", Scope::Pod, &t, &excl).outcome, Outcome::NotOptedIn);
    for label in ["true", "enabled"] {
        let mut labelled = pod(json!({}));
        labelled["metadata"]["labels"] = json!({"weir.dev/inject": label});
        let on = plan(&labelled, "shop", Scope::Pod, &t, &excl);
        assert_eq!(on.outcome, Outcome::Injected, "{label}");
        assert_eq!(on.reason, "opted in by pod label");
    }
    let on = plan(&pod(json!({"weir.dev/inject": "true"})), "shop", Scope::Pod, &t, &excl);
    assert_eq!(on.outcome, Outcome::Injected);
    assert_eq!(on.reason, "opted in by pod annotation");
    let typo = plan(&pod(json!({"weir.dev/inject": "yes"})), "shop", Scope::Pod, &t, &excl);
    assert_eq!(typo.outcome, Outcome::NotOptedIn);
    assert!(typo.warnings[0].contains("want \"true\" or \"false\""), "{:?}", typo.warnings);
}

#[test]
fn excluded_and_own_namespaces_are_never_touched() {
    let t = template("initContainers", None);
    let excl = Exclusions::defaults(Some("weir-system"));
    for ns in ["kube-system", "kube-public", "kube-node-lease", "weir-system"] {
        let d = plan(&pod(json!({"weir.dev/inject": "true"})), ns, Scope::Pod, &t, &excl);
        assert_eq!(d.outcome, Outcome::ExcludedNamespace, "{ns}");
        assert!(d.patch.is_empty());
    }
}

#[test]
fn overrides_become_flags() {
    let t = template("containers", None);
    let d = plan_ns(
        &pod(
            json!({"weir.dev/app-port": "9090", "weir.dev/max-inflight": "8", "weir.dev/entry": "true"}),
        ),
        &t,
    );
    assert_eq!(d.outcome, Outcome::Injected);
    assert_eq!(
        container_args(&d),
        [
            "run",
            "--config",
            "/etc/weir/config.yaml",
            "--app",
            "127.0.0.1:9090",
            "--max-inflight",
            "8",
            "--entry"
        ]
    );
    let d = plan_ns(&pod(json!({"weir.dev/entry": "false"})), &t);
    assert_eq!(container_args(&d), ["run", "--config", "/etc/weir/config.yaml"]);
}

#[test]
fn bad_overrides_and_conflicts_mean_no_sidecar_and_a_warning() {
    let t = template("initContainers", None);
    let cases = [
        (json!({"weir.dev/app-port": "http"}), "weir.dev/app-port"),
        (json!({"weir.dev/app-port": "0"}), "weir.dev/app-port"),
        (json!({"weir.dev/app-port": "15101"}), "a port weir listens on"),
        (json!({"weir.dev/max-inflight": "0"}), "weir.dev/max-inflight"),
        (json!({"weir.dev/max-inflight": "-3"}), "weir.dev/max-inflight"),
        (json!({"weir.dev/entry": "sometimes"}), "weir.dev/entry"),
        (json!({"weir.dev/egress": "1"}), "weir.dev/egress"),
    ];
    for (annotations, needle) in cases {
        let d = plan_ns(&pod(annotations.clone()), &t);
        assert_eq!(d.outcome, Outcome::CannotInject, "{annotations}");
        // No sidecar: the patch only says why, on the pod.
        assert_eq!(paths(&d), ["/metadata/annotations/weir.dev~1inject-status"], "{annotations}");
        let status = d.patch[0].value.as_str().unwrap();
        assert!(status.starts_with("skipped: ") && status.contains(needle), "{status}");
        assert!(d.warnings[0].contains(needle), "{annotations}: {:?}", d.warnings);
    }
    // A pod without annotations gets the map; one without metadata gets that first.
    let mut bare =
        json!({"metadata": {"name": "p"}, "spec": {"hostNetwork": true, "containers": []}});
    let d = plan_ns(&bare, &t);
    assert_eq!(paths(&d), ["/metadata/annotations"]);
    assert_eq!(
        d.patch[0].value,
        json!({"weir.dev/inject-status": "skipped: hostNetwork pods share the node's ports"})
    );
    bare.as_object_mut().unwrap().remove("metadata");
    assert_eq!(paths(&plan_ns(&bare, &t)), ["/metadata", "/metadata/annotations"]);
    let mut host = pod(json!({}));
    host["spec"]["hostNetwork"] = json!(true);
    assert!(plan_ns(&host, &t).warnings[0].contains("hostNetwork"));
    let mut taken = pod(json!({}));
    taken["spec"]["containers"][0]["ports"] = json!([{"containerPort": 15120}]);
    assert!(plan_ns(&taken, &t).warnings[0].contains("port 15120"));
    let mut clash = pod(json!({}));
    clash["spec"]["volumes"] = json!([{"name": "weir-config", "emptyDir": {}}]);
    assert!(plan_ns(&clash, &t).warnings[0].contains("volume named weir-config"));
    let mut job = pod(json!({}));
    job["spec"]["restartPolicy"] = json!("Never");
    let regular = template("containers", None);
    assert!(plan_ns(&job, &regular).warnings[0].contains("need a native sidecar"));
    assert_eq!(plan_ns(&job, &t).outcome, Outcome::Injected, "a native sidecar suits a Job");
    let no_spec = json!({"metadata": {}});
    assert_eq!(plan_ns(&no_spec, &t).outcome, Outcome::CannotInject);
    // Skipped for other reasons (not asked, opted out, excluded, already there): no patch.
    let mut opted_out = pod(json!({"weir.dev/inject": "false"}));
    assert!(plan_ns(&opted_out, &t).patch.is_empty());
    opted_out["spec"]["containers"] = json!([{"name": "weir-proxy"}]);
    assert!(plan_ns(&opted_out, &t).patch.is_empty());
}

#[test]
fn already_injected_is_left_alone_wherever_the_sidecar_sits() {
    let t = template("initContainers", None);
    let mut p = pod(json!({}));
    p["spec"]["containers"] = json!([{"name": "app"}, {"name": "weir-proxy"}]);
    assert_eq!(plan_ns(&p, &t).outcome, Outcome::AlreadyInjected);
    let mut p = pod(json!({}));
    p["spec"]["initContainers"] = json!([{"name": "weir-proxy"}]);
    assert_eq!(plan_ns(&p, &t).outcome, Outcome::AlreadyInjected);
}

#[test]
fn egress_sets_the_flag_and_http_proxy_unless_the_app_set_it() {
    let t = template("initContainers", Some("127.0.0.1:15102"));
    let mut p = pod(json!({"weir.dev/egress": "true"}));
    p["spec"]["containers"] = json!([
        {"name": "app"},
        {"name": "worker", "env": [{"name": "HTTP_PROXY", "value": "http://corp:3128"}]}
    ]);
    let d = plan_ns(&p, &t);
    assert_eq!(d.outcome, Outcome::Injected);
    assert!(container_args(&d).ends_with(&["--egress".to_string(), "127.0.0.1:15102".to_string()]));
    let env: Vec<(&str, &Value)> = d
        .patch
        .iter()
        .filter(|o| o.path.contains("/env"))
        .map(|o| (o.path.as_str(), &o.value))
        .collect();
    let proxy = "http://127.0.0.1:15102";
    assert_eq!(
        env,
        [(
            "/spec/containers/0/env",
            &json!([
                {"name": "HTTP_PROXY", "value": proxy},
                {"name": "http_proxy", "value": proxy},
                {"name": "NO_PROXY", "value": NO_PROXY},
                {"name": "no_proxy", "value": NO_PROXY}
            ])
        )],
        "the worker keeps its own proxy"
    );
    assert!(d.warnings[0].contains("container worker sets its own HTTP proxy"), "{:?}", d.warnings);
    // An app with other env vars and its own NO_PROXY: appended, NO_PROXY left alone.
    let mut p = pod(json!({"weir.dev/egress": "true"}));
    p["spec"]["containers"][0]["env"] = json!([{"name": "NO_PROXY", "value": ".svc"}]);
    let d = plan_ns(&p, &t);
    let env: Vec<&str> = d
        .patch
        .iter()
        .filter(|o| o.path == "/spec/containers/0/env/-")
        .map(|o| o.value["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["HTTP_PROXY", "http_proxy"]);
    // The egress port is weir's too: an app cannot be pointed at it.
    let d = plan_ns(&pod(json!({"weir.dev/app-port": "15102"})), &t);
    assert!(d.warnings[0].contains("a port weir listens on"), "{:?}", d.warnings);
    // Without an egress listener in the template: injected without egress, and told so.
    let d = plan_ns(&pod(json!({"weir.dev/egress": "true"})), &template("initContainers", None));
    assert_eq!(d.outcome, Outcome::Injected);
    assert!(!container_args(&d).contains(&"--egress".to_string()));
    assert!(d.warnings[0].contains("no egress listener"));
}

#[test]
fn templates_are_checked() {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    assert_eq!(Template::from_files(&files).unwrap_err().file, "placement");
    files.insert("placement".into(), "initContainers".into());
    files.insert("container.yaml".into(), "name: weir-proxy\n".into());
    files.insert("volumes.yaml".into(), "[]".into());
    let e = Template::from_files(&files).unwrap_err();
    assert!(e.to_string().contains("restartPolicy: Always"), "{e}");
    files.insert("placement".into(), "sidecar".into());
    assert!(Template::from_files(&files).unwrap_err().message.contains("want initContainers"));
    files.insert("placement".into(), "containers".into());
    files.insert("volumes.yaml".into(), "- {configMap: {name: x}}".into());
    assert!(Template::from_files(&files).unwrap_err().message.contains("no name"));
    files.insert("volumes.yaml".into(), "[]".into());
    files.insert("egress-listen".into(), "localhost".into());
    assert_eq!(Template::from_files(&files).unwrap_err().file, "egress-listen");
    files.remove("egress-listen");
    assert!(Template::from_files(&files).is_ok());
}
