"""The leaders of a deployment's groups, as the tests look for them."""

from __future__ import annotations

from typing import Any

from e2e.support.cluster import Cluster

GROUP = "leaderworkerset.sigs.k8s.io/group-index"


def leaders(cluster: Cluster, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    pods = cluster.items(
        "pods", namespace, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=leader"
    )
    return {
        int(p["metadata"]["labels"][GROUP]): p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )
