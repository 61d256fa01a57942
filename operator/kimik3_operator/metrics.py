"""The operator's own metrics, served by prometheus_client on KIMIK3_METRICS_PORT."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Gauge, Histogram

from kimik3_operator.api.conditions import Condition

RECONCILES = Counter("kimik3_reconciles", "Reconciles of KimiK3Deployments, by result", ["result"])
for _result in ("ok", "invalid", "error"):
    RECONCILES.labels(_result)  # every result has a series from the start (0, not absent)
REJECTED_OBJECTS = Counter(
    "kimik3_rejected_objects",
    "Objects the informers skipped because they nest too deep to decode, by kind",
    ["kind"],
)
NAMESPACES_LISTED_EARLY = Counter(
    "kimik3_namespaces_listed_early",
    "Namespaces whose resources went before the cluster-wide lists ended: handed over by the "
    "first list of KimiK3Deployments (handed_over) or read by lists of their own (own_lists); "
    "and those over the byte budget for their own lists, left to wait (too_large)",
    ["how"],
)
RECONCILE_SECONDS = Histogram(
    "kimik3_reconcile_duration_seconds",
    "Time one reconcile takes",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PREFLIGHT_VERDICTS = Counter(
    "kimik3_preflight_verdicts",
    "Preflight verdicts that changed a deployment's CapabilitiesVerified or DrafterPaired",
    ["condition", "status", "reason"],
)
CONDITION = Gauge(
    "kimik3_deployment_condition",
    "1 for the current status of each condition of each deployment",
    ["namespace", "name", "type", "status", "reason"],
)
ACCEPTANCE = Gauge(
    "kimik3_deployment_acceptance_rate",
    "Drafted tokens accepted over the last window, per deployment",
    ["namespace", "name"],
)
MIN_ACCEPTANCE = Gauge(
    "kimik3_deployment_min_acceptance_rate",
    "spec.monitoring.minAcceptanceRate of each deployment with a drafter",
    ["namespace", "name"],
)
ROLLOUT_ACCEPTANCE = Gauge(
    "kimik3_rollout_acceptance_rate",
    "Acceptance over the canary's window, of the canary groups and of the stable groups",
    ["namespace", "name", "track"],
)
LEADING = Gauge(
    "kimik3_leading",
    "1 while this replica reconciles: it holds the Lease, or runs standalone; 0 on standby",
)
REPLICAS = Gauge(
    "kimik3_deployment_replicas", "Groups asked for (spec.replicas)", ["namespace", "name"]
)
READY_REPLICAS = Gauge(
    "kimik3_deployment_ready_replicas",
    "Groups whose every pod is Ready (status.readyReplicas)",
    ["namespace", "name"],
)
STARTUP_PHASE = Gauge(
    "kimik3_deployment_startup_phase",
    "1 for the start-up phase the deployment is in (status.startup.phase)",
    ["namespace", "name", "phase"],
)
CACHE_BYTES = Gauge(
    "kimik3_model_cache_bytes",
    "The model cache's download: bytes done and bytes in all (status.modelCache)",
    ["namespace", "name", "kind"],
)
ADMISSION_GROUPS = Gauge(
    "kimik3_deployment_groups_by_admission",
    "Groups of a deployment that names a Kueue queue, by their Workload's state "
    "(status.admission: Admitted, QuotaReserved, Pending, Evicted, Preempted)",
    ["namespace", "name", "state"],
)
ROUTABLE_GROUPS = Gauge(
    "kimik3_deployment_routable_groups",
    "Groups the endpoint picker may route to (status.routing.routableGroups, spec.routing)",
    ["namespace", "name"],
)
ROUTING_CHANGES = Counter(
    "kimik3_routing_changes",
    "Groups taken out of routing (left) and put back (rejoined), per deployment",
    ["namespace", "name", "change"],
)
ADMISSION_STATES = ("Admitted", "QuotaReserved", "Pending", "Evicted", "Preempted")
_last_reason: dict[tuple[str, str, str], tuple[str, str]] = {}
_last_phase: dict[tuple[str, str], str] = {}


def record_conditions(namespace: str, name: str, conditions: Iterable[Condition]) -> None:
    """Exactly one series per (deployment, condition type) carries the current status."""
    for condition in conditions:
        key = (namespace, name, condition.type)
        previous = _last_reason.get(key)
        current = (condition.status, condition.reason)
        if previous == current:
            continue
        if previous is not None:
            CONDITION.remove(namespace, name, condition.type, *previous)
        CONDITION.labels(namespace, name, condition.type, *current).set(1)
        _last_reason[key] = current


def record_status(namespace: str, name: str, status: Mapping[str, object]) -> None:
    """Groups asked for and ready, the start-up phase and the download's bytes, as the
    status says them: what dashboards and alerts read without parsing the status."""
    for gauge, field in ((REPLICAS, "replicas"), (READY_REPLICAS, "readyReplicas")):
        value = status.get(field)
        if isinstance(value, int):
            gauge.labels(namespace, name).set(value)
    startup = status.get("startup")
    phase = startup.get("phase") if isinstance(startup, Mapping) else None
    previous = _last_phase.get((namespace, name))
    if isinstance(phase, str) and phase != previous:
        if previous is not None:
            STARTUP_PHASE.remove(namespace, name, previous)
        STARTUP_PHASE.labels(namespace, name, phase).set(1)
        _last_phase[(namespace, name)] = phase
    admission = status.get("admission")
    if isinstance(admission, Mapping):
        groups = admission.get("groups")
        states = (
            [g.get("state") for g in groups if isinstance(g, Mapping)]
            if isinstance(groups, list)
            else []
        )
        for state in ADMISSION_STATES:
            ADMISSION_GROUPS.labels(namespace, name, state).set(states.count(state))
    routing = status.get("routing")
    if isinstance(routing, Mapping) and isinstance(routing.get("routableGroups"), int):
        ROUTABLE_GROUPS.labels(namespace, name).set(routing["routableGroups"])
    cache = status.get("modelCache")
    if isinstance(cache, Mapping):
        for kind, field in (("done", "bytesDone"), ("total", "bytesTotal")):
            value = cache.get(field)
            if isinstance(value, int | float):
                CACHE_BYTES.labels(namespace, name, kind).set(value)


def record_rollout(namespace: str, name: str, tracks: Mapping[str, float]) -> None:
    """The canary's and the stable groups' acceptance while a canary is judged."""
    for track in ("canary", "stable"):
        if track in tracks:
            ROLLOUT_ACCEPTANCE.labels(namespace, name, track).set(tracks[track])


def known() -> set[tuple[str, str]]:
    """The deployments that have series here."""
    return {(k[0], k[1]) for k in _last_reason}


def forget(namespace: str, name: str) -> None:
    for gauge in (ACCEPTANCE, MIN_ACCEPTANCE, REPLICAS, READY_REPLICAS, ROUTABLE_GROUPS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for kind in ("done", "total"):
        with contextlib.suppress(KeyError):
            CACHE_BYTES.remove(namespace, name, kind)
    phase = _last_phase.pop((namespace, name), None)
    if phase is not None:
        with contextlib.suppress(KeyError):
            STARTUP_PHASE.remove(namespace, name, phase)
    for track in ("canary", "stable"):
        with contextlib.suppress(KeyError):
            ROLLOUT_ACCEPTANCE.remove(namespace, name, track)
    for state in ADMISSION_STATES:
        with contextlib.suppress(KeyError):
            ADMISSION_GROUPS.remove(namespace, name, state)
    for change in ("left", "rejoined"):
        with contextlib.suppress(KeyError):
            ROUTING_CHANGES.remove(namespace, name, change)
    for key in [k for k in _last_reason if k[:2] == (namespace, name)]:
        CONDITION.remove(*key, *_last_reason.pop(key))
