"""Checks that tie the chart to the `weir` binary (run by test_chart.py).

- Every rendered sidecar config and priority table passes `weir config check` /
  `weir table validate --offline` (the parsers `weir run` uses).
- The injector templates the Rust fixture tests use (inject/tests/fixtures/templates)
  are the chart's rendered `<fullname>-injector-template` ConfigMaps
  (UPDATE_GOLDEN=1 rewrites them).
- Every golden JSON Patch of the Rust fixture tests (inject/tests/golden) applies with a
  second JSON-Patch implementation (python `jsonpatch`) to exactly the golden patched
  pod, and that pod passes the Kubernetes 1.29-1.33 Pod schemas (strict).
- End to end: the injector runs with the exact arguments of the rendered Deployment, the
  certificate the chart generated and the rendered template, and a Python HTTPS client
  that trusts only the webhook's caBundle sends it an AdmissionReview.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import jsonpatch
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[3]
INJECT = REPO / "inject" / "tests"
SCHEMA_VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0"]
# ci values file (case name) -> fixture template directory.
TEMPLATE_CASES = {"weir__default": "native", "weir__native-off": "regular"}

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def configmaps(objects: list[dict], suffix: str) -> list[dict]:
    return [o for o in objects if o.get("kind") == "ConfigMap" and o["metadata"]["name"].endswith(suffix)]


def run_weir(weir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(weir), *args], capture_output=True, text=True, timeout=60, check=False)


def check_weir_files(case_name: str, objects: list[dict], weir: Path, scratch: Path) -> None:
    """`weir config check` and `weir table validate --offline` on what the chart rendered."""
    work = scratch / "weir-files" / case_name
    work.mkdir(parents=True, exist_ok=True)
    checked = 0
    for cm in configmaps(objects, "-config"):
        path = work / f"{cm['metadata']['name']}.yaml"
        path.write_text(cm["data"]["config.yaml"])
        out = run_weir(weir, "config", "check", str(path))
        assert out.returncode == 0, f"weir config check {cm['metadata']['name']}: rc {out.returncode}: {out.stderr.strip()}"
        checked += 1
    for cm in configmaps(objects, "-table"):
        path = work / f"{cm['metadata']['name']}.yaml"
        path.write_text(cm["data"]["table.yaml"])
        out = run_weir(weir, "table", "validate", "--offline", str(path))
        assert out.returncode == 0, f"weir table validate {cm['metadata']['name']}: rc {out.returncode}: {out.stderr.strip()}"
        checked += 1
    assert checked >= 2, f"expected a config and a table ConfigMap, checked {checked}"


def check_weir_rejects(weir: Path, scratch: Path) -> None:
    """The checks can fail: a bad value exits 64 with one line naming the field."""
    bad = scratch / "weir-files" / "bad"
    bad.mkdir(parents=True, exist_ok=True)
    cases = [
        ("config", "inbound:\n  max_inflight: 0\n", "inbound.max_inflight"),
        ("config", "inbound:\n  lisen: 0.0.0.0:1\n", "lisen"),
        ("table", "version: 1\ndefault_business: 300\n", "default_business"),
    ]
    for i, (kind, text, field) in enumerate(cases):
        path = bad / f"{kind}-{i}.yaml"
        path.write_text(text)
        args = ["config", "check", str(path)] if kind == "config" else ["table", "validate", "--offline", str(path)]
        out = run_weir(weir, *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 64, f"{kind} {text!r}: rc {out.returncode}"
        assert len(lines) == 1 and field in lines[0], f"{kind} {text!r}: want one line naming {field}: {out.stderr!r}"


def check_fixture_templates(cases: dict[str, list[dict]], update: bool) -> None:
    """inject/tests/fixtures/templates/* are the chart's rendered injector templates."""
    problems = []
    for case_name, directory in TEMPLATE_CASES.items():
        cm = configmaps(cases[case_name], "-injector-template")
        assert len(cm) == 1, f"{case_name}: want one injector template ConfigMap, found {len(cm)}"
        data = cm[0]["data"]
        target = INJECT / "fixtures" / "templates" / directory
        if update:
            target.mkdir(parents=True, exist_ok=True)
            for stale in set(p.name for p in target.iterdir()) - set(data):
                (target / stale).unlink()
            for key, text in data.items():
                (target / key).write_text(text)
            continue
        on_disk = {p.name: p.read_text() for p in target.iterdir()} if target.exists() else {}
        if on_disk != data:
            differing = sorted(k for k in set(on_disk) | set(data) if on_disk.get(k) != data.get(k))
            problems.append(f"{target.relative_to(REPO)}: {differing} differ from {case_name}'s render")
    assert not problems, "\n".join(problems) + "\n(UPDATE_GOLDEN=1 scripts/test-chart rewrites them; then rerun the inject tests)"


def check_golden_patches() -> None:
    """Apply each golden patch with python jsonpatch; validate the pod for 1.29-1.33."""
    goldens = sorted((INJECT / "golden").glob("*/*.json"))
    assert goldens, "no golden files under inject/tests/golden (run the inject tests with UPDATE_GOLDEN=1)"
    injected = 0
    problems = []
    for path in goldens:
        golden = json.loads(path.read_text())
        review = json.loads((INJECT / "fixtures" / "reviews" / path.name).read_text())
        pod = review["request"]["object"]
        if not golden["patch"]:
            assert golden["patchedPod"] is None, f"{path.name}: a patched pod without a patch"
            continue
        injected += 1
        patched = jsonpatch.JsonPatch(golden["patch"]).apply(copy.deepcopy(pod))
        if patched != golden["patchedPod"]:
            problems.append(f"{path.relative_to(REPO)}: python jsonpatch gives another pod than json-patch (Rust)")
            continue
        for version in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(patched, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{path.relative_to(REPO)} on {version}: {e.message} at {'/'.join(map(str, e.path))}")
    assert injected >= 6, f"only {injected} golden files carry a patch"
    # The validator can fail: an unknown field in the injected container is rejected.
    patched_pods = (json.loads(p.read_text())["patchedPod"] for p in goldens)
    broken = copy.deepcopy(next(pod for pod in patched_pods if pod))
    broken["spec"]["containers"][0]["notAField"] = True
    try:
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[0], strict=True)
        problems.append("kubernetes-validate accepted a pod with an unknown field")
    except kubernetes_validate.ValidationError:
        pass
    assert not problems, "\n".join(problems)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_injector_e2e(objects: list[dict], weir: Path, scratch: Path, namespace: str) -> None:
    """The injector as the chart deploys it, with the certificate the chart generated."""
    by = lambda kind, suffix: [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    [dep] = by("Deployment", "-injector")
    [secret] = [o for o in by("Secret", "-injector-tls")]
    [hook] = by("MutatingWebhookConfiguration", f"-injector-{namespace}")
    [template] = by("ConfigMap", "-injector-template")
    [svc] = by("Service", "-injector")
    assert (secret.get("metadata", {}).get("annotations") or {}).get("weir.dev/generated") == "true", "want a chart-generated certificate"

    work = scratch / "injector-e2e"
    tls_dir, template_dir = work / "tls", work / "template"
    tls_dir.mkdir(parents=True)
    template_dir.mkdir(parents=True)
    for key, value in secret["data"].items():
        (tls_dir / key).write_bytes(base64.b64decode(value))
    for key, value in template["data"].items():
        (template_dir / key).write_text(value)
    ca_bundles = {w["clientConfig"]["caBundle"] for w in hook["webhooks"]}
    assert len(ca_bundles) == 1, "the two webhooks trust different CAs"
    ca = work / "ca.pem"
    ca.write_bytes(base64.b64decode(ca_bundles.pop()))

    pod = dep["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    port = free_port()
    args = []
    for a in container["args"]:
        a = a.replace(mounts["tls"], str(tls_dir)).replace(mounts["template"], str(template_dir))
        if a.startswith("0.0.0.0:"):
            a = f"127.0.0.1:{port}"
        args.append(a)
    assert container["command"] == ["weir"], container["command"]
    env = {"POD_NAMESPACE": namespace, "RUST_LOG": "warn"}
    proc = subprocess.Popen([str(weir), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        context = ssl.create_default_context(cafile=str(ca))  # trusts only the chart's CA
        host = f"{svc['metadata']['name']}.{namespace}.svc"  # the name the API server dials

        def request(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            # Verify the certificate against the Service's DNS name, not 127.0.0.1.
            conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname=host)
            headers = {"content-type": "application/json", "host": host}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            return resp.status, data

        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"weir inject exited {proc.returncode}: {proc.stderr.read()}")
            try:
                status, _ = request("GET", "/ready")
                if status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            assert time.monotonic() < deadline, "weir inject not ready within 20 s"
            time.sleep(0.05)

        review = json.loads((INJECT / "fixtures" / "reviews" / "namespace__deployment-pod.json").read_text())
        # The API server calls the webhook's path with its timeout appended.
        status, data = request("POST", "/inject/namespace?timeout=5s", json.dumps(review).encode())
        assert status == 200, f"review answered {status}: {data[:300]!r}"
        response = json.loads(data)["response"]
        assert response["uid"] == review["request"]["uid"] and response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        patched = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(review["request"]["object"]))
        names = [c["name"] for c in patched["spec"].get("initContainers", []) + patched["spec"]["containers"]]
        assert names.count("weir-proxy") == 1, names
        kubernetes_validate.validate(patched, "1.33.0", strict=True)
        status, data = request("POST", "/inject/namespace", b'{"apiVersion": "admission.k8s.io/v1"')
        assert status == 400 and b"not a JSON AdmissionReview" in data, (status, data)
        # A pod that asked and cannot have weir: admitted, annotated with why, logged at WARN.
        skipped = json.loads((INJECT / "fixtures" / "reviews" / "namespace__bad-override.json").read_text())
        status, data = request("POST", "/inject/namespace", json.dumps(skipped).encode())
        assert status == 200, f"review answered {status}: {data[:300]!r}"
        response = json.loads(data)["response"]
        assert response["allowed"] is True and response["warnings"], response
        patched = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"]))).apply(copy.deepcopy(skipped["request"]["object"]))
        status_annotation = patched["metadata"]["annotations"]["weir.dev/inject-status"]
        assert status_annotation.startswith("skipped: "), status_annotation
        assert [c["name"] for c in patched["spec"]["containers"]] == [c["name"] for c in skipped["request"]["object"]["spec"]["containers"]]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("weir inject did not stop within 15 s of SIGTERM")
    log = proc.stderr.read()
    assert rc == 0, f"weir inject exited {rc} on SIGTERM: {log}"
    warned = [l for l in log.splitlines() if "WARN" in l and "admitted without the weir sidecar" in l]
    assert warned and "weir.dev/" in warned[0], f"no WARN line for the skipped pod in:\n{log}"
    assert "\x1b[" not in log, "colour escapes in a piped log"


# === helm upgrade keeps the generated certificate ===


class FakeApiServer:
    """Just enough of a Kubernetes API server (discovery and GETs) for
    `helm install --dry-run=server`, which only reads: the chart's `lookup` calls
    see the objects in `store` (path -> object), everything else is absent."""

    GROUPS = {
        "apps/v1": [("deployments", "Deployment", True)],
        "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
        "admissionregistration.k8s.io/v1": [("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False)],
    }
    CORE = [("secrets", "Secret", True), ("configmaps", "ConfigMap", True), ("services", "Service", True),
            ("serviceaccounts", "ServiceAccount", True), ("namespaces", "Namespace", False)]

    def __init__(self, store: dict[str, dict]):
        import http.server
        import threading

        api = self

        def resources(group_version: str, items) -> dict:
            return {"kind": "APIResourceList", "groupVersion": group_version, "resources": [
                {"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k, "verbs": ["get", "list"]}
                for n, k, ns in items]}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                api.requests.append(path)
                if path == "/version":
                    return self.reply(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"})
                if path == "/api":
                    return self.reply(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
                if path == "/api/v1":
                    return self.reply(200, resources("v1", api.CORE))
                if path == "/apis":
                    groups = [{"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                               "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}} for gv in api.GROUPS]
                    return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
                if path.startswith("/apis/") and path[6:] in api.GROUPS:
                    return self.reply(200, resources(path[6:], api.GROUPS[path[6:]]))
                if path in store:
                    return self.reply(200, store[path])
                if path.endswith(("/secrets", "/configmaps")):  # helm's release storage: none yet
                    return self.reply(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
                return self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

            def reply(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.requests: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeApiServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        port = self.server.server_address[1]
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "fake", "user": {"token": "not-a-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
            "current-context": "fake",
        }))
        return path


def check_generated_tls_kept_on_upgrade(helm_run, chart: Path, release: str, objects: list[dict], scratch: Path,
                                        namespace: str) -> None:
    """With the chart's generated Secret already in the cluster, a new render (an upgrade)
    reuses it: same certificate and key, and the webhooks keep trusting its CA."""
    [old] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-injector-tls")]
    # As the previous release left it: helm's ownership marks on it.
    old = copy.deepcopy(old)
    old["metadata"].setdefault("annotations", {}).update(
        {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace})
    store = {f"/api/v1/namespaces/{namespace}/secrets/{old['metadata']['name']}": old}
    work = scratch / "upgrade"
    work.mkdir(parents=True, exist_ok=True)

    def render(store: dict) -> list[dict]:
        with FakeApiServer(store) as api:
            kubeconfig = api.kubeconfig(work / "kubeconfig", namespace)
            out = helm_run("install", release, str(chart), "--namespace", namespace, "--dry-run=server",
                           "--disable-openapi-validation", "--kubeconfig", str(kubeconfig))
            assert out.returncode == 0, f"helm install --dry-run=server: {out.stderr.strip()}"
            assert any(p.endswith(old["metadata"]["name"]) for p in api.requests), "the chart did not look the Secret up"
        manifest = out.stdout.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)[0]
        return [o for o in yaml.load_all(manifest, Loader=Loader) if o]

    rendered = render(store)
    [new] = [o for o in rendered if o["kind"] == "Secret" and o["metadata"]["name"] == old["metadata"]["name"]]
    assert new["data"] == old["data"], "the generated certificate changed on upgrade"
    [hook] = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
    for w in hook["webhooks"]:
        assert w["clientConfig"]["caBundle"] == old["data"]["ca.crt"], "the webhook trusts another CA after upgrade"
    # Without the Secret in the cluster (a first install), a fresh pair is generated.
    fresh = render({})
    [first] = [o for o in fresh if o["kind"] == "Secret" and o["metadata"]["name"] == old["metadata"]["name"]]
    assert first["data"]["ca.crt"] != old["data"]["ca.crt"], "a first install must generate its own CA"
