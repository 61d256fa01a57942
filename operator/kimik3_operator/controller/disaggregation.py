"""A disaggregated deployment's transfer, judged from the acceptance rate (pure).

A prefill/decode pair that hands over the target's KV cache but not the drafter's state
still answers, fluently and at full throughput: the decode side's drafter only guesses worse.
So the decode groups' acceptance is compared with a baseline: what this deployment accepted
while it served aggregated (kept in status.disaggregation.baseline from the first reconcile
after the spec turned disaggregated), else spec.monitoring.minAcceptanceRate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.observation.acceptance import AcceptanceReading, delta_since
from kimik3_operator.observation.readings import Readings

# Drafts the decode groups must have verified in the window before their rate is judged.
MIN_DRAFTS = 20.0


def role_acceptance(
    reading: AcceptanceReading | None, pods: Sequence[Mapping[str, Any]], role: str
) -> tuple[float | None, float]:
    """(acceptance rate, drafts) of the leaders of one role over the reading's window."""
    if reading is None:
        return None, 0.0
    roles = {
        str((p.get("metadata") or {}).get("uid") or ""): (
            ((p.get("metadata") or {}).get("labels") or {}).get(c.LABEL_ROLE)
        )
        for p in pods
    }
    drafts = draft_tokens = accepted = 0.0
    for uid, series in reading.series.items():
        if roles.get(uid) != role or not series.samples:
            continue
        since = series.samples[-1].at - reading.window_seconds
        delta = delta_since(series.samples, since)
        if delta is None:
            continue
        drafts += delta.drafts
        draft_tokens += delta.draft_tokens
        accepted += delta.accepted
    if draft_tokens <= 0:
        return None, drafts
    return accepted / draft_tokens, drafts


def baseline(spec: KimiK3DeploymentSpec, status: Mapping[str, Any]) -> tuple[float, str]:
    """The acceptance the decode side is held to, and where it comes from."""
    section = status.get("disaggregation")
    if isinstance(section, Mapping):
        kept = section.get("baseline")
        if isinstance(kept, Mapping) and isinstance(kept.get("acceptanceRate"), int | float):
            return float(kept["acceptanceRate"]), str(kept.get("source") or "")
    else:
        # The first reconcile of a spec that turned disaggregated: the aggregated groups'
        # last reading, if they had one.
        speculative = status.get("speculative")
        if isinstance(speculative, Mapping):
            rate = speculative.get("acceptanceRate")
            if isinstance(rate, int | float) and 0 < rate <= 1:
                return float(rate), "the aggregated groups' acceptance"
    return spec.monitoring.min_acceptance_rate, "spec.monitoring.minAcceptanceRate"


def transfer_condition(
    spec: KimiK3DeploymentSpec,
    readings: Readings,
    pods: Sequence[Mapping[str, Any]],
    held_to: tuple[float, str],
) -> Condition | None:
    """TransferIntegrity, for a disaggregated deployment with a drafter (none without one:
    then there is no acceptance to read)."""
    disaggregation = spec.disaggregation
    if disaggregation is None or spec.paired_drafter is None:
        return None
    rate, drafts = role_acceptance(readings.acceptance, pods, "decode")
    base, source = held_to
    if rate is None or drafts < MIN_DRAFTS:
        return Condition(
            ConditionType.TRANSFER_INTEGRITY,
            "Unknown",
            Reason.AWAITING_DRAFTS,
            f"the decode groups verified {drafts:.0f} draft(s) in the window; judged from "
            f"{MIN_DRAFTS:.0f}",
        )
    floor = base * (1 - disaggregation.max_acceptance_drop)
    if rate < floor:
        return Condition(
            ConditionType.TRANSFER_INTEGRITY,
            "False",
            Reason.DRAFTER_STATE_NOT_TRANSFERRED,
            f"the decode groups accept {rate:.2f} of drafted tokens, under {floor:.2f} "
            f"({base:.2f}, {source}, less spec.disaggregation.maxAcceptanceDrop "
            f"{disaggregation.max_acceptance_drop:g}): the answers still come, but the "
            "drafter guesses without the state the prefill side computed — the KV connector "
            f"({disaggregation.connector}) most likely does not carry the drafter's KV cache "
            "in this vLLM release; serve aggregated, or move to a release whose connector "
            "transfers it",
        )
    return Condition(
        ConditionType.TRANSFER_INTEGRITY,
        "True",
        Reason.TRANSFER_INTACT,
        f"the decode groups accept {rate:.2f} of drafted tokens against {base:.2f} ({source})",
    )


def baseline_section(held_to: tuple[float, str]) -> dict[str, Any]:
    return {"acceptanceRate": round(held_to[0], 4), "source": held_to[1]}
