"""The reconcile's rollout step: reads what the canary needs (the live LeaderWorkerSet's
stable spec, the pods, the leaders' samples), asks ``rollout.plan`` and says how to build the
LeaderWorkerSet. No I/O of its own: the reconcile reads and writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.leaderworkerset import Rollout, pod_templates
from kimik3_operator.observation.acceptance import parse_rfc3339
from kimik3_operator.observation.canary import (
    CANARY,
    HELD,
    ROLLED_BACK,
    Evidence,
    Inputs,
    Plan,
    Stable,
    canary_groups,
    describe_change,
    groups_on,
    plan,
    stable_annotation,
    stable_of,
    track,
)
from kimik3_operator.observation.crashes import startup_failures
from kimik3_operator.observation.readings import Readings


@dataclass(frozen=True)
class RolloutStep:
    render: Rollout  # how to build the LeaderWorkerSet
    plan: Plan

    @property
    def settled(self) -> bool:
        """No canary in flight and no refused change: every group runs the spec's pods."""
        phase = (self.plan.section or {}).get("phase")
        return not self.plan.use_stable and phase not in (CANARY, HELD, ROLLED_BACK)


def _hash(template: Mapping[str, Any]) -> str:
    return str(template["workerTemplate"]["metadata"]["labels"][c.TEMPLATE_HASH_LABEL])


def _group(pod: Mapping[str, Any]) -> int | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    group = str(labels.get(c.LWS_GROUP_INDEX_LABEL, ""))
    return int(group) if group.isdigit() else None


def _first_failure(pods: Sequence[Mapping[str, Any]]) -> str:
    for failure in startup_failures(pods):
        what = failure.line or failure.what
        return f"pod {failure.pod} exited {failure.exit_code} ({failure.reason}): {what}"
    return ""


def rollout_step(
    body: Mapping[str, Any],
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    live_lws: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    weight_bytes: int | None,
    readings: Readings,
    now: float,
) -> RolloutStep:
    """``spec`` is what the groups should run now (a parked deployment's has no groups)."""
    raw = body.get("spec") or {}
    record = (body.get("status") or {}).get("rollout") or {}
    stable: Stable | None = stable_of(live_lws) if live_lws is not None else None
    # Built once a pass: the stable pods' template only when they differ from the spec's.
    desired_template = pod_templates(spec, owner, spec.paired_drafter, weight_bytes)
    stable_template: Mapping[str, Any] | None = None
    if stable is not None:
        same = stable.spec == spec and stable.weight_bytes == weight_bytes
        stable_template = (
            desired_template
            if same
            else pod_templates(stable.spec, owner, stable.spec.paired_drafter, stable.weight_bytes)
        )
    desired = _hash(desired_template)
    stable_hash = _hash(stable_template) if stable_template is not None else None
    canary = spec.rollout.canary
    size = spec.nodes_per_replica
    updated = groups_on(pods, desired, size)
    all_updated = set(range(spec.replicas)) <= updated
    if canary is not None and stable is not None and stable_hash != desired:
        partition, groups = canary_groups(spec.replicas, canary)
        ready = bool(groups) and set(groups) <= updated
        since = parse_rfc3339(record.get("observingSince")) or now
        series = readings.acceptance.series.values() if readings.acceptance else ()
        canary_pods = [
            p
            for p in pods
            if (_group(p) or 0) >= partition
            and ((p.get("metadata") or {}).get("labels") or {}).get(c.TEMPLATE_HASH_LABEL)
            == desired
        ]
        evidence = Evidence(
            canary_ready=ready,
            all_updated=all_updated,
            canary=track(series, desired, since),
            stable=track(series, stable_hash or "", since) if partition > 0 else None,
            failure=_first_failure(canary_pods),
        )
    else:
        evidence = Evidence(canary_ready=False, all_updated=all_updated)
    drafter = spec.paired_drafter
    bar = (
        canary.min_acceptance_rate
        if canary is not None and canary.min_acceptance_rate is not None
        else spec.monitoring.min_acceptance_rate
    )
    step = plan(
        Inputs(
            canary=canary,
            replicas=spec.replicas,
            desired_hash=desired,
            stable_hash=stable_hash,
            record=record,
            evidence=evidence,
            now=now,
            bar=bar,
            speculative=drafter is not None,
            change=describe_change(stable.raw, raw) if stable is not None else "",
        )
    )
    if step.promote or stable is None:
        annotation = stable_annotation(raw, weight_bytes)
    else:
        annotation = stable_annotation(stable.raw, stable.weight_bytes)
    render = Rollout(
        partition=step.partition,
        stable=annotation,
        pods_from=stable.spec if step.use_stable and stable is not None else None,
        pods_weight_bytes=stable.weight_bytes if stable is not None else None,
        template=stable_template if step.use_stable and stable is not None else desired_template,
    )
    return RolloutStep(render, step)
