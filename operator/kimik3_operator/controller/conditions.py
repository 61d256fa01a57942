"""The conditions a status ends with, decided here and nowhere else.

Each stage below reads one finding of the reconcile and says what Progressing, Available,
Degraded and the summary reason become while it holds. Stages apply from the lowest to the
highest, so where two hold, the higher one's word stands:

| precedence | stage | holds while |
|---|---|---|
| 1 | invalid | the name or the spec cannot be served (`InvalidSpec`); nothing else is decided |
| 2 | service account | spec.pod.serviceAccountName is not one the operator may use |
| 3 | pod security | the namespace's enforced level refuses a pod of the spec |
| 4 | name conflict | a child's name is taken by an object this resource does not control |
| 5 | preflight | CapabilitiesVerified or DrafterPaired is not True (and the mode is Enforce) |
| 6 | parked | the serving pods failed to start more often than the budget allows |
| 7 | model cache | the weights are not yet (or could not be) put in the cache |
| 8 | queue | a queue is named and Kueue is absent, or has not admitted every group |
| 9 | pods | the LeaderWorkerSet's groups, as the pods and the GPU ledger show them |

Then the conditions that never block are added: CapabilitiesVerified and DrafterPaired,
ModelCached, Admitted, SpeculationEffective, InterNodeFabric, CanaryVerified, Autoscaling
(which says what holds or limits KEDA; the groups it holds back are already out of the
replicas the stages above judge), Routing, Disaggregated (each role's groups) and
TransferIntegrity (the decode side's acceptance against the prefill side's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.observation.kueue import QueueState, admitted_condition
from kimik3_operator.observation.model_cache import (
    CacheState,
    cache_condition,
    every_pod_downloads,
    with_failed_download,
)
from kimik3_operator.observation.workload import Observation, blocked
from kimik3_operator.preflight.gate import Gate

# Where a group's pods talk over something faster than the pod network: an RDMA device
# plugin's resource, or a Multus network attached for the purpose.
RDMA_MARKERS = ("rdma", "infiniband", "roce", "efa")
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


@dataclass(frozen=True)
class Findings:
    """What one reconcile found, stage by stage (None: the stage does not hold or was not
    reached). ``pods`` is the pods' own observation, there unless a stage holds alone."""

    pods: Observation | None = None
    spec: KimiK3DeploymentSpec | None = None
    invalid: str | None = None
    pod_security: str | None = None
    service_account: str | None = None
    name_conflict: str | None = None
    gate: Gate | None = None
    parked: str | None = None
    cache: CacheState | None = None
    canary: Condition | None = None
    speculation: Condition | None = None
    queue: QueueState | None = None
    autoscaling: Condition | None = None
    routing: Condition | None = None
    disaggregated: Condition | None = None
    transfer: Condition | None = None


Stage = Callable[[Findings, Observation], Observation]


def _preflight(found: Findings, observation: Observation) -> Observation:
    """Progressing, Available and Degraded as the preflight leaves them."""
    gate = found.gate
    if gate is None or (gate.deploy and not gate.failed):
        return observation
    blocking = gate.capabilities if gate.capabilities.status != "True" else gate.drafter
    by_type = {c.type: c for c in observation.conditions}
    available = by_type[ConditionType.AVAILABLE]
    degraded = by_type[ConditionType.DEGRADED]
    progressing = by_type[ConditionType.PROGRESSING]
    summary = observation.summary_reason
    if gate.failed and degraded.status != "True":
        degraded = Condition(
            ConditionType.DEGRADED,
            "True",
            Reason.PREFLIGHT_FAILED,
            f"{blocking.type}={blocking.status} ({blocking.reason}): {blocking.message}",
        )
    if not gate.deploy:
        kept = (
            " The running LeaderWorkerSet keeps the last spec that passed."
            if observation.ready_replicas
            else ""
        )
        if gate.failed:
            progressing = Condition(
                ConditionType.PROGRESSING,
                "False",
                Reason.PREFLIGHT_FAILED,
                f"no GPU pod is created for this spec: {blocking.type} is "
                f"False ({blocking.reason}); fix the spec.{kept}",
            )
        else:
            progressing = Condition(
                ConditionType.PROGRESSING,
                "True",
                Reason.WAITING_FOR_PREFLIGHT,
                f"no GPU pod is created until {blocking.type} is True: {blocking.message}.{kept}",
            )
        available, summary = _unavailable_for(available, summary, blocking)
    return Observation(
        observation.ready_replicas,
        (progressing, available, degraded),
        summary,
        observation.problems,
    )


def _model_cache(found: Findings, observation: Observation) -> Observation:
    """While the weights are not in the cache, Progressing says so; a failed download is
    Degraded."""
    cache = found.cache
    if cache is None or cache.ready:
        return observation
    conditions = list(observation.conditions)
    waiting = Condition(
        ConditionType.PROGRESSING,
        "True" if cache.phase != "Failed" else "False",
        Reason.WAITING_FOR_MODEL_CACHE,
        f"no serving pod is created before the weights are in the cache "
        f"({cache.phase}): {cache.message}",
    )
    conditions = [waiting if c_.type == ConditionType.PROGRESSING else c_ for c_ in conditions]
    if cache.phase == "Failed":
        conditions = with_failed_download(conditions, cache)
    summary = observation.summary_reason
    if observation.ready_replicas == 0:
        summary = Reason.WAITING_FOR_MODEL_CACHE if cache.phase != "Failed" else cache.reason
    return Observation(observation.ready_replicas, tuple(conditions), summary, observation.problems)


def _unavailable_for(
    available: Condition, summary: Reason, cause: Condition
) -> tuple[Condition, Reason]:
    """Available, and the summary, naming ``cause`` while the groups are not available."""
    if available.status == "True":
        return available, summary
    return Condition(ConditionType.AVAILABLE, "False", cause.reason, cause.message), cause.reason


def _queue(found: Findings, observation: Observation) -> Observation:
    """While Kueue has not admitted every group, Progressing and Available say where they
    wait, in Kueue's words; a group preempted or evicted is Degraded. Pods that Kueue's gate
    holds are waiting for admission, not failing."""
    queue = found.queue
    if queue is None or queue.held or queue.all_admitted:
        return observation
    admitted = admitted_condition(queue)
    if not queue.installed:
        return blocked(admitted.reason, admitted.message)
    by_type = {c_.type: c_ for c_ in observation.conditions}
    progressing = by_type[ConditionType.PROGRESSING]
    available = by_type[ConditionType.AVAILABLE]
    degraded = by_type[ConditionType.DEGRADED]
    summary = observation.summary_reason
    ready = observation.ready_replicas
    if ready < queue.replicas:
        progressing = Condition(
            ConditionType.PROGRESSING,
            "True",
            admitted.reason,
            f"{ready} of {queue.replicas} group(s) ready; {admitted.message}",
        )
        available, summary = _unavailable_for(available, summary, admitted)
    if admitted.reason in (Reason.PREEMPTED, Reason.EVICTED) and degraded.status != "True":
        degraded = Condition(ConditionType.DEGRADED, "True", admitted.reason, admitted.message)
    return Observation(ready, (progressing, available, degraded), summary, observation.problems)


def _parked(found: Findings, observation: Observation) -> Observation:
    if found.parked is None:
        return observation
    return blocked(Reason.PARKED_AFTER_STARTUP_FAILURES, found.parked)


# Lowest first: each stage that holds overrides what the ones before it said.
OVERRIDES: tuple[Stage, ...] = (_queue, _model_cache, _parked, _preflight)


def final_conditions(found: Findings) -> Observation:
    """Every condition the status ends with, by the precedence above."""
    alone = (
        (Reason.INVALID_SPEC, found.invalid),
        (Reason.SERVICE_ACCOUNT_NOT_ALLOWED, found.service_account),
        (Reason.POD_SECURITY_REFUSED, found.pod_security),
        (Reason.NAME_CONFLICT, found.name_conflict),
    )
    for reason, message in alone:
        if message is not None:
            return blocked(reason, message)
    if found.pods is None:
        raise ValueError("the pods' observation is needed unless a stage holds alone")
    observation = found.pods
    for stage in OVERRIDES:
        observation = stage(found, observation)
    gate = found.gate.conditions if found.gate is not None else ()
    extra = (
        _cache_condition(found),
        admitted_condition(found.queue) if found.queue is not None else None,
        found.speculation,
        fabric_condition(found.spec) if found.spec is not None else None,
        found.canary,
        found.autoscaling,
        found.routing,
        found.disaggregated,
        found.transfer,
    )
    return dataclasses.replace(
        observation,
        conditions=(*gate, *observation.conditions, *(c_ for c_ in extra if c_ is not None)),
    )


def _cache_condition(found: Findings) -> Condition | None:
    if found.cache is not None:
        return cache_condition(found.cache)
    return every_pod_downloads(found.spec) if found.spec is not None else None


def fabric_condition(spec: KimiK3DeploymentSpec) -> Condition | None:
    """For a group that spans nodes: whether its pods ask for a fabric between them. Tensor
    parallelism over nodes exchanges activations at every layer; over the pod network (TCP
    sockets) it runs at a fraction of its speed. A warning, never a refusal."""
    if spec.nodes_per_replica <= 1:
        return None
    rdma = sorted(
        name
        for name in spec.pod.extra_resources
        if any(marker in name.lower() for marker in RDMA_MARKERS)
    )
    if rdma:
        return Condition(
            ConditionType.INTER_NODE_FABRIC,
            "True",
            Reason.RDMA_REQUESTED,
            f"each pod of the {spec.nodes_per_replica}-node groups requests {', '.join(rdma)}",
        )
    if MULTUS_ANNOTATION in spec.pod.annotations:
        return Condition(
            ConditionType.INTER_NODE_FABRIC,
            "True",
            Reason.SECONDARY_NETWORK,
            f"the pods attach {spec.pod.annotations[MULTUS_ANNOTATION]!r} "
            f"({MULTUS_ANNOTATION}); NCCL must be pointed at it (NCCL_SOCKET_IFNAME, "
            "NCCL_IB_HCA in engine.env)",
        )
    return Condition(
        ConditionType.INTER_NODE_FABRIC,
        "False",
        Reason.NO_RDMA_FABRIC,
        f"tensor parallelism spans {spec.nodes_per_replica} nodes per group and the pods ask "
        "for no RDMA resource or secondary network, so NCCL runs over the pod network at a "
        "fraction of the speed; request the fabric in spec.pod.extraResources (e.g. rdma/ib: "
        "1) and engine.addCapabilities [IPC_LOCK] (see examples/kimi-k3-text-dspark-rdma-"
        "fleet.yaml), or ignore this where the pod network is the fabric",
    )
