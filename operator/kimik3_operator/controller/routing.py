"""spec.routing: which groups the endpoint picker may route to, as one pure decision.

A group is routable when its leader is Ready, no canary judges it or has failed on it, and
its drafter's acceptance has not collapsed against the median group's. The pool's selector
includes the operator's label on each leader, so a group leaves and rejoins the pool by that
label alone, with no code inside the picker. The last routable group never leaves: a slow
group serves, an empty pool does not.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.observation.acceptance import LeaderSeries, delta_since
from kimik3_operator.observation.canary import CANARY, HELD

# Fewer drafts than this over the window say nothing about a group's drafter.
MIN_DRAFTS = 20
STARTING = "starting"
CANARY_JUDGED = "a canary judges it"
CANARY_FAILED = "its canary failed"


@dataclass(frozen=True)
class GroupInput:
    """One group as the reconcile found it: its serving pod (the leader)."""

    index: int
    leader: str  # the leader pod's name
    ready: bool
    # The routable label as it stands: "true", "false", or "" when the pod has none yet.
    label: str = ""
    acceptance: float | None = None  # over the window; None: too few drafts to judge


@dataclass(frozen=True)
class RoutingInput:
    groups: tuple[GroupInput, ...]
    max_acceptance_drop: float
    canary_judged: frozenset[int] = frozenset()
    canary_failed: frozenset[int] = frozenset()
    pool_installed: bool = True
    # The picker's Deployment has a Ready replica (None: not made yet).
    picker_ready: bool | None = None
    # Per parent (gateway) of the pool: its name and its Accepted / ResolvedRefs conditions.
    parents: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class LabelChange:
    pod: str
    group: int
    value: str  # "true" or "false"
    # "joined" (a new leader's first label), "left" or "rejoined".
    change: str


@dataclass(frozen=True)
class RoutingPlan:
    routable: tuple[int, ...]
    # Per group kept out of routing: why.
    out: Mapping[int, str]
    labels: tuple[LabelChange, ...]
    condition: Condition
    notices: tuple[Condition, ...] = ()
    # Groups kept in only because they are the last routable ones.
    kept: tuple[int, ...] = ()
    baseline: float | None = None
    parents: tuple[Mapping[str, Any], ...] = field(default=())

    def section(self) -> dict[str, Any]:
        """status.routing."""
        section: dict[str, Any] = {
            "routableGroups": len(self.routable),
            "notRoutable": [
                {"group": group, "reason": why} for group, why in sorted(self.out.items())
            ],
        }
        if self.baseline is not None:
            section["medianAcceptance"] = round(self.baseline, 4)
        if self.kept:
            section["keptAsLast"] = list(self.kept)
        if self.parents:
            section["parents"] = [dict(p) for p in self.parents]
        return section


def group_acceptance(series: Sequence[LeaderSeries], window_seconds: float) -> dict[int, float]:
    """Each group's acceptance rate over the window, from its leader's retained samples;
    groups with too few drafts are left out."""
    found: dict[int, float] = {}
    for one in series:
        if not one.group.isdigit() or not one.samples:
            continue
        delta = delta_since(one.samples, one.samples[-1].at - window_seconds)
        if delta is None or delta.drafts < MIN_DRAFTS or delta.draft_tokens <= 0:
            continue
        found[int(one.group)] = delta.accepted / delta.draft_tokens
    return found


def canary_groups(
    rollout: Mapping[str, Any] | None,
) -> tuple[frozenset[int], frozenset[int]]:
    """The groups a canary judges now, and those it failed on and holds (status.rollout)."""
    section = rollout or {}
    groups = frozenset(
        g for g in section.get("canaryGroups") or () if isinstance(g, int) and g >= 0
    )
    phase = section.get("phase")
    return (
        groups if phase == CANARY else frozenset(),
        groups if phase == HELD else frozenset(),
    )


def _collapsed(rate: float | None, baseline: float | None, max_drop: float) -> bool:
    return rate is not None and baseline is not None and rate < baseline * (1 - max_drop)


def routing_plan(found: RoutingInput) -> RoutingPlan:
    rates = [g.acceptance for g in found.groups if g.ready and g.acceptance is not None]
    # A baseline needs two groups: one group alone is not "collapsed against the others".
    baseline = statistics.median(rates) if len(rates) >= 2 else None
    out: dict[int, str] = {}
    for group in found.groups:
        if not group.ready:
            out[group.index] = STARTING
        elif group.index in found.canary_failed:
            out[group.index] = CANARY_FAILED
        elif group.index in found.canary_judged:
            out[group.index] = CANARY_JUDGED
        elif _collapsed(group.acceptance, baseline, found.max_acceptance_drop):
            out[group.index] = (
                f"acceptance {group.acceptance:.2f} is more than "
                f"{found.max_acceptance_drop:.0%} below the median group's {baseline:.2f}"
            )
    ready = [g for g in found.groups if g.ready]
    kept: tuple[int, ...] = ()
    if ready and all(g.index in out for g in ready):
        # Never the last: keep the Ready group with the best acceptance (unknown counts as
        # best: no evidence against it), the lowest index on a tie.
        best = min(
            ready,
            key=lambda g: (-(g.acceptance if g.acceptance is not None else 2.0), g.index),
        )
        kept = (best.index,)
        out.pop(best.index)
    routable = tuple(sorted(g.index for g in found.groups if g.index not in out))
    labels = tuple(_label_changes(found.groups, out))
    notices = tuple(
        _notice(change, out) for change in labels if change.change in ("left", "rejoined")
    )
    return RoutingPlan(
        routable=routable,
        out=out,
        labels=labels,
        condition=_condition(found, routable, out, kept),
        notices=notices,
        kept=kept,
        baseline=baseline,
        parents=found.parents,
    )


def _label_changes(groups: Sequence[GroupInput], out: Mapping[int, str]) -> list[LabelChange]:
    changes = []
    for group in groups:
        want = "false" if group.index in out else "true"
        if group.label == want or (want == "false" and not group.label):
            # A leader that has never been routable needs no "false": the pool selects
            # "true" only, and its first "true" is a join, not a return.
            continue
        change = "left"
        if want == "true":
            change = "rejoined" if group.label == "false" else "joined"
        changes.append(LabelChange(group.leader, group.index, want, change))
    return changes


def _notice(change: LabelChange, out: Mapping[int, str]) -> Condition:
    if change.change == "left":
        return Condition(
            ConditionType.ROUTING,
            "True",
            Reason.GROUP_LEFT_ROUTING,
            f"group {change.group} (pod {change.pod}) left routing: {out[change.group]}",
        )
    return Condition(
        ConditionType.ROUTING,
        "True",
        Reason.GROUP_REJOINED_ROUTING,
        f"group {change.group} (pod {change.pod}) is routed again",
    )


def _refusal(parents: Sequence[Mapping[str, Any]]) -> str | None:
    """A gateway's word that it refused the pool (Accepted or ResolvedRefs False)."""
    for parent in parents:
        for cond in parent.get("conditions") or ():
            if cond.get("type") in ("Accepted", "ResolvedRefs") and cond.get("status") == "False":
                return (
                    f"gateway {parent.get('name', '?')}: {cond.get('type')}=False "
                    f"({cond.get('reason', '')}): {str(cond.get('message', ''))[:200]}"
                )
    return None


def _condition(
    found: RoutingInput,
    routable: Sequence[int],
    out: Mapping[int, str],
    kept: Sequence[int],
) -> Condition:
    kind = ConditionType.ROUTING
    if not found.pool_installed:
        return Condition(
            kind,
            "False",
            Reason.INFERENCE_POOL_NOT_INSTALLED,
            "spec.routing needs the Gateway API Inference Extension's CRDs "
            "(inferencepools.inference.networking.k8s.io, v1.0 or later); install them and "
            "the pool and its endpoint picker follow",
        )
    if not found.picker_ready:
        return Condition(
            kind,
            "False",
            Reason.ENDPOINT_PICKER_NOT_READY,
            "the endpoint picker has no Ready pod yet; with failureMode "
            "FailClose the gateway refuses requests until it has",
        )
    refusal = _refusal(found.parents)
    if refusal is not None:
        return Condition(kind, "False", Reason.POOL_NOT_ACCEPTED, refusal)
    if out:
        why = "; ".join(f"group {g}: {reason}" for g, reason in sorted(out.items()))
        last = f" (group {kept[0]} kept in: the last routable group)" if kept else ""
        return Condition(
            kind,
            "True",
            Reason.GROUPS_OUT_OF_ROUTING,
            f"{len(routable)} of {len(found.groups)} group(s) routable{last}; out: {why}"[:900],
        )
    return Condition(
        kind,
        "True",
        Reason.ROUTING_ACTIVE,
        f"the endpoint picker routes to all {len(routable)} group(s)",
    )


@dataclass(frozen=True)
class RolePlans:
    """A disaggregated deployment's routing: one plan per role, each over its own groups
    (group indices repeat across roles). The P/D router picks a prefill and a decode leader
    per request, so each role keeps its own last routable group; only decode groups draft,
    so only they can leave routing for a collapsed acceptance."""

    plans: Mapping[str, RoutingPlan]

    @property
    def labels(self) -> tuple[LabelChange, ...]:
        return tuple(change for plan in self.plans.values() for change in plan.labels)

    @property
    def notices(self) -> tuple[Condition, ...]:
        return tuple(
            dataclasses.replace(notice, message=f"{role} {notice.message}")
            for role, plan in self.plans.items()
            for notice in plan.notices
        )

    @property
    def condition(self) -> Condition:
        conditions = {role: plan.condition for role, plan in self.plans.items()}
        for cond in conditions.values():
            if cond.status != "True":
                # The pool, the picker or the gateway: the same for both roles.
                return cond
        out = {
            role: cond
            for role, cond in conditions.items()
            if cond.reason == Reason.GROUPS_OUT_OF_ROUTING
        }
        if out:
            first = next(iter(out.values()))
            why = "; ".join(f"{role}: {cond.message}" for role, cond in out.items())
            return dataclasses.replace(first, message=why[:900])
        counts = " and ".join(f"{len(plan.routable)} {role}" for role, plan in self.plans.items())
        return Condition(
            ConditionType.ROUTING,
            "True",
            Reason.ROUTING_ACTIVE,
            f"the P/D router picks a prefill and a decode leader per request from all "
            f"{counts} group(s)",
        )

    def section(self) -> dict[str, Any]:
        """status.routing: the groups routable in all, and each role's own section."""
        return {
            "routableGroups": sum(len(plan.routable) for plan in self.plans.values()),
            "roles": {role: plan.section() for role, plan in self.plans.items()},
        }
