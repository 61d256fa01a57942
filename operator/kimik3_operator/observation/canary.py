"""Acceptance-gated rollout: a change of the groups' pods proves itself on the canary groups
before it reaches the rest.

Pure. The LeaderWorkerSet's partition sends a new pod template to the highest-numbered
groups only; ``judge`` weighs what those groups show over the window against the bar and
against the groups not yet updated; ``plan`` is one step of the state machine (which pods
each group runs, the partition, status.rollout, the CanaryVerified condition), which the
reconcile applies. The stable spec lives on the LeaderWorkerSet (the operator's object),
the record of the canary in status.rollout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import CanarySpec, SpecError
from kimik3_operator.observation.acceptance import LeaderSeries, delta_since, parse_rfc3339, rfc3339

CANARY = "Canary"
PROMOTING = "Promoting"
ROLLED_BACK = "RolledBack"
HELD = "Held"
COMPLETE = "Complete"
# A window counts as observed when the samples span this much of it (scrapes are periodic).
COVERAGE = 0.9
# Fields whose change is no change of the pods: a new count of groups scales, it rolls nothing.
NOT_A_CHANGE = ("replicas", "rollout")
CHANGE_LIMIT = 6


@dataclass(frozen=True)
class Track:
    """The acceptance of one set of groups over the canary's window."""

    rate: float | None  # None: no drafts
    drafts: float
    span: float  # seconds the samples cover (the shortest of its leaders)


NO_TRACK = Track(None, 0.0, 0.0)


def track(series: Iterable[LeaderSeries], template_hash: str, since: float) -> Track:
    """Drafted and accepted tokens of the leaders made from ``template_hash`` since ``since``."""
    drafts = draft_tokens = accepted = 0.0
    spans: list[float] = []
    for leader in series:
        if not template_hash or leader.template_hash != template_hash:
            continue
        delta = delta_since(leader.samples, since)
        if delta is None:
            spans.append(0.0)
            continue
        spans.append(delta.at)
        drafts += delta.drafts
        draft_tokens += delta.draft_tokens
        accepted += delta.accepted
    rate = accepted / draft_tokens if drafts > 0 and draft_tokens > 0 else None
    return Track(rate, drafts, min(spans) if spans else 0.0)


@dataclass(frozen=True)
class Evidence:
    """What the canary groups (and the others) show."""

    canary_ready: bool  # every canary group has every pod on the new template and Ready
    all_updated: bool  # every group is, on the template asked for
    canary: Track = NO_TRACK
    stable: Track | None = None  # None: every group is a canary
    failure: str = ""  # a canary pod's start-up failure, quoted


Decision = Literal["Wait", "Promote", "Fail"]


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    message: str


def _rate(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def judge(
    evidence: Evidence,
    *,
    bar: float,
    max_drop: float,
    speculative: bool,
    since_start: float,
    since_ready: float | None,
    window: float,
    ready_timeout: float,
) -> Verdict:
    """The canary's verdict: Wait, Promote or Fail, with the numbers behind it."""
    if evidence.failure:
        return Verdict("Fail", f"a canary pod failed to start: {evidence.failure}")
    if since_ready is None:
        if since_start > ready_timeout:
            return Verdict(
                "Fail",
                f"the canary groups were not Ready {since_start:.0f}s after the change "
                f"(rollout.canary.readyTimeout {ready_timeout:.0f}s)",
            )
        return Verdict("Wait", "waiting for the canary groups to become Ready")
    if since_ready < window:
        return Verdict("Wait", f"observing the canary groups: {since_ready:.0f}s of {window:.0f}s")
    if not speculative:
        return Verdict(
            "Promote", f"the canary groups stayed Ready for {window:.0f}s (no drafter to compare)"
        )
    canary, stable = evidence.canary, evidence.stable
    if canary.rate is None:
        return Verdict(
            "Wait",
            f"no drafts measured on the canary groups in {since_ready:.0f}s: the verdict "
            "waits for traffic",
        )
    if canary.span < window * COVERAGE:
        return Verdict(
            "Wait",
            f"the canary's samples cover {canary.span:.0f}s of the {window:.0f}s window so far",
        )
    against = (
        f" (stable groups {_rate(stable.rate)})" if stable is not None else " (no stable groups)"
    )
    if canary.rate < bar:
        return Verdict(
            "Fail",
            f"canary acceptance {_rate(canary.rate)} over {window:.0f}s ({canary.drafts:.0f} "
            f"drafts) is below the bar {bar}{against}",
        )
    if (
        stable is not None
        and stable.rate is not None
        and canary.rate < stable.rate * (1 - max_drop)
    ):
        drop = 1 - canary.rate / stable.rate if stable.rate else 0.0
        return Verdict(
            "Fail",
            f"canary acceptance {_rate(canary.rate)} over {window:.0f}s is {drop:.0%} below the "
            f"stable groups' {_rate(stable.rate)} (rollout.canary.maxAcceptanceDrop "
            f"{max_drop})",
        )
    return Verdict(
        "Promote",
        f"canary acceptance {_rate(canary.rate)} over {window:.0f}s ({canary.drafts:.0f} drafts) "
        f"meets the bar {bar}{against}",
    )


@dataclass(frozen=True)
class Inputs:
    canary: CanarySpec | None
    replicas: int
    desired_hash: str  # the pods the spec asks for
    stable_hash: str | None  # the stable groups' pods (None: none recorded yet)
    record: Mapping[str, Any]  # the stored status.rollout
    evidence: Evidence
    now: float
    bar: float
    speculative: bool
    change: str = ""


@dataclass(frozen=True)
class Plan:
    use_stable: bool  # the pods come from the stable spec (a rollback)
    partition: int
    promote: bool  # the spec becomes the stable one
    section: dict[str, Any] | None  # status.rollout (None: none)
    condition: Condition | None = None
    verdict: Verdict | None = None
    tracks: Mapping[str, float] = field(default_factory=dict)


def canary_groups(replicas: int, canary: CanarySpec) -> tuple[int, list[int]]:
    """The partition and the groups at or above it: the highest-numbered go first."""
    partition = max(0, replicas - canary.groups)
    return partition, list(range(partition, replicas))


def _settled(record: Mapping[str, Any], evidence: Evidence) -> dict[str, Any] | None:
    """The spec's pods are the stable ones: promoting until every group runs them."""
    if not record:
        return None
    section = {k: v for k, v in record.items() if k != "refusedHash"}
    promoting = record.get("phase") in (CANARY, PROMOTING) and not evidence.all_updated
    section["phase"] = PROMOTING if promoting else COMPLETE
    return section


def plan(inputs: Inputs) -> Plan:
    record, evidence, canary = inputs.record, inputs.evidence, inputs.canary
    if inputs.stable_hash is None or inputs.desired_hash == inputs.stable_hash:
        return Plan(False, 0, True, _settled(record, evidence))
    if canary is None:
        # No canary: LeaderWorkerSet's rolling update takes the change to every group.
        return Plan(False, 0, True, None)
    partition, groups = canary_groups(inputs.replicas, canary)
    mine = record.get("canaryHash") == inputs.desired_hash
    if mine and record.get("phase") == ROLLED_BACK:
        return Plan(True, 0, False, dict(record))
    if mine and record.get("phase") == HELD:
        return Plan(False, partition, False, dict(record))
    if not mine or record.get("phase") != CANARY:
        section: dict[str, Any] = {
            "phase": CANARY,
            "canaryHash": inputs.desired_hash,
            "canaryGroups": groups,
            "window": canary.window,
            "startedAt": rfc3339(inputs.now),
            "change": inputs.change,
            "message": "waiting for the canary groups to become Ready",
        }
        condition = Condition(
            ConditionType.CANARY_VERIFIED,
            "Unknown",
            Reason.CANARY_OBSERVING,
            f"group(s) {_groups(groups)} take the change first ({inputs.change or 'the pods'}); "
            f"the others keep theirs until the canary has been observed for {canary.window}",
        )
        return Plan(False, partition, False, section, condition)
    started = parse_rfc3339(record.get("startedAt"))
    started = inputs.now if started is None else started
    ready_at = parse_rfc3339(record.get("observingSince"))
    if ready_at is None and evidence.canary_ready:
        ready_at = inputs.now
    verdict = judge(
        evidence,
        bar=inputs.bar,
        max_drop=canary.max_acceptance_drop,
        speculative=inputs.speculative,
        since_start=inputs.now - started,
        since_ready=None if ready_at is None else inputs.now - ready_at,
        window=canary.window_seconds,
        ready_timeout=canary.ready_timeout_seconds,
    )
    section = dict(record)
    section.update({"canaryGroups": groups, "window": canary.window, "message": verdict.message})
    if ready_at is not None:
        section["observingSince"] = rfc3339(ready_at)
    tracks: dict[str, float] = {}
    if evidence.canary.rate is not None:
        section["canaryAcceptance"] = tracks["canary"] = round(evidence.canary.rate, 4)
    if evidence.stable is not None and evidence.stable.rate is not None:
        section["stableAcceptance"] = tracks["stable"] = round(evidence.stable.rate, 4)
    if verdict.decision == "Wait":
        return Plan(False, partition, False, section, None, verdict, tracks)
    section["decidedAt"] = rfc3339(inputs.now)
    change = inputs.change or "the change of the pods"
    if verdict.decision == "Promote":
        section.update(phase=PROMOTING, decision="Promoted")
        condition = Condition(
            ConditionType.CANARY_VERIFIED,
            "True",
            Reason.CANARY_PROMOTED,
            f"promoted to every group: {verdict.message}; change: {change}",
        )
        return Plan(False, 0, True, section, condition, verdict, tracks)
    if canary.on_failure == "Hold":
        section.update(phase=HELD, decision="Held")
        condition = Condition(
            ConditionType.CANARY_VERIFIED,
            "False",
            Reason.CANARY_HELD,
            f"held on group(s) {_groups(groups)}: {verdict.message}; change: {change}. Revert "
            "the change to restore those groups, or change the spec again to try anew",
        )
        return Plan(False, partition, False, section, condition, verdict, tracks)
    section.update(phase=ROLLED_BACK, decision="RolledBack", refusedHash=inputs.desired_hash)
    condition = Condition(
        ConditionType.CANARY_VERIFIED,
        "False",
        Reason.CANARY_ROLLED_BACK,
        f"rolled back on group(s) {_groups(groups)}: {verdict.message}. Refused change: "
        f"{change}; the groups keep the previous pods until the spec changes again",
    )
    return Plan(True, 0, False, section, condition, verdict, tracks)


def _groups(groups: Sequence[int]) -> str:
    return ", ".join(str(g) for g in groups) or "none"


def _flat(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _flat(item, f"{path}.{key}" if path else str(key))
    else:
        yield path, value


def _shown(path: str, value: Any) -> str:
    if value is None:
        return "unset"
    if "env" in path.split(".") or isinstance(value, list | dict):
        return "changed"  # lists and env may carry values not for events
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The spec fields that changed the pods, old -> new, briefly."""
    before = {p: v for p, v in _flat(old, "") if p.split(".")[0] not in NOT_A_CHANGE}
    after = {p: v for p, v in _flat(new, "") if p.split(".")[0] not in NOT_A_CHANGE}
    parts: list[str] = []
    for path in sorted(set(before) | set(after)):
        was, now = before.get(path), after.get(path)
        if was == now:
            continue
        a, b = _shown(path, was), _shown(path, now)
        parts.append(f"{path} changed" if "changed" in (a, b) else f"{path}: {a} -> {b}")
    if len(parts) > CHANGE_LIMIT:
        parts = [*parts[:CHANGE_LIMIT], f"and {len(parts) - CHANGE_LIMIT} more"]
    return "; ".join(parts)


@dataclass(frozen=True)
class Stable:
    """The spec the stable groups run, as recorded on the LeaderWorkerSet."""

    raw: Mapping[str, Any]
    spec: KimiK3DeploymentSpec
    weight_bytes: int | None


def stable_of(lws: Mapping[str, Any] | None) -> Stable | None:
    """The recorded stable spec, or None when there is none or it no longer parses (the
    spec then counts as the stable one)."""
    annotations = ((lws or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(c.STABLE_SPEC_ANNOTATION)
    if not isinstance(text, str) or len(text) > 256 * 1024:
        return None
    try:
        data = json.loads(text)
        raw = data["spec"]
        weight = data.get("weightBytes")
        spec = parse_spec(raw)
    except (ValueError, KeyError, TypeError, SpecError, RecursionError):
        return None
    if not isinstance(raw, Mapping):
        return None
    weight_bytes = weight if isinstance(weight, int) and not isinstance(weight, bool) else None
    return Stable(raw, spec, weight_bytes)


def stable_annotation(raw: Mapping[str, Any], weight_bytes: int | None) -> str:
    return json.dumps(
        {"spec": raw, "weightBytes": weight_bytes}, sort_keys=True, separators=(",", ":")
    )


def groups_on(pods: Sequence[Mapping[str, Any]], template_hash: str, size: int) -> set[int]:
    """Groups with all ``size`` pods made from ``template_hash``, Ready and not going away."""
    members: dict[int, int] = {}
    broken: set[int] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        group = str(labels.get(c.LWS_GROUP_INDEX_LABEL, ""))
        if not group.isdigit():
            continue
        index = int(group)
        ready = any(
            isinstance(cond, Mapping)
            and cond.get("type") == "Ready"
            and cond.get("status") == "True"
            for cond in (pod.get("status") or {}).get("conditions") or []
        )
        if labels.get(c.TEMPLATE_HASH_LABEL) != template_hash or meta.get("deletionTimestamp"):
            broken.add(index)
        elif ready:
            members[index] = members.get(index, 0) + 1
        else:
            broken.add(index)
    return {g for g, n in members.items() if n >= size and g not in broken}
