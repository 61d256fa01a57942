"""The status a reconcile wants, pure: from the stored object, the final conditions and the
parts the reconcile found; and the delta that is worth a write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.conditions import Condition, set_condition
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner, selector_labels
from kimik3_operator.observation.acceptance import AcceptanceReading, speculative_update
from kimik3_operator.observation.download_progress import with_progress
from kimik3_operator.observation.kueue import QueueState, admission_status
from kimik3_operator.observation.model_cache import CacheState, cache_section
from kimik3_operator.observation.readings import Readings
from kimik3_operator.observation.workload import Observation
from kimik3_operator.preflight.gate import Gate
from kimik3_operator.redact import redact_tree


@dataclass(frozen=True)
class RolloutStatus:
    """status.rollout, and the spec the groups run when it is not the resource's own (its
    change was refused): status.speculative describes what runs."""

    section: Mapping[str, Any] | None
    running: KimiK3DeploymentSpec | None = None


def speculation_update(
    spec: KimiK3DeploymentSpec | None,
    current: Mapping[str, Any],
    reading: AcceptanceReading | None,
) -> tuple[dict[str, object] | None, Condition | None]:
    """The new status.speculative numbers and SpeculationEffective, when a reading moved them."""
    if spec is None or reading is None or spec.paired_drafter is None:
        return None, None
    update = speculative_update(
        current.get("speculative") or {},
        current.get("conditions") or [],
        reading,
        spec.monitoring.min_acceptance_rate,
    )
    return update.section, update.condition


@dataclass(frozen=True)
class StatusParts:
    """What the status says besides the conditions (None: the reconcile did not get there,
    and the stored field is left as it is)."""

    spec: KimiK3DeploymentSpec | None = None
    gate: Gate | None = None
    cache: CacheState | None = None
    startup: Mapping[str, Any] | None = None
    readings: Readings | None = None
    # status.speculative's numbers, when the acceptance reading moved them.
    speculative_numbers: Mapping[str, object] | None = None
    startup_failures: Mapping[str, Any] | None = None
    rollout: RolloutStatus | None = None
    queue: QueueState | None = None
    # status.autoscaling (spec.autoscaling): what KEDA asks, what is made, what is held.
    autoscaling: Mapping[str, Any] | None = None
    # status.routing (spec.routing): the pool, the picker, which groups are routable.
    routing: Mapping[str, Any] | None = None
    # status.disaggregation (spec.disaggregation): the set, the connector, each role's groups.
    disaggregation: Mapping[str, Any] | None = None


def desired_status(
    body: Mapping[str, Any], observation: Observation, now: str, parts: StatusParts
) -> dict[str, Any]:
    """``observation`` is the final one (``conditions.final_conditions``)."""
    meta = body["metadata"]
    current: Mapping[str, Any] = body.get("status") or {}
    generation = int(meta.get("generation", 0) or 0)
    conditions: list[dict[str, Any]] = [dict(x) for x in current.get("conditions", []) or []]
    spec = parts.spec
    # A feature the spec no longer asks for leaves no condition and no section behind.
    gone = (
        [(section, kind) for section, kind, on in _features(spec) if not on]
        if spec is not None
        else []
    )
    conditions = [x for x in conditions if x.get("type") not in {kind for _, kind in gone}]
    for condition in observation.conditions:
        conditions = set_condition(conditions, condition, generation, now)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "reason": str(observation.summary_reason),
    }
    spec, rollout, cache, readings = parts.spec, parts.rollout, parts.cache, parts.readings
    if spec is not None:
        owner = Owner(meta["name"], meta["namespace"], meta.get("uid", ""))
        labels = selector_labels(owner, c.COMPONENT_LEADER)
        # A disaggregated deployment answers from its decode side: its groups are counted.
        serving = spec.role_spec("decode")
        if spec.disaggregated:
            labels[c.LABEL_ROLE] = "decode"
        status.update(
            {
                "replicas": serving.replicas,
                "readyReplicas": observation.ready_replicas,
                # kubectl get's Replicas column, as a Deployment's READY: ready/asked for.
                "ready": f"{observation.ready_replicas}/{serving.replicas}",
                "selector": ",".join(f"{k}={v}" for k, v in labels.items()),
                "nodesPerReplica": serving.nodes_per_replica,
                "gpusPerReplica": serving.gpus_per_replica,
                "endpoint": names.endpoint(owner.name, owner.namespace, spec.service.port),
                "speculative": _speculative(
                    rollout.running if rollout is not None and rollout.running else spec,
                    parts.speculative_numbers or current.get("speculative") or {},
                ),
            }
        )
    if cache is not None:
        status["modelCache"] = with_progress(
            cache_section(cache, current.get("modelCache") or {}),
            readings.progress if readings is not None else None,
        )
    if parts.startup is not None:
        status["startup"] = dict(parts.startup)
    if parts.startup_failures is not None:
        status["startupFailures"] = dict(parts.startup_failures)
    if rollout is not None and rollout.section:
        status["rollout"] = dict(rollout.section)
    if parts.queue is not None:
        status["admission"] = admission_status(parts.queue)
    if parts.autoscaling is not None:
        status["autoscaling"] = dict(parts.autoscaling)
    if parts.routing is not None:
        status["routing"] = dict(parts.routing)
    if parts.disaggregation is not None:
        status["disaggregation"] = dict(parts.disaggregation)
    for section, _ in gone:
        if section in current:
            status[section] = None  # named in the patch, so the API server drops it
    if parts.gate is not None:
        status["capabilities"] = _keep_checked_at(
            current.get("capabilities") or {}, parts.gate.status
        )
    # The probe's errors and the messages quote the user's env (a mirror, a proxy).
    cleaned: dict[str, Any] = redact_tree(status)
    return cleaned


def _keep_checked_at(current: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Unchanged capabilities keep their checkedAt, so a no-op reconcile writes nothing."""
    same = {k: v for k, v in current.items() if k != "checkedAt"} == {
        k: v for k, v in new.items() if k != "checkedAt"
    }
    if same and "checkedAt" in current:
        return {**new, "checkedAt": current["checkedAt"]}
    return new


def _speculative(spec: KimiK3DeploymentSpec, current: Mapping[str, Any]) -> dict[str, Any]:
    drafter = spec.paired_drafter
    if drafter is None:
        return {"method": "none"}
    # The numbers measured belong to one drafter under one method.
    same = current.get("drafter") == drafter.location and current.get("method") == drafter.method
    section = dict(current) if same else {}
    section.update(
        {
            "method": drafter.method,
            "drafter": drafter.location,
            "autoPaired": drafter.auto_paired,
        }
    )
    if drafter.num_speculative_tokens is not None:
        section["numSpeculativeTokens"] = drafter.num_speculative_tokens
    else:
        section.pop("numSpeculativeTokens", None)
    return section


def status_delta(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns the stored status into ``desired`` for the top-level fields
    it sets: only the fields that differ, and within an object the keys that differ. A merge
    patch keeps a nested key it does not name, so a key to drop is named with null (else
    the stored object keeps it, differs for ever, and every resync writes again); a
    top-level field ``desired`` sets to None is dropped where the stored status has it."""
    dropped = {k: None for k, v in desired.items() if v is None and k in current}
    wanted = _without_nulls(desired)
    changed = {k: _merge_patch(current.get(k), v) for k, v in wanted.items() if current.get(k) != v}
    return {**changed, **dropped}


def _features(spec: KimiK3DeploymentSpec) -> list[tuple[str, str, bool]]:
    """(status section, condition type, whether the spec asks for it) of each optional
    feature whose section and condition describe only what the spec asks."""
    return [
        ("autoscaling", c.ConditionType.AUTOSCALING, spec.autoscaling is not None),
        ("routing", c.ConditionType.ROUTING, spec.routing is not None),
        ("disaggregation", c.ConditionType.DISAGGREGATED, spec.disaggregated),
        ("disaggregation", c.ConditionType.TRANSFER_INTEGRITY, spec.disaggregated),
    ]


def _without_nulls(value: Any) -> Any:
    """What the API server stores of a merge patch: a null in an object removes the key."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _merge_patch(current: Any, desired: Any) -> Any:
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    patch: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        if current.get(key) != value:
            patch[key] = _merge_patch(current.get(key), value)
    return patch
