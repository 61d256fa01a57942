"""What one pod says of itself, read the same way everywhere."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names


def from_leader_set(meta: Mapping[str, Any], name: str) -> bool:
    """Whether a pod's controller is a LeaderWorkerSet's leader StatefulSet (it carries the
    LeaderWorkerSet's name, the deployment's): a namespace user's pod with our labels is
    not."""
    return any(
        isinstance(ref, Mapping)
        and ref.get("controller") is True
        and ref.get("kind") == "StatefulSet"
        and ref.get("name") == name
        for ref in meta.get("ownerReferences") or []
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (the kubelet's word, after its probes)."""
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (pod.get("status") or {}).get("conditions") or []
        if isinstance(cond, Mapping)
    )


def from_role_set(meta: Mapping[str, Any], owner_name: str, role: str) -> bool:
    """Whether a pod is of one role of the deployment's DisaggregatedSet: labelled with the
    role and controlled by the leader StatefulSet of a LeaderWorkerSet the set names
    <set>-<revision>-<role> (a rollout runs two revisions side by side)."""
    labels = meta.get("labels") or {}
    set_name = str(labels.get(c.LWS_NAME_LABEL, ""))
    pattern = (
        rf"^{re.escape(names.disaggregated_set(owner_name))}-[a-z0-9]{{{names.DS_REVISION}}}"
        rf"-{re.escape(role)}$"
    )
    return (
        labels.get(c.LABEL_ROLE) == role
        and re.match(pattern, set_name) is not None
        and from_leader_set(meta, set_name)
    )
