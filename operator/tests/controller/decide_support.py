"""The snapshot a decide() test starts from, and how it reads the Decision: shared by the
controller's table tests (a helper module, not a test module)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from conftest import resource, spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.builders.common import Owner
from kimik3_operator.controller.decide import Decision, decide
from kimik3_operator.controller.snapshot import LWS_API, Ref, Snapshot

NOW = "2026-12-05T00:00:00Z"
OWNER = Owner("k3", "llm", "uid-1")
LWS: Ref = (LWS_API, "LeaderWorkerSet", "k3")
SERVICE: Ref = ("v1", "Service", "k3")
CHILDREN = (LWS, SERVICE, ("monitoring.coreos.com/v1", "PodMonitor", "k3"))


def snapshot(
    spec: Mapping[str, Any] | None = None,
    *,
    status: Mapping[str, Any] | None = None,
    live: Mapping[Ref, Any] | None = None,
    checked: bool = True,
    **fields: Any,
) -> Snapshot:
    """A snapshot of resource ``k3`` in ``llm`` whose children the store and the API server
    have both been asked about (``checked``): those in ``live`` exist, no other."""
    body = resource(**(spec or {}))
    if status is not None:
        body["status"] = dict(status)
    parsed = spec_of(**body["spec"])
    base = Snapshot(
        body=body,
        owner=OWNER,
        now=NOW,
        seconds=0.0,
        spec=parsed,
        namespace_labels={},
        lws_installed=True,
        pod_monitor_installed=True,
        live=dict(live or {}),
    )
    if checked:
        made = {w.ref for w in decide(dataclasses.replace(base, live={})).writes}
        base = dataclasses.replace(base, absent=frozenset(made - set(base.live)))
    return dataclasses.replace(base, **fields)


def owned(kind: str, name: str, api_version: str = "v1", **more: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": f"uid-{name}",
            "ownerReferences": [{"kind": c.KIND, "name": "k3", "uid": "uid-1", "controller": True}],
        },
        **more,
    }


def written(decision: Decision) -> list[str]:
    return [f"{w.verb} {w.label}" for w in decision.writes]


def said(decision: Decision, type_: str) -> tuple[str, str]:
    found = next(x for x in decision.status["conditions"] if x["type"] == type_)
    return found["status"], found["reason"]
