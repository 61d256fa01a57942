"""spec.autoscaling, decided: how many groups the LeaderWorkerSet gets of those KEDA asks
for (spec.replicas, through the scale subresource), which directions KEDA may move, and the
Autoscaling condition that says why. Pure: the reconcile hands in what it found.

KEDA reads the leaders' load; it cannot tell a broken drafter from load, nor a group still
loading its weights from an idle one, nor a scale-up that fits from one that leaves a group
of 16 GPUs Pending. So:

- scale-out is held while the drafter's acceptance has collapsed (each request then costs
  several times the GPU time, and more groups would only buy more of the same), and both
  directions while the deployment is parked, a canary is judged or the preflight has not
  passed;
- scale-in is held while a group is still starting: the one LeaderWorkerSet removes is the
  highest-numbered, the newest, the one still loading;
- the groups accepted above minReplicas are only those the free GPUs of the matching nodes
  can place (the GPU ledger); the rest wait, named in the condition, until GPUs free up.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec


@dataclass(frozen=True)
class ScalingInput:
    """What the reconcile found that the scaling depends on."""

    # Groups the running LeaderWorkerSet has (0 before it exists).
    live_replicas: int
    ready_replicas: int
    keda_installed: bool
    preflight_passed: bool = True
    parked: bool = False
    canary_judged: bool = False
    acceptance_collapsed: bool = False
    acceptance_message: str = ""
    # Pods of this size the free GPUs of the matching nodes can place (None: no ledger).
    pods_that_fit: int | None = None
    free_gpus: int | None = None
    # Pods of this deployment's groups not yet bound to a node (made or still to be made):
    # the room above still counts their GPUs as free.
    unbound_pods: int = 0
    # With spec.scheduling: the GPUs left in the ClusterQueue's quota, and this deployment's
    # groups that hold none of it yet (None: no queue, or its quota unread).
    quota_free_gpus: int | None = None
    unadmitted_groups: int = 0


@dataclass(frozen=True)
class ScalingPlan:
    # Groups the LeaderWorkerSet is rendered with.
    replicas: int
    min_replica_count: int
    max_replica_count: int
    pause_scale_out: bool
    pause_scale_in: bool
    condition: Condition
    # For status.autoscaling.
    desired: int
    clamped: bool = False

    def section(self) -> dict[str, object]:
        return {
            "desiredReplicas": self.desired,
            "acceptedReplicas": self.replicas,
            "maxReplicaCount": self.max_replica_count,
            "scaleOut": "Paused" if self.pause_scale_out else "Allowed",
            "scaleIn": "Paused" if self.pause_scale_in else "Allowed",
        }


def _holds(found: ScalingInput) -> tuple[Reason | None, Reason | None, str]:
    """(the reason scale-out is held, the reason scale-in is held, why)."""
    if not found.preflight_passed:
        why = "the preflight has not passed: no group is added or removed for this spec"
        return Reason.HELD_FOR_PREFLIGHT, Reason.HELD_FOR_PREFLIGHT, why
    if found.parked:
        why = "the deployment is parked after start-up failures; it scales again after a fix"
        return Reason.HELD_WHILE_PARKED, Reason.HELD_WHILE_PARKED, why
    if found.canary_judged:
        why = "a canary is being judged: the groups it compares stay as they are until its verdict"
        return Reason.HELD_FOR_CANARY, Reason.HELD_FOR_CANARY, why
    if found.acceptance_collapsed:
        why = (
            "the drafter's acceptance has collapsed, so each request costs several times the "
            "GPU time and the queue grows from a fault, not from load: no group is added until "
            f"acceptance recovers ({found.acceptance_message})"
        )
        return Reason.HELD_FOR_ACCEPTANCE, None, why
    if found.ready_replicas < found.live_replicas:
        why = (
            f"{found.live_replicas - found.ready_replicas} group(s) still starting: none is "
            "removed until every group is ready (the one removed would be the newest)"
        )
        return None, Reason.HELD_WHILE_STARTING, why
    return None, None, ""


def _room(spec: KimiK3DeploymentSpec, found: ScalingInput) -> tuple[int | None, Reason]:
    """Whole groups the free GPUs (and the queue's quota) can still place, and which of the
    two is the tighter; None without a ledger or a quota."""
    rooms: list[tuple[int, Reason]] = []
    if found.pods_that_fit is not None:
        nodes = max(0, found.pods_that_fit - found.unbound_pods) // spec.nodes_per_replica
        rooms.append((nodes, Reason.CLAMPED_BY_GPUS))
    if found.quota_free_gpus is not None:
        left = found.quota_free_gpus - found.unadmitted_groups * spec.gpus_per_replica
        rooms.append((max(0, left) // spec.gpus_per_replica, Reason.CLAMPED_BY_QUOTA))
    if not rooms:
        return None, Reason.CLAMPED_BY_GPUS
    return min(rooms)


def scaling_plan(spec: KimiK3DeploymentSpec, found: ScalingInput) -> ScalingPlan:
    scaling = spec.autoscaling
    if scaling is None:
        raise ValueError("scaling_plan needs spec.autoscaling")
    desired = spec.replicas
    live = found.live_replicas
    out_held, in_held, why = _holds(found)
    # minReplicas are made whatever the load; above them, only what may and can be placed.
    base = max(live, min(desired, scaling.min_replicas))
    room, limit = _room(spec, found)
    accepted = desired
    clamped = False
    if desired > base:
        if out_held is not None:
            accepted = base
        elif room is not None and desired - base > room:
            accepted, clamped = base + room, True
    elif desired < live and in_held is not None:
        accepted = live
    condition = _condition(
        spec, found, out_held or in_held, why, desired, accepted, limit if clamped else None
    )
    return ScalingPlan(
        replicas=accepted,
        min_replica_count=scaling.min_replicas,
        max_replica_count=scaling.max_replicas,
        pause_scale_out=out_held is not None,
        pause_scale_in=in_held is not None,
        condition=condition,
        desired=desired,
        clamped=clamped,
    )


def _condition(
    spec: KimiK3DeploymentSpec,
    found: ScalingInput,
    held: Reason | None,
    why: str,
    desired: int,
    accepted: int,
    clamped: Reason | None,
) -> Condition:
    kind = ConditionType.AUTOSCALING
    if not found.keda_installed:
        return Condition(
            kind,
            "False",
            Reason.KEDA_NOT_INSTALLED,
            "spec.autoscaling needs KEDA (its keda.sh ScaledObject CRD is not installed): "
            f"nothing scales the groups, which stay at spec.replicas ({spec.replicas}). "
            "Install KEDA, or remove spec.autoscaling and set spec.replicas",
        )
    if held is not None:
        return Condition(kind, "False", held, f"scaling held: {why}")
    if clamped == Reason.CLAMPED_BY_QUOTA:
        return Condition(
            kind,
            "False",
            Reason.CLAMPED_BY_QUOTA,
            f"KEDA asks for {desired} group(s); {accepted} are made: the ClusterQueue of "
            f"LocalQueue {spec.scheduling.queue_name} has {found.quota_free_gpus} GPU(s) of "
            f"quota left and each group needs {spec.gpus_per_replica}, so no group is "
            "created to wait in the queue. More are made as quota frees up",
        )
    if clamped is not None:
        per_group = spec.gpus_per_replica
        return Condition(
            kind,
            "False",
            Reason.CLAMPED_BY_GPUS,
            f"KEDA asks for {desired} group(s); {accepted} are made: the nodes that match "
            f"spec.placement have {found.free_gpus} free GPU(s) and each group needs "
            f"{per_group} ({spec.nodes_per_replica} pod(s) of {spec.gpus_per_pod}), so no "
            "group is created that would wait Pending. More are made as GPUs free up",
        )
    scaling = spec.autoscaling
    assert scaling is not None
    return Condition(
        kind,
        "True",
        Reason.AUTOSCALING_ACTIVE,
        f"KEDA drives the groups between {scaling.min_replicas} and {scaling.max_replicas} "
        f"on {scaling.target.waiting_requests_per_group} waiting request(s) per group; "
        f"{accepted} now",
    )
