"""A status or probe report of the wrong shape is read as absent and named, never a reason for
every later reconcile of that resource to fail; the probe's verdict comes from its Job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import FakeKube, key_of, probe_report, resource, settle, spec_of
from kimik3_operator.builders.preflight_job import probe_key
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.status_input import readable_status
from kimik3_operator.preflight.probe import report_state

API = "serving.kimik3.io/v1alpha1"


def clock() -> str:
    return "2026-12-03T00:00:00Z"


@pytest.mark.parametrize(
    ("status", "dropped"),
    [
        ([1, 2], ["status"]),
        ({"modelCache": "Ready"}, ["status.modelCache"]),
        ({"capabilities": {"probe": []}, "conditions": "x"}, ["status.conditions"]),
        (
            {"modelCache": {"bytesTotal": "1e400", "phase": 3}},
            ["status.modelCache.phase", "status.modelCache.bytesTotal"],
        ),
        ({"conditions": [{"type": "Available"}, 7, {"type": 1}]}, ["status.conditions[]"]),
        ({"speculative": None}, ["status.speculative"]),
    ],
)
def test_wrong_types_are_left_out_and_named(status: Any, dropped: list[str]) -> None:
    clean, found = readable_status(status)
    assert found == dropped
    assert isinstance(clean, dict)


@pytest.mark.parametrize(
    "status",
    [
        {"capabilities": "Verified", "modelCache": [1], "conditions": {"a": 1}},
        {"modelCache": {"key": {"x": 1}, "phase": "Ready", "bytesTotal": -5}},
        {"speculative": 3, "startup": "fast", "reason": 5},
    ],
)
def test_a_malformed_status_never_stops_the_reconcile(kube: FakeKube, status: Any) -> None:
    body = resource(model={"cache": {}})
    body["status"] = status
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert "LeaderWorkerSet/k3" not in result.applied  # the cache is not Ready: held
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    assert isinstance(stored["status"]["conditions"], list)
    assert isinstance(stored["status"]["modelCache"], dict)
    warned = [w for w in kube.writes if w[:2] == ("create", "Event")]
    assert warned
    # Healed: the next reconciles find nothing to ignore, and end writing nothing.
    settle(kube, ("llm", "k3"), Context(clock=clock))
    kube.writes.clear()
    reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm") or {}), Context(clock=clock)
    )
    assert kube.writes == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1,2,3]", "not an object"),
        ('{"architectures": [1]}', "architectures is a JSON list"),
        ('{"architectures": {"X": 1}}', "architectures.X is a JSON int"),
        ('{"errors": "none"}', "errors is a JSON str"),
        ("[" * 5000 + "]" * 5000, "not JSON"),
    ],
)
def test_a_malformed_probe_report_fails_the_probe_with_the_reason(text: str, problem: str) -> None:
    state = report_state(text, "vllm/vllm-openai:v0.33.0")
    assert state.phase == "Failed" and problem in state.message


def test_a_passing_report_written_into_the_status_is_not_trusted(kube: FakeKube) -> None:
    """The status says the probe passed; the Job's pod has not answered: still waiting."""
    spec = {"preflight": {"probe": True}}
    body = resource(**spec)
    key = probe_key(spec_of(**spec))
    body["status"] = {"capabilities": {"probe": {"key": key, "report": probe_report()}}}
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert "LeaderWorkerSet/k3" not in result.applied
    stored = kube.get(API, "KimiK3Deployment", "k3", "llm") or {}
    verified = next(
        c for c in stored["status"]["conditions"] if c["type"] == "CapabilitiesVerified"
    )
    assert (verified["status"], verified["reason"]) == ("Unknown", "ProbeRunning")


def test_the_report_is_kept_on_the_job_and_outlives_the_pod(kube: FakeKube) -> None:
    spec = {"preflight": {"probe": True}}
    body = resource(**spec)
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    key = probe_key(spec_of(**spec))
    report = json.dumps(probe_report())
    kube.put_job_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "probe-1",
                "namespace": "llm",
                "labels": {"serving.kimik3.io/probe-key": key},
            },
            "status": {
                "containerStatuses": [
                    {"name": "probe", "state": {"terminated": {"exitCode": 0, "message": report}}}
                ]
            },
        }
    )
    result = reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm") or {}), Context(clock=clock)
    )
    assert "LeaderWorkerSet/k3" in result.applied
    job = next(o for k, o in kube.objects.items() if k[1] == "Job")
    assert json.loads(job["metadata"]["annotations"]["serving.kimik3.io/probe-report"])
    settle(kube, ("llm", "k3"), Context(clock=clock))
    kube.delete("v1", "Pod", "probe-1", "llm")
    kube.writes.clear()
    reconcile(
        kube, key_of(kube.get(API, "KimiK3Deployment", "k3", "llm") or {}), Context(clock=clock)
    )
    assert kube.writes == []
