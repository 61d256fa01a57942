"""A namespace user cannot take over an object by naming a KimiK3Deployment after it: a child
that exists without this resource's controller reference is never applied over."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import FakeKube, key_of, resource
from kimik3_operator.controller.reconcile import Context, reconcile

API = "serving.kimik3.io/v1alpha1"


def clock() -> str:
    return "2026-12-03T00:00:00Z"


def victim_service(owner_uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "k3", "namespace": "llm", "labels": {"team": "other"}}
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "web",
                "uid": owner_uid,
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }


def status(kube: FakeKube) -> dict[str, Any]:
    body = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    found: dict[str, Any] = body.get("status") or {}
    return found


@pytest.mark.parametrize("owner_uid", [None, "uid-of-another"])
def test_another_teams_service_is_left_alone(kube: FakeKube, owner_uid: str | None) -> None:
    victim = victim_service(owner_uid)
    kube.put(victim)
    body = resource()
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.get("v1", "Service", "k3", "llm") == victim, "not one field changed"
    applied = [w for w in kube.writes if w[0] == "apply"]
    assert applied == [], "nothing else made either: no half deployment"
    degraded = next(c for c in status(kube)["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NameConflict")
    assert "Service/k3" in degraded["message"] and "Rename" in degraded["message"]
    assert status(kube)["reason"] == "NameConflict"
    events = [w for w in kube.writes if w[:2] == ("create", "Event")]
    assert events, "a Warning event says so"
    assert "Degraded=True/NameConflict" in result.events


def test_another_resources_leader_worker_set_is_not_taken(kube: FakeKube) -> None:
    other = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "k3",
            "namespace": "llm",
            "ownerReferences": [
                {
                    "apiVersion": API,
                    "kind": "KimiK3Deployment",
                    "name": "k3",
                    "uid": "old-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {"replicas": 1},
    }
    kube.put(other)
    body = resource()
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm") == other
    message = next(c for c in status(kube)["conditions"] if c["type"] == "Degraded")["message"]
    assert "LeaderWorkerSet/k3 (controlled by KimiK3Deployment/k3)" in message


def test_when_the_object_goes_the_deployment_proceeds(kube: FakeKube) -> None:
    kube.put(victim_service())
    body = resource()
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    kube.delete("v1", "Service", "k3", "llm")
    kube.writes.clear()
    result = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm") or {}), Context(clock=clock)
    )
    assert result.applied == ["LeaderWorkerSet/k3", "Service/k3", "PodMonitor/k3"]
    degraded = next(c for c in status(kube)["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] != "NameConflict"


def test_creation_is_not_forced_and_updates_of_owned_children_are(kube: FakeKube) -> None:
    body = resource()
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.forced == [False, False, False], "created without force"
    kube.forced.clear()
    changed = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    changed["spec"]["replicas"] = 2
    kube.put(changed)
    reconcile(kube, key_of(changed), Context(clock=clock))
    assert kube.forced and all(kube.forced), "owned: force over our own fields"


def test_a_conflicting_probe_job_name_blocks_the_preflight(kube: FakeKube) -> None:
    body = resource(preflight={"probe": True})
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    job = next(o for (av, k, ns, n), o in kube.objects.items() if k == "Job")
    job["metadata"]["ownerReferences"] = []
    kube.delete(
        "v1", "ConfigMap", next(n for (av, k, ns, n) in kube.objects if k == "ConfigMap"), "llm"
    )
    kube.writes.clear()
    reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm") or {}), Context(clock=clock)
    )
    assert [w for w in kube.writes if w[0] == "apply"] == []
    assert status(kube)["reason"] == "NameConflict"
