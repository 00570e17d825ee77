"""Offline tests of the weir Helm charts (run by scripts/test-chart).

For every values file in charts/weir/ci and charts/weir-example/ci: lint with
--strict, render, compare with the golden render in tests/golden, validate
every object against the Kubernetes OpenAPI schema of the case's version
(kubernetes-validate; CRD kinds are only parsed and shape-checked), and check
the invariants the sidecar depends on. Then values.yaml documentation, and
values that the schema or the templates must reject.

A values file's first line says how to run it:
    # test-chart: kube-version=1.33.0 expect-native=true
"""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes_validate
import promql_parser
import yaml

import inject_checks
import schema_checks
import secret_checks

REPO = Path(__file__).resolve().parents[3]
CHARTS = REPO / "charts"
GOLDEN = CHARTS / "weir" / "tests" / "golden"
NAMESPACE = "apps"
RELEASE = {"weir": "demo", "weir-example": "shop"}
# Kinds served by CRDs: kubernetes-validate has no schema for them.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]):\d+$")

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# === Cases ===


@dataclass
class Case:
    chart: str
    values: Path
    kube_version: str
    expect_native: bool | None
    # `pod-sim=false`: a values file that is not a deployable pod (every field set to a
    # non-default value, an app port nothing listens on) is rendered and checked, not run.
    pod_sim: bool = True
    # Filled by render().
    text: str = ""
    objects: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.chart}__{self.values.stem.removesuffix('-values')}"


def discover_cases() -> list[Case]:
    cases = []
    for chart in ("weir", "weir-example"):
        for values in sorted((CHARTS / chart / "ci").glob("*.yaml")):
            header = values.read_text().splitlines()[0]
            m = re.match(r"#\s*test-chart:\s*(.*)$", header)
            if not m:
                raise SystemExit(f"{values}: first line must be '# test-chart: kube-version=X.Y.Z ...'")
            opts = dict(kv.split("=", 1) for kv in m.group(1).split())
            expect = opts.get("expect-native")
            cases.append(
                Case(
                    chart=chart,
                    values=values,
                    kube_version=opts["kube-version"],
                    expect_native=None if expect is None else expect == "true",
                    pod_sim=opts.get("pod-sim", "true") == "true",
                )
            )
    return cases


# === Helm ===


class Helm:
    def __init__(self, binary: Path, scratch: Path):
        self.binary = binary
        self.scratch = scratch
        # The example chart needs weir under its charts/; assemble it in scratch
        # rather than writing build output into the repository.
        self.example = scratch / "weir-example"
        shutil.copytree(CHARTS / "weir-example", self.example)
        shutil.copytree(CHARTS / "weir", self.example / "charts" / "weir", ignore=shutil.ignore_patterns("tests"))

    def chart_dir(self, chart: str) -> Path:
        return self.example if chart == "weir-example" else CHARTS / chart

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, check=False)

    def lint(self, case: Case) -> None:
        out = self.run("lint", "--strict", "--quiet", "--kube-version", case.kube_version,
                       "--namespace", NAMESPACE, str(self.chart_dir(case.chart)), "-f", str(case.values))
        if out.returncode != 0:
            raise AssertionError(f"helm lint failed:\n{out.stdout}{out.stderr}")

    def template(self, chart: str, kube_version: str, *extra: str) -> subprocess.CompletedProcess:
        return self.run("template", RELEASE[chart], str(self.chart_dir(chart)), "--namespace", NAMESPACE,
                        "--kube-version", kube_version, *extra)

    def render(self, case: Case) -> None:
        out = self.template(case.chart, case.kube_version, "-f", str(case.values))
        if out.returncode != 0:
            raise AssertionError(f"helm template failed:\n{out.stderr}")
        case.text = out.stdout
        # Parse every document ourselves: helm does not reject invalid YAML.
        case.objects = [o for o in yaml.load_all(out.stdout, Loader=Loader) if o]


# === Golden files ===


def normalize(text: str) -> str:
    """Masks what differs between renders: generated secret values, certificates and the
    CA bundle of a chart-generated webhook certificate."""
    docs = text.split("\n---\n")
    out = []
    for doc in docs:
        if 'weir.dev/generated: "true"' in doc:
            doc = re.sub(r"(?m)^(data:\n(?:  #.*\n)?  [\w.-]+: ).*$", r"\1<generated>", doc)
            doc = re.sub(r"(?m)^(\s+(?:tls\.crt|tls\.key|ca\.crt|caBundle): ).*$", r"\1<generated>", doc)
        out.append(doc)
    return "\n---\n".join(out)


def check_golden(case: Case, update: bool) -> None:
    golden = GOLDEN / f"{case.name}.yaml"
    actual = normalize(case.text)
    if update:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
        return
    if not golden.exists():
        raise AssertionError(f"missing golden file {golden.relative_to(REPO)}; run with UPDATE_GOLDEN=1")
    expected = golden.read_text()
    if expected != actual:
        diff = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(),
                                         f"golden/{golden.name}", "rendered", lineterm="", n=2))
        shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
        raise AssertionError(f"render differs from golden (UPDATE_GOLDEN=1 to accept):\n{shown}")


# === Schema validation ===


def validate_objects(case: Case) -> None:
    problems = []
    for obj in case.objects:
        kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
        where = f"{kind}/{name}"
        if not isinstance(obj.get("apiVersion"), str) or not kind or not name:
            problems.append(f"{where}: apiVersion, kind and metadata.name are required")
            continue
        if kind in CRD_KINDS:
            if not isinstance(obj.get("spec"), dict):
                problems.append(f"{where}: spec must be a mapping")
            continue
        try:
            kubernetes_validate.validate(obj, case.kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {e.message} at {'/'.join(map(str, e.path))}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{where}: no schema for {obj['apiVersion']} in Kubernetes {case.kube_version}")
    if problems:
        raise AssertionError("invalid objects:\n  " + "\n  ".join(problems))


# === Invariants ===


def by_kind(case: Case, kind: str) -> list[dict]:
    return [o for o in case.objects if o.get("kind") == kind]


def one(items: list, what: str):
    assert len(items) == 1, f"expected exactly one {what}, found {len(items)}"
    return items[0]


def weir_config(case: Case) -> dict:
    cms = [o for o in by_kind(case, "ConfigMap") if o["metadata"]["name"].endswith("-config")]
    cm = one(cms, "weir config ConfigMap")
    return yaml.load(cm["data"]["config.yaml"], Loader=Loader)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def sidecar_pods(case: Case) -> list[tuple[str, dict]]:
    """Pod specs that carry the sidecar: workload pod templates, and the pod the
    injector template describes (assembled from its ConfigMap)."""
    pods = []
    for dep in by_kind(case, "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        names = [c["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])]
        if "weir-proxy" in names or dep["spec"]["template"]["metadata"].get("labels", {}).get("weir.dev/sidecar"):
            pods.append((f"Deployment/{dep['metadata']['name']}", spec))
    for cm in by_kind(case, "ConfigMap"):
        if cm["metadata"]["name"].endswith("-injector-template"):
            data = cm["data"]
            container = yaml.load(data["container.yaml"], Loader=Loader)
            spec = {"containers": [{"name": "app"}], "volumes": yaml.load(data["volumes.yaml"], Loader=Loader)}
            if data["placement"] == "initContainers":
                spec["initContainers"] = [container]
            else:
                assert data["placement"] == "containers", data["placement"]
                spec["containers"].append(container)
            pods.append((f"ConfigMap/{cm['metadata']['name']}", spec))
    return pods


def check_sidecar(case: Case, config: dict, where: str, spec: dict) -> None:
    init = spec.get("initContainers", [])
    regular = spec.get("containers", [])
    sidecars = [c for c in init + regular if c.get("args", [])[:1] == ["run"] and c.get("command") == ["weir"]]
    assert len(sidecars) == 1, f"{where}: want the sidecar exactly once, found {len(sidecars)}"
    sidecar = sidecars[0]
    native = sidecar in init
    names = [c["name"] for c in init + regular]
    assert len(names) == len(set(names)), f"{where}: duplicate container names {names}"
    if native:
        assert sidecar.get("restartPolicy") == "Always", f"{where}: native sidecar needs restartPolicy Always"
        assert init.index(sidecar) == 0, f"{where}: native sidecar must be the first init container"
    else:
        assert "restartPolicy" not in sidecar, f"{where}: regular sidecar must not set restartPolicy"
    if case.expect_native is not None:
        assert native == case.expect_native, f"{where}: native={native}, expected {case.expect_native}"

    # Command line and config file location.
    args = sidecar["args"]
    assert args[:2] == ["run", "--config"], f"{where}: args {args}"
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    config_mount = mounts.get(args[2])
    assert config_mount and config_mount.get("subPath") == "config.yaml", f"{where}: config file not mounted at {args[2]}"

    # Listeners and probes: probes on the public listener, admin on loopback.
    public = port_of(config["admin"]["public_listen"])
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"weir-inbound": port_of(config["inbound"]["listen"]), "weir-metrics": public}, f"{where}: ports {ports}"
    assert LOOPBACK.match(config["admin"]["listen"]), f"admin.listen {config['admin']['listen']} is not loopback"
    assert port_of(config["admin"]["listen"]) not in ports.values(), f"{where}: the loopback admin port is exposed"
    for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/ready"), ("startupProbe", "/live")):
        get = sidecar[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, public), f"{where}: {probe} is {get}, want {path} on {public}"

    # Hardening.
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, f"{where}: sidecar must run as non-root"
    assert sc["readOnlyRootFilesystem"] is True, f"{where}: root filesystem must be read-only"
    assert sc["allowPrivilegeEscalation"] is False, f"{where}: privilege escalation allowed"
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), f"{where}: capabilities {sc['capabilities']}"
    env = {e["name"]: e for e in sidecar["env"]}
    assert "RUST_LOG" in env, f"{where}: RUST_LOG missing"
    assert sidecar["resources"].get("requests"), f"{where}: no resource requests"

    # Drain: a regular sidecar keeps serving while its endpoint removal propagates: a preStop
    # sleep on >= 1.30, weir's own --drain-delay before (no sleep action); a native one needs
    # neither (it stops after the app).
    major, minor = (int(x) for x in case.kube_version.split(".")[:2])
    pre_stop = sidecar.get("lifecycle", {}).get("preStop")
    drain_delay = args[args.index("--drain-delay") + 1] if "--drain-delay" in args else None
    if native:
        assert pre_stop is None and drain_delay is None, f"{where}: native sidecar with preStop {pre_stop} / drain delay {drain_delay}"
    elif (major, minor) < (1, 30):
        assert pre_stop is None, f"{where}: unexpected preStop {pre_stop} (no sleep action before 1.30)"
        assert drain_delay and re.fullmatch(r"[1-9]\d*s", drain_delay), f"{where}: regular sidecar on {case.kube_version} needs --drain-delay"
    else:
        assert pre_stop and pre_stop["sleep"]["seconds"] > 0, f"{where}: regular sidecar needs a preStop sleep"
        assert drain_delay is None, f"{where}: preStop sleep and --drain-delay both set"
    grace = spec.get("terminationGracePeriodSeconds")
    shutdown = config["inbound"].get("shutdown_grace", "0s")
    if grace is not None and re.fullmatch(r"\d+s", shutdown):
        sleep = (pre_stop["sleep"]["seconds"] if pre_stop else 0) + (int(drain_delay[:-1]) if drain_delay else 0)
        assert grace > sleep + int(shutdown[:-1]), f"{where}: grace {grace}s <= preStop/drain delay {sleep}s + shutdown_grace {shutdown}"

    # Every mount has a pod volume; secrets are read-only; file paths in the
    # config live under the matching mounts.
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in sidecar["volumeMounts"]:
        assert m["name"] in volumes, f"{where}: mount {m['name']} has no volume"
        if "secret" in volumes[m["name"]]:
            assert m.get("readOnly") is True, f"{where}: secret {m['name']} mounted writable"
    admin = config["admin"]

    def mount_of(path: str) -> dict:
        parent = path.rsplit("/", 1)[0]
        assert parent in mounts, f"{where}: no mount for {path}"
        return mounts[parent]

    token_mount = mount_of(admin["token_file"])
    token_volume = volumes[token_mount["name"]]["secret"]
    item = one(token_volume["items"], "token item")
    assert item["path"] == admin["token_file"].rsplit("/", 1)[1], f"{where}: token file name mismatch"
    assert token_mount["readOnly"] is True, f"{where}: token secret must be read-only"
    mount_of(admin["user_secret_file"])
    table_mount = mount_of(admin["table_file"])
    # A directory mount: subPath mounts never see ConfigMap updates.
    assert "subPath" not in table_mount, f"{where}: table mounted with subPath cannot hot-reload"
    assert "configMap" in volumes[table_mount["name"]], f"{where}: table volume is not a ConfigMap"
    if "state_path" in admin:
        state = mount_of(admin["state_path"])
        assert not state.get("readOnly"), f"{where}: state volume must be writable"

    # Referenced ConfigMaps/Secrets: rendered here, or named by values (existingSecret).
    rendered = {(o["kind"], o["metadata"]["name"]) for o in case.objects}
    for v in volumes.values():
        if "configMap" in v:
            assert ("ConfigMap", v["configMap"]["name"]) in rendered, f"{where}: ConfigMap {v['configMap']['name']} not rendered"
        if "secret" in v and v["name"].startswith("weir-"):
            name = v["secret"]["secretName"]
            if ("Secret", name) not in rendered:
                values = yaml.load(case.values.read_text(), Loader=Loader) or {}
                values = values.get("weir", values) if case.chart == "weir-example" else values
                existing = {values.get(k, {}).get("existingSecret") for k in ("controlToken", "userSecret")}
                assert name in existing, f"{where}: Secret {name} neither rendered nor an existingSecret"


def check_invariants(case: Case) -> None:
    config = weir_config(case)
    # The config mirrors the sidecar's configuration sections and keys (docs/design.md §12).
    assert {"inbound", "admission", "admin"} <= set(config) <= {"inbound", "admission", "admin", "egress", "log"}, \
        f"config sections {sorted(config)}"
    for key in ("listen", "app", "max_inflight", "max_queued", "task_timeout", "entry", "shutdown_grace"):
        assert key in config["inbound"], f"config inbound.{key} missing"
    for key in ("window", "window_requests", "queuing_threshold", "law", "mode"):
        assert key in config["admission"], f"config admission.{key} missing"
    for key in ("listen", "public_listen", "token_file", "table_file", "user_secret_file"):
        assert key in config["admin"], f"config admin.{key} missing"

    tables = [o for o in by_kind(case, "ConfigMap") if o["metadata"]["name"].endswith("-table")]
    table = yaml.load(one(tables, "table ConfigMap")["data"]["table.yaml"], Loader=Loader)
    assert isinstance(table["default_business"], int) and isinstance(table["rules"], list), "table shape"

    pods = sidecar_pods(case)
    injector = any(o["kind"] == "MutatingWebhookConfiguration" for o in case.objects)
    assert pods or not (injector or case.chart == "weir-example"), "no pod with the sidecar rendered"
    for where, spec in pods:
        check_sidecar(case, config, where, spec)

    # Generated secrets: marked, and given values land verbatim.
    for secret in by_kind(case, "Secret"):
        if secret["metadata"]["name"].endswith(("-token", "-user-secret")):
            value = base64.b64decode(next(iter(secret["data"].values()))).decode()
            generated = (secret["metadata"].get("annotations") or {}).get("weir.dev/generated") == "true"
            assert len(value) >= 16 if generated else value, f"Secret {secret['metadata']['name']}: weak or empty value"

    # Workloads: selectors match their pod labels; Services select some workload.
    deployments = by_kind(case, "Deployment")
    for dep in deployments:
        sel = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert sel.items() <= labels.items(), f"Deployment/{dep['metadata']['name']}: selector does not match pod labels"
    for svc in by_kind(case, "Service"):
        sel = svc["spec"]["selector"]
        targets = [d for d in deployments if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert targets, f"Service/{svc['metadata']['name']} selects no Deployment"
        container_ports = {p["name"] for d in targets
                           for c in d["spec"]["template"]["spec"].get("containers", []) + d["spec"]["template"]["spec"].get("initContainers", [])
                           for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            if isinstance(p["targetPort"], str):
                assert p["targetPort"] in container_ports, f"Service/{svc['metadata']['name']}: no container port {p['targetPort']}"

    if injector:
        check_injector(case)
    for policy in by_kind(case, "NetworkPolicy"):
        check_network_policy(case, policy)
    # The injector alerts read the injector PodMonitor's job, "<namespace>/<name>".
    injector_monitors = [m for m in by_kind(case, "PodMonitor") if m["metadata"]["name"].endswith("-injector")]
    assert bool(injector_monitors) == (injector and bool(by_kind(case, "PrometheusRule") or by_kind(case, "PodMonitor") or by_kind(case, "ServiceMonitor"))), \
        "the injector PodMonitor renders with the injector and any monitoring"
    injector_job = None
    for monitor in injector_monitors:
        injector_job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt", endpoint
    for rule in by_kind(case, "PrometheusRule"):
        check_rules(rule, injector_job)
    for cm in by_kind(case, "ConfigMap"):
        if cm["metadata"]["name"].endswith("-dashboard"):
            check_dashboard(cm)


def check_injector(case: Case) -> None:
    hook = one(by_kind(case, "MutatingWebhookConfiguration"), "webhook configuration")
    svc = one([s for s in by_kind(case, "Service") if s["metadata"]["name"].endswith("-injector")], "injector Service")
    dep = one([d for d in by_kind(case, "Deployment") if d["metadata"]["name"].endswith("-injector")], "injector Deployment")
    assert [w["clientConfig"]["service"]["path"] for w in hook["webhooks"]] == ["/inject/namespace", "/inject/pod"]
    cert_manager = "cert-manager.io/inject-ca-from" in (hook["metadata"].get("annotations") or {})
    for w in hook["webhooks"]:
        assert w["clientConfig"]["service"]["name"] == svc["metadata"]["name"], "webhook points at another Service"
        assert cert_manager or w["clientConfig"].get("caBundle"), "webhook has no CA bundle"
        exprs = {e["key"]: e for e in w["namespaceSelector"]["matchExpressions"]}
        assert NAMESPACE in exprs["kubernetes.io/metadata.name"]["values"], "release namespace not excluded"
        assert "kube-system" in exprs["kubernetes.io/metadata.name"]["values"], "kube-system not excluded"
        assert w["sideEffects"] == "None"
        assert w["reinvocationPolicy"] == "IfNeeded", "the injector must see pods other webhooks changed"
        assert w["admissionReviewVersions"] == ["v1"]
        assert 1 <= w["timeoutSeconds"] <= 30
    # Called only for pods that asked: the pod webhook selects the opt-in label (not every
    # pod CREATE in the cluster), the namespace webhook every pod not labelled out.
    [ns_hook, pod_hook] = hook["webhooks"]
    [pod_sel] = pod_hook["objectSelector"]["matchExpressions"]
    assert (pod_sel["key"], pod_sel["operator"], sorted(pod_sel["values"])) == ("weir.dev/inject", "In", ["enabled", "true"]), pod_sel
    [ns_sel] = ns_hook["objectSelector"]["matchExpressions"]
    assert (ns_sel["key"], ns_sel["operator"], sorted(ns_sel["values"])) == ("weir.dev/inject", "NotIn", ["disabled", "false"]), ns_sel
    ns_label = {e["key"]: e for e in ns_hook["namespaceSelector"]["matchExpressions"]}["weir.dev/inject"]
    assert (ns_label["operator"], ns_label["values"]) == ("In", ["enabled"]), ns_label
    pod_ns_label = {e["key"]: e for e in pod_hook["namespaceSelector"]["matchExpressions"]}["weir.dev/inject"]
    # A namespace opted out in any spelling the injector reads as "no" vetoes a pod's label.
    opt_outs = {"disabled", "false", "False", "FALSE", "0", "no", "No", "off", "Off"}
    assert pod_ns_label["operator"] == "NotIn" and set(pod_ns_label["values"]) == opt_outs | {"enabled"}, pod_ns_label
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"].get("weir.dev/inject") == "disabled", "injector pods must opt out of injection"
    assert pod["spec"]["automountServiceAccountToken"] is False
    certs = by_kind(case, "Certificate")
    tls_secret = pod["spec"]["volumes"][0]["secret"]["secretName"]
    if cert_manager:
        cert = one(certs, "Certificate")
        assert cert["spec"]["secretName"] == tls_secret
        assert f"{svc['metadata']['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    else:
        assert ("Secret", tls_secret) in {(o["kind"], o["metadata"]["name"]) for o in case.objects}
        [secret] = [o for o in by_kind(case, "Secret") if o["metadata"]["name"] == tls_secret]
        ca = base64.b64decode(secret["data"]["ca.crt"])
        assert all(base64.b64decode(w["clientConfig"]["caBundle"]) == ca for w in hook["webhooks"]), \
            "the webhook's caBundle is not the CA in the TLS Secret"
    # The server's own exclusions match the webhook's, and it runs the rendered template.
    container = one(pod["spec"]["containers"], "injector container")
    args = container["args"]
    assert args[0] == "inject", args
    excluded = {args[i + 1] for i, a in enumerate(args) if a == "--exclude-namespace"}
    assert {"kube-system"} <= excluded, f"injector args exclude {excluded}"
    assert any(e["name"] == "POD_NAMESPACE" for e in container["env"]), "injector must know its namespace"
    replicas = dep["spec"]["replicas"]
    pdbs = [p for p in by_kind(case, "PodDisruptionBudget") if p["metadata"]["name"] == dep["metadata"]["name"]]
    if pdbs:
        assert pdbs[0]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), "PDB selects no injector pod"
        assert replicas > pdbs[0]["spec"]["minAvailable"], "a PDB as large as the replica count blocks every drain"


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) on `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        value, present = labels.get(e["key"]), e["key"] in labels
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def check_network_policy(case: Case, policy: dict) -> None:
    """The no-mesh NetworkPolicy: opens only weir's two named ports of non-entry weir pods,
    the inbound one to weir pods only; never an empty `from` (which admits everyone)."""
    where = f"NetworkPolicy/{policy['metadata']['name']}"
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"], f"{where}: policyTypes {spec['policyTypes']}"
    for rule in spec["ingress"]:
        assert rule.get("from"), f"{where}: a rule without `from` admits every source"
        ports = [p["port"] for p in rule["ports"]]
        assert ports in (["weir-inbound"], ["weir-metrics"]), f"{where}: opens {ports}"
        if ports == ["weir-inbound"]:
            weir_peer = rule["from"][0]
            assert weir_peer["podSelector"]["matchLabels"] == {"weir.dev/sidecar": "weir"}, f"{where}: inbound from {weir_peer}"
    # Rendered pods: inner hops selected, entries not; the named ports exist on the selected.
    for dep in by_kind(case, "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        if labels.get("weir.dev/sidecar") != "weir":
            assert not selects(spec["podSelector"], labels), f"{where} selects Deployment/{dep['metadata']['name']} (no weir)"
            continue
        entry = labels.get("weir.dev/entry") == "true"
        assert selects(spec["podSelector"], labels) != entry, f"{where}: entry={entry} Deployment/{dep['metadata']['name']} selected wrongly"
    # And the weir.dev/entry label follows config.inbound.entry.
    config = weir_config(case)
    for dep in by_kind(case, "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        if labels.get("weir.dev/sidecar") == "weir":
            assert (labels.get("weir.dev/entry") == "true") == bool(config["inbound"]["entry"]), f"{where}: entry label"


def check_rules(rule: dict, injector_job: str | None) -> None:
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert re.search(r"weir_priority_inflation\)? > 0", rules["WeirPriorityInflation"]["expr"])
    overload = rules["WeirSustainedOverload"]["expr"]
    assert "weir_overloaded" not in overload, "the overload alert must read the shed rate, not weir_overloaded"
    assert re.search(r'outcome=~"shed_overload\|shed_deadline\|would_shed"', overload) and re.search(r"\) > 0\.\d+$", overload), overload
    assert "weir_admission_level" in rules["WeirSheddingTopClass"]["expr"]
    injector = bool(injector_job)
    assert ("WeirInjectorDown" in rules) == injector and ("WeirInjectionSkipped" in rules) == injector, sorted(rules)
    if injector:
        assert rules["WeirInjectorDown"]["expr"] == f'absent(up{{job="{injector_job}"}} == 1)', rules["WeirInjectorDown"]["expr"]
        assert f'job="{injector_job}", outcome="cannot_inject"' in rules["WeirInjectionSkipped"]["expr"]
    for r in rules.values():
        assert re.fullmatch(r"\d+[smh]", r["for"]) and r["labels"]["severity"], f"{r['alert']}: for/severity"
        try:
            promql_parser.parse(r["expr"])
        except Exception as e:  # the parser raises plain exceptions with the position
            raise AssertionError(f"{r['alert']}: invalid PromQL ({e}): {r['expr']}")


def check_dashboard(cm: dict) -> None:
    dash = json.loads(cm["data"]["weir.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for needle in ("weir_admission_level", "weir_overloaded", "histogram_quantile(0.5,", "histogram_quantile(0.99,",
                   "weir_queuing_time_seconds_bucket", "by (outcome)", "by (business)", "weir_priority_inflation"):
        assert needle in exprs, f"dashboard lacks {needle}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "dashboard panel ids repeat"


# === Chart-level checks ===


def check_values_documented() -> None:
    """Every value in values.yaml has a comment directly above it or above one
    of its parents (a commented `resources:` documents its whole mapping)."""
    undocumented = []
    for chart in ("weir", "weir-example"):
        lines = (CHARTS / chart / "values.yaml").read_text().splitlines()
        parents: list[tuple[int, bool]] = []  # (indent, documented) of enclosing keys
        for i, line in enumerate(lines):
            m = re.match(r"^(\s*)(- )?([A-Za-z_][\w-]*):(.*)$", line)
            if not m:
                continue
            indent = len(m.group(1)) + (2 if m.group(2) else 0)
            while parents and parents[-1][0] >= indent:
                parents.pop()
            prev = lines[i - 1].strip() if i else ""
            documented = prev.startswith("#") or any(d for _, d in parents)
            nxt = next((l for l in lines[i + 1:] if l.strip()), "")
            is_parent = m.group(4).strip() == "" and len(nxt) - len(nxt.lstrip()) >= indent and nxt.strip() != ""
            is_parent = is_parent and (len(nxt) - len(nxt.lstrip()) > indent or nxt.lstrip().startswith("- "))
            if is_parent:
                parents.append((indent, documented))
            elif not documented:
                undocumented.append(f"{chart}/values.yaml:{i + 1}: {m.group(3)}")
    assert not undocumented, "values without a comment:\n  " + "\n  ".join(undocumented)


def check_versions() -> None:
    chart = yaml.load((CHARTS / "weir" / "Chart.yaml").read_text(), Loader=Loader)
    values = yaml.load((CHARTS / "weir" / "values.yaml").read_text(), Loader=Loader)
    assert chart["apiVersion"] == "v2"
    assert chart["kubeVersion"].startswith(">=1.25"), chart["kubeVersion"]
    assert values["image"]["tag"] == chart["appVersion"], "values image.tag must equal Chart.yaml appVersion"
    # The image scripts/image builds by default (the Dockerfile's VERSION) is what the chart pulls.
    cargo = (REPO / "Cargo.toml").read_text()
    version = re.search(r'(?ms)^\[workspace\.package\].*?^version = "([^"]+)"', cargo).group(1)
    assert chart["appVersion"] == version, f"Chart.yaml appVersion {chart['appVersion']} != workspace version {version}"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"ARG VERSION={version}" in dockerfile, "Dockerfile VERSION differs from the workspace version"
    assert values["image"]["repository"] == "weir", "scripts/image tags weir:<version>; values image.repository differs"
    example = yaml.load((CHARTS / "weir-example" / "Chart.yaml").read_text(), Loader=Loader)
    dep = one([d for d in example["dependencies"] if d["name"] == "weir"], "weir dependency")
    assert dep["version"] == chart["version"], "weir-example depends on another weir version"


# Values that must not render: (name, extra helm args, text the error must contain).
REJECTED = [
    ("string-for-integer", ["--set-json", 'config.inbound.max_inflight="many"'], "max_inflight"),
    ("string-for-boolean", ["--set-json", 'injector.enabled="yes"'], "enabled"),
    ("bad-native-mode", ["--set", "sidecar.native=sometimes"], "native"),
    ("hostname-listen", ["--set", "config.admin.listen=localhost:15100"], "listen"),
    ("business-out-of-range", ["--set", "table.default_business=300"], "default_business"),
    ("unknown-config-key", ["--set", "config.inbound.lisen=0.0.0.0:1"], "lisen"),
    ("bad-duration", ["--set", "config.inbound.task_timeout=soon"], "task_timeout"),
    ("bad-law", ["--set", "config.admission.law=pid"], "law"),
    ("root-user", ["--set", "sidecar.runAsUser=0"], "runAsUser"),
    ("rule-without-business", ["--set-json", 'table.rules=[{"name":"x","match":{"path":"/x"}}]'], "business"),
    ("port-collision", ["--set", "config.admin.public_listen=0.0.0.0:15101"], "distinct ports"),
    ("injector-partial-tls", ["--set", "injector.tls.crt=x"], "set crt, key and caBundle together"),
    ("injector-pdb-not-a-number", ["--set", "injector.podDisruptionBudget.minAvailable=half"], "minAvailable"),
    ("injector-negative-replicas", ["--set", "injector.replicas=-1"], "replicas"),
    ("egress-listen-not-loopback", ["--set", "injector.egressListen=0.0.0.0:15102"], "egressListen"),
    ("native-on-1.27", ["--kube-version", "1.27.0", "--set", "sidecar.native=true"], "needs Kubernetes >= 1.28"),
]


def check_rejected(helm: Helm, name: str, args: list[str], needle: str) -> None:
    # A later --kube-version in args overrides this one.
    out = helm.template("weir", "1.33.0", *args)
    assert out.returncode != 0, f"{name}: rendered although it should be rejected"
    assert needle in out.stderr, f"{name}: error does not mention {needle!r}:\n{out.stderr.strip()}"


def check_notes(helm: Helm, values: str, needles: list[str], *extra: str) -> None:
    """NOTES.txt renders (helm install --dry-run=client needs no cluster)."""
    out = helm.run("install", RELEASE["weir"], str(CHARTS / "weir"), "--dry-run=client", "--namespace", NAMESPACE,
                   "-f", str(CHARTS / "weir" / "ci" / values), *extra)
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[-1]
    for needle in needles:
        assert needle in notes, f"NOTES lacks {needle!r}:\n{notes}"


def check_single_injector_has_no_pdb(helm: Helm) -> None:
    out = helm.template("weir", "1.33.0", "--set", "injector.replicas=1")
    assert out.returncode == 0, out.stderr
    kinds = [o["kind"] for o in yaml.load_all(out.stdout, Loader=Loader) if o]
    assert "Deployment" in kinds and "PodDisruptionBudget" not in kinds, "one replica must not get a blocking PDB"


def check_egress_listen(helm: Helm) -> None:
    """injector.egressListen reaches the template the injector reads (and only when set)."""
    for extra, want in (([], "127.0.0.1:15102"), (["--set", "injector.egressListen=127.0.0.9:15199"], "127.0.0.9:15199"),
                        (["--set", "injector.egressListen="], None)):
        out = helm.template("weir", "1.33.0", *extra)
        assert out.returncode == 0, out.stderr
        [cm] = [o for o in yaml.load_all(out.stdout, Loader=Loader)
                if o and o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-injector-template")]
        assert cm["data"].get("egress-listen") == want, cm["data"].get("egress-listen")


def check_given_secrets(helm: Helm) -> None:
    out = helm.template("weir", "1.33.0", "--set", "controlToken.value=s3cr3t-token-value")
    assert out.returncode == 0, out.stderr
    secrets = {o["metadata"]["name"]: o for o in yaml.load_all(out.stdout, Loader=Loader) if o and o["kind"] == "Secret"}
    token = secrets["demo-weir-token"]
    assert base64.b64decode(token["data"]["token"]) == b"s3cr3t-token-value"
    assert "annotations" not in token["metadata"], "a given token must not be marked generated"


# === Pod simulator ===


class Skip(Exception):
    """A check that cannot run here (outside CI only)."""


def check_pods(cases: list[Case], weir: Path, scratch: Path) -> None:
    """Runs every rendered and injected pod (pod_sim.py) and prints its table."""
    rendered = scratch / "pod-sim-rendered.json"
    rendered.write_text(json.dumps([[c.name, c.kube_version, c.objects] for c in cases]))
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "pod_sim.py"), "run", "--weir", str(weir),
                          "--scratch", str(scratch / "pod-sim"), "--rendered", str(rendered)],
                         capture_output=True, text=True, check=False, timeout=600)
    if out.returncode == 77 and not os.environ.get("CI"):
        raise Skip(out.stderr.strip())
    print(out.stdout, end="", flush=True)
    assert out.returncode == 0, f"pod simulator: rc {out.returncode}\n{out.stderr.strip()[-2000:]}"


# === Runner ===


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--helm", required=True, type=Path)
    parser.add_argument("--scratch", required=True, type=Path)
    parser.add_argument("--weir", required=True, type=Path, help="the weir binary (config/table checks, injector e2e)")
    args = parser.parse_args()
    update = os.environ.get("UPDATE_GOLDEN") == "1"

    helm = Helm(args.helm.resolve(), args.scratch)
    weir = args.weir.resolve()
    cases = discover_cases()
    checks: list[tuple[str, callable]] = [
        ("values documented", check_values_documented),
        ("chart versions", check_versions),
        ("given secrets land verbatim", lambda: check_given_secrets(helm)),
        ("one injector replica gets no PodDisruptionBudget", lambda: check_single_injector_has_no_pdb(helm)),
        ("injector.egressListen reaches the injector template", lambda: check_egress_listen(helm)),
        ("NOTES (defaults)", lambda: check_notes(helm, "default-values.yaml", ["Injection webhook", "TLS generate", "port-forward"])),
        ("NOTES (injector off)", lambda: check_notes(helm, "default-values.yaml", ["injector is off"], "--set", "injector.enabled=false")),
        ("NOTES (injector)", lambda: check_notes(helm, "all-on-values.yaml", ["weir.dev/inject=enabled", "weir.dev/inject: \"false\""])),
        ("weir config check / table validate reject bad files", lambda: inject_checks.check_weir_rejects(weir, args.scratch)),
        ("inject golden patches: python jsonpatch + kubernetes 1.29-1.33 schemas", inject_checks.check_golden_patches),
    ]
    checks += [(f"rejects {n}", (lambda n=n, a=a, s=s: check_rejected(helm, n, a, s))) for n, a, s in REJECTED]

    def case_checks(case: Case):
        return [
            (f"{case.name}: lint --strict", lambda: helm.lint(case)),
            (f"{case.name}: render", lambda: helm.render(case)),
            (f"{case.name}: golden", lambda: check_golden(case, update)),
            (f"{case.name}: kubernetes {case.kube_version} schema", lambda: validate_objects(case)),
            (f"{case.name}: invariants", lambda: check_invariants(case)),
            (f"{case.name}: weir config check / table validate --offline",
             lambda: inject_checks.check_weir_files(case.name, case.objects, weir, args.scratch)),
        ]

    def run(check) -> tuple[str, str | None]:
        name, fn = check
        try:
            fn()
            return name, None
        except Skip as e:
            print(f"skip {name}: {e}")
            return name, None
        except AssertionError as e:
            return name, str(e) or traceback.format_exc()
        except Exception:
            return name, traceback.format_exc()

    def run_case(case: Case) -> list[tuple[str, str | None]]:
        results = []
        for check in case_checks(case):
            results.append(run(check))
            if results[-1][1] and check[0].endswith(": render"):
                break  # nothing left to check without a render
        return results

    # helm is the slow part; two workers match the machines' two cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [r for rs in pool.map(run_case, cases) for r in rs]
        results += list(pool.map(run, checks))
    # Checks that need several renders.
    rendered = {c.name: c.objects for c in cases}
    results.append(run(("inject fixture templates are the chart's renders",
                        lambda: inject_checks.check_fixture_templates(rendered, update))))
    results.append(run(("every field `weir run` reads is settable through values (ci/every-field-values.yaml)",
                        lambda: schema_checks.check_every_field_settable(rendered["weir__every-field"], weir))))
    results.append(run(("injector e2e: rendered Deployment args, chart-generated certificate, HTTPS client trusting the caBundle",
                        lambda: inject_checks.check_injector_e2e(rendered["weir__default"], weir, args.scratch, NAMESPACE))))
    results.append(run(("one user secret per cluster: per-namespace releases copy userSecret.shareFrom (fake API server, --dry-run=server)",
                        lambda: secret_checks.check_user_secret_shared(helm.run, CHARTS / "weir", args.scratch))))
    results.append(run(("helm upgrade keeps the generated injector certificate (fake API server, --dry-run=server)",
                        lambda: inject_checks.check_generated_tls_kept_on_upgrade(
                            helm.run, CHARTS / "weir", RELEASE["weir"], rendered["weir__default"], args.scratch, NAMESPACE))))
    if not update:
        results.append(run(("pod simulator: every rendered and injected pod starts, passes its probes, serves and stops",
                            lambda: check_pods([c for c in cases if c.objects and c.pod_sim], weir, args.scratch))))
    stale = sorted({p.name for p in GOLDEN.glob("*.yaml")} - {f"{c.name}.yaml" for c in cases})
    if update:
        for name in stale:
            (GOLDEN / name).unlink()
    else:
        results.append(("no stale golden files", f"no ci values file renders {stale}; UPDATE_GOLDEN=1 removes them" if stale else None))

    failed = 0
    for name, error in results:
        if error is None:
            print(f"ok   {name}")
        else:
            failed += 1
            print(f"FAIL {name}\n     " + error.strip().replace("\n", "\n     "))
    if update:
        print(f"golden files written to {GOLDEN.relative_to(REPO)}")
    print(f"chart: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
