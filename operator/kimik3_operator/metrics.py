"""The operator's own metrics, served by prometheus_client on KIMIK3_METRICS_PORT."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Gauge, Histogram

from kimik3_operator.conditions import Condition

RECONCILES = Counter("kimik3_reconciles", "Reconciles of KimiK3Deployments, by result", ["result"])
for _result in ("ok", "invalid", "error"):
    RECONCILES.labels(_result)  # every result has a series from the start (0, not absent)
REJECTED_OBJECTS = Counter(
    "kimik3_rejected_objects",
    "Objects the informers skipped because they nest too deep to decode, by kind",
    ["kind"],
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
_last_reason: dict[tuple[str, str, str], tuple[str, str]] = {}


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


def record_rollout(namespace: str, name: str, tracks: Mapping[str, float]) -> None:
    """The canary's and the stable groups' acceptance while a canary is judged."""
    for track in ("canary", "stable"):
        if track in tracks:
            ROLLOUT_ACCEPTANCE.labels(namespace, name, track).set(tracks[track])


def known() -> set[tuple[str, str]]:
    """The deployments that have series here."""
    return {(k[0], k[1]) for k in _last_reason}


def forget(namespace: str, name: str) -> None:
    for gauge in (ACCEPTANCE, MIN_ACCEPTANCE):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for track in ("canary", "stable"):
        with contextlib.suppress(KeyError):
            ROLLOUT_ACCEPTANCE.remove(namespace, name, track)
    for key in [k for k in _last_reason if k[:2] == (namespace, name)]:
        CONDITION.remove(*key, *_last_reason.pop(key))
