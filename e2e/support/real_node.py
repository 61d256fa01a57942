"""The real nodes (e2e/runtime/node-up.sh N): containerd, runc and a kubelet each beside the
KWOK nodes, kube-proxy and CoreDNS for them (e2e/runtime/services-up.sh), and the images built
for them without a registry (e2e/runtime/images.sh)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "e2e" / "runtime"


def _runtime_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (RUNTIME / "runtime.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


SETTINGS = _runtime_env()
NODE_NAME = SETTINGS["NODE_NAME"]
NODE_PREFIX = SETTINGS["NODE_PREFIX"]
NODE_LABEL = SETTINGS["NODE_LABEL"]
NODE_INDEX_LABEL = SETTINGS["NODE_INDEX_LABEL"]
# The extended resource each real node advertises one of (node-up.sh): a GPU's stand-in, so a
# group of one-"GPU" pods spreads one pod per node as GPU pods do.
GPU_STAND_IN = SETTINGS["GPU_STAND_IN"]
OPERATOR_IMAGE = SETTINGS["OPERATOR_IMAGE"]
HUB_IMAGE = SETTINGS["HUB_IMAGE"]
KUBECTL_IMAGE = SETTINGS["KUBECTL_IMAGE"]


REAL_NODES_TOLERATION = {"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}


def any_real_node() -> dict[str, Any]:
    """Pod spec fields that let a pod land on any real node, and only a pod that asks."""
    return {"nodeSelector": {NODE_LABEL: "true"}, "tolerations": [REAL_NODES_TOLERATION]}


@dataclass(frozen=True)
class RealNode:
    name: str
    api_host: str  # the API server's endpoint address, which pods reach directly
    api_port: str
    host_address: str  # the node's address on the bridge: where pods reach this machine
    index: int = 0

    def placement(self) -> dict[str, Any]:
        """Pod spec fields that put a pod on this real node, and only a pod that asks."""
        return {
            "nodeSelector": {NODE_LABEL: "true", NODE_INDEX_LABEL: str(self.index)},
            "tolerations": [REAL_NODES_TOLERATION],
        }

    @property
    def containerd(self) -> pathlib.Path:
        return ROOT / "e2e" / ".run" / f"node-{self.index}" / "containerd.sock"

    def api_env(self) -> list[dict[str, str]]:
        return [
            {"name": "KUBERNETES_SERVICE_HOST", "value": self.api_host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": self.api_port},
        ]


def start_real_node(env: dict[str, str], index: int = 0) -> RealNode:
    """Starts (or reuses) real node ``index``; fails with node-up.sh's reason where it cannot
    run. KIMIK3_REAL_NODE=off skips these tests on purpose (a machine without root)."""
    if os.environ.get("KIMIK3_REAL_NODE") == "off":
        pytest.skip("KIMIK3_REAL_NODE=off: the real-node tests do not run")
    up = subprocess.run(
        ["bash", str(RUNTIME / "node-up.sh"), str(index)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if up.returncode != 0:
        raise AssertionError(f"real node {index} did not start: {up.stderr[-2000:]}")
    slices = subprocess.run(
        [
            "kubectl",
            "get",
            "endpointslice",
            "-n",
            "default",
            "-l",
            "kubernetes.io/service-name=kubernetes",
            "-o",
            "jsonpath={.items[0].endpoints[0].addresses[0]} {.items[0].ports[0].port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    address = subprocess.run(
        [
            "kubectl",
            "get",
            "node",
            f"{NODE_PREFIX}{index}",
            "-o",
            "jsonpath={.status.addresses[?(@.type=='InternalIP')].address}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return RealNode(f"{NODE_PREFIX}{index}", slices[0], slices[1], address, index)


def start_real_nodes(env: dict[str, str], count: int = 2) -> list[RealNode]:
    """``count`` real nodes with the cluster's services: kube-proxy and CoreDNS."""
    nodes = [start_real_node(env, index) for index in range(count)]
    services = subprocess.run(
        ["bash", str(RUNTIME / "services-up.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if services.returncode != 0:
        raise AssertionError(f"kube-proxy and CoreDNS did not start: {services.stderr[-2000:]}")
    return nodes


def build_images(env: dict[str, str], *names: str, node: int = 0) -> str:
    """Builds (or takes from the cache) and loads the named images into real node ``node``;
    returns the timings."""
    out = subprocess.run(
        ["bash", str(RUNTIME / "images.sh"), *names],
        env={**env, "KIMIK3_IMAGE_NODE": str(node)},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if out.returncode != 0:
        raise AssertionError(f"images.sh {' '.join(names)} failed: {out.stderr[-3000:]}")
    return out.stdout


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body.decode()
