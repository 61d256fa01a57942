"""Kueue admission in the reconcile, as a table over snapshots: what the operator makes for
a spec that names a LocalQueue, when it holds the groups until the preflight passes, and what
its conditions say of the Workloads Kueue keeps (their shapes as Kueue v0.17 writes them)."""

from __future__ import annotations

from typing import Any

import pytest
from decide_support import LWS, said, snapshot, written

from conftest import spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.children import desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.controller.decide import decide
from kimik3_operator.observation.crashes import startup_failures
from kimik3_operator.observation.kueue import admitted_condition, queue_state
from kimik3_operator.status_view import render_status

QUEUED = {"scheduling": {"queueName": "gpus", "topology": {"required": "topology.x/rack"}}}
PROBED = {**QUEUED, "preflight": {"probe": True}}
LWS_UID = "uid-lws"


def lws(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": LWS[0],
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "k3",
            "namespace": "llm",
            "uid": LWS_UID,
            "annotations": annotations or {},
            "ownerReferences": [{"kind": c.KIND, "name": "k3", "uid": "uid-1", "controller": True}],
        },
        "spec": {},
    }


HELD = lws({c.KUEUE_ADMISSION_GATED_BY: c.KUEUE_PREFLIGHT_GATE})


def workload(group: int, *conditions: tuple[str, str, str, str], queue: str = "") -> Any:
    return {
        "metadata": {
            "name": f"leaderworkerset-k3-{group}-abcde",
            "labels": {c.KUEUE_JOB_UID_LABEL: LWS_UID},
            "annotations": {"kueue.x-k8s.io/component-workload-index": str(group)},
        },
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions
            ],
            **({"admission": {"clusterQueue": queue}} if queue else {}),
        },
    }


ADMITTED = workload(
    0,
    ("QuotaReserved", "True", "QuotaReserved", ""),
    ("Admitted", "True", "Admitted", ""),
    queue="cq",
)
PENDING = workload(
    0,
    (
        "QuotaReserved",
        "False",
        "Pending",
        "couldn't assign flavors to pod set leader: insufficient unused quota for "
        "nvidia.com/gpu in flavor gpu-racks, 8 more needed",
    ),
)
PREEMPTED = workload(
    0,
    ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x)"),
    ("Preempted", "True", "InClusterQueue", "Preempted to accommodate a workload (UID: x)"),
)


def test_the_leaderworkerset_carries_what_kueues_integration_reads() -> None:
    spec = spec_of(scheduling={**QUEUED["scheduling"], "workloadPriorityClassName": "serving"})
    made = desired_children(spec, Owner("k3", "llm", "uid-1"), parts=("groups",))[0]
    labels = made["metadata"]["labels"]
    assert labels[c.KUEUE_QUEUE_LABEL] == "gpus"
    assert labels[c.KUEUE_PRIORITY_CLASS_LABEL] == "serving"
    assert c.KUEUE_ADMISSION_GATED_BY not in made["metadata"].get("annotations", {})
    template = made["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        annotations = template[role]["metadata"]["annotations"]
        assert annotations[c.KUEUE_REQUIRED_TOPOLOGY] == "topology.x/rack"
        assert annotations[c.KUEUE_PODSET_GROUP] == "group", "leader and workers: one group"
    preferred = spec_of(scheduling={"queueName": "gpus", "topology": {"preferred": "rack"}})
    worker = desired_children(preferred, Owner("k3", "llm", "u"), parts=("groups",))[0]
    annotations = worker["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]
    assert annotations["annotations"][c.KUEUE_PREFERRED_TOPOLOGY] == "rack"
    plain = desired_children(spec_of(), Owner("k3", "llm", "u"), parts=("groups",))[0]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in plain["metadata"]["labels"])


@pytest.mark.parametrize(
    ("scheduling", "field"),
    [
        ({"queueName": "GPUs"}, "spec.scheduling.queueName"),
        ({"topology": {"required": "rack"}}, "spec.scheduling.topology"),
        ({"workloadPriorityClassName": "high"}, "spec.scheduling.workloadPriorityClassName"),
        ({"queueName": "q", "topology": {}}, "spec.scheduling.topology"),
        (
            {"queueName": "q", "topology": {"required": "a", "preferred": "b"}},
            "spec.scheduling.topology",
        ),
        (
            {"queueName": "q", "topology": {"required": "not a key"}},
            "spec.scheduling.topology.required",
        ),
    ],
)
def test_a_scheduling_field_kueue_cannot_take_is_named(
    scheduling: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({"scheduling": scheduling})
    assert raised.value.path == field


def test_a_kueue_key_in_the_pod_labels_is_refused_for_spec_scheduling() -> None:
    with pytest.raises(SpecError, match=r"spec\.scheduling"):
        parse_spec({"pod": {"labels": {c.KUEUE_QUEUE_LABEL: "gpus"}}})


def test_without_kueue_nothing_is_made_and_admitted_says_why() -> None:
    decision = decide(snapshot(QUEUED, kueue_installed=False))
    assert not [w for w in decision.writes if w.ref == LWS]
    assert said(decision, "Admitted") == ("False", "KueueNotInstalled")
    assert said(decision, "Degraded") == ("True", "KueueNotInstalled")
    assert decision.status["reason"] == "KueueNotInstalled"


def test_a_spec_without_a_queue_has_no_admitted_condition() -> None:
    decision = decide(snapshot({}, kueue_installed=True))
    assert "Admitted" not in {x["type"] for x in decision.status["conditions"]}
    assert "admission" not in decision.status


def test_with_the_gate_the_groups_are_made_held_while_the_probe_runs() -> None:
    decision = decide(snapshot(PROBED, kueue_installed=True, kueue_admission_gate=True))
    made = next(w for w in decision.writes if w.ref == LWS)
    assert made.body["metadata"]["annotations"][c.KUEUE_ADMISSION_GATED_BY] == (
        c.KUEUE_PREFLIGHT_GATE
    )
    # Still held, and only then: the gate is never added to a LeaderWorkerSet that exists.
    held = decide(
        snapshot(PROBED, kueue_installed=True, kueue_admission_gate=True, live={LWS: HELD})
    )
    assert said(held, "Admitted") == ("False", "AdmissionHeldForPreflight")
    assert held.status["admission"]["held"] is True
    running = decide(
        snapshot(PROBED, kueue_installed=True, kueue_admission_gate=True, live={LWS: lws()})
    )
    assert not [w for w in running.writes if w.ref == LWS], "an ungated set is left as it runs"


def test_without_the_gate_or_with_a_cache_the_groups_wait_for_the_preflight() -> None:
    for spec, gate in ((PROBED, False), ({**PROBED, "model": {"cache": {}}}, True)):
        decision = decide(snapshot(spec, kueue_installed=True, kueue_admission_gate=gate))
        assert not [w for w in decision.writes if w.ref == LWS]


def test_the_gate_is_lifted_once_the_preflight_passes() -> None:
    decision = decide(
        snapshot(QUEUED, kueue_installed=True, kueue_admission_gate=True, live={LWS: HELD})
    )
    applied = next(w for w in decision.writes if w.ref == LWS)
    assert c.KUEUE_ADMISSION_GATED_BY not in applied.body["metadata"].get("annotations", {})


def test_a_refused_spec_never_waits_in_the_queue() -> None:
    refused = {**QUEUED, "engine": {"image": "vllm/vllm-openai:v0.27.1"}}
    decision = decide(
        snapshot(refused, kueue_installed=True, kueue_admission_gate=True, live={LWS: HELD})
    )
    assert "delete LeaderWorkerSet/k3" in written(decision)
    kept = decide(snapshot(refused, kueue_installed=True, live={LWS: lws()}))
    assert "delete LeaderWorkerSet/k3" not in written(kept), "a running set keeps serving"


@pytest.mark.parametrize(
    ("workloads", "admitted", "progressing", "degraded"),
    [
        ([ADMITTED], ("True", "Admitted"), None, None),
        (
            [PENDING],
            ("False", "WaitingForQuota"),
            ("True", "WaitingForQuota"),
            ("False", "AsExpected"),
        ),
        ([], ("False", "WaitingForQuota"), ("True", "WaitingForQuota"), None),
        ([PREEMPTED], ("False", "Preempted"), ("True", "Preempted"), ("True", "Preempted")),
        (
            [workload(0, ("QuotaReserved", "True", "QuotaReserved", "waiting for checks"))],
            ("False", "QuotaReserved"),
            ("True", "QuotaReserved"),
            None,
        ),
    ],
)
def test_the_conditions_say_where_the_groups_wait(
    workloads: list[Any],
    admitted: tuple[str, str],
    progressing: tuple[str, str] | None,
    degraded: tuple[str, str] | None,
) -> None:
    decision = decide(
        snapshot(QUEUED, kueue_installed=True, live={LWS: lws()}, workloads=tuple(workloads))
    )
    assert said(decision, "Admitted") == admitted
    if progressing is not None:
        assert said(decision, "Progressing") == progressing
    if degraded is not None:
        assert said(decision, "Degraded") == degraded


def test_kueues_own_words_reach_the_status_and_the_cli() -> None:
    decision = decide(
        snapshot(QUEUED, kueue_installed=True, live={LWS: lws()}, workloads=(PENDING,))
    )
    message = next(x for x in decision.status["conditions"] if x["type"] == "Admitted")["message"]
    assert message.startswith("0 of 1 group(s) admitted by LocalQueue gpus; waiting for quota:")
    assert "8 more needed" in message
    group = decision.status["admission"]["groups"][0]
    assert (group["group"], group["state"]) == (0, "Pending")
    body = {"metadata": {"name": "k3", "namespace": "llm"}, "status": decision.status}
    shown = render_status(body)
    assert "Queue: gpus  admitted groups 0/1" in shown
    assert "group 0  Pending  Workload leaderworkerset-k3-0-abcde: couldn't assign" in shown


def test_workloads_of_another_leaderworkerset_or_without_an_index_are_not_read() -> None:
    spec = spec_of(**QUEUED)
    other = workload(0, ("Admitted", "True", "Admitted", ""))
    other["metadata"]["labels"][c.KUEUE_JOB_UID_LABEL] = "someone-else"
    unindexed = workload(0, ("Admitted", "True", "Admitted", ""))
    unindexed["metadata"]["annotations"] = {}
    state = queue_state(spec, installed=True, lws=lws(), workloads=[other, unindexed])
    assert state is not None and state.groups == ()
    assert admitted_condition(state).reason == "WaitingForQuota"


def test_a_pod_kueue_stops_is_not_a_startup_failure() -> None:
    pod = {
        "metadata": {"name": "k3-0", "uid": "p"},
        "status": {
            "conditions": [{"type": "TerminationTarget", "status": "True", "reason": "Preempted"}],
            "containerStatuses": [
                {"name": "vllm", "state": {"terminated": {"exitCode": 1, "finishedAt": "t"}}}
            ],
        },
    }
    assert startup_failures([pod]) == []
