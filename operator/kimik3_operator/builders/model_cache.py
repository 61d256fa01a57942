"""The model cache: a PersistentVolumeClaim holding the weights for every pod, and the CPU-only
Job that fills (or, for a volume the user filled, verifies) it once per target and drafter
revision. The Job's name carries a hash of what it fetches, so a changed revision gets a new
Job that fills the same volume before the rollout, and an unchanged one keeps its result."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any, Final

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec, ModelCacheSpec
from kimik3_operator.builders.common import (
    Owner,
    hardened,
    job_placement,
    labels,
    metadata,
    token_and_engine_env,
)

CACHE_MOUNT: Final = "/model-cache"
# The Hub's cache layout inside the volume: vLLM finds repo@revision there with no network.
HUB_CACHE: Final = f"{CACHE_MOUNT}/hub"
SCRIPT_KEY: Final = "download.py"
SCRIPT_MOUNT: Final = "/download"
PROGRESS_PORT: Final = 8090
# A pod killed midway is replaced; its successor resumes the partial files.
DOWNLOAD_RETRIES: Final = 6


def download_script() -> str:
    return resources.files("kimik3_operator.weights").joinpath("download_script.py").read_text()


def cache_claim_name(owner: Owner, cache: ModelCacheSpec) -> str:
    return cache.claim_name or names.model_cache_claim(owner.name)


def download_request(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """What the Job fetches: the target and the drafter at their pinned revisions."""
    cache = spec.model.cache
    repos = [{"repo": spec.model.repo, "revision": spec.model.revision}]
    drafter = spec.paired_drafter
    if drafter is not None and drafter.repo:
        repos.append({"repo": drafter.repo, "revision": drafter.revision})
    return {
        "repos": repos,
        "verifyOnly": cache is not None and cache.access_mode == "ReadOnlyMany",
        "progressPort": PROGRESS_PORT,
    }


def cache_key(spec: KimiK3DeploymentSpec, owner: Owner) -> str:
    """The image is left out on purpose: a new vLLM image needs no new download."""
    cache = spec.model.cache
    claim = cache_claim_name(owner, cache) if cache is not None else ""
    material = json.dumps({"claim": claim, "request": download_request(spec)}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def build_cache_claim(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any] | None:
    """The claim the operator creates; None when the user names one (never touched)."""
    cache = spec.model.cache
    if cache is None or cache.claim_name:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        claim_spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(owner, names.model_cache_claim(owner.name), c.COMPONENT_MODEL_CACHE),
        "spec": claim_spec,
    }


def build_download_config_map(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, names.download_config_map(owner.name), c.COMPONENT_DOWNLOAD),
        "data": {SCRIPT_KEY: download_script()},
    }


def job_env(spec: KimiK3DeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": "/tmp/hf"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    env += token_and_engine_env(spec)
    env.append({"name": "HF_HUB_CACHE", "value": HUB_CACHE})
    return env


def build_download_job(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is None:
        raise ValueError("spec.model.cache is not set")
    key = cache_key(spec, owner)
    request = download_request(spec)
    read_only = bool(request["verifyOnly"])
    meta = metadata(owner, names.download_job(owner.name, key), c.COMPONENT_DOWNLOAD)
    meta["labels"][c.CACHE_KEY_LABEL] = key
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": DOWNLOAD_RETRIES,
            "template": {
                "metadata": {
                    "labels": {**labels(owner, c.COMPONENT_DOWNLOAD), c.CACHE_KEY_LABEL: key}
                },
                "spec": hardened(
                    {
                        "restartPolicy": "Never",
                        **job_placement(spec),
                        "containers": [
                            {
                                "name": "download",
                                "image": spec.engine.image,
                                "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
                                "args": [json.dumps(request, sort_keys=True)],
                                "env": job_env(spec),
                                "ports": [
                                    {
                                        "name": "progress",
                                        "containerPort": PROGRESS_PORT,
                                        "protocol": "TCP",
                                    }
                                ],
                                "resources": {
                                    "requests": {"cpu": "1", "memory": "2Gi"},
                                    "limits": {"memory": "8Gi"},
                                },
                                "volumeMounts": [
                                    {"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True},
                                    {
                                        "name": "model-cache",
                                        "mountPath": CACHE_MOUNT,
                                        "readOnly": read_only,
                                    },
                                ],
                                "terminationMessagePolicy": "File",
                            }
                        ],
                        "volumes": [
                            {
                                "name": "script",
                                "configMap": {"name": names.download_config_map(owner.name)},
                            },
                            {
                                "name": "model-cache",
                                "persistentVolumeClaim": {
                                    "claimName": cache_claim_name(owner, cache),
                                    "readOnly": read_only,
                                },
                            },
                        ],
                    }
                ),
            },
        },
    }
