"""From Kueue's Workloads (one per group) to where the groups stand in the queue: the
Admitted condition and status.admission.

Pure: the snapshot reads the Workloads of the deployment's LeaderWorkerSet (by Kueue's
job-uid label) and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec

Obj = Mapping[str, Any]
GroupState = Literal["Admitted", "QuotaReserved", "Pending", "Evicted", "Preempted"]
# Kueue writes the group index of a LeaderWorkerSet's Workload here.
WORKLOAD_INDEX_ANNOTATION = "kueue.x-k8s.io/component-workload-index"
MESSAGE_LIMIT = 300
# Workloads read per deployment: its groups, the surge, and room for one replaced set.
WORKLOAD_READ_LIMIT_MARGIN = 8


@dataclass(frozen=True)
class GroupAdmission:
    group: int
    workload: str
    state: GroupState
    message: str = ""


@dataclass(frozen=True)
class QueueState:
    """The groups of a deployment whose spec names a LocalQueue."""

    queue: str
    installed: bool = True
    # The operator's gate is on the LeaderWorkerSet: no group is admitted until it lifts.
    held: bool = False
    lws_exists: bool = False
    replicas: int = 0
    groups: tuple[GroupAdmission, ...] = ()
    cluster_queue: str = ""

    def count(self, state: GroupState) -> int:
        return sum(1 for g in self.groups if g.state == state)

    @property
    def all_admitted(self) -> bool:
        wanted = [g for g in self.groups if g.group < self.replicas]
        return len(wanted) >= self.replicas and all(g.state == "Admitted" for g in wanted)


def read_limit(spec: KimiK3DeploymentSpec) -> int:
    return spec.replicas + WORKLOAD_READ_LIMIT_MARGIN


def held_by_operator(lws: Obj | None) -> bool:
    annotations = ((lws or {}).get("metadata") or {}).get("annotations") or {}
    gates = str(annotations.get(c.KUEUE_ADMISSION_GATED_BY, ""))
    return c.KUEUE_PREFLIGHT_GATE in (g.strip() for g in gates.split(","))


def _condition(workload: Obj, kind: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _true(workload: Obj, kind: str) -> Mapping[str, Any] | None:
    cond = _condition(workload, kind)
    return cond if cond is not None and cond.get("status") == "True" else None


def group_admission(workload: Obj) -> GroupAdmission | None:
    """One Workload's state; None for one that is not a group's (no index)."""
    meta = workload.get("metadata") or {}
    index = str((meta.get("annotations") or {}).get(WORKLOAD_INDEX_ANNOTATION, ""))
    if not index.isdigit():
        return None
    name = str(meta.get("name", ""))
    state: GroupState
    preempted = _true(workload, "Preempted")
    evicted = _true(workload, "Evicted")
    admitted = _true(workload, "Admitted")
    reserved = _true(workload, "QuotaReserved")
    if preempted is not None or (evicted is not None and evicted.get("reason") == "Preempted"):
        state, cond = "Preempted", preempted or evicted
    elif evicted is not None:
        state, cond = "Evicted", evicted
    elif admitted is not None:
        state, cond = "Admitted", admitted
    elif reserved is not None:
        state, cond = "QuotaReserved", reserved
    else:
        state, cond = "Pending", _condition(workload, "QuotaReserved")
    message = str((cond or {}).get("message") or "")[:MESSAGE_LIMIT]
    return GroupAdmission(int(index), name, state, message)


def queue_state(
    spec: KimiK3DeploymentSpec,
    *,
    installed: bool,
    lws: Obj | None,
    workloads: Sequence[Obj],
) -> QueueState | None:
    """None when the spec names no queue."""
    if not spec.queued:
        return None
    queue = str(spec.scheduling.queue_name)
    if not installed:
        return QueueState(queue, installed=False, replicas=spec.replicas)
    lws_uid = ((lws or {}).get("metadata") or {}).get("uid")
    groups: dict[int, GroupAdmission] = {}
    cluster_queue = ""
    for workload in workloads:
        labels = (workload.get("metadata") or {}).get("labels") or {}
        if not lws_uid or labels.get(c.KUEUE_JOB_UID_LABEL) != lws_uid:
            continue
        found = group_admission(workload)
        if found is None:
            continue
        held = groups.get(found.group)
        # Two Workloads of one group (a replaced one not yet gone): the admitted one speaks.
        if held is None or (held.state != "Admitted" and found.state == "Admitted"):
            groups[found.group] = found
        admission = (workload.get("status") or {}).get("admission") or {}
        cluster_queue = cluster_queue or str(admission.get("clusterQueue") or "")
    return QueueState(
        queue,
        held=held_by_operator(lws),
        lws_exists=lws is not None,
        replicas=spec.replicas,
        groups=tuple(groups[i] for i in sorted(groups)),
        cluster_queue=cluster_queue,
    )


def _groups_text(groups: Sequence[GroupAdmission], limit: int = 3) -> str:
    shown = "; ".join(
        f"group {g.group}: {g.message}" if g.message else f"group {g.group}" for g in groups[:limit]
    )
    more = f" (and {len(groups) - limit} more)" if len(groups) > limit else ""
    return shown + more


def admitted_condition(state: QueueState) -> Condition:
    """Whether Kueue admitted every group, and if not, its own word on why."""
    queue = f"LocalQueue {state.queue}"
    if not state.installed:
        return Condition(
            ConditionType.ADMITTED,
            "False",
            Reason.KUEUE_NOT_INSTALLED,
            f"spec.scheduling.queueName names {queue} and Kueue is not installed (no "
            f"{c.KUEUE_WORKLOAD_CRD} CRD): no group is created; install Kueue with its "
            "leaderworkerset.x-k8s.io/leaderworkerset and pod integrations, or remove "
            "spec.scheduling by re-creating the KimiK3Deployment",
        )
    if state.held:
        return Condition(
            ConditionType.ADMITTED,
            "False",
            Reason.ADMISSION_HELD_FOR_PREFLIGHT,
            f"the groups wait in {queue} without taking quota until the preflight passes "
            f"(the LeaderWorkerSet's {c.KUEUE_ADMISSION_GATED_BY} names "
            f"{c.KUEUE_PREFLIGHT_GATE})",
        )
    preempted = [g for g in state.groups if g.state == "Preempted"]
    evicted = [g for g in state.groups if g.state == "Evicted"]
    pending = [g for g in state.groups if g.state == "Pending"]
    reserved = [g for g in state.groups if g.state == "QuotaReserved"]
    admitted = state.count("Admitted")
    of = f"{admitted} of {state.replicas} group(s) admitted by {queue}"
    if preempted:
        return Condition(
            ConditionType.ADMITTED,
            "False",
            Reason.PREEMPTED,
            f"{of}; preempted by Kueue, the group waits for quota again: "
            + _groups_text(preempted),
        )
    if evicted:
        return Condition(
            ConditionType.ADMITTED,
            "False",
            Reason.EVICTED,
            f"{of}; evicted by Kueue: " + _groups_text(evicted),
        )
    if state.all_admitted:
        where = f" (ClusterQueue {state.cluster_queue})" if state.cluster_queue else ""
        return Condition(
            ConditionType.ADMITTED,
            "True",
            Reason.ADMITTED,
            f"every group ({state.replicas}) admitted by {queue}{where}",
        )
    if reserved and not pending:
        return Condition(
            ConditionType.ADMITTED,
            "False",
            Reason.QUOTA_RESERVED,
            f"{of}; quota reserved, waiting for Kueue's admission checks: "
            + _groups_text(reserved),
        )
    missing = state.replicas - len([g for g in state.groups if g.group < state.replicas])
    if pending:
        text = f"{of}; waiting for quota: " + _groups_text(pending)
    elif not state.lws_exists:
        text = f"the groups go to {queue} once the LeaderWorkerSet is created"
    else:
        text = f"{of}; Kueue has not yet made a Workload for {max(missing, 0)} group(s)"
    return Condition(ConditionType.ADMITTED, "False", Reason.WAITING_FOR_QUOTA, text)


def admission_status(state: QueueState) -> dict[str, Any]:
    """status.admission: the queue and each group's Workload."""
    section: dict[str, Any] = {
        "queueName": state.queue,
        "admittedGroups": state.count("Admitted"),
        "held": state.held,
        "groups": [
            {
                "group": g.group,
                "workload": g.workload,
                "state": g.state,
                **({"message": g.message} if g.message else {}),
            }
            for g in state.groups[:64]
        ],
    }
    if state.cluster_queue:
        section["clusterQueue"] = state.cluster_queue
    return section


def _whole(value: Any) -> int | None:
    """A count of devices as Kueue writes a quantity (an integer, or its string)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def quota_free(cluster_queue: Obj | None, resource: str, held: int = 0) -> int | None:
    """Of ``resource``, the ClusterQueue's nominal quota (every flavor) less what its
    Workloads have reserved, and at least ``held`` (what this deployment's admitted groups
    hold: Kueue writes the ClusterQueue's status after it admits a Workload, so a status
    read just then has not counted it yet); None when the queue says nothing of it.
    Borrowing from a cohort is not counted: a group is made only where its own queue's quota
    has room."""
    if cluster_queue is None:
        return None
    nominal = 0
    named = False
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in (group or {}).get("flavors") or []:
            for entry in (flavor or {}).get("resources") or []:
                if isinstance(entry, Mapping) and entry.get("name") == resource:
                    amount = _whole(entry.get("nominalQuota", 0))
                    if amount is None:
                        return None
                    nominal += amount
                    named = True
    if not named:
        return None
    reserved = 0
    for flavor in (cluster_queue.get("status") or {}).get("flavorsReservation") or []:
        for entry in (flavor or {}).get("resources") or []:
            if isinstance(entry, Mapping) and entry.get("name") == resource:
                reserved += _whole(entry.get("total", 0)) or 0
    return max(0, nominal - max(reserved, held))


def admitted_groups(workloads: Sequence[Obj]) -> int:
    """Groups whose Workload holds quota (reserved or admitted)."""
    return sum(
        1
        for workload in workloads
        if (found := group_admission(workload)) is not None
        and found.state in ("Admitted", "QuotaReserved")
    )
