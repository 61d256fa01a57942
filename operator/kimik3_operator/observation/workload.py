"""From the LeaderWorkerSet and its pods to Progressing, Available and Degraded.

Pure: the handler reads the objects and passes them in, so every transition is a unit test.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DISAGGREGATED_ROLES
from kimik3_operator.observation.crashes import STARTUP_REASONS, startup_failures
from kimik3_operator.observation.pods import pod_ready

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class GpuCounts:
    """GPUs on the nodes that match the placement: what the scheduler had to work with."""

    allocatable: int = 0
    free: int = 0
    largest_free_on_one_node: int = 0
    nodes: int = 0
    # Pods of the size asked for (``per_pod`` GPUs each) that the free GPUs can place.
    pods_that_fit: int = 0
    # Of the deployment's own serving pods, those the ledger already holds on a node (their
    # GPUs are out of ``free``); None where the counts were not asked with them. Read from
    # the same ledger as ``free``, so that a pod is never counted twice, or not at all, when
    # the ledger's watch and the reconcile's pod list are at different points.
    own_pods_held: int | None = None


@dataclass(frozen=True)
class Problem:
    reason: Reason
    message: str


@dataclass(frozen=True)
class Observation:
    ready_replicas: int
    conditions: tuple[Condition, ...]
    summary_reason: Reason
    problems: tuple[Problem, ...] = field(default=())


def group_readiness(
    pods: Sequence[Obj], size: int, replicas: int, gone_nodes: frozenset[str] = frozenset()
) -> int:
    """Groups below ``replicas`` whose ``size`` pods all exist, are Ready and are on a node
    that still exists."""
    groups: dict[str, list[Obj]] = defaultdict(list)
    for pod in pods:
        index = pod.get("metadata", {}).get("labels", {}).get(c.LWS_GROUP_INDEX_LABEL)
        if index is not None and not pod.get("metadata", {}).get("deletionTimestamp"):
            groups[index].append(pod)
    ready = 0
    for index, members in groups.items():
        if not index.isdigit() or int(index) >= replicas:
            continue
        if len(members) == size and all(
            pod_ready(p) and p.get("spec", {}).get("nodeName") not in gone_nodes for p in members
        ):
            ready += 1
    return ready


def group_gaps(
    pods: Sequence[Obj],
    size: int,
    replicas: int,
    name: str = "",
    gone_nodes: frozenset[str] = frozenset(),
) -> list[str]:
    """For each group below ``replicas`` that is not ready, which pods keep it back and why:
    missing (LWS recreates the group), terminating, not scheduled, or not Ready."""
    groups: dict[int, dict[int, Obj]] = defaultdict(dict)
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels", {}) or {}
        group, worker = labels.get(c.LWS_GROUP_INDEX_LABEL), labels.get(c.LWS_WORKER_INDEX_LABEL)
        if str(group).isdigit() and str(worker).isdigit():
            groups[int(str(group))][int(str(worker))] = pod
    gaps = []
    for index in range(replicas):
        members = groups.get(index, {})
        why = []
        for worker in range(size):
            member = members.get(worker)
            expected = f"{name}-{index}" + (f"-{worker}" if worker else "") if name else ""
            if member is None:
                what = f"pod {expected}" if expected else f"worker {worker}"
                why.append(f"{what} missing")
                continue
            pod_name = member.get("metadata", {}).get("name", expected)
            node = member.get("spec", {}).get("nodeName")
            if node in gone_nodes:
                why.append(f"pod {pod_name} on node {node}, which is gone")
            elif member.get("metadata", {}).get("deletionTimestamp"):
                why.append(f"pod {pod_name} terminating" + (f" on node {node}" if node else ""))
            elif not node:
                why.append(f"pod {pod_name} not scheduled")
            elif not pod_ready(member):
                why.append(f"pod {pod_name} on node {node} not Ready")
        if why:
            gaps.append(f"group {index}: {', '.join(why)}")
    return gaps


def lost_pods(pods: Sequence[Obj], gone_nodes: frozenset[str]) -> list[Problem]:
    """Pods bound to a node that no longer exists: their group is down until LWS recreates it."""
    lost = []
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        node = pod.get("spec", {}).get("nodeName")
        if node in gone_nodes:
            labels = pod.get("metadata", {}).get("labels", {}) or {}
            group = labels.get(c.LWS_GROUP_INDEX_LABEL, "?")
            lost.append(
                Problem(
                    Reason.NODE_LOST,
                    (
                        f"pod {pod.get('metadata', {}).get('name')} of group {group} is bound to "
                        f"node {node}, which is gone; LeaderWorkerSet recreates the group on "
                        "the remaining nodes"
                    ),
                )
            )
    return lost


def pod_problems(
    pods: Sequence[Obj], spec: KimiK3DeploymentSpec, gpus: GpuCounts | None
) -> list[Problem]:
    """The worst thing about each pod, most severe reasons first."""
    found: list[Problem] = []
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        problem = _pod_problem(pod, spec, gpus)
        if problem is not None:
            found.append(problem)
    order = [
        Reason.POD_OOM_KILLED,
        *STARTUP_REASONS,
        Reason.POD_CRASH_LOOPING,
        Reason.IMAGE_PULL_FAILED,
        Reason.INSUFFICIENT_GPUS,
        Reason.UNSCHEDULABLE,
    ]
    return sorted(found, key=lambda p: order.index(p.reason))


def _short_of_gpus(pod: Obj, spec: KimiK3DeploymentSpec) -> bool:
    """The scheduler turned the pod away for want of the placement's GPU resource."""
    return any(
        cond.get("type") == "PodScheduled"
        and cond.get("status") == "False"
        and cond.get("reason") == "Unschedulable"
        and f"Insufficient {spec.placement.gpu_resource}" in str(cond.get("message", ""))
        for cond in (pod.get("status", {}) or {}).get("conditions", []) or []
    )


def serving_pods(pods: Sequence[Obj]) -> list[Obj]:
    """The groups' leaders and workers, less those being deleted (their replacements need
    the GPUs they still hold)."""
    return [
        pod
        for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(c.LABEL_COMPONENT)
        in (c.COMPONENT_LEADER, c.COMPONENT_WORKER)
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]


def serving_pod_uids(pods: Sequence[Obj]) -> list[str]:
    return [str((p.get("metadata") or {}).get("uid", "")) for p in serving_pods(pods)]


def wants_gpu_counts(pods: Sequence[Obj], spec: KimiK3DeploymentSpec) -> bool:
    """Whether the status will quote the GPU ledger: some pod is short of GPUs."""
    return any(_short_of_gpus(pod, spec) for pod in pods)


def _pod_problem(pod: Obj, spec: KimiK3DeploymentSpec, gpus: GpuCounts | None) -> Problem | None:
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {}) or {}
    for cs in status.get("containerStatuses", []) or []:
        state = cs.get("state", {}) or {}
        last = (cs.get("lastState", {}) or {}).get("terminated") or {}
        terminated = state.get("terminated") or {}
        if "OOMKilled" in (last.get("reason"), terminated.get("reason")):
            limit = spec.resources.memory or "no limit set"
            return Problem(
                Reason.POD_OOM_KILLED,
                (
                    f"pod {name} container {cs.get('name')} was OOM-killed "
                    f"(restarts: {cs.get('restartCount', 0)}, memory limit: {limit}); raise "
                    "spec.resources.memory, or lower engine.maxModelLen or the batch size"
                ),
            )
    failures = [f for f in startup_failures([pod]) if f.quoted]
    if failures:
        # The container's own last lines say why it stopped: better than "crash-looping".
        return Problem(failures[-1].reason, failures[-1].message)
    for cs in status.get("containerStatuses", []) or []:
        state = cs.get("state", {}) or {}
        last = (cs.get("lastState", {}) or {}).get("terminated") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if reason == "CrashLoopBackOff":
            exit_info = ""
            if last:
                exit_info = f", last exit code {last.get('exitCode')} ({last.get('reason')})"
            return Problem(
                Reason.POD_CRASH_LOOPING,
                (
                    f"pod {name} container {cs.get('name')} is crash-looping "
                    f"(restarts: {cs.get('restartCount', 0)}{exit_info}); see "
                    f"kubectl logs {name} --previous"
                ),
            )
        if reason in c.IMAGE_PULL_REASONS:
            return Problem(
                Reason.IMAGE_PULL_FAILED,
                (
                    f"pod {name} cannot pull image {cs.get('image')}: {reason}: "
                    f"{waiting.get('message', '')}".rstrip(": ")
                    + "; check spec.engine.image and the registry credentials"
                ),
            )
    for cond in status.get("conditions", []) or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            message = str(cond.get("message", ""))
            if f"Insufficient {spec.placement.gpu_resource}" in message:
                return Problem(Reason.INSUFFICIENT_GPUS, _gpu_message(name, spec, gpus, message))
            return Problem(Reason.UNSCHEDULABLE, f"pod {name} cannot be scheduled: {message}")
    return None


def _gpu_message(
    pod: str, spec: KimiK3DeploymentSpec, gpus: GpuCounts | None, scheduler: str
) -> str:
    resource = spec.placement.gpu_resource
    asked = spec.gpus_per_replica * spec.replicas
    text = (
        f"pod {pod} asks for {spec.gpus_per_pod} {resource} on one node; "
        f"{spec.replicas} group(s) x {spec.nodes_per_replica} pod(s) need {asked} {resource} "
        f"in total"
    )
    if gpus is not None:
        text += (
            f"; the {gpus.nodes} node(s) matching the placement have {gpus.allocatable} "
            f"allocatable and {gpus.free} free, at most {gpus.largest_free_on_one_node} "
            f"free on one node"
        )
    return text + f" (scheduler: {scheduler}); add GPU nodes, or lower spec.replicas"


def min_available(spec: KimiK3DeploymentSpec) -> int:
    """Groups that must be ready for Available, honouring rollout.maxUnavailable."""
    unavailable = spec.rollout.max_unavailable
    if isinstance(unavailable, str):
        percent = int(unavailable.rstrip("%") or 0)
        allowed = math.floor(spec.replicas * percent / 100)
    else:
        allowed = unavailable
    return max(1, spec.replicas - allowed)


def observe(
    spec: KimiK3DeploymentSpec,
    *,
    lws_crd_installed: bool,
    lws: Obj | None,
    pods: Sequence[Obj],
    gpus: GpuCounts | None = None,
    name: str = "",
    gone_nodes: frozenset[str] = frozenset(),
) -> Observation:
    if not lws_crd_installed:
        message = (
            f"the LeaderWorkerSet CRD ({c.LWS_CRD}) is not installed; install LeaderWorkerSet "
            "(kubectl apply --server-side -f "
            "https://github.com/kubernetes-sigs/lws/releases/download/v0.8.0/manifests.yaml, "
            "or its Helm chart), then the operator retries"
        )
        return blocked(Reason.LEADER_WORKER_SET_CRD_MISSING, message)
    size = spec.nodes_per_replica
    replicas = spec.replicas
    ready = group_readiness(pods, size, replicas, gone_nodes)
    gaps = group_gaps(pods, size, replicas, name, gone_nodes) if lws is not None else []
    problems = tuple(lost_pods(pods, gone_nodes) + pod_problems(pods, spec, gpus))
    lws_status = (lws or {}).get("status", {}) or {}
    updated = int(lws_status.get("updatedReplicas", 0) or 0)

    if lws is None:
        progressing = Condition(
            ConditionType.PROGRESSING,
            "True",
            Reason.WAITING_FOR_LEADER_WORKER_SET,
            "waiting for the LeaderWorkerSet to be created",
        )
    elif updated < replicas and ready > 0:
        progressing = Condition(
            ConditionType.PROGRESSING,
            "True",
            Reason.ROLLING_UPDATE,
            f"{updated} of {replicas} group(s) updated, {ready} ready",
        )
    elif ready < replicas:
        progressing = Condition(
            ConditionType.PROGRESSING,
            "True",
            Reason.GROUPS_STARTING,
            f"{ready} of {replicas} group(s) of {size} pod(s) ready" + _gaps(gaps),
        )
    else:
        progressing = Condition(
            ConditionType.PROGRESSING, "False", Reason.AVAILABLE, f"all {replicas} group(s) ready"
        )

    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more pod problem(s))" if len(problems) > 1 else ""
        degraded = Condition(ConditionType.DEGRADED, "True", first.reason, first.message + more)
    else:
        degraded = Condition(
            ConditionType.DEGRADED, "False", Reason.AS_EXPECTED, "no pod problems seen"
        )

    if replicas == 0:
        available = Condition(
            ConditionType.AVAILABLE, "False", Reason.SCALED_TO_ZERO, "spec.replicas is 0"
        )
    elif ready >= replicas:
        available = Condition(
            ConditionType.AVAILABLE,
            "True",
            Reason.AVAILABLE,
            f"{ready} of {replicas} group(s) ready, every pod Ready",
        )
    elif ready >= min_available(spec):
        available = Condition(
            ConditionType.AVAILABLE,
            "True",
            Reason.SOME_GROUPS_READY,
            f"{ready} of {replicas} group(s) ready, within "
            f"rollout.maxUnavailable={spec.rollout.max_unavailable}",
        )
    else:
        reason = (
            problems[0].reason
            if problems
            else (Reason.NO_GROUP_READY if ready == 0 else Reason.SOME_GROUPS_READY)
        )
        available = Condition(
            ConditionType.AVAILABLE,
            "False",
            reason,
            f"{ready} of {replicas} group(s) ready; a group is ready when "
            f"all its {size} pod(s) are Ready" + _gaps(gaps),
        )
    return Observation(ready, (progressing, available, degraded), available.reason, problems)


def _gaps(gaps: Sequence[str], limit: int = 4) -> str:
    if not gaps:
        return ""
    more = f"; and {len(gaps) - limit} more group(s)" if len(gaps) > limit else ""
    return "; " + "; ".join(gaps[:limit]) + more


def blocked(reason: Reason, message: str) -> Observation:
    return Observation(
        0,
        (
            Condition(ConditionType.PROGRESSING, "False", reason, message),
            Condition(ConditionType.AVAILABLE, "False", reason, message),
            Condition(ConditionType.DEGRADED, "True", reason, message),
        ),
        reason,
        (Problem(reason, message),),
    )


def invalid_spec(message: str) -> Observation:
    return blocked(Reason.INVALID_SPEC, message)


@dataclass(frozen=True)
class RoleObservation:
    """A side of a prefill/decode pair: its groups as ``observe`` sees them."""

    role: str
    replicas: int
    observation: Observation

    @property
    def ready(self) -> int:
        return self.observation.ready_replicas

    def section(self) -> dict[str, Any]:
        by_type = {c_.type: c_ for c_ in self.observation.conditions}
        available = by_type[ConditionType.AVAILABLE]
        return {
            "name": self.role,
            "replicas": self.replicas,
            "readyReplicas": self.ready,
            "reason": str(available.reason),
            "message": available.message,
        }


def observe_roles(
    spec: KimiK3DeploymentSpec,
    *,
    ds_crd_installed: bool,
    ds: Obj | None,
    pods: Sequence[Obj],
    gpus: GpuCounts | None = None,
    gone_nodes: frozenset[str] = frozenset(),
) -> tuple[Observation, tuple[RoleObservation, ...]]:
    """A disaggregated deployment's groups, role by role (each role's LeaderWorkerSet counts
    its groups from 0, so the pods are told apart by their role label first). It serves when
    both roles do: Available only with both; ready groups are the decode side's, which
    answers the requests."""
    if not ds_crd_installed:
        message = (
            f"the DisaggregatedSet CRD ({c.DS_CRD}) is not installed: spec.disaggregation needs "
            "LeaderWorkerSet v0.9.0 or later; upgrade LeaderWorkerSet, then the operator retries"
        )
        return blocked(Reason.DISAGGREGATED_SET_NOT_INSTALLED, message), ()
    roles: list[RoleObservation] = []
    for role in DISAGGREGATED_ROLES:
        side = spec.role_spec(role)
        mine = [
            p
            for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get(c.LABEL_ROLE) == role
        ]
        seen = observe(
            side,
            lws_crd_installed=True,
            lws=ds,
            pods=mine,
            gpus=gpus,
            # The role's pods are named by the DisaggregatedSet's revision: not guessed here.
            name="",
            gone_nodes=gone_nodes,
        )
        roles.append(RoleObservation(role, side.replicas, seen))
    by_role = {r.role: r for r in roles}
    decode = by_role["decode"].observation
    merged: list[Condition] = []
    for kind in (ConditionType.PROGRESSING, ConditionType.AVAILABLE, ConditionType.DEGRADED):
        each = {r.role: {c_.type: c_ for c_ in r.observation.conditions}[kind] for r in roles}
        worst = _worst(kind, list(each.values()))
        text = "; ".join(f"{role}: {cond.message}" for role, cond in each.items())
        merged.append(Condition(kind, worst.status, worst.reason, text))
    problems = tuple(p for r in roles for p in r.observation.problems)
    available = merged[1]
    summary = available.reason if available.status != "True" else decode.summary_reason
    return Observation(decode.ready_replicas, tuple(merged), summary, problems), tuple(roles)


def _worst(kind: ConditionType, conditions: list[Condition]) -> Condition:
    """The condition that speaks for the pair: a role not available, progressing or degraded
    over one that is fine."""
    if kind == ConditionType.AVAILABLE:
        return next((c_ for c_ in conditions if c_.status != "True"), conditions[-1])
    return next((c_ for c_ in conditions if c_.status == "True"), conditions[-1])


def roles_condition(roles: Sequence[RoleObservation]) -> Condition | None:
    """Disaggregated: each role's groups in one line, True when both have every group."""
    if not roles:
        return None
    counts = ", ".join(f"{r.role} {r.ready}/{r.replicas}" for r in roles)
    short = [r for r in roles if r.ready < r.replicas]
    if not short:
        return Condition(
            ConditionType.DISAGGREGATED, "True", Reason.ROLES_READY, f"groups ready: {counts}"
        )
    first = short[0]
    return Condition(
        ConditionType.DISAGGREGATED,
        "False",
        Reason.ROLE_NOT_READY,
        f"groups ready: {counts}; {first.role}: "
        + {c_.type: c_ for c_ in first.observation.conditions}[ConditionType.AVAILABLE].message,
    )
