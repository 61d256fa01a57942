"""The operator's cost curve on the local control plane (make cluster-up): one cluster of
2,000 fake GPU nodes grown in steps (by default 20,000 unrelated pods and 100
KimiK3Deployments, then 100,000 pods and 500 deployments, then 200,000 pods and 500), and at
each size a fresh start of the operator, which lists everything again. Per size: the time
from the start until every existing resource is reconciled, the time until the new ones are
Available, the operator's peak RSS during the lists and its RSS once idle, and, idle, its
API writes and status writes per minute (from the API server's audit log). Then the cost of
a pod (between the last two sizes, whose deployments are the same) and of a deployment.
Prints figures; asserts nothing.

    .venv/bin/python bench/scale_curve.py [--sizes 20000:100,100000:500,200000:500]
        [--keep] [--resume PODS:DEPLOYMENTS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from bench.operator_scrape import SERVER, rss_mib  # noqa: E402
from bench.scale import (  # noqa: E402
    ACCOUNT,
    AUDIT,
    KUBECONFIG,
    NOISE,
    NS,
    POOL,
    RUN,
    Operator,
    audit_counts,
    create_quietly,
    deployment,
    noise_pod,
    now,
    parallel,
    wait_available,
    wait_settled,
)

from e2e.cluster.nodes import node as fake_node  # noqa: E402
from e2e.support.cluster import Cluster, service_account_kubeconfig, tools_bin  # noqa: E402
from kimik3_operator.kube import ApiKube  # noqa: E402

READS = ("get", "list", "watch")
SERVICE_RANGE = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "ServiceCIDR",
    "metadata": {"name": "kimik3-bench"},
    "spec": {"cidrs": ["10.1.0.0/20"]},
}


class Peak:
    """The operator's RSS sampled every 0.5 s; the peak since ``reset``."""

    def __init__(self, operator: Operator) -> None:
        self.operator = operator
        self.peak = 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def reset(self) -> None:
        self.peak = 0.0

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            proc = self.operator.process
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    self.peak = max(self.peak, rss_mib(proc.pid))


def pending(admin: ApiKube) -> bool:
    """Whether any unrelated pod is still Pending (one object asked for, not 100,000)."""
    found = admin._call(
        "GET",
        f"/api/v1/namespaces/{NOISE}/pods",
        query=[("fieldSelector", "status.phase=Pending"), ("limit", "1")],
    )
    return bool(found.get("items"))


def sizes(text: str) -> list[tuple[int, int]]:
    return [(int(p), int(d)) for p, d in (pair.split(":") for pair in text.split(","))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--sizes", type=sizes, default=sizes("20000:100,100000:500,200000:500"))
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--keep", action="store_true", help="leave the objects in place")
    parser.add_argument(
        "--resume",
        type=lambda text: sizes(text)[0],
        help="PODS:DEPLOYMENTS an earlier run with --keep (or stopped) left in place",
    )
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
    for ns in () if args.resume else (NS, NOISE):  # what an earlier run left goes first
        for args_ in (
            ("delete", "namespace", ns, "--ignore-not-found", "--wait=false"),
            ("wait", "--for=delete", f"namespace/{ns}", "--timeout=1800s"),
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
    # The control plane's own Service range holds 254 addresses; each deployment has one.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_RANGE))
    cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", NS, check=False)
    cluster.kubectl(
        "create", "clusterrolebinding", "kimik3-bench", "--clusterrole=cluster-admin",
        f"--serviceaccount={NS}:{ACCOUNT}", check=False,
    )  # fmt: skip
    sa_config = service_account_kubeconfig(cluster, NS, ACCOUNT, RUN / "bench-sa.kubeconfig")
    scrape_port, metrics_port = 19611, 19612
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(scrape_port)], cwd=ROOT)
    env = {
        **os.environ,
        "KUBECONFIG": str(sa_config),
        "KIMIK3_NAMESPACES": NS,
        "KIMIK3_METRICS_PORT": str(metrics_port),
        "KIMIK3_METRICS_ADDRESS": "127.0.0.1",
        "KIMIK3_HEALTH_ENDPOINT": "http://127.0.0.1:19613/healthz",
        "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{scrape_port}/{{pod}}",
    }
    operator = Operator(env, metrics_port)
    peak = Peak(operator)
    rows: list[tuple[int, int, float, float]] = []
    pods, deployments = args.resume or (0, 0)
    try:
        for want_pods, want_deployments in args.sizes:
            started = now()
            parallel(lambda i: create_quietly(admin, noise_pod(i, args.nodes)),
                     range(pods, want_pods), workers=32)  # fmt: skip
            print(
                f"\n{want_pods} unrelated pods ({want_pods - pods} new in {now() - started:.0f}s)"
            )
            pods = want_pods
            # Measure against a cluster at rest: KWOK marks the pods Running only so fast.
            while now() - started < 1800 and pending(admin):
                time.sleep(10)
            print(f"  ... Running {now() - started:.0f}s after the first")

            peak.reset()
            restarted = operator.start()
            while operator.reconciles() < deployments:
                time.sleep(0.1)
            converged = now() - restarted
            names = [f"k{i:03d}" for i in range(deployments, want_deployments)]
            started = now()
            parallel(lambda n: admin.create(deployment(n)), names, workers=32)
            deployments = want_deployments
            took = wait_available(admin, deployments, 900)
            wait_settled(admin, 180)
            proc = operator.process
            assert proc is not None
            _, offset = audit_counts(0)
            t0 = now()
            time.sleep(args.idle_seconds)
            counts, _ = audit_counts(offset)
            minutes = (now() - t0) / 60
            written = {k: v for k, v in counts.items() if k.split(" ")[0] not in READS}
            writes = sum(written.values())
            status = sum(v for k, v in counts.items() if k.endswith("kimik3deployments/status"))
            rss = rss_mib(proc.pid)
            print(
                f"{pods} pods, {deployments} KimiK3Deployments: from the operator's start to "
                f"the {deployments - len(names)} existing reconciled {converged:.1f}s; the "
                f"{len(names)} new Available {took:.1f}s after they were applied; RSS peak "
                f"{peak.peak:.0f} MiB during the lists, {rss:.0f} MiB idle; idle writes "
                f"{writes / minutes:.1f}/min (status {status / minutes:.1f}/min"
                + "".join(f"; {k} {v}" for k, v in sorted(written.items()))
                + ")"
            )
            rows.append((pods, deployments, rss, peak.peak))
            operator.stop()
        print("\npods     deployments  RSS idle  RSS peak")
        for row in rows:
            print(f"{row[0]:<8} {row[1]:<12} {row[2]:>5.0f} MiB {row[3]:>5.0f} MiB")
        if len(rows) >= 3 and rows[-1][1] == rows[-2][1]:
            per_pod = (rows[-1][2] - rows[-2][2]) * 1024 / (rows[-1][0] - rows[-2][0])
            per_deployment = (
                (rows[1][2] - rows[0][2]) * 1024 - per_pod * (rows[1][0] - rows[0][0])
            ) / (rows[1][1] - rows[0][1])
            print(
                f"cost of a pod {per_pod:.2f} KiB (between the last two sizes); of a "
                f"KimiK3Deployment with its children {per_deployment:.0f} KiB (between the "
                f"first two, less their pods)"
            )
    finally:
        operator.stop()
        server.terminate()
        if not args.keep:
            cluster.kubectl("delete", "namespace", NS, NOISE, "--wait=false", check=False)
            cluster.kubectl("delete", "clusterrolebinding", "kimik3-bench", check=False)
            # Held by its Services until the namespace is gone, then deleted.
            cluster.kubectl("delete", "servicecidr", "kimik3-bench", "--wait=false", check=False)
            cluster.kubectl("delete", "nodes", "-l", "kimik3.io/pool=bench", "--wait=false")
    return 0


if __name__ == "__main__":
    sys.exit(main())
