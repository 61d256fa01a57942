"""A namespace user's pods against the running operator (`kimik3 run` on the local control
plane, make cluster-up). The user picks the image, so the user controls what the leaders'
/metrics and the download pod's /progress answer. KWOK pods have no network, so the
operator's KIMIK3_SCRAPE_URL and KIMIK3_DOWNLOAD_PROGRESS_URL point at one local server that
answers per pod as a hostile image would:

  huge-*      a 400-byte /metrics with position="30000000"
  big-*       a 200 MiB /metrics
  drip-*      one byte every 2 s, for ever
  redirect-*  302 to another port (a second server counts the requests that arrive there)
  ok-*        a well-behaved vLLM leader
  the download pod's /progress: [1,2,3], 1e400, 10,000-deep nesting, 50 MiB, in turn

The operator runs as a ServiceAccount (bound to cluster-admin), as it runs in a cluster.

Phase 1 serves every pod as a well-behaved leader; phase 2 turns the hostility on; phase 3
fills the tenant's namespace with what the operator might hold in memory, one kind at a time:
1,000 ConfigMaps of 250 KiB carrying the operator's managed-by label and naming a resource
as their controller; 200 KimiK3Deployments at the schema's limits (64 KiB of env values,
32 KiB of extraArgs, a 200 KiB annotation as kubectl's last-applied copy); 200 pods bound to
GPU nodes with 1 MiB env values (the GPU ledger lists every bound pod), then restarts of the
operator, which lists all of it again, watching the tenants' namespaces and every namespace,
each beside the same restarts before phase 3 (the other tenant holding as many resources);
at each restart a resource is created in the namespace of a tenant that sorts before the
hostile one and of one that sorts after it. Printed: the operator's RSS after each step and its
peak (the chart's limit is 512 MiB), another tenant's reconcile delay (a new resource in
another namespace until its status is written) beside the same delay in phase 1, the gaps
between the periodic resyncs (configured 5 s), the requests that reached the other port,
and, side by side in the same run, what an unbounded read (urllib, a timeout per read,
redirects followed) costs for the same answers. Prints figures; asserts nothing.

    .venv/bin/python bench/hostile.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pathlib
import re
import resource
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from bench.operator_scrape import rss_mib  # noqa: E402 - after the path

from e2e.support.chart import admin_service_account  # noqa: E402
from e2e.support.cluster import Cluster, tools_bin  # noqa: E402
from kimik3_operator.api.constants import API_VERSION  # noqa: E402
from kimik3_operator.kube import ApiKube, send  # noqa: E402
from kimik3_operator.runtime.bounded_http import fetch as bounded_fetch  # noqa: E402

KUBECONFIG = ROOT / "e2e" / ".run" / "kubeconfig"
NAMESPACE = "bench-hostile"
OTHER = "bench-other"  # another tenant, whose reconcile delay is timed
# A third tenant, whose namespace sorts before the hostile one: a cluster-wide list passes it
# first (the API server lists in namespace order), OTHER's after the hostile tenant's.
FIRST = "bench-a-tenant"
NOISE = "bench-hostile-pods"  # pods anyone may run: the GPU ledger lists them
HOME = "bench-hostile-operator"  # the operator's ServiceAccount
RESYNC_SECONDS = 5
KINDS = ("ok", "huge", "big", "drip", "redirect")
SERVER = textwrap.dedent("""
    import itertools, json, pathlib, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from e2e.support.vllm_exporter import FakeLeader
    port, trap, flag = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
    leaders = {}
    answers = itertools.cycle(["[1,2,3]", '{"bytesDone": 1e400}', "[" * 10000 + "]" * 10000,
                               "#" * (50 << 20)])
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def send(self, body, status=200):
            self.send_response(status); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            hostile = flag.exists()
            if self.path.startswith("/progress/"):
                calm = '{"phase": "Downloading", "bytesTotal": 100}'
                body = next(answers) if hostile else calm
                return self.send(body.encode())
            pod = self.path.rsplit("/", 1)[-1]
            kind = pod.split("-", 1)[0]
            leader = leaders.setdefault(pod, FakeLeader(started=time.time() - 600))
            text = leader.exposition()
            if not hostile or kind == "ok":
                return self.send(text.encode())
            if kind == "huge":
                name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                line = name + '{position="30000000"} 1\\n'
                return self.send((text + line).encode())
            if kind == "big":
                self.send_response(200); self.send_header("Content-Length", str(200 << 20))
                self.end_headers()
                chunk = b"#" * (1 << 20)
                for _ in range(200):
                    self.wfile.write(chunk)
                return
            if kind == "drip":
                self.send_response(200); self.send_header("Content-Length", "100000")
                self.end_headers()
                for _ in range(100000):
                    self.wfile.write(b"#"); self.wfile.flush(); time.sleep(2)
                return
            if kind == "redirect":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{trap}/metrics")
                self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a): pass
    ThreadingHTTPServer.handle_error = lambda *a: None  # clients that hang up are the point
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")
TRAP = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            with open(sys.argv[2], "a") as hits:
                hits.write("hit\\n")
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a): pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")
AGGREGATE = textwrap.dedent("""
    import resource, sys, time, urllib.request
    sys.path.insert(0, "operator")
    from prometheus_client.parser import text_string_to_metric_families
    from kimik3_operator.observation.acceptance import ACCEPTED_PER_POS, LeaderWindow, aggregate
    from kimik3_operator.observation.acceptance import parse_metrics
    texts = []
    for _ in range(2):  # two samples a second apart: the leader's counters have moved
        texts.append(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
        time.sleep(1)
    started = time.monotonic()
    if sys.argv[2] == "unbounded":
        # The acceptance by position as it was computed before: every index the pod names.
        per_position = {}
        for family in text_string_to_metric_families(texts[1]):
            for sample in family.samples:
                position = sample.labels.get("position", "")
                if sample.name.removesuffix("_total") == ACCEPTED_PER_POS and position.isdigit():
                    per_position[int(position)] = sample.value
        tuple(per_position.get(i, 0.0) / 10 for i in range(max(per_position) + 1))
    else:
        window = LeaderWindow()
        for at, text in zip((0.0, 10.0), texts):
            window.add(parse_metrics(text, at, 3), 10.0)
        aggregate([window], 10.0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{time.monotonic() - started:.1f} s, peak RSS {peak:.0f} MiB")
""")
UNBOUNDED = textwrap.dedent("""
    import resource, sys, time, urllib.request
    started = time.monotonic()
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as response:
            size = len(response.read())
        outcome = f"read {size} bytes"
    except Exception as exc:
        outcome = type(exc).__name__
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{time.monotonic() - started:.1f}|{peak:.0f}|{outcome}")
""")


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], input=stdin, env=env, check=True, capture_output=True, text=True
    ).stdout


def reconciles(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    found = re.search(r'^kimik3_reconciles_total\{result="ok"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


class Arrivals:
    """When the API server's watch hands each resource of the other tenant's namespace to a
    watcher of the bench's own, not the operator's: time before that is the API server's."""

    def __init__(self, api: ApiKube) -> None:
        self.api = api
        self.seen: dict[str, float] = {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        path = f"/apis/{API_VERSION}/namespaces/{OTHER}/kimik3deployments"
        while True:
            with contextlib.suppress(Exception):  # a watch that ends is opened again
                raw = send(self.api.api_client, "GET", path, query=[("watch", "1")]).response
                pending = b""
                for chunk in raw.stream(4096):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        event = json.loads(line)
                        name = event["object"]["metadata"]["name"]
                        if event["type"] == "ADDED":
                            self.seen.setdefault(name, time.monotonic())
            time.sleep(0.1)


ARRIVALS: list[Arrivals] = []  # the bench's one watcher, once main has made it


class ResyncWatch:
    """Times the resync batches from the operator's reconcile counter: with no change in
    the cluster, every reconcile is a resync's, and they come in one batch per period."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.batches: list[float] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        last = reconciles(self.port)
        while not self._stop.wait(0.25):
            try:
                now = reconciles(self.port)
            except OSError:
                return  # the operator has stopped
            if now > last and (not self.batches or time.monotonic() - self.batches[-1] > 1):
                self.batches.append(time.monotonic())
            last = now

    def gaps_since(self, since: float) -> list[float]:
        times = [t for t in self.batches if t >= since]
        return [round(b - a, 1) for a, b in itertools.pairwise(times)]


def unbounded_read(url: str, limit: float) -> str:
    try:
        out = subprocess.run(
            [sys.executable, "-c", UNBOUNDED, url],
            capture_output=True,
            text=True,
            timeout=limit,
            check=False,
        ).stdout.strip()
        seconds, peak, outcome = out.split("|")
        return f"{seconds} s, peak RSS {peak} MiB, {outcome}"
    except subprocess.TimeoutExpired:
        return f"still reading after {limit:.0f} s (killed)"


def bounded_read(url: str) -> str:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.monotonic()
    try:
        outcome = f"read {len(bounded_fetch(url))} bytes"
    except OSError as exc:
        outcome = f"refused: {exc}"
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return f"{time.monotonic() - started:.1f} s, peak RSS +{after - before:.0f} MiB, {outcome}"


class RssPeak:
    """The operator's RSS, sampled every 0.2 s, and its peak since the last ``reset``."""

    def __init__(self) -> None:
        self.pid = 0
        self.peak = 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def reset(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0

    def _run(self) -> None:
        while True:
            time.sleep(0.2)
            with contextlib.suppress(OSError, ValueError):
                if self.pid:
                    self.peak = max(self.peak, rss_mib(self.pid))


def reconcile_delay(api: ApiKube, tag: str, namespace: str = OTHER) -> tuple[float, float]:
    """Seconds from creating a resource in another tenant's namespace to its first status,
    and of those the API server's answer to the create itself."""
    name = f"probe-{tag}"
    began = time.strftime("%H:%M:%S")
    started = time.monotonic()
    api.create({**json.loads(deployment(name)), "metadata": {"name": name, "namespace": namespace}})
    created = time.monotonic() - started
    while time.monotonic() - started < 120:
        found = api.get(API_VERSION, "KimiK3Deployment", name, namespace) or {}
        if (found.get("status") or {}).get("observedGeneration"):
            took = time.monotonic() - started
            if took > 2 and namespace == OTHER:
                # To find in the operator's log (its slow requests and reconciles).
                seen = ARRIVALS[0].seen.get(name) if ARRIVALS else None
                watch = "not yet" if seen is None else f"after {seen - started:.2f} s"
                print(
                    f"    (slow: {OTHER}/{name}, created at {began}, {took:.2f} s; the API "
                    f"server's watch handed it to another watcher {watch})"
                )
            return took, created
        time.sleep(0.02)
    return float("inf"), created


def first_line_at(path: pathlib.Path, offset: int) -> float:
    """The wall-clock time of the first line the operator logged after ``offset``."""
    with path.open("rb") as handle:
        handle.seek(offset)
        for line in handle:
            found = re.match(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]", line)
            if found:
                stamp = time.mktime(time.strptime(found[1].decode(), "%Y-%m-%d %H:%M:%S"))
                return stamp + int(found[2]) / 1000
    return float("nan")


def service_create(api: ApiKube, name: str) -> float:
    """Seconds the API server takes to create a Service like the one a first reconcile makes
    (a ClusterIP allocated), in the other tenant's namespace; the Service is deleted again."""
    started = time.monotonic()
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": OTHER},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 8000}]},
        }
    )
    took = time.monotonic() - started
    api.delete("v1", "Service", name, OTHER)
    return took


def reconcile_delays(api: ApiKube, tag: str, count: int = 5) -> str:
    """``count`` delays one after another: their median and longest, and beside them the API
    server's median answer to the resource's create and to a Service create (the write a
    first reconcile waits for longest), the parts no operator can shorten."""
    found = [reconcile_delay(api, f"{tag}-{i}") for i in range(count)]
    services = sorted(service_create(api, f"timing-{tag}-{i}") for i in range(count))
    delays = sorted(d for d, _ in found)
    creates = sorted(c for _, c in found)
    return (
        f"median {delays[count // 2]:.2f} s, longest {delays[-1]:.2f} s of {count} (the API "
        f"server alone: the resource's create {creates[count // 2]:.2f} s, a Service's "
        f"{services[count // 2]:.2f} s, medians)"
    )


def at_schema_limits(name: str) -> dict[str, Any]:
    """A resource as large as the schema lets it be, applied with kubectl's last-applied copy."""
    body: dict[str, Any] = json.loads(deployment(name))
    body["spec"]["replicas"] = 0
    body["spec"]["engine"] = {
        "env": [{"name": f"E{i}", "value": "e" * 16384} for i in range(4)],
        "extraArgs": ["x" * 4096 for _ in range(8)],
    }
    body["metadata"].update(
        namespace=NAMESPACE,
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "#" * 200_000},
    )
    return body


def claiming_config_map(number: int, owner_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"bulk-{number}",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "kimik3-operator"},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "KimiK3Deployment",
                    "name": "ok",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "data": {"blob": "#" * (250 * 1024)},
    }


def bound_pod(number: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"big-env-{number}",
            "namespace": NOISE,
            "annotations": {"note": "#" * 200_000},
        },
        "spec": {
            "nodeName": f"gpu-node-{number % 4}",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "BIG", "value": "#" * (1 << 20)}],
                    "resources": {"requests": {"cpu": "1m"}},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def parallel(fn: Callable[[Any], Any], items: list[Any]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fn, items))


def deployment(name: str, cache: bool = False) -> str:
    spec: dict[str, object] = {
        "replicas": 1,
        "parallelism": {"tensor": 1},
        "drafter": {"method": "eagle3", "repo": "x/eagle3", "numSpeculativeTokens": 3},
        "preflight": {"mode": "Disabled"},
        "monitoring": {"podMonitor": False},
    }
    if cache:
        spec["model"] = {"cache": {"size": "1Gi"}}
    return json.dumps(
        {
            "apiVersion": "serving.kimik3.io/v1alpha1",
            "kind": "KimiK3Deployment",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--port", type=int, default=19511)
    parser.add_argument("--restarts", type=int, default=3, help="restarts per scope and phase")
    args = parser.parse_args()
    env = {
        **os.environ,
        "KUBECONFIG": str(KUBECONFIG),
        "PATH": f"{tools_bin()}:{os.environ['PATH']}",
    }
    trap_port, metrics_port = args.port + 1, args.port + 2
    flag = ROOT / "e2e" / ".run" / "bench-hostile.on"
    flag.unlink(missing_ok=True)
    kubectl(env, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests/crd"))
    for namespace in (NAMESPACE, OTHER, FIRST, NOISE, HOME):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # a previous run's namespace may still be going
            found = subprocess.run(
                ["kubectl", "get", "namespace", namespace],
                env=env,
                capture_output=True,
                check=False,
            )
            if found.returncode != 0:
                break
            time.sleep(2)
        kubectl(env, "create", "namespace", namespace)
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    api = ApiKube.from_environment()
    ARRIVALS.append(Arrivals(api))
    volume = ROOT / "e2e" / ".run" / "volumes" / NAMESPACE
    volume.mkdir(parents=True, exist_ok=True)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"cache-{NAMESPACE}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": str(volume), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": NAMESPACE, "name": "dl-model-cache"},
        },
    }
    kubectl(env, "apply", "-f", "-", stdin=json.dumps(pv))
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.port), str(trap_port), str(flag)], cwd=ROOT
    )
    hits = ROOT / "e2e" / ".run" / "bench-hostile.hits"
    hits.write_text("")
    trap = subprocess.Popen([sys.executable, "-c", TRAP, str(trap_port), str(hits)])
    # The operator's own identity, as it runs in a cluster: an admin's requests are exempt
    # from the API server's Priority and Fairness, the operator's are queued by it.
    cluster = Cluster(KUBECONFIG, tools_bin())
    operator_env = {
        **env,
        "KUBECONFIG": str(admin_service_account(cluster, HOME, "kimik3-operator")),
        "KIMIK3_LEASE_NAMESPACE": HOME,
        "KIMIK3_NAMESPACES": f"{NAMESPACE},{OTHER},{FIRST}",
        "KIMIK3_METRICS_PORT": str(metrics_port),
        "KIMIK3_METRICS_ADDRESS": "127.0.0.1",
        "KIMIK3_HEALTH_ENDPOINT": "http://127.0.0.1:18097/healthz",
        "KIMIK3_RESYNC_SECONDS": str(RESYNC_SECONDS),
        "KIMIK3_SCRAPE_SECONDS": "5",
        "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{args.port}/metrics/{{pod}}",
        "KIMIK3_DOWNLOAD_PROGRESS_URL": f"http://127.0.0.1:{args.port}/progress/{{pod}}",
    }

    log_path = ROOT / "e2e" / ".run" / "bench-hostile-operator.log"
    log = open(log_path, "ab")  # noqa: SIM115

    started: list[subprocess.Popen[bytes]] = []  # every one is stopped at the end

    def start_operator(every_namespace: bool = False) -> subprocess.Popen[bytes]:
        scope = {"KIMIK3_NAMESPACES": ""} if every_namespace else {}
        started.append(
            subprocess.Popen(
                [sys.executable, "-m", "kimik3_operator", "run"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**operator_env, **scope},
            )
        )
        return started[-1]

    def restarts(
        when: str, label: str, running: subprocess.Popen[bytes]
    ) -> subprocess.Popen[bytes]:
        """``args.restarts`` restarts of the operator in each scope, a resource created in
        FIRST's and in OTHER's namespace as each process starts: the delays to their status
        and how much of them was Python's start-up."""
        for every_namespace in (False, True):
            found: dict[str, list[float]] = {FIRST: [], OTHER: []}
            peaks, ups = [], []
            for attempt in range(args.restarts):
                running.terminate()
                running.wait(timeout=30)
                log.flush()
                offset = log_path.stat().st_size
                spawned = time.time()
                running = start_operator(every_namespace)
                rss.reset(running.pid)
                tag = f"restart-{label}-{int(every_namespace)}-{attempt}"
                with ThreadPoolExecutor(2) as pool:
                    delays = {
                        ns: pool.submit(reconcile_delay, api, f"{tag}-{ns[6]}", ns) for ns in found
                    }
                for ns, future in delays.items():
                    found[ns].append(future.result()[0])
                time.sleep(15)
                for ns in found:  # each restart finds the same resources
                    api.delete(API_VERSION, "KimiK3Deployment", f"probe-{tag}-{ns[6]}", ns)
                ups.append(first_line_at(log_path, offset) - spawned)
                peaks.append(rss.peak)
            scope = "every namespace" if every_namespace else "the three namespaces"
            print(
                f"  restart {when}, watching {scope}: RSS peak {max(peaks):.0f} MiB; a resource "
                f"created as the process started had its status after (s) "
                f"{FIRST} {[round(d, 2) for d in found[FIRST]]}, "
                f"{OTHER} {[round(d, 2) for d in found[OTHER]]}; "
                f"Python's start-up before the first log line {[round(u, 2) for u in ups]}"
            )
        return running

    operator = start_operator()
    rss = RssPeak()
    rss.reset(operator.pid)
    try:
        for kind in KINDS:
            kubectl(env, "apply", "-n", NAMESPACE, "-f", "-", stdin=deployment(kind))
        kubectl(env, "apply", "-n", NAMESPACE, "-f", "-", stdin=deployment("dl", cache=True))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            items = json.loads(kubectl(env, "get", "kk3d", "-n", NAMESPACE, "-o", "json"))["items"]
            ready = sum(i.get("status", {}).get("readyReplicas", 0) for i in items)
            downloading = any(
                (i.get("status", {}).get("modelCache") or {}).get("phase") == "Downloading"
                for i in items
            )
            if ready == len(KINDS) and downloading:
                break
            time.sleep(2)
        print(f"{len(KINDS)} leaders Ready and a download running; operator pid {operator.pid}")
        watch = ResyncWatch(metrics_port)
        time.sleep(args.seconds / 2)
        calm_rss = rss_mib(operator.pid)
        calm = time.monotonic() - args.seconds / 2
        print(
            f"phase 1, well-behaved answers: RSS {calm_rss:.0f} MiB, resync gaps (s) "
            f"{watch.gaps_since(calm)}"
        )

        calm_delay = reconcile_delays(api, "calm")
        flag.touch()
        hostile_from = time.monotonic()
        peak = 0.0
        while time.monotonic() - hostile_from < args.seconds:
            time.sleep(1)
            peak = max(peak, rss_mib(operator.pid))
        gaps = watch.gaps_since(hostile_from)
        print(
            f"phase 2, hostile answers for {args.seconds:.0f} s: RSS {rss_mib(operator.pid):.0f} "
            f"MiB (peak {peak:.0f}, +{peak - calm_rss:.0f} MiB over phase 1); resync gaps (s) "
            f"{gaps}, longest {max(gaps, default=0):.1f} (configured {RESYNC_SECONDS})"
        )

        hostile_delay = reconcile_delays(api, "hostile")
        print(
            f"another tenant's reconcile delay: {calm_delay} before the hostile answers; "
            f"{hostile_delay} during them"
        )

        owner = api.get(API_VERSION, "KimiK3Deployment", "ok", NAMESPACE) or {}
        owner_uid = str((owner.get("metadata") or {}).get("uid", ""))
        steps: list[tuple[str, Callable[[], None]]] = [
            (
                "1,000 labelled 250 KiB ConfigMaps naming a resource as controller",
                lambda: parallel(
                    lambda n: api.create(claiming_config_map(n, owner_uid)), list(range(1000))
                ),
            ),
            (
                "200 KimiK3Deployments at the schema's limits",
                lambda: parallel(
                    lambda n: api.create(at_schema_limits(f"max-{n}")), list(range(200))
                ),
            ),
            (
                "200 bound pods with 1 MiB env values",
                lambda: parallel(lambda n: api.create(bound_pod(n)), list(range(200))),
            ),
        ]
        # The other tenant holds as many resources as it will after phase 3 (25).
        fillers = [f"filler-{n}" for n in range(15)]
        for name in fillers:
            api.create(
                {**json.loads(deployment(name)), "metadata": {"name": name, "namespace": OTHER}}
            )
        operator = restarts("before phase 3 (no hostile objects)", "before", operator)
        for name in fillers:
            api.delete(API_VERSION, "KimiK3Deployment", name, OTHER)
        print(
            "phase 3, memory (the chart's limit is 512 MiB); "
            f"RSS now {rss_mib(operator.pid):.0f} MiB"
        )
        for number, (what, make) in enumerate(steps):
            before = rss_mib(operator.pid)
            rss.reset(operator.pid)
            make()
            time.sleep(10)
            delay = reconcile_delays(api, f"mem-{number}")
            print(
                f"  + {what}: RSS {before:.0f} -> {rss_mib(operator.pid):.0f} MiB "
                f"(peak {rss.peak:.0f}); another tenant's reconcile delay {delay}"
            )
        oversized = at_schema_limits("over")
        oversized["spec"]["engine"]["env"] = [{"name": "X", "value": "#" * 30000}] * 40
        try:
            api.create(oversized)
            print("  a resource with 1.2 MB of env values: accepted")
        except Exception as exc:
            print(f"  a resource with 1.2 MB of env values: refused ({str(exc)[:120]}...)")
        operator = restarts("with all of it present", "after", operator)
        followed = hits.read_text().count("hit")
        print(f"operator requests that followed a redirect to the other port: {followed}")

        huge = f"http://127.0.0.1:{args.port}/metrics/huge-0"
        print("side by side, parsing the huge position index in a fresh process:")
        for label in ("unbounded", "bounded"):
            cost = subprocess.run(
                [sys.executable, "-c", AGGREGATE, huge, label],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            ).stdout.strip()
            print(f"  {label:9}: {cost}")
        print("side by side, one read of each answer in a fresh process:")
        for kind in ("huge", "big", "drip", "redirect"):
            url = f"http://127.0.0.1:{args.port}/metrics/{kind}-0"
            before = hits.read_text().count("hit")
            print(f"  {kind:9} unbounded: {unbounded_read(url, 30)}")
            if kind == "redirect":
                arrived = hits.read_text().count("hit") - before
                print(f"            (the other port received {arrived})")
            before = hits.read_text().count("hit")
            print(f"  {kind:9} bounded:   {bounded_read(url)}")
            if kind == "redirect":
                arrived = hits.read_text().count("hit") - before
                print(f"            (the other port received {arrived})")
    finally:
        flag.unlink(missing_ok=True)
        for process in started:
            process.terminate()
            process.wait(timeout=20)
        server.terminate()
        trap.kill()
        kubectl(env, "delete", "clusterrolebinding", HOME, "--ignore-not-found")
        for namespace in (NAMESPACE, OTHER, FIRST, NOISE, HOME):
            kubectl(env, "delete", "namespace", namespace, "--wait=false")
        kubectl(env, "delete", "pv", f"cache-{NAMESPACE}", "--wait=false")
    return 0


if __name__ == "__main__":
    sys.exit(main())
