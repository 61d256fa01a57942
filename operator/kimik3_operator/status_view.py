"""`kimik3 status NAME`: a KimiK3Deployment's conditions and its acceptance by draft
position as terminal bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BAR_WIDTH = 40


def bar(value: float, width: int = BAR_WIDTH) -> str:
    filled = max(0.0, min(1.0, value)) * width
    whole = int(filled)
    partial = " ▏▎▍▌▋▊▉"[int((filled - whole) * 8)] if whole < width else ""
    return ("█" * whole + partial).ljust(width)


def render_status(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata", {})
    status: Mapping[str, Any] = body.get("status") or {}
    lines = [
        f"{meta.get('namespace')}/{meta.get('name')}  "
        f"ready groups {status.get('readyReplicas', 0)}/{status.get('replicas', '?')}  "
        f"nodes/group {status.get('nodesPerReplica', '?')}  "
        f"endpoint {status.get('endpoint', '-')}",
        "",
        "Conditions:",
    ]
    conditions: Sequence[Mapping[str, Any]] = status.get("conditions") or []
    width = max((len(str(c.get("type"))) for c in conditions), default=10)
    for c in conditions:
        lines.append(
            f"  {c.get('type', ''):<{width}}  {c.get('status', ''):<7} "
            f"{c.get('reason', '')}: {c.get('message', '')}"
        )
    speculative: Mapping[str, Any] = status.get("speculative") or {}
    lines += [
        "",
        f"Drafter: {speculative.get('method', 'none')} {speculative.get('drafter', '')}".rstrip(),
    ]
    rate = speculative.get("acceptanceRate")
    if rate is None:
        lines.append("  acceptance: no data (no drafts in the last window)")
        return "\n".join(lines)
    lines.append(
        f"  acceptance rate {rate:.1%}   mean acceptance length "
        f"{speculative.get('meanAcceptanceLength', 0):.2f}   sampled "
        f"{speculative.get('sampledAt', '?')}"
    )
    if speculative.get("stale"):
        lines.append(f"  stale: {speculative['stale']}")
    positions: Sequence[float] = speculative.get("perPositionAcceptance") or []
    if positions:
        lines.append("  acceptance by draft position:")
        for i, value in enumerate(positions):
            lines.append(f"  {i:>3} {bar(value)} {value:6.1%}")
    return "\n".join(lines)
