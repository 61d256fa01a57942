"""The PodMonitor that scrapes the leaders' /metrics (vLLM's spec-decode counters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, metadata, selector_labels
from kimik3_operator.builders.leaderworkerset import PORT_NAME


def wants_pod_monitor(spec: KimiK3DeploymentSpec) -> bool:
    return spec.monitoring.pod_monitor


def build_pod_monitor(
    spec: KimiK3DeploymentSpec, owner: Owner, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``labels``: the operator's setting for a Prometheus that selects monitors by label;
    they never replace the labels the operator finds its children by."""
    meta = metadata(owner, names.pod_monitor(owner.name), c.COMPONENT_LEADER)
    meta["labels"] = {**(labels or {}), **meta["labels"]}
    return {
        "apiVersion": f"{c.MONITORING_GROUP}/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector_labels(owner, c.COMPONENT_LEADER)},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": "30s"}],
            # The dashboards and alerts group vLLM's series by deployment through this label
            # (app_kubernetes_io_instance in Prometheus).
            "podTargetLabels": [c.LABEL_INSTANCE],
        },
    }
