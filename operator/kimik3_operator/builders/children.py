"""Every child of one KimiK3Deployment, in the order they are applied: the LeaderWorkerSet
first, since everything a user waits for starts from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, with_spec_hash
from kimik3_operator.builders.leaderworkerset import NO_ROLLOUT, Rollout, build_leader_worker_set
from kimik3_operator.builders.podmonitor import build_pod_monitor, wants_pod_monitor
from kimik3_operator.builders.service import build_service


def build_children(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    *,
    pod_monitor_available: bool = True,
    weight_bytes: int | None = None,
    rollout: Rollout = NO_ROLLOUT,
    pod_monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    drafter = spec.paired_drafter
    children = [
        build_leader_worker_set(spec, owner, drafter, weight_bytes, rollout),
        build_service(spec, owner),
    ]
    if wants_pod_monitor(spec) and pod_monitor_available:
        children.append(build_pod_monitor(spec, owner, pod_monitor_labels))
    return [with_spec_hash(child) for child in children]
