"""Step three of a reconcile, the only one that writes: the Decision's writes in order
(independent children side by side), then the status patch and the events; and the metrics
that describe the outcome."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.controller.decide import Decision, Write
from kimik3_operator.controller.snapshot import Snapshot
from kimik3_operator.events import post_event
from kimik3_operator.kube import Kube

log = logging.getLogger(__name__)


@dataclass
class ReconcileResult:
    invalid: bool = False
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[str] = field(default_factory=list)


# Children that no other write of a decision needs in place first (nothing reads them at
# creation): consecutive writes of these go to the API server side by side, so a new
# deployment waits one round trip for its group, Service and monitors, not one each; on a
# loaded API server that is most of another tenant's wait. Everything else keeps the order.
SIDE_BY_SIDE = frozenset(
    {
        "LeaderWorkerSet",
        "DisaggregatedSet",
        "Service",
        "PodMonitor",
        "ScaledObject",
        "InferencePool",
        "HTTPRoute",
    }
)


def _joins(write: Write) -> bool:
    return write.verb in ("apply", "create") and write.ref[1] in SIDE_BY_SIDE


def batches(writes: Sequence[Write]) -> list[list[Write]]:
    """The writes in order, consecutive side-by-side applies of distinct objects grouped."""
    found: list[list[Write]] = []
    for write in writes:
        last = found[-1] if found else None
        if last and _joins(write) and _joins(last[0]) and all(w.ref != write.ref for w in last):
            last.append(write)
        else:
            found.append([write])
    return found


def act(kube: Kube, snap: Snapshot, decision: Decision) -> ReconcileResult:
    result = ReconcileResult(invalid=decision.invalid)
    for batch in batches(decision.writes):
        if len(batch) == 1:
            _write(kube, snap, batch[0], result)
        else:
            _side_by_side(kube, snap, batch, result)
    write_status(kube, snap, decision, result)
    return result


def _side_by_side(
    kube: Kube, snap: Snapshot, batch: Sequence[Write], result: ReconcileResult
) -> None:
    """The batch's writes at once (a thread each, not a pool another tenant's reconcile could
    fill); recorded in the decision's order, the first failure raised once all have ended."""
    parts = [ReconcileResult() for _ in batch]
    with ThreadPoolExecutor(len(batch), thread_name_prefix="write") as pool:
        futures = [
            pool.submit(_write, kube, snap, write, part)
            for write, part in zip(batch, parts, strict=True)
        ]
    for part in parts:
        result.applied.extend(part.applied)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


def write_status(
    kube: Kube, snap: Snapshot, decision: Decision, result: ReconcileResult | None = None
) -> None:
    """The status patch (when something changed) and an event for each changed condition."""
    result = result if result is not None else ReconcileResult()
    owner = snap.owner
    metrics.record_conditions(owner.namespace, owner.name, decision.conditions)
    metrics.record_status(owner.namespace, owner.name, decision.status)
    if decision.tracks is not None:
        metrics.record_rollout(owner.namespace, owner.name, decision.tracks)
    if decision.status_patch:
        log.debug(
            "%s/%s: status fields changed: %s",
            owner.namespace,
            owner.name,
            sorted(decision.status_patch),
        )
        kube.patch_status(c.API_VERSION, c.KIND, owner.name, owner.namespace, decision.status_patch)
        result.status_written = True
    for condition in decision.events:
        if condition.reason in (Reason.GROUP_LEFT_ROUTING, Reason.GROUP_REJOINED_ROUTING):
            change = "left" if condition.reason == Reason.GROUP_LEFT_ROUTING else "rejoined"
            metrics.ROUTING_CHANGES.labels(owner.namespace, owner.name, change).inc()
        if condition.type in (ConditionType.CAPABILITIES_VERIFIED, ConditionType.DRAFTER_PAIRED):
            metrics.PREFLIGHT_VERDICTS.labels(
                condition.type, condition.status, condition.reason
            ).inc()
        post_event(kube, snap.body, condition, snap.now)
        result.events.append(f"{condition.type}={condition.status}/{condition.reason}")


def _write(kube: Kube, snap: Snapshot, write: Write, result: ReconcileResult) -> None:
    api_version, kind, name = write.ref
    namespace = snap.owner.namespace
    if write.verb in ("apply", "create"):
        # Created without force, so a field another manager holds is a conflict, never
        # taken over; forced only over an object this resource controls.
        kube.apply(write.body, force=write.force)
        result.applied.append(write.label)
    elif write.verb == "delete":
        kube.delete(api_version, kind, name, namespace)
        result.deleted.append(write.label)
    elif write.verb == "patch":
        kube.patch(api_version, kind, name, namespace, write.body)
    else:
        kube.patch_status(api_version, kind, name, namespace, write.body)
