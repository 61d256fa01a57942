"""Every condition transition derived from the LeaderWorkerSet and its pods."""

from __future__ import annotations

import json
from typing import Any

from conftest import spec_of
from kimik3_operator.observation.workload import GpuCounts, observe
from kimik3_operator.runtime.gpu_ledger import GpuLedger

LWS: dict[str, Any] = {"status": {"replicas": 1, "updatedReplicas": 1}}


def pod(name: str, group: int, ready: bool = True, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    conditions += status.pop("conditions", [])
    return {
        "metadata": {
            "name": name,
            "labels": {"leaderworkerset.sigs.k8s.io/group-index": str(group)},
        },
        "status": {"conditions": conditions, **status},
    }


def conds(obs: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in obs.conditions}


def test_lws_crd_missing_says_how_to_install() -> None:
    obs = observe(spec_of(), lws_crd_installed=False, lws=None, pods=[])
    assert conds(obs)["Degraded"] == ("True", "LeaderWorkerSetCRDMissing")
    assert "install LeaderWorkerSet" in obs.conditions[0].message


def test_waiting_for_the_lws() -> None:
    obs = observe(spec_of(), lws_crd_installed=True, lws=None, pods=[])
    assert conds(obs) == {
        "Progressing": ("True", "WaitingForLeaderWorkerSet"),
        "Available": ("False", "NoGroupReady"),
        "Degraded": ("False", "AsExpected"),
    }


def test_group_with_a_pod_not_ready_is_not_available() -> None:
    pods = [pod("k3-0", 0), pod("k3-0-1", 0, ready=False)]
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=pods)
    assert obs.ready_replicas == 0
    assert conds(obs)["Available"] == ("False", "NoGroupReady")
    assert conds(obs)["Progressing"] == ("True", "GroupsStarting")


def test_group_missing_a_pod_is_not_available() -> None:
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=[pod("k3-0", 0)])
    assert obs.ready_replicas == 0


def test_all_pods_ready_is_available() -> None:
    pods = [pod("k3-0", 0), pod("k3-0-1", 0)]
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=pods)
    assert obs.ready_replicas == 1
    assert conds(obs) == {
        "Progressing": ("False", "Available"),
        "Available": ("True", "Available"),
        "Degraded": ("False", "AsExpected"),
    }


def test_within_max_unavailable_stays_available_while_rolling() -> None:
    spec = spec_of(replicas=3)
    pods = [pod(f"k3-{g}-{i}", g) for g in (0, 1) for i in (0, 1)]
    lws = {"status": {"replicas": 3, "updatedReplicas": 1}}
    obs = observe(spec, lws_crd_installed=True, lws=lws, pods=pods)
    assert obs.ready_replicas == 2
    assert conds(obs)["Available"] == ("True", "SomeGroupsReady")
    assert conds(obs)["Progressing"] == ("True", "RollingUpdate")


def test_crash_loop_is_degraded_with_the_exit_code() -> None:
    bad = pod(
        "k3-0-1",
        0,
        ready=False,
        containerStatuses=[
            {
                "name": "vllm",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    )
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=[pod("k3-0", 0), bad])
    assert conds(obs)["Degraded"] == ("True", "PodCrashLooping")
    assert conds(obs)["Available"] == ("False", "PodCrashLooping")
    message = next(c.message for c in obs.conditions if c.type == "Degraded")
    assert "k3-0-1" in message and "restarts: 4" in message and "exit code 1" in message


def test_oom_outranks_crash_loop() -> None:
    oom = pod(
        "k3-0",
        0,
        ready=False,
        containerStatuses=[
            {
                "name": "vllm",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ],
    )
    obs = observe(
        spec_of(resources={"memory": "256Gi"}), lws_crd_installed=True, lws=LWS, pods=[oom]
    )
    assert conds(obs)["Degraded"] == ("True", "PodOOMKilled")
    assert "256Gi" in obs.conditions[2].message


def test_image_pull_failure() -> None:
    bad = pod(
        "k3-0",
        0,
        ready=False,
        containerStatuses=[
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v9",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
            }
        ],
    )
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=[bad])
    assert conds(obs)["Degraded"] == ("True", "ImagePullFailed")
    assert "vllm/vllm-openai:v9" in obs.conditions[2].message


def test_insufficient_gpus_reports_asked_and_free() -> None:
    pending = pod(
        "k3-1",
        1,
        ready=False,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    gpus = GpuCounts(allocatable=32, free=0, largest_free_on_one_node=0, nodes=4)
    obs = observe(spec_of(replicas=3), lws_crd_installed=True, lws=LWS, pods=[pending], gpus=gpus)
    assert conds(obs)["Degraded"] == ("True", "InsufficientGPUs")
    message = obs.conditions[2].message
    assert "asks for 8 nvidia.com/gpu" in message
    assert "need 48 nvidia.com/gpu" in message
    assert "32 allocatable and 0 free" in message


def test_other_unschedulable_reason() -> None:
    pending = pod(
        "k3-0",
        0,
        ready=False,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity.",
            }
        ],
    )
    obs = observe(spec_of(), lws_crd_installed=True, lws=LWS, pods=[pending])
    assert conds(obs)["Degraded"] == ("True", "Unschedulable")


def test_scaled_to_zero() -> None:
    obs = observe(spec_of(replicas=0), lws_crd_installed=True, lws=LWS, pods=[])
    assert conds(obs)["Available"] == ("False", "ScaledToZero")


def test_gpu_inventory_counts_free_gpus_on_matching_nodes() -> None:
    def node(name: str, gpus: int, pool: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {"pool": pool}},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
        }

    nodes = [node("a", 8, "h200"), node("b", 8, "h200"), node("c", 8, "other")]
    pods = [
        {
            "spec": {
                "nodeName": "a",
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "6"}}}],
            },
            "status": {"phase": "Running"},
        },
        {
            "spec": {
                "nodeName": "b",
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}],
            },
            "status": {"phase": "Succeeded"},
        },
    ]
    ledger = GpuLedger()
    ledger.nodes_listed(nodes)
    ledger.pods_listed([{**p, "metadata": {"uid": str(i)}} for i, p in enumerate(pods)])
    inv = ledger.counts("nvidia.com/gpu", {"pool": "h200"})
    assert inv == GpuCounts(allocatable=16, free=10, largest_free_on_one_node=8, nodes=2)
    # Asked with the deployment's own pods: how many of them the ledger holds on a node (the
    # ended pod and one the ledger has not seen yet are not held).
    own = ledger.counts("nvidia.com/gpu", {"pool": "h200"}, own=["0", "1", "unseen"])
    assert own.own_pods_held == 1
    # The watch moves the numbers: the running pod ends, the node cordoned.
    ledger.pod_event(
        "MODIFIED", {**pods[0], "metadata": {"uid": "0"}, "status": {"phase": "Succeeded"}}
    )
    ledger.node_event("MODIFIED", {**nodes[1], "spec": {"unschedulable": True}})
    inv = ledger.counts("nvidia.com/gpu", {"pool": "h200"})
    assert inv == GpuCounts(allocatable=8, free=8, largest_free_on_one_node=8, nodes=1)
    # ... and, asked with the deployment's own pods, holds none of them now.
    assert ledger.counts("nvidia.com/gpu", {}, own=["0", "1"]).own_pods_held == 0


def test_gpu_inventory_leaves_out_nodes_whose_taints_the_placement_does_not_tolerate() -> None:
    taint = {"key": "pool", "value": "demo", "effect": "NoSchedule"}
    nodes = [
        {"metadata": {"name": "a"}, "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        {
            "metadata": {"name": "b"},
            "spec": {"taints": [taint, {"key": "soft", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        },
    ]
    ledger = GpuLedger()
    ledger.nodes_listed(nodes)
    ledger.pods_listed([])
    assert ledger.counts("nvidia.com/gpu", {}).nodes == 1
    exact = [{"key": "pool", "operator": "Equal", "value": "demo", "effect": "NoSchedule"}]
    assert ledger.counts("nvidia.com/gpu", {}, exact).nodes == 2
    assert ledger.counts("nvidia.com/gpu", {}, [{"operator": "Exists"}]).nodes == 2
    wrong = [{"key": "pool", "operator": "Equal", "value": "prod"}]
    assert ledger.counts("nvidia.com/gpu", {}, wrong).nodes == 1


def member(group: int, worker: int, node: str = "n1", ready: bool = True) -> dict[str, Any]:
    name = f"k3-{group}" + (f"-{worker}" if worker else "")
    return {
        "metadata": {
            "name": name,
            "labels": {
                "leaderworkerset.sigs.k8s.io/group-index": str(group),
                "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            },
        },
        "spec": {"nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_status_names_the_group_that_is_not_ready_and_why() -> None:
    spec = spec_of(replicas=3)  # groups of two pods
    pods = [member(0, 0), member(0, 1), member(1, 0), member(2, 0), member(2, 1, ready=False)]
    lws = {"status": {"replicas": 3, "updatedReplicas": 3}}
    obs = observe(spec, lws_crd_installed=True, lws=lws, pods=pods, name="k3")
    messages = {c.type: c.message for c in obs.conditions}
    assert "group 1: pod k3-1-1 missing" in messages["Progressing"]
    assert "group 2: pod k3-2-1 on node n1 not Ready" in messages["Progressing"]
    assert "group 0" not in messages["Progressing"]
    assert "group 1: pod k3-1-1 missing" in messages["Available"]


def test_the_ledger_counts_the_same_from_the_few_fields_it_keeps() -> None:
    from kimik3_operator.runtime.gpu_ledger import ledger_node_fields, ledger_pod_fields

    node = {
        "metadata": {"name": "a", "labels": {"pool": "x"}, "annotations": {"big": "y" * 1000}},
        "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "images": ["z" * 1000]},
    }
    pod = {
        "metadata": {"uid": "1", "name": "p", "labels": {"a": "b"}},
        "spec": {
            "nodeName": "a",
            "containers": [{"image": "i", "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
    }
    full, slim = GpuLedger(), GpuLedger()
    full.nodes_listed([node])
    full.pods_listed([pod])
    slim.nodes_listed([ledger_node_fields(node)])
    slim.pods_listed([ledger_pod_fields(pod)])
    toleration = [{"key": "k", "operator": "Exists"}]
    assert (
        slim.counts("nvidia.com/gpu", {"pool": "x"}, toleration)
        == full.counts("nvidia.com/gpu", {"pool": "x"}, toleration)
        == GpuCounts(allocatable=8, free=6, largest_free_on_one_node=6, nodes=1)
    )
    assert len(json.dumps(ledger_node_fields(node))) < 300
