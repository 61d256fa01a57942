"""What one pod says of itself, read the same way everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (the kubelet's word, after its probes)."""
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (pod.get("status") or {}).get("conditions") or []
        if isinstance(cond, Mapping)
    )
