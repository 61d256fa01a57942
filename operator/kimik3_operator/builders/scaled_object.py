"""The KEDA ScaledObject of spec.autoscaling: its target is the KimiK3Deployment itself (its
scale subresource, whose selector is the leaders'), its triggers the leaders' own vLLM load in
Prometheus, averaged per group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, metadata
from kimik3_operator.builders.health_checks import startup_budget_seconds

DEFAULT_PROMETHEUS_URL = c.DEFAULT_PROMETHEUS_URL

# One group at a time: each is a whole copy of the model on its GPUs.
SCALE_DOWN_POLICY_SECONDS = 300
# KEDA's cooldown before scaling to zero, at the least.
MIN_COOLDOWN_SECONDS = 300
# The HPA's largest stabilization window.
MAX_WINDOW_SECONDS = 3600


@dataclass(frozen=True)
class Bounds:
    """What the reconcile decided for KEDA: the replica bounds and the directions held."""

    min_replica_count: int
    max_replica_count: int
    pause_scale_out: bool = False
    pause_scale_in: bool = False

    @classmethod
    def of(cls, spec: KimiK3DeploymentSpec) -> Bounds:
        """As the spec alone gives them (``kimik3 render``)."""
        scaling = spec.autoscaling
        assert scaling is not None
        return cls(scaling.min_replicas, scaling.max_replicas)


def leader_series(metric: str, owner: Owner) -> str:
    """The deployment's leaders' series, as the PodMonitor labels them (namespace, and the
    instance label as app_kubernetes_io_instance)."""
    return f'{metric}{{namespace="{owner.namespace}",app_kubernetes_io_instance="{owner.name}"}}'


def scale_down_window(spec: KimiK3DeploymentSpec, weight_bytes: int | None) -> int:
    """A group removed costs a whole start-up to get back: it goes only after the load has
    stayed low for about as long (at most the HPA's hour), unless the spec says otherwise."""
    scaling = spec.autoscaling
    assert scaling is not None
    explicit = scaling.behavior.scale_down_stabilization_seconds
    if explicit is not None:
        return explicit
    return min(MAX_WINDOW_SECONDS, startup_budget_seconds(spec, weight_bytes))


def build_scaled_object(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    bounds: Bounds | None = None,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    weight_bytes: int | None = None,
) -> dict[str, Any]:
    scaling = spec.autoscaling
    assert scaling is not None
    plan = bounds or Bounds.of(spec)
    budget = startup_budget_seconds(spec, weight_bytes)
    window = scale_down_window(spec, weight_bytes)
    meta = metadata(owner, names.scaled_object(owner.name), c.COMPONENT_LEADER)
    annotations: dict[str, str] = {}
    if plan.pause_scale_out:
        annotations[c.KEDA_PAUSED_SCALE_OUT] = "true"
    if plan.pause_scale_in:
        annotations[c.KEDA_PAUSED_SCALE_IN] = "true"
    if annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    triggers: list[dict[str, Any]] = [
        _trigger(
            "waiting-requests",
            f"sum({leader_series('vllm:num_requests_waiting', owner)})",
            str(scaling.target.waiting_requests_per_group),
            prometheus_url,
        )
    ]
    if scaling.target.kv_cache_usage is not None:
        triggers.append(
            _trigger(
                "kv-cache-usage",
                f"sum({leader_series('vllm:kv_cache_usage_perc', owner)})",
                f"{scaling.target.kv_cache_usage:g}",
                prometheus_url,
            )
        )
    return {
        "apiVersion": f"{c.KEDA_GROUP}/{c.KEDA_VERSION}",
        "kind": "ScaledObject",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": owner.name},
            "pollingInterval": scaling.behavior.polling_interval_seconds,
            # Before the first scale to zero, and between two: a group loading its weights
            # serves nothing yet and must not be read as idle.
            "initialCooldownPeriod": budget,
            "cooldownPeriod": max(MIN_COOLDOWN_SECONDS, window),
            "minReplicaCount": plan.min_replica_count,
            "maxReplicaCount": plan.max_replica_count,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {
                            "stabilizationWindowSeconds": (
                                scaling.behavior.scale_up_stabilization_seconds
                            ),
                        },
                        "scaleDown": {
                            "stabilizationWindowSeconds": window,
                            "policies": [
                                {
                                    "type": "Pods",
                                    "value": 1,
                                    "periodSeconds": SCALE_DOWN_POLICY_SECONDS,
                                }
                            ],
                        },
                    }
                }
            },
            "triggers": triggers,
        },
    }


def _trigger(name: str, query: str, threshold: str, server: str) -> dict[str, Any]:
    # AverageValue: the HPA divides the deployment's sum by the threshold, so the threshold
    # is per group (the scale subresource counts groups, through their leaders).
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": server,
            "query": query,
            "threshold": threshold,
            "ignoreNullValues": "true",
        },
    }
