"""Every child of one KimiK3Deployment, in the order the operator applies them: the one
list the reconcile and ``kimik3 render`` share."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, with_spec_hash
from kimik3_operator.builders.disaggregation import build_disaggregated_set
from kimik3_operator.builders.leaderworkerset import NO_ROLLOUT, Rollout, build_leader_worker_set
from kimik3_operator.builders.model_cache import (
    build_cache_claim,
    build_download_config_map,
    build_download_job,
)
from kimik3_operator.builders.podmonitor import build_pod_monitor, wants_pod_monitor
from kimik3_operator.builders.preflight_job import build_probe_config_map, build_probe_job
from kimik3_operator.builders.routing import PickerSettings, routing_children
from kimik3_operator.builders.scaled_object import (
    DEFAULT_PROMETHEUS_URL,
    Bounds,
    build_scaled_object,
)
from kimik3_operator.builders.service import build_service

# probe: the image probe's ConfigMap and Job; cache: the model cache's claim (unless the
# user names one), the download script's ConfigMap and the download Job; groups: the
# LeaderWorkerSet (with spec.disaggregation, the DisaggregatedSet); serving: its Service and
# PodMonitor; scaling: KEDA's ScaledObject; routing: the InferencePool, its endpoint picker
# and the HTTPRoute.
Part = Literal["probe", "cache", "groups", "serving", "scaling", "routing"]
ALL_PARTS: tuple[Part, ...] = ("probe", "cache", "groups", "serving", "scaling", "routing")


def desired_children(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    *,
    parts: Collection[Part] = ALL_PARTS,
    pod_monitor_available: bool = True,
    weight_bytes: int | None = None,
    rollout: Rollout = NO_ROLLOUT,
    pod_monitor_labels: Mapping[str, str] | None = None,
    admission_held: bool = False,
    scaling: Bounds | None = None,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    picker: PickerSettings | None = None,
    gateway_api: bool = True,
) -> list[dict[str, Any]]:
    children: list[dict[str, Any]] = []
    if "probe" in parts and spec.preflight.mode != "Disabled" and spec.preflight.probe:
        children += [build_probe_config_map(owner), build_probe_job(spec, owner)]
    if "cache" in parts and spec.model.cache is not None:
        claim = build_cache_claim(spec, owner)
        children += [
            *([claim] if claim is not None else []),
            build_download_config_map(owner),
            build_download_job(spec, owner),
        ]
    if "groups" in parts and spec.disaggregated:
        sidecar = (picker or PickerSettings()).sidecar_image
        children.append(build_disaggregated_set(spec, owner, weight_bytes, sidecar))
    elif "groups" in parts:
        children.append(
            build_leader_worker_set(
                spec, owner, spec.paired_drafter, weight_bytes, rollout, admission_held
            )
        )
    if "serving" in parts:
        children.append(build_service(spec, owner))
        if wants_pod_monitor(spec) and pod_monitor_available:
            children.append(build_pod_monitor(spec, owner, pod_monitor_labels))
    if "scaling" in parts and spec.autoscaling is not None:
        children.append(
            build_scaled_object(spec, owner, scaling, prometheus_url, weight_bytes=weight_bytes)
        )
    if "routing" in parts:
        monitor = (
            dict(pod_monitor_labels or {})
            if wants_pod_monitor(spec) and pod_monitor_available
            else None
        )
        children += routing_children(
            spec, owner, picker or PickerSettings(), gateway_api, pod_monitor_labels=monitor
        )
    return [with_spec_hash(child) for child in children]
