"""Whether the namespace's Pod Security level will admit the pods a spec makes, told before
any of them is applied: the level, the spec field that breaks it, and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.pods import pod_specs
from kimik3_operator.observation.pod_security import (
    ENFORCE_LABEL,
    LEVELS,
    Level,
    Policy,
    Violation,
    violations,
)

# The spec fields behind the pod fields a namespace can refuse; every other field of the
# operator's pods meets restricted whatever the spec says.
_SPEC_FIELDS: tuple[tuple[str, str], ...] = (
    (".capabilities.add", "spec.engine.addCapabilities"),
    (".runAsNonRoot", "spec.securityContext.runAsNonRoot"),
    (".runAsUser", "spec.securityContext.runAsUser"),
)


@dataclass(frozen=True)
class Refusal:
    """The pods the namespace would refuse, and what would admit them."""

    policy: Policy
    needed: Level
    found: tuple[tuple[str, Violation], ...]

    @property
    def spec_fields(self) -> tuple[str, ...]:
        fields = dict.fromkeys(spec_field(v.field) for _, v in self.found)
        return tuple(fields)

    def message(self, namespace: str) -> str:
        policy = self.policy
        label = f"{ENFORCE_LABEL}={policy.level}"
        if policy.invalid:
            label = f"{policy.invalid} (not a level or version: PodSecurity enforces restricted)"
        elif policy.version != "latest":
            label += f" at version {policy.version}"
        what = "; ".join(
            f"{pods}: {spec_field(v.field)} gives {v.field}={v.value}, which {v.level} refuses "
            f"({v.control})"
            for pods, v in self.found
        )
        return (
            f"namespace {namespace} enforces Pod Security {policy.level} ({label}) and would "
            f"refuse {what}. Nothing was created. Fix: {_fix(self)}, or label the namespace "
            f"{ENFORCE_LABEL}={self.needed}, the level these pods need"
        )


def spec_field(pod_field: str) -> str:
    for suffix, field in _SPEC_FIELDS:
        if pod_field.endswith(suffix):
            return field
    return pod_field


def _fix(refusal: Refusal) -> str:
    fields = refusal.spec_fields
    fixes = []
    if "spec.engine.addCapabilities" in fields:
        fixes.append("remove spec.engine.addCapabilities (IPC_LOCK and SYS_NICE break baseline)")
    if "spec.securityContext.runAsNonRoot" in fields or "spec.securityContext.runAsUser" in fields:
        fixes.append(
            "run the serving pods as non-root (spec.securityContext.runAsNonRoot: true with a "
            "non-zero runAsUser; the default without engine.addCapabilities)"
        )
    return " and ".join(fixes) or f"change {', '.join(fields)}"


def needed_level(pods: Sequence[tuple[str, dict[str, object]]]) -> Level:
    """The most restrictive level that admits every pod."""
    for level in reversed(LEVELS):
        if not any(violations(pod, Policy(level)) for _, pod in pods):
            return level
    return "privileged"


def predict(spec: KimiK3DeploymentSpec, owner: Owner, policy: Policy) -> Refusal | None:
    """None when the namespace admits every pod this spec makes."""
    if policy.level == "privileged":
        return None  # the usual namespace: nothing to build
    pods = pod_specs(spec, owner)
    found = tuple((what, v) for what, pod in pods for v in violations(pod, policy))
    if not found:
        return None
    # One line per pod kind and field: the leader and the workers share their template.
    unique = tuple(dict.fromkeys(found))
    return Refusal(policy, needed_level(pods), unique)
