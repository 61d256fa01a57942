"""The DisaggregatedSet of spec.disaggregation: a prefill and a decode role, each a
LeaderWorkerSet's spec built as the deployment's own is, from the role's spec, with its side
of the KV transfer. LeaderWorkerSet's controller makes one LeaderWorkerSet per role and rolls
the two together (a role's partition is its, so none is set here)."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DISAGGREGATED_ROLES
from kimik3_operator.builders.command import Transfer
from kimik3_operator.builders.common import Owner, metadata
from kimik3_operator.builders.leaderworkerset import (
    leader_worker_set_spec,
    pod_templates,
    queue_labels,
)


def build_disaggregated_set(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    weight_bytes: int | None = None,
    sidecar_image: str = c.DEFAULT_ROUTING_SIDECAR_IMAGE,
) -> dict[str, Any]:
    """``sidecar_image``: the operator's setting for the decode leaders' routing sidecar."""
    disaggregation = spec.disaggregation
    if disaggregation is None:
        raise ValueError("spec.disaggregation is not set")
    meta = metadata(owner, names.disaggregated_set(owner.name), c.COMPONENT_SERVING)
    meta["labels"].update(queue_labels(spec))
    roles = []
    for role in DISAGGREGATED_ROLES:
        side = spec.role_spec(role)
        transfer = Transfer(
            role,
            disaggregation.connector,
            sidecar_image=sidecar_image if role == "decode" else None,
            sidecar_port=spec.service.port,
        )
        template = pod_templates(side, owner, side.paired_drafter, weight_bytes, transfer)
        lws_spec = leader_worker_set_spec(side, template, partition=None)
        if spec.placement.topology_key:
            role_meta: dict[str, Any] = {
                "annotations": {c.LWS_EXCLUSIVE_TOPOLOGY: spec.placement.topology_key}
            }
        else:
            role_meta = {}
        roles.append(
            {"name": role, **({"metadata": role_meta} if role_meta else {}), "spec": lws_spec}
        )
    return {
        "apiVersion": f"{c.DS_GROUP}/{c.DS_VERSION}",
        "kind": "DisaggregatedSet",
        "metadata": meta,
        "spec": {"roles": roles},
    }
