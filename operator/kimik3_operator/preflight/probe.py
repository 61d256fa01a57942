"""Reading the image probe's Job and pod: pure, from the objects to a state."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kimik3_operator.api.constants import IMAGE_PULL_REASONS, Reason

Phase = Literal["Done", "Running", "Failed", "Missing"]


@dataclass(frozen=True)
class ProbeState:
    phase: Phase
    reason: Reason
    message: str
    report: dict[str, Any] | None = None


# The report's top-level fields the preflight reads, and the JSON type each must have.
REPORT_SHAPES: dict[str, type | tuple[type, ...]] = {
    "architectures": dict,
    "drafters": dict,
    "dspark": dict,
    "serve": dict,
    "speculative": dict,
    "errors": list,
    "vllmVersion": str,
    "platform": str,
    "fatal": str,
    "checksAuxHiddenStatesOverPP": bool,
    "draftInheritsExpertParallel": bool,
    "engine": dict,
    "construct": dict,
    "targetConfig": (dict, type(None)),
    "drafterConfig": (dict, type(None)),
}


def report_problem(report: Any) -> str | None:
    """Why a probe report cannot be read, or None. The probe runs in the user's image, so
    its answer is checked like any other input."""
    if not isinstance(report, dict):
        return f"a JSON {type(report).__name__}, not an object"
    for key, shape in REPORT_SHAPES.items():
        if key in report and not isinstance(report[key], shape):
            return f"{key} is a JSON {type(report[key]).__name__}"
    for key in ("architectures", "drafters"):
        for name, entry in (report.get(key) or {}).items():
            if not isinstance(entry, dict):
                return f"{key}.{name} is a JSON {type(entry).__name__}, not an object"
    return None


def report_state(text: str, image: str) -> ProbeState:
    """The probe's verdict from its report (the pod's termination message, or the copy the
    operator keeps on its Job)."""
    try:
        report = json.loads(text)
    except (ValueError, RecursionError):
        return ProbeState(
            "Failed", Reason.PROBE_FAILED, f"the probe's report is not JSON: {text[:300]}"
        )
    problem = report_problem(report)
    if problem is not None:
        return ProbeState(
            "Failed", Reason.PROBE_FAILED, f"the probe's report in {image} is malformed: {problem}"
        )
    if "fatal" in report:
        return ProbeState(
            "Failed", Reason.PROBE_FAILED, f"the probe failed in {image}: {report['fatal']}"
        )
    return ProbeState("Done", Reason.PROBED, f"vLLM {report.get('vllmVersion')} answered", report)


def probe_state(
    job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], image: str
) -> ProbeState:
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_PULL_REASONS:
                return ProbeState(
                    "Failed",
                    Reason.PROBE_IMAGE_PULL_FAILED,
                    (
                        f"the probe cannot pull spec.engine.image={image!r}: "
                        f"{waiting.get('reason')}"
                        f" {waiting.get('message', '')}".rstrip()
                        + "; a GPU pod could not pull it either: fix the image or its credentials"
                    ),
                )
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if not terminated:
                continue
            text = terminated.get("message") or ""
            if text:
                return report_state(text, image)
            if terminated.get("exitCode", 0) != 0:
                return ProbeState(
                    "Failed",
                    Reason.PROBE_FAILED,
                    (
                        f"the probe exited with code {terminated.get('exitCode')} "
                        f"({terminated.get('reason')}) and no report; see kubectl logs "
                        f"{pod.get('metadata', {}).get('name')}"
                    ),
                )
            return ProbeState(
                "Missing",
                Reason.PROBE_REPORT_MISSING,
                (
                    f"the probe pod {pod.get('metadata', {}).get('name')} finished without a "
                    "report;"
                    " the operator keeps reading it"
                ),
            )
    for cond in (job or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            reason = (
                Reason.PROBE_DEADLINE_EXCEEDED
                if cond.get("reason") == "DeadlineExceeded"
                else Reason.PROBE_FAILED
            )
            return ProbeState(
                "Failed",
                reason,
                f"the probe Job failed: {cond.get('reason')}: {cond.get('message')}",
            )
    return ProbeState(
        "Running",
        Reason.PROBE_RUNNING,
        f"the image probe is asking vLLM in {image} (about a minute on a CPU node)",
    )
