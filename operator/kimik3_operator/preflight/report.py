"""From findings to a verdict, to the CapabilitiesVerified and DrafterPaired conditions, and
to ``status.capabilities``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.preflight.rules import Context, Facts, Finding
from kimik3_operator.preflight.table import format_version, resolve_version

Verdict = Literal["Pass", "Fail", "NeedsProbe"]


def verdict(findings: Sequence[Finding]) -> Verdict:
    if any(f.status == "Fail" for f in findings):
        return "Fail"
    if any(f.status == "Unknown" for f in findings):
        return "NeedsProbe"
    return "Pass"


def _summarise(findings: Sequence[Finding]) -> str:
    return " | ".join(f.message for f in findings)


def capabilities_condition(findings: Sequence[Finding], source: str) -> Condition:
    mine = [f for f in findings if f.condition == ConditionType.CAPABILITIES_VERIFIED]
    failed = [f for f in mine if f.status == "Fail"]
    if failed:
        return Condition(
            ConditionType.CAPABILITIES_VERIFIED, "False", failed[0].reason, _summarise(failed)
        )
    unknown = [f for f in mine if f.status == "Unknown"]
    if unknown:
        return Condition(
            ConditionType.CAPABILITIES_VERIFIED, "Unknown", unknown[0].reason, _summarise(unknown)
        )
    return Condition(
        ConditionType.CAPABILITIES_VERIFIED,
        "True",
        Reason.VERIFIED,
        f"{len(mine)} check(s) passed ({source})",
    )


def drafter_condition(spec: KimiK3DeploymentSpec, findings: Sequence[Finding]) -> Condition:
    mine = [f for f in findings if f.condition == ConditionType.DRAFTER_PAIRED]
    failed = [f for f in mine if f.status == "Fail"]
    if failed:
        return Condition(
            ConditionType.DRAFTER_PAIRED, "False", failed[0].reason, _summarise(failed)
        )
    drafter = spec.paired_drafter
    if drafter is None:
        return Condition(
            ConditionType.DRAFTER_PAIRED,
            "True",
            Reason.NO_DRAFTER,
            "drafter.method is none: no speculative decoding",
        )
    unknown = [f for f in mine if f.status == "Unknown"]
    if unknown:
        return Condition(
            ConditionType.DRAFTER_PAIRED, "Unknown", unknown[0].reason, _summarise(unknown)
        )
    what = drafter.location or (
        "from the prompt's n-grams"
        if drafter.method == "ngram"
        else f"the target's own {drafter.method} layers"
    )
    if drafter.auto_paired:
        return Condition(
            ConditionType.DRAFTER_PAIRED,
            "True",
            Reason.AUTO_PAIRED,
            (
                f"paired {spec.model.repo} with the known {drafter.method} drafter {what} "
                f"({drafter.num_speculative_tokens} speculative tokens)"
            ),
        )
    return Condition(
        ConditionType.DRAFTER_PAIRED, "True", Reason.PAIRED, f"{drafter.method} drafter {what}"
    )


def capabilities_status(
    spec: KimiK3DeploymentSpec, facts: Facts, source: str, checked_at: str
) -> dict[str, Any]:
    resolved = resolve_version(spec.engine.version, spec.engine.image)
    ctx = Context(spec, facts, resolved.version, resolved.source)
    caps = ctx.target_caps() or {}
    status: dict[str, Any] = {
        "vllmVersion": format_version(resolved.version) if resolved.version else "unknown",
        "platform": spec.engine.platform,
        "architecture": spec.model.architecture,
        "source": source,
        "checkedAt": checked_at,
    }
    for key in ("supportsEagle3", "supportsPipelineParallel", "isHybrid", "multimodal"):
        if key in caps:
            status[key] = bool(caps[key])
    return status


def report(findings: Sequence[Finding]) -> dict[str, Any]:
    return {"verdict": verdict(findings), "checks": [f.as_dict() for f in findings]}
