"""Pod simulator: every pod the charts render or the injector patches, run as the kubelet
would run it, on this machine (run by test_chart.py; needs root: network and mount
namespaces).

For each pod:
- a network namespace of its own (a "pause" process, as Kubernetes does), joined to the
  simulator's node namespace by a veth pair: the pod has an IP, the probes and requests come
  from the node side, so a port bound on loopback only is not reachable, as in a cluster;
- its ConfigMap, Secret and emptyDir volumes materialised the way the kubelet writes them
  (`..data` symlink to a timestamped directory, `defaultMode`, `items`), from the rendered
  objects (a Secret the chart does not render, such as a cert-manager certificate or an
  `existingSecret`, gets a stand-in, named in the notes);
- each weir container in a mount namespace of its own, chrooted into a root holding only
  the files the image holds (the binary at /usr/local/bin/weir and the libraries distroless/cc
  provides, nothing else: no shell), its volumes mounted at their mountPaths (subPath
  included), read-only except its emptyDirs when `readOnlyRootFilesystem` says so, started
  with the container's command, args and env as its runAsUser/runAsGroup with no_new_privs
  and no capabilities; other containers (the app, an istio-proxy) are stand-ins that listen
  on their declared ports;
- native sidecars (init containers with restartPolicy Always) start first, each gated by
  its startup probe, then the regular containers;
- then: every declared containerPort accepts from the node, every probe (startup, liveness,
  readiness; httpGet or tcpSocket) answers 2xx, a request through weir's inbound port
  reaches the stand-in app (for the injector: an AdmissionReview answered with a patch,
  whose pod is simulated next), and the pod is stopped as the kubelet stops it (native
  sidecars after the app; preStop sleep, then SIGTERM), requests keep being served while
  weir's preStop sleep or drain delay runs, and each weir container exits 0 within
  terminationGracePeriodSeconds.

Prints one row per container and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import base64
import copy
import http.client
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# The injector's review fixtures (only the simulator reads them; its stand-ins run a copy of
# this file from elsewhere).
INJECT_REVIEWS = Path(__file__).resolve().parent.parent.parent.parent / "inject" / "tests" / "fixtures" / "reviews"
# distroless's PATH (the image's ENV): `weir` resolves to /usr/local/bin/weir.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WEIR_IN_IMAGE = "usr/local/bin/weir"
# What gcr.io/distroless/cc-debian12 holds that weir may link against (glibc 2.36 and
# libgcc_s from Debian 12, as the build stage). Anything else would be missing in the image.
RUNTIME_LIBS = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libpthread.so.0",
                "libdl.so.2", "librt.so.1"}
# The image's USER (Dockerfile) when a pod sets no runAsUser/runAsGroup.
IMAGE_USER = (65532, 65532)
# Istio's proxy in every Istio pod: Envoy's outbound and inbound capture ports, pilot-agent's
# merged metrics and health, Envoy's Prometheus port (declared here as container ports, so
# the injector sees them), and Envoy's admin on loopback (bound, not declared, as in Istio).
ISTIO_PORTS = [15001, 15006, 15020, 15021, 15090]
ISTIO_LOOPBACK = ["127.0.0.1:15000"]
ISTIO_UID = 1337
APP_UID = 101  # nginx-unprivileged's user
POLL = 0.05
# How long a declared port may take to accept once its container runs (see check_running).
PORT_GRACE_S = 10.0
NODE_MARK = "WEIR_POD_SIM_NODE"


# === Image root ===


def ldd(binary: Path) -> list[tuple[str, str]]:
    """(soname, path) of every library the dynamic loader maps for `binary`."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if "not a dynamic executable" in out.stdout + out.stderr:
        return []
    assert out.returncode == 0, f"ldd {binary}: {out.stderr.strip()}"
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if m := re.match(r"(\S+) => (\S+) \(", line):
            libs.append((m.group(1), m.group(2)))
        elif m := re.match(r"(/\S+) \(", line):
            libs.append((Path(m.group(1)).name, m.group(1)))
    return libs


def assemble_image_root(root: Path, weir: Path) -> list[str]:
    """A root holding what the image holds for weir (Dockerfile: distroless/cc-debian12:nonroot
    plus the binary): the binary, the libraries it links from the runtime base, /etc/passwd and
    /etc/group with nonroot, /tmp and /home/nonroot. Returns the files, for the record."""
    root.mkdir(parents=True)
    files = []

    def place(rel: str, src: Path | None = None, text: str | None = None, mode: int = 0o644) -> None:
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src is not None:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        else:
            dst.write_text(text or "")
        os.chmod(dst, mode)
        files.append("/" + rel)

    place(WEIR_IN_IMAGE, weir.resolve(), mode=0o755)
    for soname, path in ldd(weir):
        if soname == "linux-vdso.so.1":
            continue
        assert soname in RUNTIME_LIBS, f"weir links {soname} ({path}), which distroless/cc does not hold"
        real = Path(path).resolve()
        if path.startswith("/lib64/"):
            # Debian's layout: /lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...
            place(f"lib/x86_64-linux-gnu/{real.name}", real, mode=0o755)
            (root / "lib64").mkdir(exist_ok=True)
            os.symlink(f"/lib/x86_64-linux-gnu/{real.name}", root / path.lstrip("/"))
            files.append(f"{path} -> /lib/x86_64-linux-gnu/{real.name}")
        else:
            place(path.lstrip("/"), real, mode=0o755 if "ld-linux" in soname else 0o644)
    place("etc/passwd", text="root:x:0:0:root:/root:/sbin/nologin\n"
                             "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
                             "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
    place("etc/group", text="root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)
    (root / "home" / "nonroot").mkdir(parents=True)
    os.chown(root / "home" / "nonroot", 65532, 65532)
    files += ["/tmp/", "/home/nonroot/"]
    return files


# === Pods ===


@dataclass
class Pod:
    case: str
    source: str
    metadata: dict
    spec: dict
    objects: list[dict]
    namespace: str
    # For the injector pod: AdmissionReviews to send once it serves, (label, review, path).
    reviews: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Istio's proxy stands beside weir in this pod.
    mesh: str = ""

    @property
    def name(self) -> str:
        return f"{self.case}: {self.source}"


@dataclass
class Row:
    pod: str
    container: str
    kind: str
    user: str = "-"
    rootfs: str = "-"
    ports: str = "-"
    probes: str = "-"
    request: str = "-"
    stopping: str = "-"
    exit: str = "-"
    problems: list[str] = field(default_factory=list)


def is_weir(container: dict) -> bool:
    image = container.get("image", "")
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return container.get("command", [None])[:1] == ["weir"] or repository.rsplit("/", 1)[-1] == "weir"


def pods_of(case: str, objects: list[dict], kube_version: str) -> list[Pod]:
    """Pod templates of the rendered Deployments; the injector's gets the reviews to send."""
    pods = []
    hooks = [o for o in objects if o.get("kind") == "MutatingWebhookConfiguration"]
    for dep in (o for o in objects if o.get("kind") == "Deployment"):
        template = dep["spec"]["template"]
        pod = Pod(case=case, source=f"Deployment/{dep['metadata']['name']}", metadata=copy.deepcopy(template["metadata"]),
                  spec=copy.deepcopy(template["spec"]), objects=objects,
                  namespace=dep["metadata"].get("namespace", "apps"))
        pod.metadata["name"] = f"{dep['metadata']['name']}-sim"
        containers = pod.spec.get("containers", [])
        if any((c.get("args") or [None])[0] == "inject" for c in containers) and hooks:
            [hook] = hooks
            path = next(w["clientConfig"]["service"]["path"] for w in hook["webhooks"]
                        if w["clientConfig"]["service"]["path"].endswith("/namespace"))
            review = json.loads((INJECT_REVIEWS / "namespace__deployment-pod.json").read_text())
            pod.reviews.append(("app pod", review, path))
            native = int(kube_version.split(".")[1]) >= 29
            pod.reviews.append(("app pod + istio-proxy", istio_review(review, native), path))
        pods.append(pod)
    return pods


def istio_review(review: dict, native: bool) -> dict:
    """The fixture pod as Istio's injector leaves it (Istio's webhook sorts before weir's):
    istio-init and istio-proxy with their ports, run as 1337."""
    review = copy.deepcopy(review)
    review["request"]["uid"] = review["request"]["uid"][:-4] + "1571"
    pod = review["request"]["object"]
    pod["metadata"].setdefault("annotations", {}).update({
        "sidecar.istio.io/status": '{"initContainers":["istio-init"],"containers":["istio-proxy"]}',
        "prometheus.io/port": "15020",
        # docs/mesh.md: weir's probe port outside Envoy's capture, as Istio's own 15020/15021/15090.
        "traffic.sidecar.istio.io/excludeInboundPorts": "15120",
    })
    pod["metadata"]["labels"]["security.istio.io/tlsMode"] = "istio"
    proxy = {
        "name": "istio-proxy",
        "image": "docker.io/istio/proxyv2:1.24.0",
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
        "ports": [{"name": f"istio-{p}", "containerPort": p, "protocol": "TCP"} for p in ISTIO_PORTS],
        "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 15},
        "securityContext": {"runAsUser": ISTIO_UID, "runAsGroup": ISTIO_UID, "runAsNonRoot": True,
                            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    }
    init = {
        "name": "istio-init",
        "image": "docker.io/istio/proxyv2:1.24.0",
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*",
                 "-b", "*", "-d", "15090,15021,15020,15120"],
        "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
    }
    if native:
        # Istio's native-sidecar mode: istio-proxy is an init container with restartPolicy Always.
        proxy["restartPolicy"] = "Always"
        pod["spec"]["initContainers"] = [init, proxy]
    else:
        pod["spec"]["initContainers"] = [init]
        pod["spec"]["containers"].append(proxy)
    return review


# === Volumes ===


def find(objects: list[dict], kind: str, name: str) -> dict | None:
    return next((o for o in objects if o.get("kind") == kind and o["metadata"]["name"] == name), None)


def is_pem(data: dict) -> bool:
    try:
        return all(base64.b64decode(data.get(k, "")).startswith(b"-----BEGIN") for k in ("tls.crt", "tls.key"))
    except ValueError:
        return False


def stand_in_tls(work: Path, dns_names: list[str]) -> dict[str, bytes]:
    """A CA and a server certificate for `dns_names`, as cert-manager would issue them."""
    work.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        out = subprocess.run(["openssl", *args], cwd=work, capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"openssl {args[0]}: {out.stderr.strip()}"

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=pod-sim stand-in CA")
    run("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={dns_names[0]}")
    (work / "ext").write_text("subjectAltName=" + ",".join(f"DNS:{n}" for n in dns_names) + "\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "2", "-extfile", "ext")
    return {k: (work / k).read_bytes() for k in ("tls.crt", "tls.key", "ca.crt")}


def atomic_writer(target: Path, files: dict[str, bytes], mode: int) -> None:
    """The kubelet's layout for ConfigMap/Secret volumes: files in a timestamped directory,
    `..data` pointing at it, and each key a symlink through `..data`."""
    target.mkdir(parents=True)
    stamp = target / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir()
    for key, data in files.items():
        path = stamp / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode)
    os.symlink(stamp.name, target / "..data")
    for key in {k.split("/", 1)[0] for k in files}:
        os.symlink(f"..data/{key}", target / key)
    os.chmod(stamp, 0o755)
    os.chmod(target, 0o755)


def materialise(pod: Pod, work: Path, needed: set[str]) -> dict[str, tuple[Path, str]]:
    """Writes the pod's volumes that `needed` names; returns name -> (directory, type)."""
    out = {}
    for volume in pod.spec.get("volumes", []):
        name = volume["name"]
        if name not in needed:
            continue
        target = work / "volumes" / name
        if "emptyDir" in volume:
            target.mkdir(parents=True)
            os.chmod(target, 0o777)  # the kubelet's emptyDir mode
            out[name] = (target, "emptyDir")
        elif "configMap" in volume or "secret" in volume:
            secret = "secret" in volume
            ref = volume["secret"] if secret else volume["configMap"]
            obj_name = ref["secretName"] if secret else ref["name"]
            obj = find(pod.objects, "Secret" if secret else "ConfigMap", obj_name)
            if obj is None or (secret and obj_name.endswith("-injector-tls") and not is_pem(obj.get("data", {}))):
                data = stand_in_secret(pod, obj_name, work)
            elif secret:
                data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
                data |= {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
            else:
                data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            if "items" in ref:
                data = {item["path"]: data[item["key"]] for item in ref["items"]}
            atomic_writer(target, data, ref.get("defaultMode", 0o644))
            out[name] = (target, "secret" if secret else "configMap")
        else:
            raise AssertionError(f"volume {name}: only configMap, secret and emptyDir are simulated: {volume}")
    return out


def stand_in_secret(pod: Pod, name: str, work: Path) -> dict[str, bytes]:
    if name.endswith("-injector-tls"):
        certs = [o for o in pod.objects if o.get("kind") == "Certificate" and o["spec"]["secretName"] == name]
        svc = [o for o in pod.objects if o.get("kind") == "Service" and o["metadata"]["name"].endswith("-injector")]
        names = certs[0]["spec"]["dnsNames"] if certs else \
            [f"{svc[0]['metadata']['name']}.{pod.namespace}.svc"]
        pod.notes.append(f"Secret {name}: stand-in certificate ({'cert-manager' if certs else 'values carry placeholders'})")
        return stand_in_tls(work / "stand-in-tls", names)
    # existingSecret: any key the volume's items ask for gets a random value.
    pod.notes.append(f"Secret {name}: stand-in for an existingSecret")
    keys = set()
    for volume in pod.spec.get("volumes", []):
        if volume.get("secret", {}).get("secretName") == name:
            keys |= {item["key"] for item in volume["secret"].get("items", [])}
    return {k: base64.b16encode(os.urandom(24)) for k in keys or {"secret"}}


# === Processes ===


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path):
        self.name = name
        self.log = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.exited_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            rc = self.popen.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return None
        if self.exited_at is None:
            self.exited_at = time.monotonic()
        return rc

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait()
        self._log.close()


def status_of(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def mounts_of(pid: int) -> list[tuple[str, str]]:
    """(mount point as the process sees it, per-mount options) of every mount in its root."""
    out = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        out.append((point, fields[5]))
    return out


# === Kubelet probes ===


def resolve_port(port, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise AssertionError(f"probe port {port!r} names no port of {container['name']}")


def http_status(host: str, port: int, path: str, *, https: bool = False, timeout: float = 1.0,
                method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    if https:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers={"user-agent": "kube-probe/1.33", "connection": "close", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def probe_once(probe: dict, container: dict, pod_ip: str) -> str | None:
    """None when the probe succeeds (2xx, or a TCP connect), else why not."""
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = resolve_port(get["port"], container)
            status, _, _ = http_status(get.get("host", pod_ip), port, get.get("path", "/"),
                                       https=get.get("scheme", "HTTP") == "HTTPS", timeout=timeout,
                                       headers={h["name"]: h["value"] for h in get.get("httpHeaders", [])})
            return None if 200 <= status < 300 else f"HTTP {status} on {port}"
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            with socket.create_connection((pod_ip, port), timeout=timeout):
                return None
        return f"probe kind {sorted(probe)} is not simulated"
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"


def wait_probe(probe: dict, container: dict, pod_ip: str, proc: Proc) -> str | None:
    """Polls until the probe succeeds within the kubelet's window (initial delay + period x
    failureThreshold), or the container exits."""
    window = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    deadline = time.monotonic() + max(window, 5)
    why = "never probed"
    while time.monotonic() < deadline:
        why = probe_once(probe, container, pod_ip)
        if why is None:
            return None
        if not proc.alive():
            return f"container exited {proc.popen.returncode}: {proc.tail()}"
        time.sleep(POLL * 2)
    return f"{why} for {window}s"


PROBES = (("startupProbe", "startup"), ("livenessProbe", "live"), ("readinessProbe", "ready"))


# === One pod ===


class PodRun:
    def __init__(self, pod: Pod, index: int, image_root: Path, scratch: Path, stand_in: Path):
        self.pod = pod
        self.index = index
        self.image_root = image_root
        self.work = scratch / f"pod-{index}"
        self.work.mkdir(parents=True)
        self.stand_in = stand_in
        self.node_ip = f"10.{index}.0.1"
        self.ip = f"10.{index}.0.2"
        self.procs: dict[str, Proc] = {}
        self.pause: subprocess.Popen | None = None
        self.rows: dict[str, Row] = {}
        self.injected: list[Pod] = []
        # Containers whose startup probe failed: the kubelet restarts them and never runs
        # their liveness or readiness probes.
        self.startup_failed: set[str] = set()

    # --- network ---

    def net_up(self) -> None:
        self.pause = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"], start_new_session=True)
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.pause.pid}/ns/net") == mine:
            assert time.monotonic() < deadline, "pause process has no network namespace"
            time.sleep(0.01)
        host = f"sim{self.index}"
        pid = str(self.pause.pid)
        for cmd in (["ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", pid],
                    ["ip", "addr", "add", f"{self.node_ip}/24", "dev", host],
                    ["ip", "link", "set", host, "up"],
                    ["nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up"],
                    ["nsenter", "-t", pid, "-n", "ip", "addr", "add", f"{self.ip}/24", "dev", "eth0"],
                    ["nsenter", "-t", pid, "-n", "ip", "link", "set", "eth0", "up"]):
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            assert out.returncode == 0, f"{' '.join(cmd)}: {out.stderr.strip()}"

    # --- containers ---

    def env_of(self, container: dict) -> dict[str, str]:
        env = {"PATH": IMAGE_PATH, "HOSTNAME": self.pod.metadata["name"]}
        fields = {"metadata.name": self.pod.metadata["name"], "metadata.namespace": self.pod.namespace,
                  "status.podIP": self.ip, "spec.nodeName": "pod-sim", "spec.serviceAccountName": "default"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                raise AssertionError(f"{container['name']}: env {e['name']} source not simulated")
        return env

    def user_of(self, container: dict) -> tuple[int, int]:
        pod_sc = self.pod.spec.get("securityContext", {})
        sc = container.get("securityContext", {})
        uid = sc.get("runAsUser", pod_sc.get("runAsUser", IMAGE_USER[0]))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", IMAGE_USER[1]))
        return uid, gid

    def start_weir(self, container: dict, volumes: dict[str, tuple[Path, str]]) -> Proc:
        name = container["name"]
        sc = container.get("securityContext", {})
        uid, gid = self.user_of(container)
        root = self.work / "roots" / name
        root.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", "--link", str(self.image_root), str(root)], check=True)
        script = ["set -e", f"mount --bind {q(root)} {q(root)}"]
        rw = []
        for mount in container.get("volumeMounts", []):
            source, kind = volumes[mount["name"]]
            if mount.get("subPath"):
                source = (source / mount["subPath"]).resolve()
            target = root / mount["mountPath"].lstrip("/")
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            script.append(f"mount --bind {q(source)} {q(target)}")
            # The kubelet mounts ConfigMap and Secret volumes read-only whatever the mount says.
            if mount.get("readOnly") or kind in ("configMap", "secret"):
                script.append(f"mount -o remount,bind,ro {q(target)}")
            else:
                rw.append(mount["mountPath"])
        # What every container runtime provides: /proc, a few devices, and the kubelet's
        # /etc/hosts, /etc/hostname and /etc/resolv.conf (read-only here: nothing of weir's
        # may write outside its emptyDirs).
        etc = self.work / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{self.ip}\t{self.pod.metadata['name']}\n")
        (etc / "hostname").write_text(self.pod.metadata["name"] + "\n")
        (etc / "resolv.conf").write_text(f"search {self.pod.namespace}.svc.cluster.local svc.cluster.local\n"
                                          "nameserver 10.96.0.10\noptions ndots:5\n")
        (root / "proc").mkdir(exist_ok=True)
        script.append(f"mount -t proc proc {q(root / 'proc')}")
        (root / "dev").mkdir(exist_ok=True)
        for dev in ("null", "zero", "random", "urandom"):
            (root / "dev" / dev).touch()
            script.append(f"mount --bind /dev/{dev} {q(root / 'dev' / dev)}")
        for f in ("hosts", "hostname", "resolv.conf"):
            (root / "etc" / f).touch()
            script.append(f"mount --bind {q(etc / f)} {q(root / 'etc' / f)}")
            script.append(f"mount -o remount,bind,ro {q(root / 'etc' / f)}")
        if sc.get("readOnlyRootFilesystem"):
            script.append(f"mount -o remount,bind,ro {q(root)}")
        argv = [*container.get("command", ["/usr/local/bin/weir"]), *container.get("args", [])]
        # no_new_privs (allowPrivilegeEscalation: false); the bounding set keeps only what
        # chroot needs to switch user, and the switch to a non-root uid clears the rest.
        nnp = "--no-new-privs " if sc.get("allowPrivilegeEscalation") is False else ""
        script.append(f"exec setpriv {nnp}--bounding-set=-all,+sys_chroot,+setuid,+setgid -- "
                      f"chroot --userspec={uid}:{gid} --groups={gid} {q(root)} {' '.join(q(a) for a in argv)}")
        cmd = ["nsenter", "-t", str(self.pause.pid), "-n", "--", "unshare", "--mount", "--propagation", "private",
               "--", "/bin/sh", "-c", "\n".join(script)]
        proc = Proc(name, cmd, self.env_of(container), self.work / f"{name}.log")
        proc.rw = rw  # type: ignore[attr-defined]
        proc.root = root  # type: ignore[attr-defined]
        return proc

    def start_stand_in(self, container: dict, linger: float) -> Proc:
        name = container["name"]
        ports = [p["containerPort"] for p in container.get("ports", [])]
        if not ports and name == "app":
            ports = [8080]
        binds = [f"0.0.0.0:{p}" for p in ports] + (ISTIO_LOOPBACK if name == "istio-proxy" else [])
        uid, _ = self.user_of(container) if "runAsUser" in container.get("securityContext", {}) else (APP_UID, APP_UID)
        cmd = ["nsenter", "-t", str(self.pause.pid), "-n", "--", "setpriv", f"--reuid={uid}", f"--regid={uid}",
               "--clear-groups", "--no-new-privs", "/usr/bin/python3", str(self.stand_in), "stand-in",
               "--name", name, "--linger", str(linger), *binds]
        return Proc(name, cmd, {"PATH": os.environ.get("PATH", IMAGE_PATH)}, self.work / f"{name}.log")

    # --- the run ---

    def run(self) -> list[Row]:
        try:
            self.net_up()
            self.lifecycle()
        except Exception as e:  # noqa: BLE001 - reported in the table
            row = next(iter(self.rows.values()), None) or self.rows.setdefault(
                "-", Row(self.pod.name, "-", "-"))
            row.problems.append(f"{type(e).__name__}: {e}" if isinstance(e, AssertionError)
                                else traceback.format_exc(limit=3))
        finally:
            for proc in self.procs.values():
                proc.kill()
            if self.pause:
                self.pause.kill()
                self.pause.wait()
        for row in self.rows.values():
            row.pod = self.pod.name
        return list(self.rows.values())

    def lifecycle(self) -> None:
        # The pod as simulated (for an injected one: the patched pod), for the record.
        import yaml  # the simulator's venv has it (test-chart)

        (self.work / "pod.yaml").write_text(yaml.safe_dump({"metadata": self.pod.metadata, "spec": self.pod.spec},
                                                           sort_keys=False))
        spec = self.pod.spec
        init, regular = spec.get("initContainers", []), spec.get("containers", [])
        weir_containers = [c for c in init + regular if is_weir(c)]
        needed = {m["name"] for c in weir_containers for m in c.get("volumeMounts", [])}
        volumes = materialise(self.pod, self.work, needed)
        names = [c["name"] for c in init + regular]
        assert len(names) == len(set(names)), f"duplicate container names {names}"
        declared = [(c["name"], p["containerPort"]) for c in init + regular for p in c.get("ports", [])]
        ports = [p for _, p in declared]
        clash = sorted({p for p in ports if ports.count(p) > 1})
        assert not clash, f"containers declare the same port: {[(n, p) for n, p in declared if p in clash]}"

        # The stand-in app honours the same shutdown delay as a regular weir sidecar beside it
        # (the app gets SIGTERM at the same moment); beside a native sidecar it just exits.
        delays = [stop_delay(c) for c in weir_containers if not is_native(c)]
        app_linger = max(delays) + 1 if any(delays) else 0

        # Native sidecars and init containers, in order; a native sidecar gates the next
        # container on its startup probe.
        for c in init:
            native = c.get("restartPolicy") == "Always"
            if not native:
                self.pod.notes.append(f"init container {c['name']}: not run (its image is not weir's)")
                assert not is_weir(c), f"{c['name']}: weir as a run-to-completion init container is not simulated"
                continue
            self.start(c, volumes, "native", app_linger)
            self.started(c, gate=True)
        for c in regular:
            self.start(c, volumes, "regular", app_linger)
        for c in init + regular:
            if c["name"] in self.procs and (c in regular or c.get("restartPolicy") == "Always"):
                self.started(c, gate=False)
        for c in init + regular:
            if c["name"] in self.procs:
                self.check_running(c)
        self.check_requests(weir_containers)
        self.stop()

    def row(self, c: dict, kind: str) -> Row:
        return self.rows.setdefault(c["name"], Row(self.pod.name, c["name"], kind))

    def start(self, c: dict, volumes, kind: str, app_linger: float) -> None:
        if is_weir(c):
            self.row(c, kind)
            self.procs[c["name"]] = self.start_weir(c, volumes)
        else:
            self.rows.setdefault(c["name"], Row(self.pod.name, c["name"], f"{kind}, stand-in"))
            self.procs[c["name"]] = self.start_stand_in(c, app_linger)

    def started(self, c: dict, gate: bool) -> None:
        """The container counts as started: its startup probe passed (or it has none and its
        ports accept)."""
        proc, row = self.procs[c["name"]], self.rows[c["name"]]
        if "startupProbe" in c:
            why = wait_probe(c["startupProbe"], c, self.ip, proc)
            if why:
                row.problems.append(f"startup probe: {why}")
                self.startup_failed.add(c["name"])
                if gate:
                    self.check_running(c)
                    raise AssertionError(f"{c['name']}: startup probe failed; the kubelet starts nothing after it")
        else:
            for p in c.get("ports", []):
                why = wait_probe({"tcpSocket": {"port": p["containerPort"]}, "periodSeconds": 1, "failureThreshold": 20},
                                 c, self.ip, proc)
                if why:
                    row.problems.append(f"port {p['containerPort']}: {why}")
                    break

    def check_running(self, c: dict) -> None:
        """Who the container runs as and what it may write (weir's), its ports, its probes."""
        proc, row = self.procs[c["name"]], self.rows[c["name"]]
        if is_weir(c) and proc.alive():
            st = status_of(proc.pid)
            uid, gid = self.user_of(c)
            uids, gids = st["Uid"].split(), st["Gid"].split()
            groups = st.get("Groups", "").split()
            ok = set(uids) == {str(uid)} and set(gids) == {str(gid)} and int(st["CapEff"], 16) == 0 \
                and int(st["CapPrm"], 16) == 0
            nnp = st.get("NoNewPrivs", "0").strip() == "1"
            row.user = f"{uid}:{gid} caps 0{' nnp' if nnp else ''}" if ok else f"uid {uids} gid {gids} caps {st['CapEff']}"
            if not ok or groups not in ([], [str(gid)]):
                row.problems.append(f"runs as uid {uids} gid {gids} groups {groups} CapEff {st['CapEff']}")
            if c.get("securityContext", {}).get("allowPrivilegeEscalation") is False and not nnp:
                row.problems.append("no_new_privs not set")
            mounts = mounts_of(proc.pid)
            writable = sorted(p for p, opts in mounts if "rw" in opts.split(",") and not p.startswith(("/proc", "/dev/")))
            expect = sorted(proc.rw)  # type: ignore[attr-defined]
            root_ro = any(p == "/" and "ro" in o.split(",") for p, o in mounts)
            row.rootfs = ("ro" if root_ro else "rw") + (f", rw: {' '.join(writable)}" if writable else "")
            if c.get("securityContext", {}).get("readOnlyRootFilesystem") and (not root_ro or writable != expect):
                row.problems.append(f"writable: {writable}, want only the emptyDirs {expect}")
        # Ports and probes.
        # Each port gets up to PORT_GRACE_S to accept: a container's listeners come up one
        # after another (weir's admin port before its inbound one), and this check may run
        # between them on a busy machine; the kubelet, too, sends nothing before the probes.
        up, down = [], []
        for p in c.get("ports", []):
            deadline = time.monotonic() + PORT_GRACE_S
            while True:
                try:
                    with socket.create_connection((self.ip, p["containerPort"]), timeout=2):
                        up.append(str(p["containerPort"]))
                    break
                except OSError as e:
                    if time.monotonic() >= deadline or not proc.alive():
                        down.append(f"{p['containerPort']} ({e.strerror or e})")
                        break
                    time.sleep(0.1)
        row.ports = " ".join(up) + (" up" if up else "") + (f"; DOWN {' '.join(down)}" if down else "")
        if c["name"] == "istio-proxy" and proc.alive():
            row.ports += f", {' '.join(ISTIO_LOOPBACK)} bound"
        if down:
            row.problems.append(f"ports not accepting: {down}")
        results = []
        for key, label in PROBES:
            if key not in c:
                continue
            if c["name"] in self.startup_failed:
                results.append("startup FAIL" if key == "startupProbe" else f"{label} not run")
                continue
            why = wait_probe(c[key], c, self.ip, proc) if key != "startupProbe" else probe_once(c[key], c, self.ip)
            results.append(label + (" 2xx" if why is None else " FAIL"))
            if why:
                row.problems.append(f"{label} probe: {why}")
        row.probes = ", ".join(results) if results else "none"
        if not proc.alive():
            row.problems.append(f"exited {proc.popen.returncode}: {proc.tail()}")

    def check_requests(self, weir_containers: list[dict]) -> None:
        for c in weir_containers:
            row = self.rows[c["name"]]
            if not self.procs[c["name"]].alive():
                continue
            args = c.get("args", [])
            if args[:1] == ["inject"]:
                self.send_reviews(c, row)
            elif args[:1] == ["run"]:
                port = resolve_port("weir-inbound", c)
                try:
                    status, headers, body = http_status(self.ip, port, "/pod-sim/request", timeout=5,
                                                        headers={"x-user-id": "pod-sim-user"})
                except (OSError, http.client.HTTPException) as e:
                    row.request = f"FAIL :{port}"
                    row.problems.append(f"request through {port}: {e}")
                    continue
                reached = headers.get("x-stand-in") == "app"
                level = headers.get("x-admission-level")
                row.request = f"{status} :{port} -> app" if reached else f"{status} :{port}"
                if status != 200 or not reached or not level:
                    row.problems.append(f"request through {port}: {status}, reached app {reached}, "
                                        f"x-admission-level {level!r}: {body[:120]!r}")

    def send_reviews(self, c: dict, row: Row) -> None:
        port = resolve_port(c["ports"][0]["name"], c)
        hooks = [o for o in self.pod.objects if o.get("kind") == "MutatingWebhookConfiguration"]
        ca_bundle = hooks[0]["webhooks"][0]["clientConfig"].get("caBundle") if hooks else None
        tls = self.work / "volumes" / "tls"
        ca = base64.b64decode(ca_bundle) if ca_bundle and not any("stand-in certificate" in n for n in self.pod.notes) \
            else (tls / "ca.crt").read_bytes()
        svc = next(o for o in self.pod.objects if o.get("kind") == "Service" and o["metadata"]["name"].endswith("-injector"))
        host = f"{svc['metadata']['name']}.{self.pod.namespace}.svc"
        context = ssl.create_default_context(cadata=ca.decode())  # the API server trusts the caBundle only
        done = []
        for label, review, path in self.pod.reviews:
            try:
                conn = http.client.HTTPSConnection(self.ip, port, timeout=10, context=context)
                conn.sock = context.wrap_socket(socket.create_connection((self.ip, port), timeout=10), server_hostname=host)
                conn.request("POST", f"{path}?timeout=5s", body=json.dumps(review).encode(),
                             headers={"content-type": "application/json", "host": host})
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
            except (OSError, http.client.HTTPException, ssl.SSLError) as e:
                row.problems.append(f"review {label}: {e}")
                continue
            if resp.status != 200:
                row.problems.append(f"review {label}: HTTP {resp.status} {data[:200]!r}")
                continue
            answer = json.loads(data)["response"]
            if not answer.get("patch"):
                warnings = answer.get("warnings") or []
                row.problems.append(f"review {label}: not injected: {warnings}")
                continue
            import jsonpatch  # the simulator's venv has it (test-chart)

            patch = json.loads(base64.b64decode(answer["patch"]))
            obj = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(review["request"]["object"]))
            obj["metadata"]["name"] = obj["metadata"].get("generateName", "pod-") + "sim"
            done.append(f"{label}: {len(patch)} ops")
            self.injected.append(Pod(case=self.pod.case, source=f"injected {label}", metadata=obj["metadata"],
                                     spec=obj["spec"], objects=self.pod.objects,
                                     namespace=review["request"]["namespace"],
                                     mesh="istio" if "istio" in label else ""))
        row.request = f"{len(done)}/{len(self.pod.reviews)} reviews patched"

    def stop(self) -> None:
        """As the kubelet stops a pod: regular containers first (each after its preStop), then
        native sidecars in reverse order; all within terminationGracePeriodSeconds."""
        grace = self.pod.spec.get("terminationGracePeriodSeconds", 30)
        t0 = time.monotonic()
        init = [c for c in self.pod.spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        regular = self.pod.spec["containers"]
        self.stop_group([c for c in regular if c["name"] in self.procs], t0, grace)
        self.stop_group([c for c in reversed(init) if c["name"] in self.procs], t0, grace)

    def stop_group(self, group: list[dict], t0: float, grace: float) -> None:
        threads = [threading.Thread(target=self.stop_one, args=(c, t0, grace)) for c in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def stop_one(self, c: dict, t0: float, grace: float) -> None:
        proc = self.procs[c["name"]]
        row = self.rows[c["name"]]
        weir = is_weir(c)
        pre_stop = c.get("lifecycle", {}).get("preStop", {})
        sleep = pre_stop.get("sleep", {}).get("seconds", 0)
        drain_delay = flag_seconds(c.get("args", []), "--drain-delay")
        serving = weir and c.get("args", [])[:1] == ["run"] and (sleep or drain_delay)
        served: list[str] = []
        ready: list[int] = []
        signalled = [0.0]  # when SIGTERM went out (read by the traffic thread)
        stop_sending = threading.Event()
        if serving:
            port = resolve_port("weir-inbound", c)
            public = resolve_port(c["readinessProbe"]["httpGet"]["port"], c) if "readinessProbe" in c else None

            def traffic() -> None:
                # New connections, as callers whose endpoints have not caught up would open.
                while not stop_sending.is_set():
                    try:
                        status, headers, _ = http_status(self.ip, port, "/pod-sim/stopping", timeout=3)
                        served.append(str(status) if headers.get("x-stand-in") == "app" else f"{status}!")
                    except (OSError, http.client.HTTPException) as e:
                        served.append(type(e).__name__)
                    if public and signalled[0] and time.monotonic() - signalled[0] > 0.3:
                        try:
                            ready.append(http_status(self.ip, public, "/ready", timeout=1)[0])
                        except (OSError, http.client.HTTPException):
                            ready.append(0)
                    stop_sending.wait(0.25)

            sender = threading.Thread(target=traffic)
            sender.start()
        if sleep:
            time.sleep(sleep)  # the preStop sleep action
            if serving and not drain_delay:
                # SIGTERM next: weir stops accepting at once, so the callers stop first.
                stop_sending.set()
                sender.join()
        term = time.monotonic()
        signalled[0] = term
        proc.signal(signal.SIGTERM)
        if serving and drain_delay:
            # Callers keep coming through the drain delay (the endpoint update is slow); the
            # last second is left out so a busy machine cannot land a connect after the close.
            time.sleep(max(drain_delay - 1.0, 0.5))
            stop_sending.set()
            sender.join()
        left = grace - (time.monotonic() - t0)
        rc = proc.wait(left)
        if rc is None:
            proc.kill()
            row.exit = f"still running at {grace}s: SIGKILL"
            row.problems.append(f"not stopped within terminationGracePeriodSeconds {grace}s")
            return
        drained = (proc.exited_at or time.monotonic()) - term
        total = (proc.exited_at or time.monotonic()) - t0
        if weir:
            row.exit = f"rc {rc}, SIGTERM->exit {drained:.2f}s, {total:.1f}s of {grace}s"
            if rc != 0:
                row.problems.append(f"exit {rc} on SIGTERM: {proc.tail()}")
        if serving:
            ok = sum(1 for s in served if s == "200")
            what = f"preStop sleep {sleep}s" if sleep else f"drain delay {drain_delay:g}s"
            row.stopping = f"{what}: {ok}/{len(served)} served"
            if ready:
                row.stopping += f", /ready {'503' if all(r == 503 for r in ready) else ready}"
            if not served or ok != len(served):
                outcomes = ", ".join(f"{n}x {k}" for k, n in Counter(served).items())
                row.problems.append(f"requests while stopping ({what}): {outcomes or 'none sent'}")
            if drain_delay and ready and not all(r == 503 for r in ready):
                row.problems.append(f"/ready during the drain delay: {ready}")


def is_native(c: dict) -> bool:
    return c.get("restartPolicy") == "Always"


def flag_seconds(args: list[str], flag: str) -> float:
    for i, a in enumerate(args):
        value = args[i + 1] if a == flag and i + 1 < len(args) else a.split("=", 1)[1] if a.startswith(flag + "=") else None
        if value is not None:
            m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", value)
            assert m, f"{flag} {value}: not a duration this simulator reads"
            return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]
    return 0.0


def stop_delay(c: dict) -> float:
    return c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0) or \
        flag_seconds(c.get("args", []), "--drain-delay")


def q(p) -> str:
    return shlex.quote(str(p))


# === Stand-in containers ===


def stand_in(args: argparse.Namespace) -> int:
    """An app (or mesh proxy) that answers 200 on its ports and, on SIGTERM, keeps serving
    for --linger seconds before it exits (an app that honours the same shutdown delay)."""
    name = args.name
    # SIGTERM is taken with sigwait, never by a handler: blocked here, before any thread
    # starts (threads inherit the mask), it stays pending until the main thread asks for it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def answer(self):
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            body = f"stand-in {name}: {self.command} {self.path}\n".encode()
            self.send_response(200)
            self.send_header("x-stand-in", name)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = answer

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    servers = []
    for bind in args.bind:
        host, port = bind.rsplit(":", 1)
        try:
            servers.append(Server((host, int(port)), Handler))
        except OSError as e:
            print(f"stand-in {name}: cannot listen on {bind}: {e}", flush=True)
            return 1
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"stand-in {name}: listening on {' '.join(args.bind)}", flush=True)
    signal.sigwait({signal.SIGTERM})
    print(f"stand-in {name}: SIGTERM, serving {args.linger:g}s more", flush=True)
    time.sleep(args.linger)
    print(f"stand-in {name}: exit", flush=True)
    return 0


# === Running everything ===


def simulate(cases: list[tuple[str, str, list[dict]]], weir: Path, scratch: Path) -> tuple[list[Row], list[str], list[str]]:
    """Runs every pod of `cases` ((name, kube version, objects)) and the pods the injectors
    patch. Returns the rows, the image root's files and the notes."""
    scratch.mkdir(parents=True, exist_ok=True)
    image_root = scratch / "image-root"
    files = assemble_image_root(image_root, weir)
    # The stand-ins run as other users: a copy of this script where they can read it (the
    # scratch directory may be private to root, and it holds the pods' secrets).
    stand_in_dir = Path(tempfile.mkdtemp(prefix="weir-pod-sim-"))
    os.chmod(stand_in_dir, 0o755)
    stand_in_script = stand_in_dir / "stand_in.py"
    shutil.copy(__file__, stand_in_script)
    os.chmod(stand_in_script, 0o644)
    try:
        return run_pods(cases, image_root, scratch, stand_in_script, files)
    finally:
        shutil.rmtree(stand_in_dir, ignore_errors=True)


def run_pods(cases, image_root: Path, scratch: Path, stand_in_script: Path, files: list[str]):
    pods = [p for case, version, objects in cases for p in pods_of(case, objects, version)]
    rows: list[Row] = []
    notes: list[str] = []
    index = iter(range(1, 250))
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=24) as pool:
        pending: list[Future] = []

        def submit(pod: Pod) -> None:
            run = PodRun(pod, next(index), image_root, scratch, stand_in_script)
            pending.append(pool.submit(lambda: (run, run.run())))

        for pod in pods:
            submit(pod)
        while pending:
            future = pending.pop(0)
            run, pod_rows = future.result()
            with lock:
                rows.extend(pod_rows)
                notes.extend(f"{run.pod.name}: {n}" for n in run.pod.notes)
            for injected in run.injected:
                submit(injected)
    order = {p.name: i for i, p in enumerate(pods)}
    rows.sort(key=lambda r: (r.pod.split(": ")[0], order.get(r.pod, 99), r.pod))
    return rows, files, notes


COLUMNS = [("pod", "pod"), ("container", "container"), ("kind", "kind"), ("user", "user"), ("rootfs", "root fs"),
           ("ports", "ports"), ("probes", "probes"), ("request", "request"), ("stopping", "while stopping"),
           ("exit", "SIGTERM")]


def table(rows: list[Row]) -> str:
    cells = [[h for _, h in COLUMNS]] + [[str(getattr(r, k)) for k, _ in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(rows: list[Row], files: list[str], notes: list[str], weir: Path) -> tuple[str, int]:
    out = [f"pod simulator: weir {weir} ({weir.stat().st_size / 1e6:.1f} MB)",
           f"image root (what the image holds for weir): {' '.join(files)}", "", table(rows), ""]
    failed = [r for r in rows if r.problems]
    for r in failed:
        out.append(f"FAIL {r.pod} / {r.container}:")
        out += [f"     {p}" for p in dict.fromkeys(r.problems)]
    for n in notes:
        out.append(f"note {n}")
    weir_rows = [r for r in rows if "stand-in" not in r.kind]
    out.append(f"pods: {len({r.pod for r in rows})}, weir containers: {len(weir_rows)}, failed rows: {len(failed)}")
    return "\n".join(out), 1 if failed or not weir_rows else 0


def in_node_namespace(argv: list[str]) -> int:
    """Re-runs this script in a network namespace of its own (the simulated node), so pod IPs
    and veth names never meet the host's or another run's."""
    env = dict(os.environ, **{NODE_MARK: "1"})
    return subprocess.run(["unshare", "--net", "--", sys.executable, __file__, *argv], env=env, check=False).returncode


def render_cases(helm: Path, scratch: Path, only: list[str]) -> list[tuple[str, str, list[dict]]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import test_chart  # noqa: E402 - the same discovery and render as the chart suite

    h = test_chart.Helm(helm, scratch)
    out = []
    for case in test_chart.discover_cases():
        if only and case.name not in only:
            continue
        h.render(case)
        out.append((case.name, case.kube_version, case.objects))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate the pods (renders the ci cases unless --rendered)")
    run.add_argument("--weir", required=True, type=Path)
    run.add_argument("--scratch", required=True, type=Path)
    run.add_argument("--rendered", type=Path, help="JSON [[case, kube version, objects], ...] (test_chart.py)")
    run.add_argument("--helm", type=Path, help="helm binary, to render the ci cases here")
    run.add_argument("--case", action="append", default=[], help="only these ci cases (repeat)")
    si = sub.add_parser("stand-in")
    si.add_argument("--name", required=True)
    si.add_argument("--linger", type=float, default=0)
    si.add_argument("bind", nargs="*")
    args = parser.parse_args()
    if args.command == "stand-in":
        return stand_in(args)
    if args.command != "run":
        parser.print_help()
        return 64
    if os.geteuid() != 0:
        print("pod simulator: needs root (network and mount namespaces, setuid to the pods' users)", file=sys.stderr)
        return 77
    for tool in ("ip", "unshare", "nsenter", "setpriv", "chroot", "ldd", "openssl", "mount"):
        if shutil.which(tool) is None:
            print(f"pod simulator: needs {tool} on PATH (scripts/setup installs it)", file=sys.stderr)
            return 69
    if os.environ.get(NODE_MARK) != "1":
        return in_node_namespace(sys.argv[1:])
    if args.rendered:
        cases = [tuple(c) for c in json.loads(args.rendered.read_text())]
        if args.case:
            cases = [c for c in cases if c[0] in args.case]
    else:
        assert args.helm, "--helm or --rendered"
        cases = render_cases(args.helm.resolve(), args.scratch / "render", args.case)
    rows, files, notes = simulate(cases, args.weir.resolve(), args.scratch / "pods")
    text, rc = report(rows, files, notes, args.weir.resolve())
    print(text, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
