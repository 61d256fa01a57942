"""Deciding whether a child needs a write: a reconcile that changes nothing writes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimik3_operator.api.constants import SPEC_HASH_ANNOTATION


def is_subset(desired: Any, live: Any) -> bool:
    """Whether every field of ``desired`` has the same value in ``live``.

    The server adds defaults and normalises quantities to strings ("8" for 8), so extra
    fields in ``live`` are fine and scalars compare by their string form too.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and is_subset(value, live[key]) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    if desired == live:
        return True
    return (
        not isinstance(desired, bool) and not isinstance(live, bool) and (str(desired) == str(live))
    )


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    if live is None:
        return True
    want = desired.get("metadata", {}).get("annotations", {}).get(SPEC_HASH_ANNOTATION)
    have = (live.get("metadata", {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    return want != have or not is_subset(desired, live)
