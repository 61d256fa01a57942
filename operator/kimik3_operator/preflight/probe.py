"""Reading the image probe's Job and pod: pure, from the objects to a state."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kimik3_operator.api.constants import Reason
from kimik3_operator.observe import IMAGE_PULL_REASONS

Phase = Literal["Done", "Running", "Failed", "Missing"]


@dataclass(frozen=True)
class ProbeState:
    phase: Phase
    reason: str
    message: str
    report: dict[str, Any] | None = None


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
                try:
                    report = json.loads(text)
                except ValueError:
                    return ProbeState(
                        "Failed",
                        Reason.PROBE_FAILED,
                        f"the probe's report is not JSON: {text[:300]}",
                    )
                if "fatal" in report:
                    return ProbeState(
                        "Failed",
                        Reason.PROBE_FAILED,
                        f"the probe failed in {image}: {report['fatal']}",
                    )
                return ProbeState(
                    "Done", Reason.PROBED, f"vLLM {report.get('vllmVersion')} answered", report
                )
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
                "ProbeDeadlineExceeded"
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
