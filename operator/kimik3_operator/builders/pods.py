"""Every pod the operator would make for a spec, as the pod specs the API server admits:
the serving pods of the LeaderWorkerSet and the Jobs' pods. Read by the Pod Security
prediction, in the reconcile and in ``kimik3 preflight``."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.leaderworkerset import pod_templates
from kimik3_operator.builders.model_cache import build_download_job
from kimik3_operator.builders.preflight_job import build_probe_job

SERVING = "the serving pods"
PROBE = "the image probe Job's pod"
DOWNLOAD = "the model cache's download Job's pod"


def pod_specs(spec: KimiK3DeploymentSpec, owner: Owner) -> list[tuple[str, dict[str, Any]]]:
    """(what it is, its pod spec) for each kind of pod this spec makes."""
    found: list[tuple[str, dict[str, Any]]] = []
    templates = pod_templates(spec, owner, spec.paired_drafter)
    for role in ("leaderTemplate", "workerTemplate"):
        if role in templates:
            found.append((SERVING, templates[role]["spec"]))
    if spec.preflight.mode != "Disabled" and spec.preflight.probe:
        found.append((PROBE, build_probe_job(spec, owner)["spec"]["template"]["spec"]))
    if spec.model.cache is not None:
        found.append((DOWNLOAD, build_download_job(spec, owner)["spec"]["template"]["spec"]))
    return found
