"""The stored status, read defensively. The operator writes the status, but anyone allowed to
write ``kimik3deployments/status`` can write anything there the schema lets through, and an
older release may have written another shape: a field of the wrong type is ignored (and
named, so the caller can say so), never a reason for a reconcile to fail."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHAPES: dict[str, type | tuple[type, ...]] = {
    "conditions": list,
    "modelCache": dict,
    "speculative": dict,
    "capabilities": dict,
    "startup": dict,
    "startupFailures": dict,
    "rollout": dict,
    "admission": dict,
    "reason": str,
    "observedGeneration": int,
    "replicas": int,
    "readyReplicas": int,
}
CONDITION_STRINGS = ("type", "status", "reason", "message", "lastTransitionTime")
CACHE_STRINGS = ("key", "phase", "claimName", "claimUID", "job", "message", "progress")
CACHE_COUNTS = ("bytesTotal", "bytesDone", "verifiedBytes", "bytesPerSecond", "etaSeconds")
ROLLOUT_STRINGS = (
    "phase",
    "canaryHash",
    "refusedHash",
    "window",
    "startedAt",
    "observingSince",
    "decidedAt",
    "decision",
    "change",
    "message",
)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _condition_ok(item: Any) -> bool:
    return (
        isinstance(item, Mapping)
        and isinstance(item.get("type"), str)
        and all(isinstance(item.get(k), str) for k in CONDITION_STRINGS if k in item)
    )


def readable_status(status: Any) -> tuple[dict[str, Any], list[str]]:
    """The status with every field of the wrong type left out, and the paths left out."""
    if status is None:
        return {}, []
    if not isinstance(status, Mapping):
        return {}, ["status"]
    clean: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in status.items():
        shape = SHAPES.get(key)
        if shape is not None and (not isinstance(value, shape) or isinstance(value, bool)):
            dropped.append(f"status.{key}")
            continue
        clean[key] = value
    conditions = clean.get("conditions")
    if conditions is not None:
        kept = [item for item in conditions if _condition_ok(item)]
        if len(kept) != len(conditions):
            dropped.append("status.conditions[]")
            clean["conditions"] = kept
    cache = clean.get("modelCache")
    if cache is not None:
        bad = [k for k in CACHE_STRINGS if k in cache and not isinstance(cache[k], str)]
        bad += [k for k in CACHE_COUNTS if k in cache and not _is_count(cache[k])]
        if "repos" in cache and not (
            isinstance(cache["repos"], list) and all(isinstance(r, Mapping) for r in cache["repos"])
        ):
            bad.append("repos")
        if bad:
            dropped += [f"status.modelCache.{k}" for k in bad]
            clean["modelCache"] = {k: v for k, v in cache.items() if k not in bad}
    rollout = clean.get("rollout")
    if rollout is not None:
        bad = [k for k in ROLLOUT_STRINGS if k in rollout and not isinstance(rollout[k], str)]
        if "canaryGroups" in rollout and not (
            isinstance(rollout["canaryGroups"], list)
            and all(_is_count(g) for g in rollout["canaryGroups"])
        ):
            bad.append("canaryGroups")
        if bad:
            dropped += [f"status.rollout.{k}" for k in bad]
            clean["rollout"] = {k: v for k, v in rollout.items() if k not in bad}
    return clean, dropped


def with_readable_status(body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The object with its status read defensively, and what was left out."""
    status, dropped = readable_status(body.get("status"))
    return {**body, "status": status}, dropped
