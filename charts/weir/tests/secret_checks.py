"""The user-hash secret is one per cluster by default (run by test_chart.py).

Each per-namespace release used to generate its own, so one user got different levels at
different entries. Now a release copies the shared Secret `userSecret.shareFrom`
(weir-system/weir-user-secret) by lookup at install/upgrade. Checked with
`helm install --dry-run=server` against the fake API server of inject_checks.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from inject_checks import FakeApiServer

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SHARED = base64.b64encode(b"the-one-user-secret-of-this-cluster-0123456789").decode()
OLD_LOCAL = base64.b64encode(b"a-per-namespace-secret-from-an-earlier-install").decode()


def secret(namespace: str, name: str, value: str) -> tuple[str, dict]:
    return (f"/api/v1/namespaces/{namespace}/secrets/{name}",
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {"secret": value},
             # As the release "weir" in that namespace left it: helm's ownership marks.
             "metadata": {"name": name, "namespace": namespace,
                          "labels": {"app.kubernetes.io/managed-by": "Helm"},
                          "annotations": {"meta.helm.sh/release-name": "weir", "meta.helm.sh/release-namespace": namespace,
                                          "weir.dev/generated": "true"}}})


def check_user_secret_shared(helm_run, chart: Path, scratch: Path) -> None:
    work = scratch / "user-secret"
    work.mkdir(parents=True, exist_ok=True)

    def install(namespace: str, store: dict, *extra: str) -> tuple[dict, str]:
        with FakeApiServer(store) as api:
            kubeconfig = api.kubeconfig(work / "kubeconfig", namespace)
            out = helm_run("install", "weir", str(chart), "--namespace", namespace, "--dry-run=server",
                           "--disable-openapi-validation", "--kubeconfig", str(kubeconfig),
                           "--set", "fullnameOverride=weir", *extra)
        assert out.returncode == 0, f"helm install --dry-run=server -n {namespace}: {out.stderr.strip()}"
        manifest, notes = out.stdout.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)
        [user] = [o for o in yaml.load_all(manifest, Loader=Loader)
                  if o and o["kind"] == "Secret" and o["metadata"]["name"] == "weir-user-secret"]
        return user, notes

    shared = dict([secret("weir-system", "weir-user-secret", SHARED)])
    # A per-namespace release copies the cluster's shared secret...
    user, notes = install("shop", shared, "--set", "injector.enabled=false")
    assert user["data"]["secret"] == SHARED, "the shop release did not copy weir-system/weir-user-secret"
    assert user["metadata"]["annotations"] == {"weir.dev/shared-from": "weir-system/weir-user-secret"}, user["metadata"]
    assert "copied from weir-system/weir-user-secret" in notes, notes
    # ...also over the one an earlier install generated there (an upgrade mends the split).
    with_old = dict(shared, **dict([secret("payments", "weir-user-secret", OLD_LOCAL)]))
    user, _ = install("payments", with_old, "--set", "injector.enabled=false")
    assert user["data"]["secret"] == SHARED, "an upgrade kept a per-namespace secret over the shared one"
    # The release that holds the shared Secret keeps its own (it is the source).
    user, notes = install("weir-system", shared)
    assert user["data"]["secret"] == SHARED and "WARNING" not in notes
    # Nothing to share: generated here, and NOTES says what that costs.
    user, notes = install("shop", {}, "--set", "injector.enabled=false")
    assert user["data"]["secret"] not in (SHARED, OLD_LOCAL)
    assert user["metadata"]["annotations"] == {"weir.dev/generated": "true"}
    assert "WARNING: the user secret was generated for this namespace alone" in notes, notes
    # A given value wins over everything.
    given = base64.b64encode(b"given-by-values").decode()
    user, _ = install("shop", shared, "--set", "injector.enabled=false", "--set", "userSecret.value=given-by-values")
    assert user["data"]["secret"] == given
