"""One reconcile of a KimiK3Deployment: parse, build, apply what changed, observe, status.

It talks to the API only through ``Kube`` and writes only what differs, so the same call
serves the create/update/resume handlers, the timer and the child-event handlers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec, SpecError, parse_spec
from kimik3_operator.builders.children import build_children
from kimik3_operator.builders.common import Owner, selector_labels, with_spec_hash
from kimik3_operator.builders.probe import build_probe_config_map, build_probe_job, probe_key
from kimik3_operator.conditions import Condition, changed, now_rfc3339, set_condition
from kimik3_operator.handlers.apply import needs_apply
from kimik3_operator.kube import Kube, KubeError, Obj
from kimik3_operator.observe import Observation, gpu_inventory, invalid_spec, observe
from kimik3_operator.preflight.gate import Gate, evaluate, gated_observation
from kimik3_operator.preflight.pairing import resolve_drafter
from kimik3_operator.preflight.probe import ProbeState, probe_state
from kimik3_operator.preflight.table import load_table

log = logging.getLogger(__name__)
CRD_API = "apiextensions.k8s.io/v1"
LWS_API = f"{c.LWS_GROUP}/{c.LWS_VERSION}"
WARNING_REASONS = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.LEADER_WORKER_SET_CRD_MISSING,
        Reason.POD_CRASH_LOOPING,
        Reason.POD_OOM_KILLED,
        Reason.IMAGE_PULL_FAILED,
        Reason.INSUFFICIENT_GPUS,
        Reason.UNSCHEDULABLE,
        Reason.APPLY_FAILED,
        Reason.PREFLIGHT_FAILED,
    }
)

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def lock_for(namespace: str, name: str) -> threading.Lock:
    """One reconcile at a time per resource: handlers run in several threads."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


@dataclass
class ReconcileResult:
    invalid: bool = False
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[str] = field(default_factory=list)


def reconcile(
    kube: Kube, body: Mapping[str, Any], clock: Callable[[], str] = now_rfc3339
) -> ReconcileResult:
    meta = body["metadata"]
    with lock_for(meta["namespace"], meta["name"]), metrics.RECONCILE_SECONDS.time():
        # The status is written whole per field: start from the stored object, not from a
        # body that another writer (the acceptance scraper) may have overtaken.
        fresh = kube.get(c.API_VERSION, c.KIND, meta["name"], meta["namespace"])
        if fresh is None or fresh.get("metadata", {}).get("deletionTimestamp"):
            return ReconcileResult()
        try:
            result = _reconcile(kube, fresh, clock)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        metrics.RECONCILES.labels("invalid" if result.invalid else "ok").inc()
        return result


def _reconcile(kube: Kube, body: Mapping[str, Any], clock: Callable[[], str]) -> ReconcileResult:
    meta = body["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    result = ReconcileResult()
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as err:
        result.invalid = True
        observation = invalid_spec(f"{err}. No child was created or changed.")
        _write_status(kube, body, None, observation, result, clock)
        return result

    gate = _preflight(kube, spec, owner, body, result, clock)
    lws_installed = _crd_exists(kube, c.LWS_CRD)
    if lws_installed and gate.deploy:
        pod_monitor_installed = _crd_exists(kube, c.PODMONITOR_CRD)
        children = build_children(spec, owner, pod_monitor_available=pod_monitor_installed)
        try:
            _apply_children(kube, children, result)
            if pod_monitor_installed and not any(ch["kind"] == "PodMonitor" for ch in children):
                _delete_owned(
                    kube,
                    f"{c.MONITORING_GROUP}/v1",
                    "PodMonitor",
                    names.pod_monitor(owner.name),
                    owner,
                    result,
                )
        except KubeError as exc:
            observation = Observation(
                0,
                (
                    Condition(
                        ConditionType.DEGRADED,
                        "True",
                        Reason.APPLY_FAILED,
                        f"applying the children failed: {exc}; the operator retries",
                    ),
                ),
                Reason.APPLY_FAILED,
            )
            _write_status(kube, body, spec, observation, result, clock, gate)
            raise
    lws = (
        kube.get(LWS_API, "LeaderWorkerSet", names.leader_worker_set(owner.name), owner.namespace)
        if lws_installed
        else None
    )
    pods = _pods(kube, owner) if lws_installed else []
    observation = observe(spec, lws_crd_installed=lws_installed, lws=lws, pods=pods)
    if any(p.reason == Reason.INSUFFICIENT_GPUS for p in observation.problems):
        gpus = gpu_inventory(
            kube.list("v1", "Node"),
            kube.list("v1", "Pod", field_selector="status.phase!=Succeeded,status.phase!=Failed"),
            spec,
        )
        observation = observe(spec, lws_crd_installed=True, lws=lws, pods=pods, gpus=gpus)
    _write_status(kube, body, spec, gated_observation(observation, gate), result, clock, gate)
    return result


def _preflight(
    kube: Kube,
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    body: Mapping[str, Any],
    result: ReconcileResult,
    clock: Callable[[], str],
) -> Gate:
    """The static stage, then (when asked and not already failed) the image probe."""
    table = load_table()
    if spec.preflight.mode == "Disabled" or not spec.preflight.probe:
        return evaluate(spec, table, clock())
    static = evaluate(spec, table, clock())
    if static.failed:
        return static
    key = probe_key(spec)
    stored = ((body.get("status") or {}).get("capabilities") or {}).get("probe") or {}
    if stored.get("key") == key and stored.get("report"):
        state = ProbeState("Done", "Probed", "recorded", stored["report"])
        return evaluate(spec, table, clock(), state, key)
    _apply_children(
        kube,
        [
            with_spec_hash(build_probe_config_map(owner)),
            with_spec_hash(build_probe_job(spec, owner)),
        ],
        result,
    )
    job = kube.get("batch/v1", "Job", names.preflight_job(owner.name, key), owner.namespace)
    pods = kube.list("v1", "Pod", owner.namespace, label_selector=f"{c.PROBE_KEY_LABEL}={key}")
    state = probe_state(job, pods, spec.engine.image)
    return evaluate(spec, table, clock(), state, key)


def _crd_exists(kube: Kube, name: str) -> bool:
    return kube.get(CRD_API, "CustomResourceDefinition", name) is not None


def _pods(kube: Kube, owner: Owner) -> list[Obj]:
    selector = f"{c.LABEL_INSTANCE}={owner.name},{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
    return kube.list("v1", "Pod", owner.namespace, label_selector=selector)


def _apply_children(kube: Kube, children: Sequence[Obj], result: ReconcileResult) -> None:
    for child in children:
        meta = child["metadata"]
        live = kube.get(child["apiVersion"], child["kind"], meta["name"], meta["namespace"])
        if needs_apply(child, live):
            kube.apply(child)
            result.applied.append(f"{child['kind']}/{meta['name']}")


def _delete_owned(
    kube: Kube, api_version: str, kind: str, name: str, owner: Owner, result: ReconcileResult
) -> None:
    live = kube.get(api_version, kind, name, owner.namespace)
    if live is None:
        return
    refs = live.get("metadata", {}).get("ownerReferences", []) or []
    if any(ref.get("uid") == owner.uid for ref in refs):
        kube.delete(api_version, kind, name, owner.namespace)
        result.deleted.append(f"{kind}/{name}")


def desired_status(
    body: Mapping[str, Any],
    spec: KimiK3DeploymentSpec | None,
    observation: Observation,
    now: str,
    gate: Gate | None = None,
) -> dict[str, Any]:
    meta = body["metadata"]
    current: Mapping[str, Any] = body.get("status") or {}
    generation = int(meta.get("generation", 0) or 0)
    conditions: list[dict[str, Any]] = [dict(x) for x in current.get("conditions", []) or []]
    for condition in _all_conditions(observation, gate):
        conditions = set_condition(conditions, condition, generation, now)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "reason": observation.summary_reason,
    }
    if spec is not None:
        owner = Owner(meta["name"], meta["namespace"], meta.get("uid", ""))
        labels = selector_labels(owner, c.COMPONENT_LEADER)
        status.update(
            {
                "replicas": spec.replicas,
                "readyReplicas": observation.ready_replicas,
                "selector": ",".join(f"{k}={v}" for k, v in labels.items()),
                "nodesPerReplica": spec.nodes_per_replica,
                "gpusPerReplica": spec.gpus_per_replica,
                "endpoint": names.endpoint(owner.name, owner.namespace, spec.service.port),
                "speculative": _speculative(spec, current.get("speculative") or {}),
            }
        )
    if gate is not None:
        status["capabilities"] = _keep_checked_at(current.get("capabilities") or {}, gate.status)
    return status


def _all_conditions(observation: Observation, gate: Gate | None) -> tuple[Condition, ...]:
    return (gate.conditions if gate is not None else ()) + observation.conditions


def _keep_checked_at(current: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Unchanged capabilities keep their checkedAt, so a no-op reconcile writes nothing."""
    same = {k: v for k, v in current.items() if k != "checkedAt"} == {
        k: v for k, v in new.items() if k != "checkedAt"
    }
    if same and "checkedAt" in current:
        return {**new, "checkedAt": current["checkedAt"]}
    return new


def _speculative(spec: KimiK3DeploymentSpec, current: Mapping[str, Any]) -> dict[str, Any]:
    drafter = resolve_drafter(spec)
    if drafter is None:
        return {"method": "none"}
    section = dict(current) if current.get("drafter") == drafter.repo else {}
    section.update(
        {
            "method": drafter.method,
            "drafter": drafter.repo,
            "autoPaired": drafter.auto_paired,
        }
    )
    if drafter.num_speculative_tokens is not None:
        section["numSpeculativeTokens"] = drafter.num_speculative_tokens
    else:
        section.pop("numSpeculativeTokens", None)
    return section


def status_delta(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status fields whose value differs (a merge patch replaces each whole)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _write_status(
    kube: Kube,
    body: Mapping[str, Any],
    spec: KimiK3DeploymentSpec | None,
    observation: Observation,
    result: ReconcileResult,
    clock: Callable[[], str],
    gate: Gate | None = None,
) -> None:
    meta = body["metadata"]
    current: Mapping[str, Any] = body.get("status") or {}
    status = desired_status(body, spec, observation, clock(), gate)
    conditions = _all_conditions(observation, gate)
    metrics.record_conditions(meta["namespace"], meta["name"], conditions)
    delta = status_delta(current, status)
    if not delta:
        return
    kube.patch_status(c.API_VERSION, c.KIND, meta["name"], meta["namespace"], delta)
    result.status_written = True
    old_conditions = current.get("conditions", []) or []
    for condition in _all_conditions(observation, gate):
        if changed(old_conditions, condition):
            if condition.type in (
                ConditionType.CAPABILITIES_VERIFIED,
                ConditionType.DRAFTER_PAIRED,
            ):
                metrics.PREFLIGHT_VERDICTS.labels(
                    condition.type, condition.status, condition.reason
                ).inc()
            post_event(kube, body, condition, clock())
            result.events.append(f"{condition.type}={condition.status}/{condition.reason}")


def post_event(kube: Kube, body: Mapping[str, Any], condition: Condition, now: str) -> None:
    meta = body["metadata"]
    warning = condition.reason in WARNING_REASONS or (
        condition.type == ConditionType.DEGRADED and condition.status == "True"
    )
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": "Warning" if warning else "Normal",
        "reason": condition.reason,
        "message": f"{condition.type}={condition.status}: {condition.message}"[:1024],
        "source": {"component": c.OPERATOR_NAME},
        "reportingComponent": c.OPERATOR_NAME,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.create(event)
    except KubeError as exc:
        # An event is best effort: losing one must not fail the reconcile.
        log.warning("could not post event %s: %s", condition.reason, exc)
