"""Prints fake GPU Node objects for KWOK as a YAML stream.

Each node stands in for a GPU machine: KWOK keeps the capacity given here and marks the node
Ready, so the real scheduler places pods against real `nvidia.com/gpu` accounting.
"""

from __future__ import annotations

import argparse
import sys

import yaml

TOPOLOGY_LABEL = "topology.kimik3.io/domain"


def node(
    index: int,
    gpus: int,
    domains: int,
    product: str,
    prefix: str = "gpu-node",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, object]:
    capacity = {
        "cpu": "96",
        "memory": "1Ti",
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
        "ephemeral-storage": "32Ti",  # eight pods that each download 1.7 TB
    }
    name = f"{prefix}-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                TOPOLOGY_LABEL: f"domain-{index % domains}",
                **(labels or {}),
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--domains", type=int, default=2)
    parser.add_argument("--product", default="NVIDIA-H200")
    parser.add_argument("--prefix", default="gpu-node")
    parser.add_argument("--label", action="append", default=[], help="key=value")
    parser.add_argument("--taint", action="append", default=[], help="key=value:Effect")
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.label)
    taints = []
    for item in args.taint:
        pair, effect = item.rsplit(":", 1)
        key, value = pair.split("=", 1)
        taints.append({"key": key, "value": value, "effect": effect})
    nodes = [
        node(i, args.gpus, max(1, args.domains), args.product, args.prefix, labels, taints)
        for i in range(args.count)
    ]
    yaml.safe_dump_all(nodes, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
