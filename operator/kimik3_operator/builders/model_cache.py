"""The model cache: a PersistentVolumeClaim holding the weights for every pod, and the CPU-only
Job that fills (or, for a volume the user filled, verifies) it once per target and drafter
revision. The Job's name carries a hash of what it fetches, so a changed revision gets a new
Job that fills the same volume before the rollout, and an unchanged one keeps its result.
Once a rollout to a new revision is complete, a collect Job deletes what only the revisions no
longer asked for use.

The Job's deadline (activeDeadlineSeconds) = DEADLINE_SLACK_SECONDS + the claim's size /
DOWNLOAD_MIN_BYTES_PER_SECOND: whatever the Hub does, the Job ends. For the default 2Ti at
50 MB/s: 600 + 2.2e12 / 5e7 = 44,576 s (12.4 h); at 500 MB/s the 1.6 TB of Kimi-K3 take 53 min."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any, Final

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.quantities import quantity_bytes
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import ModelCacheSpec
from kimik3_operator.builders.common import (
    JOB_TMP_SIZE,
    Owner,
    hardened,
    job_placement,
    job_run_as,
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
# The script's exit status for a failure no retry can change (the Hub's listing is unusable,
# the volume is too small): the Job stops at once.
EXIT_FINAL: Final = 3
DOWNLOAD_MIN_BYTES_PER_SECOND: Final = 50_000_000
DEADLINE_SLACK_SECONDS: Final = 600


def download_script() -> str:
    return resources.files("kimik3_operator.programs").joinpath("download.py").read_text()


def cache_claim_name(owner: Owner, cache: ModelCacheSpec) -> str:
    return cache.claim_name or names.model_cache_claim(owner.name)


def _what_to_fetch(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The target and the drafter at their pinned revisions, and whether only to verify."""
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


def deadline_seconds(cache: ModelCacheSpec) -> int:
    return DEADLINE_SLACK_SECONDS + quantity_bytes(cache.size) // DOWNLOAD_MIN_BYTES_PER_SECOND


def download_request(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The script's request: what to fetch, and how (programs/download.py)."""
    request = _what_to_fetch(spec)
    cache = spec.model.cache
    if cache is not None:
        request.update(
            {
                "mode": "verify" if request["verifyOnly"] else "fill",
                "connections": cache.connections,
                "chunkBytes": quantity_bytes(cache.chunk_size),
                "deadlineSeconds": deadline_seconds(cache),
            }
        )
    return request


def cache_key(spec: KimiK3DeploymentSpec, owner: Owner) -> str:
    """What is fetched, into which claim. The image is left out on purpose (a new vLLM image
    needs no new download), and so is how it is fetched (connections, chunk size)."""
    cache = spec.model.cache
    claim = cache_claim_name(owner, cache) if cache is not None else ""
    material = json.dumps({"claim": claim, "request": _what_to_fetch(spec)}, sort_keys=True)
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


FAILURE_POLICY: Final = {
    "rules": [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "download", "operator": "In", "values": [EXIT_FINAL]},
        },
        # A pod evicted or preempted is no failure of the download: its successor resumes.
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]
}


def build_download_job(spec: KimiK3DeploymentSpec, owner: Owner) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is None:
        raise ValueError("spec.model.cache is not set")
    key = cache_key(spec, owner)
    request = download_request(spec)
    return _cache_job(
        spec,
        owner,
        names.download_job(owner.name, key),
        c.COMPONENT_DOWNLOAD,
        {c.CACHE_KEY_LABEL: key},
        request,
        read_only=bool(request["verifyOnly"]),
        deadline=deadline_seconds(cache),
    )


def build_collect_job(
    spec: KimiK3DeploymentSpec, owner: Owner, key: str, keep: list[dict[str, str]]
) -> dict[str, Any]:
    """Deletes from the claim what only revisions no longer asked for use: ``keep`` is the
    repositories and commits the cache for ``key`` verified."""
    if spec.model.cache is None:
        raise ValueError("spec.model.cache is not set")
    request = {"mode": "collect", "keep": keep}
    return _cache_job(
        spec,
        owner,
        names.collect_job(owner.name, key),
        c.COMPONENT_COLLECT,
        {c.COLLECT_KEY_LABEL: key},
        request,
        read_only=False,
        deadline=DEADLINE_SLACK_SECONDS,
    )


def _cache_job(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    name: str,
    component: str,
    more_labels: dict[str, str],
    request: dict[str, Any],
    *,
    read_only: bool,
    deadline: int,
) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is None:
        raise ValueError("spec.model.cache is not set")
    meta = metadata(owner, name, component)
    meta["labels"].update(more_labels)
    container: dict[str, Any] = {
        "name": "download",
        "image": spec.engine.image,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "args": [json.dumps(request, sort_keys=True)],
        "env": job_env(spec),
        # Two cores: sha256 runs at about 1-2 GB/s a core, beside the transfer.
        "resources": {
            "requests": {"cpu": "2", "memory": "2Gi"},
            "limits": {"memory": "8Gi"},
        },
        "volumeMounts": [
            {"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True},
            {"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": read_only},
        ],
        "terminationMessagePolicy": "File",
    }
    if component == c.COMPONENT_DOWNLOAD:
        container["ports"] = [
            {"name": "progress", "containerPort": PROGRESS_PORT, "protocol": "TCP"}
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": DOWNLOAD_RETRIES,
            "activeDeadlineSeconds": deadline,
            "podFailurePolicy": FAILURE_POLICY,
            "template": {
                "metadata": {"labels": {**labels(owner, component), **more_labels}},
                "spec": hardened(
                    {
                        "restartPolicy": "Never",
                        **job_placement(spec),
                        "containers": [container],
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
                    },
                    job_run_as(spec),
                    JOB_TMP_SIZE,
                ),
            },
        },
    }
