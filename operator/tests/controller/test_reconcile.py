"""The reconcile against a recording fake API: what it writes, and that a no-op writes nothing."""

from __future__ import annotations

import json
from typing import Any

from conftest import FakeKube, key_of, resource, settle
from kimik3_operator.controller.drift import is_subset, needs_apply
from kimik3_operator.controller.reconcile import Context, reconcile

NOW = "2026-12-02T00:00:00Z"


def clock() -> str:
    return NOW


def stored(kube: FakeKube, body: dict[str, Any]) -> dict[str, Any]:
    kube.put(body)
    return body


def test_first_reconcile_applies_children_and_status(kube: FakeKube) -> None:
    body = stored(kube, resource())
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.applied == ["LeaderWorkerSet/k3", "Service/k3", "PodMonitor/k3"]
    assert result.status_written
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    assert status["observedGeneration"] == 1
    assert status["nodesPerReplica"] == 2
    assert status["gpusPerReplica"] == 16
    assert status["endpoint"] == "http://k3.llm.svc:8000"
    assert status["selector"] == "app.kubernetes.io/instance=k3,app.kubernetes.io/component=leader"
    assert status["speculative"]["drafter"] == "RedHatAI/Kimi-K3-speculator.dspark"
    assert {c["type"] for c in status["conditions"]} == {
        "CapabilitiesVerified",
        "DrafterPaired",
        "Progressing",
        "Available",
        "Degraded",
        "ModelCached",
        "InterNodeFabric",
    }
    # Two pods (TP 16 on 8-GPU nodes) and no fabric asked for: said, not refused.
    fabric = next(c for c in status["conditions"] if c["type"] == "InterNodeFabric")
    assert (fabric["status"], fabric["reason"]) == ("False", "NoRDMAFabric")
    assert "spec.pod.extraResources" in fabric["message"]
    # Two pods (TP 16 on 8-GPU nodes) with no cache: each downloads the whole checkpoint.
    cached = next(c for c in status["conditions"] if c["type"] == "ModelCached")
    assert cached["status"] == "False" and cached["reason"] == "NoModelCache"
    assert "each of the 2 serving pods" in cached["message"]
    assert "spec.model.cache" in cached["message"]
    assert "Degraded=False/AsExpected" in result.events


def test_a_reconcile_that_changes_nothing_writes_nothing(kube: FakeKube) -> None:
    """The first pass creates the children, the second writes what it observes of them;
    from then on, with nothing changed, a pass writes nothing (a later clock included)."""
    body = stored(kube, resource())
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=clock))
    observed = reconcile(kube, key_of(body), Context(clock=clock))
    assert observed.applied == [], "the children were right the first time"
    kube.writes.clear()
    again = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    result = reconcile(kube, key_of(again), Context(clock=lambda: "2026-12-02T01:00:00Z"))
    assert kube.writes == []
    assert result.applied == [] and not result.status_written and result.events == []


def test_changed_spec_reapplies_only_what_changed(kube: FakeKube) -> None:
    reconcile(kube, key_of(stored(kube, resource())), Context(clock=clock))
    kube.writes.clear()
    body = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    body["spec"] = {"preflight": {"probe": False}, "engine": {"image": "vllm/vllm-openai:v0.34.0"}}
    body["metadata"]["generation"] = 2
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.applied == ["LeaderWorkerSet/k3"]


def test_removed_field_is_reapplied(kube: FakeKube) -> None:
    reconcile(
        kube,
        key_of(stored(kube, resource(placement={"nodeSelector": {"pool": "a"}}))),
        Context(clock=clock),
    )
    kube.writes.clear()
    body = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    body["spec"] = {"preflight": {"probe": False}}
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.applied == ["LeaderWorkerSet/k3"]


def test_invalid_spec_creates_no_child_and_says_why(kube: FakeKube) -> None:
    body = stored(kube, resource(drafter={"method": "none", "repo": "me/drafter"}))
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.invalid
    assert [w for w in kube.writes if w[0] == "apply"] == []
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.drafter.repo='me/drafter'" in degraded["message"]
    assert "remove drafter.repo" in degraded["message"]
    assert status["reason"] == "InvalidSpec"
    assert ("create", "Event", "") in kube.writes


def test_invalid_update_leaves_existing_children_alone(kube: FakeKube) -> None:
    reconcile(kube, key_of(stored(kube, resource())), Context(clock=clock))
    kube.writes.clear()
    body = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    body["spec"] = {"preflight": {"probe": False}, "replicas": -1}
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.invalid
    assert {w[0] for w in kube.writes} <= {"patch_status", "create"}
    assert kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm") is not None


def test_without_lws_crd_nothing_is_applied() -> None:
    kube = FakeKube(crds=())
    result = reconcile(kube, key_of(stored(kube, resource())), Context(clock=clock))
    assert result.applied == []
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    assert status["reason"] == "LeaderWorkerSetCRDMissing"


def test_without_prometheus_operator_no_pod_monitor() -> None:
    kube = FakeKube(crds=("leaderworkersets.leaderworkerset.x-k8s.io",))
    result = reconcile(kube, key_of(stored(kube, resource())), Context(clock=clock))
    assert result.applied == ["LeaderWorkerSet/k3", "Service/k3"]


def test_turning_the_pod_monitor_off_deletes_it(kube: FakeKube) -> None:
    reconcile(kube, key_of(stored(kube, resource())), Context(clock=clock))
    body = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    body["spec"] = {"preflight": {"probe": False}, "monitoring": {"podMonitor": False}}
    kube.put(body)
    result = reconcile(kube, key_of(body), Context(clock=clock))
    assert result.deleted == ["PodMonitor/k3"]


def test_the_pod_monitor_carries_the_operators_labels_for_a_selecting_prometheus(
    kube: FakeKube,
) -> None:
    """kube-prometheus-stack selects monitors by release=<name>: the operator's setting puts
    that label on every PodMonitor, without replacing the labels it finds its children by;
    a reconcile that changes nothing writes nothing afterwards."""
    body = stored(kube, resource())
    labels = {"release": "kube-prometheus-stack", "app.kubernetes.io/instance": "not-k3"}
    context = Context(clock=clock, pod_monitor_labels=labels)
    reconcile(kube, key_of(body), context)
    monitor = kube.get("monitoring.coreos.com/v1", "PodMonitor", "k3", "llm")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "k3"
    settle(kube, key_of(body), context)
    kube.writes.clear()
    again = reconcile(kube, key_of(body), context)
    assert again.applied == [] and not again.status_written and kube.writes == []


def test_groups_asked_for_ready_and_the_start_up_phase_are_metrics(kube: FakeKube) -> None:
    """What dashboards and alerts read without parsing the status; gone with the resource."""
    from prometheus_client import REGISTRY

    from kimik3_operator import metrics

    body = stored(kube, resource())
    reconcile(kube, key_of(body), Context(clock=clock))
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    labels = {"namespace": "llm", "name": "k3"}
    assert REGISTRY.get_sample_value("kimik3_deployment_replicas", labels) == status["replicas"]
    assert REGISTRY.get_sample_value("kimik3_deployment_ready_replicas", labels) == 0
    phase = {**labels, "phase": status["startup"]["phase"]}
    assert REGISTRY.get_sample_value("kimik3_deployment_startup_phase", phase) == 1
    metrics.forget("llm", "k3")
    assert REGISTRY.get_sample_value("kimik3_deployment_replicas", labels) is None
    assert REGISTRY.get_sample_value("kimik3_deployment_startup_phase", phase) is None


def test_subset_tolerates_server_defaults_and_quantity_strings() -> None:
    desired = {"a": {"gpu": 8, "list": [{"x": 1}]}, "flag": True}
    live = {"a": {"gpu": "8", "list": [{"x": 1, "default": "y"}], "extra": 1}, "flag": True}
    assert is_subset(desired, live)
    assert not is_subset({"flag": True}, {"flag": "True"})
    assert not is_subset({"list": [1, 2]}, {"list": [1]})
    assert needs_apply({"metadata": {}}, None)


TEST_CONFIG = {"method": "draft_model", "model": "/models/tiny", "num_speculative_tokens": 3}


def _serving_args(kube: FakeKube, role: str = "leaderTemplate") -> list[str]:
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    spec = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
    args: list[str] = spec["containers"][0]["args"]
    return args


def test_a_draft_model_from_a_volume_is_chosen_in_the_spec(kube: FakeKube) -> None:
    drafter = {
        "method": "draft_model",
        "source": {"pvc": {"claimName": "drafts", "path": "tiny/"}},
        "numSpeculativeTokens": 3,
    }
    body = stored(kube, resource(drafter=drafter, preflight={"mode": "Disabled"}))
    reconcile(kube, key_of(body), Context(clock=clock))
    args = _serving_args(kube)
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "draft_model",
        "model": "/drafter/tiny",
        "num_speculative_tokens": 3,
    }
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    pod = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert {"name": "drafter", "mountPath": "/drafter", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    assert {
        "name": "drafter",
        "persistentVolumeClaim": {"claimName": "drafts", "readOnly": True},
    } in pod["volumes"]
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    assert status["speculative"]["method"] == "draft_model"
    assert status["speculative"]["drafter"] == "/drafter/tiny"


def test_ngram_drafts_from_the_prompt(kube: FakeKube) -> None:
    drafter = {"method": "ngram", "numSpeculativeTokens": 4}
    body = stored(kube, resource(drafter=drafter, preflight={"mode": "Enforce", "probe": False}))
    reconcile(kube, key_of(body), Context(clock=clock))
    args = _serving_args(kube)
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
    }
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    paired = {c["type"]: c for c in status["conditions"]}["DrafterPaired"]
    assert paired["status"] == "True" and "n-grams" in paired["message"]


def test_a_draft_model_waits_for_the_probe(kube: FakeKube) -> None:
    """Its class and vocabulary are only known from its config.json: NeedsProbe, no pods."""
    drafter = {"method": "draft_model", "repo": "org/small", "numSpeculativeTokens": 3}
    body = stored(kube, resource(drafter=drafter, preflight={"mode": "Enforce", "probe": False}))
    reconcile(kube, key_of(body), Context(clock=clock))
    assert kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm") is None
    status = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")["status"]
    paired = {c["type"]: c for c in status["conditions"]}["DrafterPaired"]
    assert (paired["status"], paired["reason"]) == ("Unknown", "DrafterNeedsProbe")


def test_the_old_annotation_does_nothing(kube: FakeKube) -> None:
    """A namespace user cannot replace the speculative config through an annotation."""
    body = resource(preflight={"mode": "Disabled"})
    body["metadata"]["annotations"] = {
        "serving.kimik3.io/test-speculative-config": json.dumps(TEST_CONFIG)
    }
    reconcile(kube, key_of(stored(kube, body)), Context(clock=clock))
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "k3", "llm")
    args = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--speculative-config") + 1])["method"] == "dspark"


def test_the_status_patch_removes_what_a_field_no_longer_has() -> None:
    """A merge patch keeps a nested key it does not name: the status delta names dropped keys
    with null, and leaves out nulls the server would not store. Without it the stored
    startup kept its slowestPod once Ready, differed for ever, and bench/scale.py measured
    every resource written again at every resync."""
    from conftest import merge_patch
    from kimik3_operator.controller.status import status_delta

    current = {
        "startup": {"phase": "LoadingWeights", "message": "1 of 2", "slowestPod": "k3-0-1"},
        "capabilities": {"probe": {"report": {"vllmVersion": "0.33.0"}}},
        "reason": "GroupsStarting",
    }
    desired = {
        "startup": {"phase": "Ready", "message": "1 of 1 groups ready"},
        "capabilities": {"probe": {"report": {"vllmVersion": "0.33.0", "speculative": None}}},
        "reason": "GroupsStarting",
    }
    delta = status_delta(current, desired)
    assert delta == {
        "startup": {"phase": "Ready", "message": "1 of 1 groups ready", "slowestPod": None}
    }
    stored = merge_patch(current, delta)
    assert stored["startup"] == desired["startup"]
    assert status_delta(stored, desired) == {}, "the next reconcile writes nothing"


def test_the_legacy_finalizer_is_dropped_only_from_the_version_read(kube: FakeKube) -> None:
    """Kopf's finalizer of earlier releases goes; the patch carries the resourceVersion the
    snapshot read, so a resource changed in between is not written over (409), and the
    next pass drops it from the new version."""
    import pytest

    from kimik3_operator.api.constants import LEGACY_KOPF_FINALIZER
    from kimik3_operator.controller.act import act
    from kimik3_operator.controller.decide import decide
    from kimik3_operator.controller.snapshot import take_snapshot
    from kimik3_operator.kube import KubeError

    body = resource()
    body["metadata"]["finalizers"] = [LEGACY_KOPF_FINALIZER, "example.com/keep"]
    kube.put(body)
    snap = take_snapshot(kube, key_of(body), Context(clock=clock))
    assert snap is not None
    kube.patch(
        "serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm", {"metadata": {"labels": {}}}
    )
    with pytest.raises(KubeError) as raised:
        act(kube, snap, decide(snap))
    assert raised.value.status == 409
    stored = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    assert LEGACY_KOPF_FINALIZER in stored["metadata"]["finalizers"]
    reconcile(kube, key_of(stored), Context(clock=clock))
    stored = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    assert stored["metadata"]["finalizers"] == ["example.com/keep"]
