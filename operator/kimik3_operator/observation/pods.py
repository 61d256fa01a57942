"""What one pod says of itself, read the same way everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def from_leader_set(meta: Mapping[str, Any], name: str) -> bool:
    """Whether a pod's controller is a LeaderWorkerSet's leader StatefulSet (it carries the
    LeaderWorkerSet's name, the deployment's): a namespace user's pod with our labels is
    not."""
    return any(
        isinstance(ref, Mapping)
        and ref.get("controller") is True
        and ref.get("kind") == "StatefulSet"
        and ref.get("name") == name
        for ref in meta.get("ownerReferences") or []
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (the kubelet's word, after its probes)."""
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (pod.get("status") or {}).get("conditions") or []
        if isinstance(cond, Mapping)
    )
