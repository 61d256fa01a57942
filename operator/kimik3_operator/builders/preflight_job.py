"""The image probe: a ConfigMap holding the probe script and a CPU-only Job in the exact
serving image that runs it. One Job per (image, platform, architecture, model revision,
drafter revision): its name carries a hash of them, so an unchanged key reuses its result."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DISAGGREGATED_ROLES, TARGET_ARCHITECTURES
from kimik3_operator.builders.command import (
    MODEL_MOUNT,
    Role,
    Transfer,
    expanded_serve_args,
    model_location,
)
from kimik3_operator.builders.common import (
    JOB_TMP_SIZE,
    Owner,
    drafter_volume,
    hardened,
    job_placement,
    job_run_as,
    labels,
    metadata,
    token_and_engine_env,
)

SCRIPT_KEY = "probe.py"
SCRIPT_MOUNT = "/probe"
DEADLINE_SECONDS = 900


def probe_script() -> str:
    return resources.files("kimik3_operator.programs").joinpath("probe.py").read_text()


def probe_request(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """What the probe is asked: the platform, the architectures, where the configs are."""
    target: dict[str, Any] = {"repo": spec.model.repo, "revision": spec.model.revision}
    if spec.model.source.pvc is not None:
        target = {"path": model_location(spec)}
    drafter = spec.paired_drafter
    drafter_location: dict[str, Any] = {}
    if drafter is not None and drafter.path:
        drafter_location = {"path": drafter.path}
    elif drafter is not None and drafter.repo:
        drafter_location = {"repo": drafter.repo, "revision": drafter.revision}
    return {
        "platform": spec.engine.platform,
        "architectures": sorted(set(TARGET_ARCHITECTURES) | {spec.model.architecture}),
        "target": target,
        "drafter": drafter_location,
        # Built by vLLM itself in the image, the way the serving pods will build it.
        "speculativeConfig": drafter.speculative_config() if drafter is not None else None,
        "tensorParallel": spec.role_spec("decode").parallelism.tensor,
        "pipelineParallel": spec.role_spec("decode").parallelism.pipeline,
        # The exact command lines, for the image's own argument parser; the engine is built
        # from "leader"'s (a disaggregated deployment's decode leader: it serves).
        "serve": serve_lines(spec),
    }


def serve_lines(spec: KimiK3DeploymentSpec) -> dict[str, list[str]]:
    """Every distinct command line the serving pods run, by who runs it."""
    if spec.disaggregation is None:
        return {role: expanded_serve_args(spec, spec.paired_drafter, role) for role in _pods(spec)}
    lines: dict[str, list[str]] = {}
    for side in DISAGGREGATED_ROLES:
        role_spec = spec.role_spec(side)
        transfer = Transfer(side, spec.disaggregation.connector)
        for role in _pods(role_spec):
            key = role if side == "decode" else f"{side}-{role}"
            lines[key] = expanded_serve_args(role_spec, role_spec.paired_drafter, role, transfer)
    return lines


def _pods(spec: KimiK3DeploymentSpec) -> tuple[Role, ...]:
    return ("leader", "worker") if spec.nodes_per_replica > 1 else ("leader",)


def probe_key(spec: KimiK3DeploymentSpec) -> str:
    material = json.dumps(
        {"image": spec.engine.image, "request": probe_request(spec)}, sort_keys=True
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def build_probe_config_map(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, names.probe_config_map(owner.name), c.COMPONENT_PREFLIGHT),
        "data": {SCRIPT_KEY: probe_script()},
    }


def build_probe_job(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    key = probe_key(spec)
    pod_labels = {**labels(owner, c.COMPONENT_PREFLIGHT), c.PROBE_KEY_LABEL: key}
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": "/tmp/hf"}]
    env += token_and_engine_env(spec)
    mounts: list[dict[str, Any]] = [{"name": "probe", "mountPath": SCRIPT_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "probe", "configMap": {"name": names.probe_config_map(owner.name)}}
    ]
    pvc = spec.model.source.pvc
    if pvc is not None:
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
    drafter = drafter_volume(spec)
    if drafter is not None:
        volumes.append(drafter[0])
        mounts.append(drafter[1])
    meta = metadata(owner, names.preflight_job(owner.name, key), c.COMPONENT_PREFLIGHT)
    meta["labels"][c.PROBE_KEY_LABEL] = key
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": hardened(
                    {
                        "restartPolicy": "Never",
                        **job_placement(spec),
                        "containers": [
                            {
                                "name": "probe",
                                "image": spec.engine.image,
                                "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
                                "args": [json.dumps(probe_request(spec), sort_keys=True)],
                                "env": env,
                                "resources": {
                                    "requests": {"cpu": "1", "memory": "4Gi"},
                                    "limits": {"memory": "8Gi"},
                                },
                                "volumeMounts": mounts,
                                "terminationMessagePolicy": "File",
                            }
                        ],
                        "volumes": volumes,
                    },
                    job_run_as(spec),
                    JOB_TMP_SIZE,
                ),
            },
        },
    }
