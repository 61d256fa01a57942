"""The one real node (e2e/runtime/node-up.sh): containerd, runc and a kubelet beside the KWOK
nodes, and the images built for it without a registry (e2e/runtime/images.sh)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
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
NODE_LABEL = SETTINGS["NODE_LABEL"]
OPERATOR_IMAGE = SETTINGS["OPERATOR_IMAGE"]
HUB_IMAGE = SETTINGS["HUB_IMAGE"]
KUBECTL_IMAGE = SETTINGS["KUBECTL_IMAGE"]


@dataclass(frozen=True)
class RealNode:
    name: str
    api_host: str  # where pods reach the API server (no service proxy runs here)
    api_port: str
    host_address: str  # the node's address on the bridge: where pods reach this machine

    def placement(self) -> dict[str, Any]:
        """Pod spec fields that put a pod on the real node, and only a pod that asks."""
        return {
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        }

    def api_env(self) -> list[dict[str, str]]:
        return [
            {"name": "KUBERNETES_SERVICE_HOST", "value": self.api_host},
            {"name": "KUBERNETES_SERVICE_PORT", "value": self.api_port},
        ]


def start_real_node(env: dict[str, str]) -> RealNode:
    """Starts (or reuses) the node; fails with node-up.sh's reason where it cannot run.
    KIMIK3_REAL_NODE=off skips these tests on purpose (a machine without root)."""
    if os.environ.get("KIMIK3_REAL_NODE") == "off":
        pytest.skip("KIMIK3_REAL_NODE=off: the real-node tests do not run")
    up = subprocess.run(
        ["bash", str(RUNTIME / "node-up.sh")], env=env, capture_output=True, text=True, check=False
    )
    if up.returncode != 0:
        raise AssertionError(f"the real node did not start: {up.stderr[-2000:]}")
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
            NODE_NAME,
            "-o",
            "jsonpath={.status.addresses[?(@.type=='InternalIP')].address}",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return RealNode(NODE_NAME, slices[0], slices[1], address)


def build_images(env: dict[str, str], *names: str) -> str:
    """Builds (or takes from the cache) and loads the named images; returns the timings."""
    out = subprocess.run(
        ["bash", str(RUNTIME / "images.sh"), *names],
        env=env,
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
