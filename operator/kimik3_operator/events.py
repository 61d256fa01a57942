"""Kubernetes events for condition transitions; the type follows from the condition."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.kube import Kube, KubeError
from kimik3_operator.redact import redact

log = logging.getLogger(__name__)

# Conditions whose False means trouble; Degraded is the other way round.
_TROUBLE_WHEN_FALSE = frozenset(
    {
        ConditionType.CAPABILITIES_VERIFIED,
        ConditionType.DRAFTER_PAIRED,
        ConditionType.AVAILABLE,
        ConditionType.SPECULATION_EFFECTIVE,
        ConditionType.CANARY_VERIFIED,
        ConditionType.INTER_NODE_FABRIC,
    }
)


def event_type(condition: Condition) -> str:
    """Warning for every condition that reports trouble, Normal for the rest."""
    trouble = (condition.type in _TROUBLE_WHEN_FALSE and condition.status == "False") or (
        condition.type == ConditionType.DEGRADED and condition.status == "True"
    )
    return "Warning" if trouble else "Normal"


def build_event(body: Mapping[str, Any], condition: Condition, now: str) -> dict[str, Any]:
    meta = body["metadata"]
    return {
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
        "type": event_type(condition),
        "reason": str(condition.reason),
        "message": redact(f"{condition.type}={condition.status}: {condition.message}")[:1024],
        "source": {"component": c.OPERATOR_NAME},
        "reportingComponent": c.OPERATOR_NAME,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_event(kube: Kube, body: Mapping[str, Any], condition: Condition, now: str) -> None:
    try:
        kube.create(build_event(body, condition, now))
    except KubeError as exc:
        # An event is best effort: losing one must not fail the reconcile.
        log.warning("could not post event %s: %s", condition.reason, exc)


def too_deep_condition(limit: int) -> Condition:
    """What the event on a KimiK3Deployment the operator cannot decode says."""
    return Condition(
        ConditionType.DEGRADED,
        "True",
        Reason.OBJECT_TOO_DEEP,
        f"the operator skips this KimiK3Deployment: a field of it nests deeper than "
        f"{limit} levels (open fields such as status.capabilities take whatever "
        f"is written); nothing of it is reconciled until that field is replaced or removed",
    )
