"""metav1.Condition helpers: pure, so every transition is unit-tested."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kimik3_operator.api.constants import ConditionType, Reason

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    type: ConditionType
    status: Status
    reason: Reason  # a StrEnum, so a misspelt reason fails the type check
    message: str


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    new: Condition,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """Conditions with ``new`` set; ``lastTransitionTime`` moves only when the status changes.
    Type and reason are stored as plain strings: the status is JSON and YAML to its readers."""
    result: list[dict[str, Any]] = []
    replaced = False
    for existing in conditions:
        if existing.get("type") != new.type:
            result.append(dict(existing))
            continue
        replaced = True
        changed = existing.get("status") != new.status
        result.append(
            {
                "type": str(new.type),
                "status": new.status,
                "reason": str(new.reason),
                "message": new.message,
                "lastTransitionTime": now if changed else existing.get("lastTransitionTime", now),
                "observedGeneration": generation,
            }
        )
    if not replaced:
        result.append(
            {
                "type": str(new.type),
                "status": new.status,
                "reason": str(new.reason),
                "message": new.message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
        )
    return result


def find(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def changed(old: Sequence[Mapping[str, Any]], new: Condition) -> bool:
    """Whether setting ``new`` changes its status, reason or message (worth an Event)."""
    current = find(old, new.type)
    if current is None:
        return True
    return (current.get("status"), current.get("reason"), current.get("message")) != (
        new.status,
        new.reason,
        new.message,
    )
