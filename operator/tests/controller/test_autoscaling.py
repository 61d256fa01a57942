"""spec.autoscaling in the reconcile, as a table over snapshots: the ScaledObject made for KEDA,
the groups the LeaderWorkerSet gets of those KEDA asks for, what holds scaling and why, and
what happens where KEDA is absent."""

from __future__ import annotations

from typing import Any

import pytest
from decide_support import LWS, owned, said, snapshot, written

from conftest import spec_of
from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.children import desired_children
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.health_checks import startup_budget_seconds
from kimik3_operator.controller.decide import decide
from kimik3_operator.controller.snapshot import KEDA_API, Ref
from kimik3_operator.observation.kueue import quota_free
from kimik3_operator.observation.workload import GpuCounts
from kimik3_operator.status_view import render_status

SCALED: Ref = (KEDA_API, "ScaledObject", "k3")
AUTO = {
    "parallelism": {"tensor": 8},
    "autoscaling": {"maxReplicas": 4, "target": {"waitingRequestsPerGroup": 5}},
}
# Room for three more 8-GPU groups.
ROOMY = GpuCounts(allocatable=64, free=24, largest_free_on_one_node=8, nodes=8, pods_that_fit=3)


def live_lws(replicas: int, ready: int) -> dict[str, Any]:
    return owned(
        "LeaderWorkerSet",
        "k3",
        LWS[0],
        spec={"replicas": replicas},
        status={"readyReplicas": ready},
    )


def bound_pods(groups: int) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"k3-{i}",
                "labels": {
                    c.LABEL_INSTANCE: "k3",
                    c.LABEL_COMPONENT: c.COMPONENT_LEADER,
                },
            },
            "spec": {"nodeName": f"node-{i}"},
            "status": {},
        }
        for i in range(groups)
    ]


def decided(
    replicas: int,
    live: int | None = None,
    ready: int | None = None,
    status: dict[str, Any] | None = None,
    gpus: GpuCounts | None = ROOMY,
    keda: bool = True,
    extra: dict[str, Any] | None = None,
) -> Any:
    children = {LWS: live_lws(live, live if ready is None else ready)} if live is not None else {}
    snap = snapshot(
        {**AUTO, "replicas": replicas, **(extra or {})},
        status=status,
        live=children,
        keda_installed=keda,
        gpus=gpus,
        pods=tuple(bound_pods(live or 0)),
    )
    return decide(snap)


def lws_replicas(decision: Any) -> int | None:
    for write in decision.writes:
        if write.ref == LWS:
            return int(write.body["spec"]["replicas"])
    return None


def scaled_object(decision: Any) -> dict[str, Any]:
    found: dict[str, Any] = next(w.body for w in decision.writes if w.ref == SCALED)
    return found


def test_the_scaled_object_targets_the_deployment_on_its_leaders_load_per_group() -> None:
    decision = decided(1)
    body = scaled_object(decision)
    spec = body["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": c.API_VERSION,
        "kind": "KimiK3Deployment",
        "name": "k3",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": c.DEFAULT_PROMETHEUS_URL,
        "query": 'sum(vllm:num_requests_waiting{namespace="llm",app_kubernetes_io_instance="k3"})',
        "threshold": "5",
        "ignoreNullValues": "true",
    }
    # A group takes its start-up budget to serve: KEDA waits that long before any scale to
    # zero, and the HPA removes a group only after the load stayed low about as long.
    budget = startup_budget_seconds(spec_of(**AUTO))
    assert spec["initialCooldownPeriod"] == budget
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == min(3600, budget)
    assert "annotations" not in body["metadata"] or not any(
        k.startswith("autoscaling.keda.sh/") for k in body["metadata"]["annotations"]
    )
    assert said(decision, "Autoscaling") == ("True", "AutoscalingActive")
    assert decision.status["autoscaling"]["scaleOut"] == "Allowed"


def test_a_kv_cache_target_is_a_second_trigger() -> None:
    extra = {
        "autoscaling": {
            "maxReplicas": 4,
            "target": {"kvCacheUsage": 0.8},
            "behavior": {"scaleDownStabilizationSeconds": 120},
        }
    }
    body = scaled_object(decided(1, extra=extra))
    names = [t["name"] for t in body["spec"]["triggers"]]
    assert names == ["waiting-requests", "kv-cache-usage"]
    assert body["spec"]["triggers"][1]["metadata"]["threshold"] == "0.8"
    behavior = body["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120


def test_a_scale_up_within_the_free_gpus_is_made_whole() -> None:
    decision = decided(3, live=1)
    assert lws_replicas(decision) == 3
    assert said(decision, "Autoscaling") == ("True", "AutoscalingActive")


def test_a_scale_up_beyond_the_free_gpus_is_clamped_and_says_by_how_much() -> None:
    tight = GpuCounts(allocatable=32, free=16, largest_free_on_one_node=8, nodes=4, pods_that_fit=2)
    decision = decided(4, live=1, gpus=tight)
    assert lws_replicas(decision) == 3
    assert said(decision, "Autoscaling") == ("False", "ClampedByGPUs")
    message = next(x for x in decision.status["conditions"] if x["type"] == "Autoscaling")[
        "message"
    ]
    assert "KEDA asks for 4 group(s); 3 are made" in message and "16 free GPU(s)" in message
    assert decision.status["autoscaling"]["desiredReplicas"] == 4
    assert decision.status["replicas"] == 3


def test_groups_made_but_not_yet_placed_take_their_gpus_from_the_room() -> None:
    # Three groups asked of the LeaderWorkerSet, one pod bound: two groups' GPUs are spoken
    # for although the ledger still counts them free.
    snap = snapshot(
        {**AUTO, "replicas": 4},
        live={LWS: live_lws(3, 1)},
        keda_installed=True,
        gpus=GpuCounts(
            allocatable=32, free=16, largest_free_on_one_node=8, nodes=4, pods_that_fit=2
        ),
        pods=tuple(bound_pods(1)),
    )
    decision = decide(snap)
    assert lws_replicas(decision) == 3


def test_pods_bound_in_the_pod_list_but_not_yet_in_the_ledger_still_take_room() -> None:
    # Under load the ledger's pod watch runs behind the reconcile's pod list: two groups'
    # pods are bound in the list but the ledger still counts their GPUs free (and holds
    # neither pod). Counting them bound from the list would make a group no GPU can place.
    behind = GpuCounts(
        allocatable=32, free=16, largest_free_on_one_node=8, nodes=4, pods_that_fit=2,
        own_pods_held=0,
    )  # fmt: skip
    caught_up = GpuCounts(32, 0, 0, 4, pods_that_fit=0, own_pods_held=2)
    roomy = GpuCounts(64, 16, 8, 8, pods_that_fit=2, own_pods_held=2)
    for gpus, made in ((behind, 2), (caught_up, 2), (roomy, 4)):
        snap = snapshot(
            {**AUTO, "replicas": 4},
            live={LWS: live_lws(2, 2)},
            keda_installed=True,
            gpus=gpus,
            pods=tuple(bound_pods(2)),
        )
        assert lws_replicas(decide(snap)) == made, gpus


def test_min_replicas_are_made_whatever_the_gpus() -> None:
    full = GpuCounts(allocatable=8, free=0, largest_free_on_one_node=0, nodes=1, pods_that_fit=0)
    extra = {"autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
    assert lws_replicas(decided(2, gpus=full, extra=extra)) == 2


def test_a_collapsed_drafter_holds_scale_out_not_scale_in() -> None:
    collapsed = {
        "conditions": [
            {
                "type": "SpeculationEffective",
                "status": "False",
                "reason": "AcceptanceBelowMinimum",
                "message": "acceptance rate 0.04 below spec.monitoring.minAcceptanceRate 0.5",
            }
        ]
    }
    up = decided(3, live=1, status=collapsed)
    assert lws_replicas(up) == 1
    assert said(up, "Autoscaling") == ("False", "HeldForAcceptance")
    annotations = scaled_object(up)["metadata"]["annotations"]
    assert annotations[c.KEDA_PAUSED_SCALE_OUT] == "true"
    assert c.KEDA_PAUSED_SCALE_IN not in annotations
    down = decided(1, live=2, status=collapsed)
    assert lws_replicas(down) == 1


def test_a_group_still_starting_is_never_removed() -> None:
    decision = decided(1, live=3, ready=2)
    assert lws_replicas(decision) == 3
    assert said(decision, "Autoscaling") == ("False", "HeldWhileStarting")
    annotations = scaled_object(decision)["metadata"]["annotations"]
    assert annotations == {**annotations, c.KEDA_PAUSED_SCALE_IN: "true"}
    assert c.KEDA_PAUSED_SCALE_OUT not in annotations


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"rollout": {"phase": "Canary"}}, "HeldForCanary"),
        ({"startupFailures": {"parked": True, "count": 3, "generation": 1}}, "HeldWhileParked"),
    ],
    ids=["a canary judged", "parked"],
)
def test_scaling_is_held_both_ways_while(status: dict[str, Any], reason: str) -> None:
    decision = decided(3, live=2, status=status)
    assert said(decision, "Autoscaling")[1] == reason
    annotations = scaled_object(decision)["metadata"]["annotations"]
    assert annotations[c.KEDA_PAUSED_SCALE_OUT] == annotations[c.KEDA_PAUSED_SCALE_IN] == "true"


def test_a_spec_the_preflight_refuses_gets_no_scaled_object() -> None:
    decision = decided(1, extra={"engine": {"image": "vllm/vllm-openai:v0.27.1"}})
    assert not [w for w in decision.writes if w.ref == SCALED]
    assert said(decision, "Autoscaling") == ("False", "HeldForPreflight")


def test_without_keda_nothing_scales_and_the_condition_says_so() -> None:
    decision = decided(2, keda=False)
    assert not [w for w in decision.writes if w.ref == SCALED]
    assert lws_replicas(decision) == 2
    status, reason = said(decision, "Autoscaling")
    assert (status, reason) == ("False", "KedaNotInstalled")


def test_removing_autoscaling_deletes_the_scaled_object() -> None:
    live = {SCALED: owned("ScaledObject", "k3", KEDA_API)}
    snap = snapshot({"parallelism": {"tensor": 8}}, live=live, keda_installed=True)
    assert "delete ScaledObject/k3" in written(decide(snap))


def test_a_second_reconcile_writes_nothing() -> None:
    first = decided(2, live=2)
    children = {
        w.ref: {**w.body, "metadata": {**w.body["metadata"], "uid": "u"}} for w in first.writes
    }
    snap = snapshot(
        {**AUTO, "replicas": 2},
        status=first.status,
        live={**children, LWS: {**children[LWS], "status": {"readyReplicas": 2}}},
        keda_installed=True,
        gpus=ROOMY,
        pods=tuple(bound_pods(2)),
    )
    again = decide(snap)
    assert written(again) == [] and again.status_patch == {}


def test_render_shows_the_scaled_object_the_operator_applies() -> None:
    owner = Owner("k3", "llm", "uid-1")
    kinds = [child["kind"] for child in desired_children(spec_of(**AUTO), owner)]
    assert "ScaledObject" in kinds


def test_kimik3_status_shows_what_keda_asks_and_what_is_made() -> None:
    decision = decided(4, live=1, gpus=GpuCounts(32, 16, 8, 4, pods_that_fit=2))
    text = render_status(
        {"metadata": {"name": "k3", "namespace": "llm"}, "status": decision.status}
    )
    assert "Autoscaling: KEDA asks 4 group(s), 3 made (max 4)" in text


@pytest.mark.parametrize(
    ("autoscaling", "extra", "field"),
    [
        ({"maxReplicas": 2, "minReplicas": 3}, {}, "spec.autoscaling.minReplicas"),
        ({"maxReplicas": 2, "minReplicas": 0}, {}, "spec.autoscaling.minReplicas"),
        (
            {"maxReplicas": 2, "minReplicas": 0, "scaleToZero": True},
            {},
            "spec.autoscaling.minReplicas",
        ),
        ({"maxReplicas": 2, "scaleToZero": True}, {}, "spec.autoscaling.scaleToZero"),
        ({"maxReplicas": 2, "target": {"kvCacheUsage": 1.5}}, {}, "spec.autoscaling.target"),
        (
            {"maxReplicas": 2, "behavior": {"scaleDownStabilizationSeconds": 7200}},
            {},
            "spec.autoscaling.behavior",
        ),
        ({"maxReplicas": 0}, {}, "spec.autoscaling.maxReplicas"),
    ],
)
def test_bad_autoscaling_is_refused_naming_the_field(
    autoscaling: dict[str, Any], extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec({"autoscaling": autoscaling, **extra})
    assert field in str(raised.value)


def test_scale_to_zero_is_taken_with_a_cache_and_the_opt_in() -> None:
    parsed = parse_spec(
        {
            "model": {"cache": {"size": "2Ti"}},
            "autoscaling": {"maxReplicas": 2, "minReplicas": 0, "scaleToZero": True},
        }
    )
    assert parsed.autoscaling is not None and parsed.autoscaling.min_replicas == 0


def cluster_queue(nominal: int, reserved: int) -> dict[str, Any]:
    return {
        "spec": {
            "resourceGroups": [
                {
                    "flavors": [
                        {
                            "name": "a",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": nominal}],
                        }
                    ]
                }
            ]
        },
        "status": {
            "flavorsReservation": [
                {"name": "a", "resources": [{"name": "nvidia.com/gpu", "total": str(reserved)}]}
            ]
        },
    }


def test_the_quota_left_is_the_nominal_less_what_is_reserved() -> None:
    assert quota_free(cluster_queue(32, 8), "nvidia.com/gpu") == 24
    assert quota_free(cluster_queue(32, 40), "nvidia.com/gpu") == 0
    assert quota_free(cluster_queue(32, 8), "amd.com/gpu") is None
    assert quota_free(None, "nvidia.com/gpu") is None


def test_a_queued_scale_up_is_clamped_to_the_quota_left() -> None:
    # Eight GPUs of quota left: one more 8-GPU group, although the nodes have room for three.
    snap = snapshot(
        {**AUTO, "replicas": 4, "scheduling": {"queueName": "gpus"}},
        live={LWS: live_lws(1, 1)},
        keda_installed=True,
        kueue_installed=True,
        gpus=ROOMY,
        pods=tuple(bound_pods(1)),
        quota_free_gpus=8,
        workloads=(
            {
                "metadata": {
                    "name": "w0",
                    "labels": {},
                    "annotations": {"kueue.x-k8s.io/component-workload-index": "0"},
                },
                "status": {"conditions": [{"type": "Admitted", "status": "True"}]},
            },
        ),
    )
    decision = decide(snap)
    assert lws_replicas(decision) == 2
    assert said(decision, "Autoscaling") == ("False", "ClampedByQuota")


def test_a_reservation_the_cluster_queue_has_not_counted_yet_is_counted() -> None:
    # Kueue admitted this deployment's group (16 GPUs) and has not yet written it into the
    # ClusterQueue's status: the quota left is still 0, not 16.
    assert quota_free(cluster_queue(16, 0), "nvidia.com/gpu", held=16) == 0
    assert quota_free(cluster_queue(32, 24), "nvidia.com/gpu", held=16) == 8
