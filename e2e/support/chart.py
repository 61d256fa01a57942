"""The operator's Helm chart as the tests install it."""

from __future__ import annotations

import subprocess

from e2e.support.cluster import (
    ROOT,
    Cluster,
)

CHART = ROOT / "charts" / "kimik3-operator"


SMALL = {
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
    "parallelism": {"tensor": 8},
}


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), *args],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result
