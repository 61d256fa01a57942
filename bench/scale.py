"""The operator at scale and under faults, on the local control plane (make cluster-up).

Builds 2,000 fake GPU nodes and 20,000 unrelated pods, then applies 100 KimiK3Deployments of
2-node groups at once, and reports: apply-to-LeaderWorkerSet latency (p50/p99) beside the
LeaderWorkerSet controller's own LeaderWorkerSet-to-StatefulSet latency, the time until every
resource is Available, the operator's peak RSS and CPU, its API requests per minute when idle
(from the API server's audit log, which records exactly the operator's ServiceAccount, by
verb and resource) and its status writes per minute when idle; the time from a restart to
steady state; then ``--kills`` kill -9 of the operator at random moments while half the
deployments are replaced and a quarter rescaled, and the duplicate and orphaned children
after convergence. Prints figures; asserts nothing.

    .venv/bin/python bench/scale.py [--nodes 2000] [--noise-pods 20000] [--deployments 100]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from bench.operator_scrape import SERVER, cpu_seconds, rss_mib  # noqa: E402

from e2e.cluster.nodes import node as fake_node  # noqa: E402
from e2e.support.cluster import Cluster, service_account_kubeconfig, tools_bin  # noqa: E402
from kimik3_operator.kube import ApiKube, KubeError  # noqa: E402
from kimik3_operator.runtime.informer import Informer  # noqa: E402

RUN = ROOT / "e2e" / ".run"
KUBECONFIG = RUN / "kubeconfig"
AUDIT = RUN / "kwok" / "clusters" / "kimik3-e2e" / "logs" / "audit.log"
NS = "kimik3-bench"  # the audit policy records this namespace's operator ServiceAccount
NOISE = "bench-noise"
ACCOUNT = "kimik3-operator"
USER = f"system:serviceaccount:{NS}:{ACCOUNT}"
POOL = {"kimik3.io/pool": "bench"}


def now() -> float:
    return time.monotonic()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 16) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def create_quietly(api: ApiKube, manifest: dict[str, Any]) -> None:
    try:
        api.create(manifest)
    except KubeError as exc:
        if exc.status != 409:
            raise


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "parallelism": {"tensor": 16},
            "placement": {"gpusPerNode": 8, "nodeSelector": POOL},
            "preflight": {"probe": False},
        },
    }


def noise_pod(index: int, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"noise-{index}", "namespace": NOISE, "labels": {"app": "noise"}},
        "spec": {
            "nodeName": f"bench-node-{index % nodes}",
            "containers": [{"name": "c", "image": "registry.invalid/noise:1"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


class Seen:
    """First-seen times of objects, from a watch in this process."""

    def __init__(self, api_client: Any, path: str, key: Callable[[dict[str, Any]], str]) -> None:
        self.times: dict[str, float] = {}
        self.key = key
        self.informer = Informer(
            api_client, path, on_sync=self._sync, on_event=self._event, name=path
        )

    def _sync(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.times.setdefault(self.key(item), now())

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "ADDED":
            self.times.setdefault(self.key(obj), now())


class Operator:
    def __init__(self, env: dict[str, str], port: int) -> None:
        self.env = env
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.log = open(RUN / "bench-operator.log", "ab")  # noqa: SIM115 - lives with the run

    def start(self) -> float:
        started = now()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kimik3_operator", "run"],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        return started

    def kill9(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def reconciles(self) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return -1
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kimik3_reconciles_total{")
        )


def audit_counts(offset: int) -> tuple[collections.Counter[str], int]:
    """Requests the operator's ServiceAccount made after ``offset`` bytes of the audit log."""
    counts: collections.Counter[str] = collections.Counter()
    with open(AUDIT, "rb") as log:
        log.seek(offset)
        for line in log:
            event = json.loads(line)
            if event.get("user", {}).get("username") != USER:
                continue
            if event.get("stage") not in ("ResponseComplete", "ResponseStarted", "Panic"):
                continue
            ref = event.get("objectRef", {}) or {}
            resource = ref.get("resource", "?") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            if event.get("verb") == "watch" and event.get("stage") == "ResponseComplete":
                continue  # a watch is counted once, when it starts
            counts[f"{event.get('verb')} {resource}"] += 1
        end = log.tell()
    return counts, end


def status_of(api: ApiKube) -> list[dict[str, Any]]:
    return api.list("serving.kimik3.io/v1alpha1", "KimiK3Deployment", NS)


def available(item: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Available" and c.get("status") == "True"
        for c in item.get("status", {}).get("conditions", []) or []
    ) and item.get("status", {}).get("observedGeneration") == item["metadata"].get("generation")


def wait_available(api: ApiKube, count: int, timeout: float) -> float:
    start = now()
    while now() - start < timeout:
        items = status_of(api)
        if len(items) == count and all(available(i) for i in items):
            return now() - start
        time.sleep(1)
    return float("nan")


def wait_settled(api: ApiKube, timeout: float) -> None:
    start = now()
    while now() - start < timeout:
        if all(
            any(
                c.get("type") == "SpeculationEffective" and c.get("status") == "True"
                for c in i.get("status", {}).get("conditions", []) or []
            )
            for i in status_of(api)
        ):
            break
        time.sleep(2)
    time.sleep(5)


def children_report(api: ApiKube) -> dict[str, int]:
    """Duplicates and orphans among the operator's children after convergence."""
    owners = {i["metadata"]["uid"]: i for i in status_of(api)}
    report = collections.Counter[str]()
    for kind in ("LeaderWorkerSet", "Service"):
        for what in ("orphaned", "duplicate", "missing"):
            report[f"{what} {kind}"] = 0
    for kind, version in (
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1"),
        ("Service", "v1"),
    ):
        per_owner = collections.Counter[str]()
        managed = "app.kubernetes.io/managed-by=kimik3-operator"
        for child in api.list(version, kind, NS, label_selector=managed):
            refs = child["metadata"].get("ownerReferences") or []
            uids = [r["uid"] for r in refs if r.get("kind") == "KimiK3Deployment"]
            if not uids or uids[0] not in owners:
                report[f"orphaned {kind}"] += 1
                continue
            per_owner[uids[0]] += 1
            owner = owners[uids[0]]
            if kind == "LeaderWorkerSet" and child["spec"]["replicas"] != owner["spec"].get(
                "replicas", 1
            ):
                report["LeaderWorkerSet with stale replicas"] += 1
        report[f"duplicate {kind}"] += sum(n - 1 for n in per_owner.values() if n > 1)
        report[f"missing {kind}"] += len(set(owners) - set(per_owner))
    report["LeaderWorkerSet with stale replicas"] += 0
    return dict(report)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--noise-pods", type=int, default=20000)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=120)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="leave the objects in place")
    args = parser.parse_args()
    bin_dir = tools_bin()
    cluster = Cluster(KUBECONFIG, bin_dir)
    if not AUDIT.exists():
        print("the cluster has no audit log; recreate it: make cluster-down cluster-up")
        return 1
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    admin = ApiKube.from_environment()
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests/crd")
    )
    cluster.kubectl(
        "wait", "--for=condition=established", "crd/kimik3deployments.serving.kimik3.io"
    )
    for ns in (NS, NOISE):  # what an earlier run left goes first
        for args_ in (
            ("delete", "namespace", ns, "--ignore-not-found", "--wait=false"),
            ("wait", "--for=delete", f"namespace/{ns}", "--timeout=900s"),
        ):
            subprocess.run(
                [str(bin_dir / "kubectl"), *args_], env=cluster.env, capture_output=True,
                check=False,
            )  # fmt: skip

    started = now()
    parallel(
        lambda i: create_quietly(
            admin, fake_node(i, 8, 4, "NVIDIA-H200", prefix="bench-node", labels=POOL)
        ),
        range(args.nodes),
    )
    print(f"{args.nodes} fake GPU nodes in {now() - started:.0f}s")
    for ns in (NS, NOISE):
        create_quietly(admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    started = now()
    parallel(lambda i: create_quietly(admin, noise_pod(i, args.nodes)), range(args.noise_pods))
    print(f"{args.noise_pods} unrelated pods in {now() - started:.0f}s")
    # Measure against a cluster at rest: KWOK marks 20,000 pods Running only so fast here.
    while admin.list("v1", "Pod", NOISE, field_selector="status.phase=Pending"):
        time.sleep(5)
    print(f"... and Running {now() - started:.0f}s after the first")

    cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", NS, check=False)
    cluster.kubectl(
        "create", "clusterrolebinding", "kimik3-bench", "--clusterrole=cluster-admin",
        f"--serviceaccount={NS}:{ACCOUNT}", check=False,
    )  # fmt: skip
    sa_config = service_account_kubeconfig(cluster, NS, ACCOUNT, RUN / "bench-sa.kubeconfig")
    scrape_port, metrics_port = 19601, 19602
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(scrape_port)], cwd=ROOT)
    env = {
        **os.environ,
        "KUBECONFIG": str(sa_config),
        "KIMIK3_NAMESPACES": NS,
        "KIMIK3_METRICS_PORT": str(metrics_port),
        "KIMIK3_METRICS_ADDRESS": "127.0.0.1",
        "KIMIK3_HEALTH_ENDPOINT": "http://127.0.0.1:19603/healthz",
        "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{scrape_port}/{{pod}}",
    }
    operator = Operator(env, metrics_port)
    peak = [0.0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            proc = operator.process
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], rss_mib(proc.pid))

    threading.Thread(target=sample, daemon=True).start()
    lws_seen = Seen(
        admin.api_client,
        f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets",
        lambda o: o["metadata"]["name"],
    )
    sts_seen = Seen(
        admin.api_client,
        f"/apis/apps/v1/namespaces/{NS}/statefulsets",
        lambda o: o["metadata"]["name"],
    )
    for seen in (lws_seen, sts_seen):
        seen.informer.start()
        seen.informer.synced.wait(30)

    try:
        operator.start()
        while operator.reconciles() < 0:
            time.sleep(0.2)
        print(f"operator up; GPU ledger and caches listed {args.noise_pods} pods")
        names = [f"k{i:03d}" for i in range(args.deployments)]
        applied: dict[str, float] = {}

        def apply(name: str) -> None:
            admin.create(deployment(name))
            applied[name] = now()

        started = now()
        parallel(apply, names, workers=32)
        print(f"{len(names)} KimiK3Deployments applied in {now() - started:.1f}s")
        took = wait_available(admin, len(names), 600)
        print(f"every KimiK3Deployment Available {took:.1f}s after the first apply")
        lws_latency = [lws_seen.times[n] - applied[n] for n in names if n in lws_seen.times]
        sts_latency = [sts_seen.times[n] - lws_seen.times[n] for n in names if n in sts_seen.times]
        print(
            f"apply -> LeaderWorkerSet: p50 {statistics.median(lws_latency):.3f}s, "
            f"p99 {pct(lws_latency, 0.99):.3f}s over {len(lws_latency)}"
        )
        print(
            f"LeaderWorkerSet -> StatefulSet (the LWS controller): p50 "
            f"{statistics.median(sts_latency):.3f}s, p99 {pct(sts_latency, 0.99):.3f}s; "
            f"ratio operator/LWS at p50 "
            f"{statistics.median(lws_latency) / max(statistics.median(sts_latency), 1e-6):.2f}"
        )

        # Idle means settled: every first acceptance measurement is in.
        wait_settled(admin, 180)
        proc = operator.process
        assert proc is not None
        _, offset = audit_counts(0)
        cpu0, t0 = cpu_seconds(proc.pid), now()
        time.sleep(args.idle_seconds)
        counts, _ = audit_counts(offset)
        minutes = (now() - t0) / 60
        cpu = (cpu_seconds(proc.pid) - cpu0) / (now() - t0)
        non_watch = {k: v for k, v in counts.items() if not k.startswith("watch ")}
        status_writes = sum(v for k, v in counts.items() if k.endswith("kimik3deployments/status"))
        print(
            f"idle {args.idle_seconds:.0f}s: operator CPU {cpu:.1%} of a core; API requests "
            f"{sum(non_watch.values()) / minutes:.1f}/min besides watches "
            f"({dict(sorted(non_watch.items())) or 'none'}); watches started "
            f"{sum(v for k, v in counts.items() if k.startswith('watch ')) / minutes:.1f}/min; "
            f"status writes {status_writes / minutes:.1f}/min"
        )
        print(f"operator peak RSS so far {peak[0]:.0f} MiB")

        operator.kill9()
        restarted = operator.start()
        while operator.reconciles() < len(names):
            time.sleep(0.1)
        steady = now() - restarted
        print(
            f"restart (kill -9, start) to every resource reconciled from fresh caches: "
            f"{steady:.1f}s"
        )

        # Faults: kill -9 at random moments while half the deployments are replaced and a
        # quarter rescaled, the changes spread over the same period.
        half = names[: len(names) // 2]
        replacements = [f"r{i:03d}" for i in range(len(half))]
        rescaled = names[len(half) : len(half) + len(names) // 4]
        changes: list[Callable[[], Any]] = []
        for old_name, new_name in zip(half, replacements, strict=True):
            changes.append(
                lambda o=old_name: admin.delete(
                    "serving.kimik3.io/v1alpha1", "KimiK3Deployment", o, NS
                )
            )
            changes.append(lambda n=new_name: admin.create(deployment(n)))
        for name in rescaled:
            changes.append(
                lambda n=name: admin.patch(
                    "serving.kimik3.io/v1alpha1", "KimiK3Deployment", n, NS,
                    {"spec": {"replicas": 2}},
                )
            )  # fmt: skip
        random.shuffle(changes)
        per_kill = max(1, -(-len(changes) // max(args.kills, 1)))
        kills = [0]

        def killer() -> None:
            while kills[0] < args.kills or changes:
                for _ in range(min(per_kill, len(changes))):
                    changes.pop()()
                time.sleep(random.uniform(0.2, 3.0))
                if kills[0] < args.kills:
                    operator.kill9()
                    kills[0] += 1
                    operator.start()

        thread = threading.Thread(target=killer)
        thread.start()
        thread.join()
        print(f"{kills[0]} kill -9 of the operator during the changes")
        took = wait_available(admin, len(names), 900)
        time.sleep(20)  # garbage collection of the deleted deployments' children
        print(
            f"every resource Available {took:.0f}s after the last kill; children after "
            f"garbage collection: {children_report(admin)}"
        )
        print(f"operator peak RSS over the run {peak[0]:.0f} MiB")
        crashes = (RUN / "bench-operator.log").read_text(errors="replace").count("Traceback")
        print(f"tracebacks in the operator's log over the run: {crashes}")
    finally:
        sampling.set()
        operator.stop()
        server.terminate()
        for seen in (lws_seen, sts_seen):
            seen.informer.stop()
        if not args.keep:
            cluster.kubectl("delete", "namespace", NS, NOISE, "--wait=false", check=False)
            cluster.kubectl("delete", "clusterrolebinding", "kimik3-bench", check=False)
            cluster.kubectl("delete", "nodes", "-l", "kimik3.io/pool=bench", "--wait=false")
    return 0


if __name__ == "__main__":
    sys.exit(main())
