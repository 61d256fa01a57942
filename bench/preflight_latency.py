"""Time from `kubectl apply` of the incompatible example to CapabilitiesVerified=False, on the
real control plane (make cluster-up) with the operator running as a process. Prints the
median of N runs and the spread; it asserts nothing.

    .venv/bin/python bench/preflight_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time
import uuid

import kubernetes
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from e2e.support.cluster import tools_bin  # noqa: E402 - after the path

KUBECONFIG = ROOT / "e2e" / ".run" / "kubeconfig"
GROUP, VERSION, PLURAL = "serving.kimik3.io", "v1alpha1", "kimik3deployments"


def verified_false(api: kubernetes.client.CustomObjectsApi, ns: str, name: str) -> bool:
    body = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return any(
        c.get("type") == "CapabilitiesVerified" and c.get("status") == "False"
        for c in body.get("status", {}).get("conditions", []) or []
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    tools = tools_bin()
    kubectl = [f"{tools}/kubectl", "--kubeconfig", str(KUBECONFIG)]
    crd = ROOT / "manifests" / "crd" / "kimik3deployments.yaml"
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(crd)], check=True, capture_output=True
    )
    subprocess.run(
        [
            *kubectl,
            "wait",
            "--for",
            "condition=established",
            "crd/kimik3deployments.serving.kimik3.io",
        ],
        check=True,
        capture_output=True,
    )
    kubernetes.config.load_kube_config(str(KUBECONFIG))
    core = kubernetes.client.CoreV1Api()
    api = kubernetes.client.CustomObjectsApi()
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    example = yaml.safe_load((ROOT / "examples" / "kimi-k3-text-dspark-old-vllm.yaml").read_text())
    env = {
        **os.environ,
        "KUBECONFIG": str(KUBECONFIG),
        "KIMIK3_NAMESPACES": ns,
        "KIMIK3_HEALTH_ENDPOINT": "http://127.0.0.1:18099/healthz",
        "KIMIK3_METRICS_PORT": "0",
        "KIMIK3_SCRAPE_URL": "http://127.0.0.1:9/{pod}",  # KWOK pod IPs are made up
    }
    operator = subprocess.Popen(
        [sys.executable, "-m", "kimik3_operator", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        samples = []
        for i in range(args.runs):
            body = {**example, "metadata": {"name": f"old-{i}"}}
            started = time.perf_counter()
            api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
            while not verified_false(api, ns, f"old-{i}"):
                time.sleep(0.01)
            samples.append(time.perf_counter() - started)
        print(
            f"apply -> CapabilitiesVerified=False over {len(samples)} runs: "
            f"median {statistics.median(samples) * 1000:.0f} ms, "
            f"min {min(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms"
        )
    finally:
        operator.terminate()
        operator.wait(timeout=15)
        core.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
