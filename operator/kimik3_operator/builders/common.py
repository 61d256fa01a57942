"""Metadata shared by every child: labels and the owner reference."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from kimik3_operator.api import constants as c
from kimik3_operator.api.pairing import DRAFTER_MOUNT
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DEFAULT_USER


@dataclass(frozen=True)
class Owner:
    """The KimiK3Deployment that owns the children."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: owner.name,
        c.LABEL_COMPONENT: component,
        c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
    }


def selector_labels(owner: Owner, component: str) -> dict[str, str]:
    return {c.LABEL_INSTANCE: owner.name, c.LABEL_COMPONENT: component}


def metadata(owner: Owner, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner.reference()],
    }


def with_spec_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with a hash of itself, so a reconcile can tell that nothing changed,
    including fields the previous version set and this one no longer does."""
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    meta = manifest.setdefault("metadata", {})
    meta.setdefault("annotations", {})[c.SPEC_HASH_ANNOTATION] = digest
    return manifest


# Every pod's writable scratch space (also HOME): vLLM's compile and kernel caches, the Hub's
# small files. A size limit, so a runaway cache evicts its own pod and not the node's others.
TMP_MOUNT: Final = "/tmp"
SERVING_TMP_SIZE: Final = "16Gi"
JOB_TMP_SIZE: Final = "2Gi"


@dataclass(frozen=True)
class RunAs:
    """Who a pod's containers run as (the pod's and containers' securityContext)."""

    non_root: bool
    user: int | None
    group: int | None
    fs_group: int | None
    read_only_root: bool = True


def serving_run_as(spec: KimiK3DeploymentSpec) -> RunAs:
    """spec.securityContext after its defaults (spec.runs_as_non_root): a non-root pod
    without a named user runs as DEFAULT_USER; a root one as the image's user."""
    security = spec.security_context
    non_root = spec.runs_as_non_root
    default = DEFAULT_USER if non_root else None
    user = security.run_as_user if security.run_as_user is not None else default
    group = security.run_as_group if security.run_as_group is not None else default
    fs_group = security.fs_group if security.fs_group is not None else group
    return RunAs(non_root, user, group, fs_group, security.read_only_root_filesystem)


def job_run_as(spec: KimiK3DeploymentSpec) -> RunAs:
    """The Jobs (probe, download, collect) need no capability: always non-root, read-only,
    as the serving pods' user where that is not root, so that the files the download writes
    are the serving pods' own."""
    serving = serving_run_as(spec)
    user = serving.user or DEFAULT_USER
    group = serving.group if serving.group else user
    fs_group = serving.fs_group if serving.fs_group else group
    return RunAs(True, user, group, fs_group, True)


def hardened(
    pod_spec: dict[str, Any], run_as: RunAs, tmp_size: str, add: Sequence[str] = ()
) -> dict[str, Any]:
    """Every pod the operator makes: no API token (none of them calls the API server), the
    runtime's default seccomp profile, containers that cannot gain privileges and hold no
    Linux capability (GPUs come through the device plugin, which needs none) but the ones
    ``add`` names (spec.engine.addCapabilities, serving pods only), the user ``run_as``
    names, and a size-limited emptyDir at /tmp that is also HOME (an image's HOME is often
    root's, which another user cannot write)."""
    pod_spec["automountServiceAccountToken"] = False
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if run_as.non_root:
        pod_security["runAsNonRoot"] = True
    for key, value in (
        ("runAsUser", run_as.user),
        ("runAsGroup", run_as.group),
        ("fsGroup", run_as.fs_group),
    ):
        if value is not None:
            pod_security[key] = value
    if run_as.fs_group is not None:
        # Without it the kubelet walks every file of a 1.6 TB volume at each pod's start.
        pod_security["fsGroupChangePolicy"] = "OnRootMismatch"
    pod_spec["securityContext"] = pod_security
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    pod_spec.setdefault("volumes", []).append({"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}})
    for container in pod_spec.get("containers", []):
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": dict(capabilities),
            "readOnlyRootFilesystem": run_as.read_only_root,
        }
        container.setdefault("volumeMounts", []).append({"name": "tmp", "mountPath": TMP_MOUNT})
        # Before the user's env (spec.engine.env), which may set either.
        home = [{"name": "HOME", "value": TMP_MOUNT}]
        if run_as.user:
            # Python's getpass (torch's compile cache) asks for a name the image's
            # /etc/passwd may not have for this user.
            home.append({"name": "USER", "value": "vllm"})
        container["env"] = home + list(container.get("env", []))
    return pod_spec


def token_and_engine_env(spec: KimiK3DeploymentSpec, fetches: bool = True) -> list[dict[str, Any]]:
    """What every pod that reaches the Hub gets: the token, by reference only (its value never
    passes through the operator), then spec.engine.env (a mirror in HF_ENDPOINT, a proxy).
    A pod that does not fetch (serving from the model cache, offline) gets no token."""
    env: list[dict[str, Any]] = []
    ref = spec.model.hf_token_secret_ref
    if ref is not None and fetches:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    return env + [dict(e) for e in spec.engine.env]


def job_placement(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """Where the CPU-only Jobs (the image probe, the weight download) run: no GPU request,
    no GPU node selector; spec.placement.jobs when set."""
    jobs = spec.placement.jobs
    placement: dict[str, Any] = {}
    if jobs.node_selector:
        placement["nodeSelector"] = dict(jobs.node_selector)
    if jobs.tolerations:
        placement["tolerations"] = [dict(t) for t in jobs.tolerations]
    return placement


def drafter_volume(spec: KimiK3DeploymentSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The volume and mount of a drafter read from a claim (spec.drafter.source.pvc), for
    the serving pods and the probe alike; None when the drafter comes from the Hub."""
    source = spec.drafter.source
    if source is None or spec.drafter.method in ("ngram", "none"):
        return None
    volume = {
        "name": "drafter",
        "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
    }
    return volume, {"name": "drafter", "mountPath": DRAFTER_MOUNT, "readOnly": True}
