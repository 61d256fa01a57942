"""The one step that writes: a decision's independent children go to the API server side by
side, everything else in the decision's order, and a failure is raised once the writes in
flight have ended."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from conftest import FakeKube, key_of, resource
from kimik3_operator.controller.act import act, batches
from kimik3_operator.controller.decide import Write, decide
from kimik3_operator.controller.reconcile import Context
from kimik3_operator.controller.snapshot import take_snapshot
from kimik3_operator.kube import KubeError

LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3")
SERVICE = ("v1", "Service", "k3")
MONITOR = ("monitoring.coreos.com/v1", "PodMonitor", "k3")
JOB = ("batch/v1", "Job", "k3-probe")
CONFIG = ("v1", "ConfigMap", "k3-download")


def labels(groups: list[list[Write]]) -> list[list[str]]:
    return [[f"{w.verb} {w.label}" for w in group] for group in groups]


def test_independent_children_are_grouped_and_the_rest_keeps_its_order() -> None:
    writes = [
        Write("create", CONFIG),
        Write("create", JOB),
        Write("apply", LWS),
        Write("apply", SERVICE),
        Write("apply", MONITOR),
        Write("delete", ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3-old")),
        Write("apply", SERVICE),
        Write("apply", SERVICE),
    ]
    assert labels(batches(writes)) == [
        ["create ConfigMap/k3-download"],
        ["create Job/k3-probe"],
        ["apply LeaderWorkerSet/k3", "apply Service/k3", "apply PodMonitor/k3"],
        ["delete LeaderWorkerSet/k3-old"],
        # One object twice: the second waits for the first.
        ["apply Service/k3"],
        ["apply Service/k3"],
    ]


class SlowKube(FakeKube):
    """Each apply waits until ``together`` applies are in flight (or 5 s): only writes made
    side by side get through quickly. ``refuse`` names a kind whose apply fails."""

    def __init__(self, together: int, refuse: str = "") -> None:
        super().__init__()
        self.barrier = threading.Barrier(together)
        self.refuse = refuse
        self.met = 0

    def apply(self, manifest: Mapping[str, Any], force: bool = True) -> Any:
        if manifest["kind"] in ("LeaderWorkerSet", "Service", "PodMonitor"):
            try:
                self.barrier.wait(timeout=5)
                self.met += 1
            except threading.BrokenBarrierError:
                pass
        if manifest["kind"] == self.refuse:
            raise KubeError(422, "Unprocessable Entity", f"{self.refuse} refused")
        return super().apply(manifest, force)


def first_pass(kube: FakeKube) -> Any:
    body = resource()
    kube.put(body)
    snap = take_snapshot(kube, key_of(body), Context(clock=lambda: "2026-12-06T00:00:00Z"))
    assert snap is not None
    return snap, decide(snap)


def test_a_new_deployments_group_service_and_monitor_are_written_at_once() -> None:
    kube = SlowKube(together=3)
    snap, decision = first_pass(kube)
    result = act(kube, snap, decision)
    assert kube.met == 3, "the three children were not in flight together"
    # Recorded in the decision's order whatever order they ended in.
    assert result.applied == ["LeaderWorkerSet/k3", "Service/k3", "PodMonitor/k3"]
    assert result.status_written


def test_a_failed_child_is_raised_after_the_others_are_written_and_no_status_claims_it() -> None:
    kube = SlowKube(together=3, refuse="Service")
    snap, decision = first_pass(kube)
    with pytest.raises(KubeError, match="Service refused"):
        act(kube, snap, decision)
    assert kube.get(*LWS[:2], "k3", "llm") is not None
    assert kube.get(*MONITOR[:2], "k3", "llm") is not None
    stored = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm") or {}
    assert "status" not in stored, "the status is written after the children, not beside them"
