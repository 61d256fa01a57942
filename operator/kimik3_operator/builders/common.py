"""Metadata shared by every child: labels and the owner reference."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api.pairing import DRAFTER_MOUNT
from kimik3_operator.api.spec import KimiK3DeploymentSpec


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


def hardened(pod_spec: dict[str, Any], add: Sequence[str] = ()) -> dict[str, Any]:
    """Every pod the operator makes: no API token (none of them calls the API server), the
    runtime's default seccomp profile, and containers that cannot gain privileges and hold
    no Linux capability (GPUs come through the device plugin, which needs none) but the
    ones ``add`` names (spec.engine.addCapabilities, serving pods only)."""
    pod_spec["automountServiceAccountToken"] = False
    pod_spec.setdefault("securityContext", {})["seccompProfile"] = {"type": "RuntimeDefault"}
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    for container in pod_spec.get("containers", []):
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": dict(capabilities),
        }
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
