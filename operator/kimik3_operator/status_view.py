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


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _startup_lines(status: Mapping[str, Any]) -> list[str]:
    """The start-up phase, and the model cache's progress as a bar."""
    lines: list[str] = []
    startup: Mapping[str, Any] = status.get("startup") or {}
    if startup:
        slowest = f" (slowest pod {startup['slowestPod']})" if startup.get("slowestPod") else ""
        lines += ["", f"Start-up: {startup.get('phase')}{slowest}: {startup.get('message', '')}"]
    cache: Mapping[str, Any] = status.get("modelCache") or {}
    if not cache:
        return lines
    lines.append(f"Model cache: {cache.get('phase')} in {cache.get('claimName')}")
    total = int(cache.get("bytesTotal") or 0)
    verifying = cache.get("phase") == "Verifying"
    done = int(cache.get("verifiedBytes" if verifying else "bytesDone") or 0)
    if total:
        rate = cache.get("bytesPerSecond")
        eta = cache.get("etaSeconds")
        tail = f"  {int(rate) / 1e6:.0f} MB/s" if rate else ""
        tail += (
            f"  about {_duration(eta)} left"
            if eta is not None and cache.get("phase") != "Ready"
            else ""
        )
        lines.append(
            f"  {bar(done / total)} {done / total:6.1%}  {done / 1e9:.1f} of {total / 1e9:.1f} GB"
            f"{' verified' if verifying else ''}{tail}"
        )
    old = cache.get("oldRevisions") or []
    if old:
        lines.append(
            f"  old revisions kept until the rollout completes: {', '.join(map(str, old))} "
            f"({int(cache.get('oldBytes') or 0) / 1e9:.1f} GB)"
        )
    if cache.get("bytesFreed") is not None:
        lines.append(f"  old revisions collected: {int(cache['bytesFreed']) / 1e9:.1f} GB freed")
    return lines


def _rollout_lines(status: Mapping[str, Any]) -> list[str]:
    """The canary of the last change: phase, groups, both acceptances as bars, the verdict."""
    rollout: Mapping[str, Any] = status.get("rollout") or {}
    if not rollout:
        return []
    groups = ", ".join(str(g) for g in rollout.get("canaryGroups") or []) or "-"
    lines = [
        "",
        f"Rollout: {rollout.get('phase')}  canary group(s) {groups}  window "
        f"{rollout.get('window', '?')}",
    ]
    if rollout.get("change"):
        lines.append(f"  change: {rollout['change']}")
    for track in ("canary", "stable"):
        value = rollout.get(f"{track}Acceptance")
        if isinstance(value, int | float):
            lines.append(f"  {track:<6} {bar(value)} {value:6.1%}")
    if rollout.get("decision"):
        lines.append(f"  decision: {rollout['decision']} at {rollout.get('decidedAt', '?')}")
    if rollout.get("message"):
        lines.append(f"  {rollout['message']}")
    return lines


def _admission_lines(status: Mapping[str, Any]) -> list[str]:
    """Kueue's word on each group of a deployment that names a queue."""
    admission: Mapping[str, Any] = status.get("admission") or {}
    if not admission:
        return []
    where = admission.get("queueName", "?")
    if admission.get("clusterQueue"):
        where += f" (ClusterQueue {admission['clusterQueue']})"
    held = "  held until the preflight passes" if admission.get("held") else ""
    lines = [
        "",
        f"Queue: {where}  admitted groups {admission.get('admittedGroups', 0)}/"
        f"{status.get('replicas', '?')}{held}",
    ]
    for group in admission.get("groups") or []:
        if not isinstance(group, Mapping):
            continue
        message = f": {group['message']}" if group.get("message") else ""
        lines.append(
            f"  group {group.get('group')}  {group.get('state')}  "
            f"Workload {group.get('workload')}{message}"
        )
    return lines


def _autoscaling_lines(status: Mapping[str, Any]) -> list[str]:
    """What KEDA asks, what is made, and which directions are held."""
    scaling: Mapping[str, Any] = status.get("autoscaling") or {}
    if not scaling:
        return []
    return [
        "",
        f"Autoscaling: KEDA asks {scaling.get('desiredReplicas', '?')} group(s), "
        f"{scaling.get('acceptedReplicas', '?')} made (max {scaling.get('maxReplicaCount', '?')})"
        f"  scale-out {scaling.get('scaleOut', '?')}  scale-in {scaling.get('scaleIn', '?')}",
    ]


def _routing_lines(status: Mapping[str, Any]) -> list[str]:
    """How many groups the endpoint picker may route to, and why the others may not."""
    routing: Mapping[str, Any] = status.get("routing") or {}
    if not routing:
        return []
    lines = ["", f"Routing: {routing.get('routableGroups', '?')} group(s) routable"]
    roles = routing.get("roles")
    # A disaggregated deployment's: each role's groups, decided apart.
    sections = roles.items() if isinstance(roles, Mapping) else [("", routing)]
    for role, section in sections:
        if not isinstance(section, Mapping):
            continue
        if role:
            lines.append(f"  {role}: {section.get('routableGroups', '?')} routable")
        for out in section.get("notRoutable") or []:
            if isinstance(out, Mapping):
                prefix = f"{role} " if role else ""
                lines.append(f"  {prefix}group {out.get('group')}  out: {out.get('reason')}")
    return lines


def _disaggregation_lines(status: Mapping[str, Any]) -> list[str]:
    """Each role's groups, and why a role is short of them; the decode side's baseline."""
    section: Mapping[str, Any] = status.get("disaggregation") or {}
    if not section:
        return []
    lines = [
        "",
        f"Disaggregated: set {section.get('disaggregatedSet', '?')}  "
        f"connector {section.get('connector', '?')}",
    ]
    for role in section.get("roles") or []:
        if not isinstance(role, Mapping):
            continue
        ready = f"{role.get('readyReplicas', 0)}/{role.get('replicas', '?')}"
        line = f"  {role.get('name')}  ready groups {ready}"
        if role.get("readyReplicas") != role.get("replicas"):
            line += f"  {role.get('reason')}: {role.get('message')}"
        lines.append(line)
    baseline = section.get("baseline")
    if isinstance(baseline, Mapping):
        lines.append(
            f"  decode held to acceptance {baseline.get('acceptanceRate')} "
            f"({baseline.get('source')})"
        )
    return lines


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
    lines += _admission_lines(status)
    lines += _autoscaling_lines(status)
    lines += _routing_lines(status)
    lines += _disaggregation_lines(status)
    lines += _startup_lines(status)
    lines += _rollout_lines(status)
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
