"""A KimiK3Deployment through its life on the real control plane.

The LWS controller, StatefulSet controller, scheduler and garbage collector are real; KWOK
stands in for the GPU nodes' kubelets and marks scheduled pods Running and Ready.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from e2e.support.cluster import Cluster, OperatorProcess, condition, describe, kimi, wait_for

pytestmark = pytest.mark.kwok

LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
# The image probe runs a container, which KWOK cannot; test_preflight.py plays it explicitly.
SMALL = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
}


def pods_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return cluster.items("pods", namespace, f"app.kubernetes.io/instance={name}")


def node_gpus(cluster: Cluster) -> dict[str, tuple[int, str]]:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {
        n["metadata"]["name"]: (
            int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)),
            n["metadata"]["labels"].get("topology.kimik3.io/domain", ""),
        )
        for n in nodes
    }


def test_text_dspark_becomes_an_available_two_node_group(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("k3", **SMALL), namespace)
    body = wait_condition("k3", namespace, "Available", "True", "Available", timeout=120)
    status = body["status"]
    assert status["readyReplicas"] == 1
    assert status["replicas"] == 1
    assert status["ready"] == "1/1"
    columns = cluster.kubectl("get", "kk3d", "k3", "-n", namespace, "--no-headers").stdout.split()
    assert columns[:2] == ["k3", "True"] and columns[2] == "1/1", "Replicas as a Deployment's"
    assert status["nodesPerReplica"] == 2
    assert status["gpusPerReplica"] == 16
    assert status["endpoint"] == f"http://k3.{namespace}.svc:8000"
    assert condition(body, "Degraded")["status"] == "False"
    assert condition(body, "Progressing")["status"] == "False"

    lws = cluster.get("lws", "k3", namespace)
    assert lws is not None
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["kind"] == "KimiK3Deployment"
    statefulsets = cluster.items("statefulsets", namespace)
    assert len(statefulsets) == 2  # the leaders' and group 0's workers'

    pods = pods_of(cluster, namespace, "k3")
    assert len(pods) == 2
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 2, "each pod of the group on its own node"
    gpus = node_gpus(cluster)
    for pod in pods:
        assert gpus[pod["spec"]["nodeName"]][0] == 8
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "8"
    leader = next(
        p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/component"] == "leader"
    )
    env = {e["name"]: e.get("value") for e in leader["spec"]["containers"][0]["env"]}
    assert env.get("LWS_GROUP_SIZE") == "2", "the LWS pod webhook injected its variables"

    svc = cluster.get("service", "k3", namespace)
    assert svc is not None
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "leader"
    assert svc["spec"]["clusterIP"] != "None", "the leaders' Service, not LWS's headless one"
    assert [r["kind"] for r in svc["metadata"]["ownerReferences"]] == ["KimiK3Deployment"]
    # LWS's headless Service for the group's DNS names, and the leader address built on it.
    headless = cluster.get("service", "k3-0", namespace)
    assert headless is not None and headless["spec"]["clusterIP"] == "None"
    assert env.get("LWS_LEADER_ADDRESS") == f"k3-0.k3-0.{namespace}"
    assert cluster.get("podmonitor", "k3", namespace) is not None

    table = cluster.kubectl("get", "kk3d", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "READY",
        "REPLICAS",
        "TP",
        "NODES",
        "DRAFTER",
        "ACCEPT",
        "REASON",
        "STARTUP",
        "AGE",
    ]
    # No traffic yet, so no acceptance: the row has one cell fewer than the header.
    assert table[1].split()[:8] == ["k3", "True", "1/1", "16", "2", "dspark", "Available", "Ready"]


def test_group_stays_in_one_topology_domain(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    spec = {**SMALL, "placement": {"topologyKey": "topology.kimik3.io/domain"}}
    cluster.apply(kimi("topo", **spec), namespace)
    wait_condition("topo", namespace, "Available", "True", timeout=120)
    gpus = node_gpus(cluster)
    domains = {gpus[p["spec"]["nodeName"]][1] for p in pods_of(cluster, namespace, "topo")}
    assert len(domains) == 1


def test_too_many_gpus_is_degraded_with_the_numbers(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("big", replicas=3, **SMALL), namespace)
    body = wait_condition("big", namespace, "Degraded", "True", "InsufficientGPUs", timeout=120)
    message = condition(body, "Degraded")["message"]
    assert "asks for 8 nvidia.com/gpu" in message
    assert "need 48 nvidia.com/gpu" in message
    assert "32 allocatable" in message
    assert condition(body, "Progressing")["status"] == "True"
    pending = [p for p in pods_of(cluster, namespace, "big") if p["status"]["phase"] == "Pending"]
    assert pending
    events = cluster.events(namespace, "reason=InsufficientGPUs")
    assert "Warning" in {e["type"] for e in events}


def test_scaling_adds_and_removes_groups(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    spec = {**SMALL, "parallelism": {"tensor": 8}}
    cluster.apply(kimi("scale", **spec), namespace)
    wait_condition("scale", namespace, "Available", "True", "Available", timeout=120)
    cluster.kubectl(
        "patch", "kk3d", "scale", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":3}}'
    )

    def ready(n: int) -> Callable[[], bool]:
        def check() -> bool:
            body = cluster.get("kk3d", "scale", namespace) or {}
            groups = {
                p["metadata"]["labels"].get(LWS_GROUP_LABEL)
                for p in pods_of(cluster, namespace, "scale")
                if not p["metadata"].get("deletionTimestamp")
            }
            return bool(
                body.get("status", {}).get("readyReplicas") == n
                and len(groups) == n
                and condition(body, "Available").get("reason") == "Available"
            )

        return check

    wait_for(ready(3), 120, "3 ready groups", lambda: describe(cluster, "scale", namespace))
    cluster.kubectl("scale", "kk3d", "scale", "-n", namespace, "--replicas=1")
    wait_for(ready(1), 120, "1 ready group", lambda: describe(cluster, "scale", namespace))
    lws = cluster.get("lws", "scale", namespace)
    assert lws is not None and lws["spec"]["replicas"] == 1


def test_changing_the_image_rolls_the_groups(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    spec = {**SMALL, "replicas": 2, "parallelism": {"tensor": 8}}
    cluster.apply(kimi("roll", **spec), namespace)
    wait_condition("roll", namespace, "Available", "True", "Available", timeout=120)
    new_image = "vllm/vllm-openai:v0.34.0"
    cluster.kubectl(
        "patch",
        "kk3d",
        "roll",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"engine": {"image": new_image}}}),
    )
    lws = cluster.get("lws", "roll", namespace)
    assert lws is not None
    rolling = lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)
    worst_ready = [2]

    def rolled() -> bool:
        pods = [
            p
            for p in pods_of(cluster, namespace, "roll")
            if not p["metadata"].get("deletionTimestamp")
        ]
        ready = sum(
            1
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
        )
        worst_ready[0] = min(worst_ready[0], ready)
        images = {p["spec"]["containers"][0]["image"] for p in pods}
        return images == {new_image} and ready == 2

    wait_for(
        rolled, 180, "every group on the new image", lambda: describe(cluster, "roll", namespace)
    )
    assert worst_ready[0] >= 1, "maxUnavailable=1 keeps one of two groups serving"
    wait_condition("roll", namespace, "Available", "True", "Available", timeout=60)


def test_deleting_the_resource_removes_every_child(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("gone", **SMALL), namespace)
    wait_condition("gone", namespace, "Available", "True", timeout=120)
    cluster.kubectl("delete", "kk3d", "gone", "-n", namespace, "--wait=true")

    def all_gone() -> bool:
        return (
            cluster.get("lws", "gone", namespace) is None
            and cluster.get("service", "gone", namespace) is None
            and cluster.get("podmonitor", "gone", namespace) is None
            and not cluster.items("statefulsets", namespace)
            and not pods_of(cluster, namespace, "gone")
        )

    wait_for(all_gone, 120, "garbage collection of every child")


def test_restarted_operator_leaves_unchanged_children_alone(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("steady", **SMALL), namespace)
    wait_condition("steady", namespace, "Available", "True", "Available", timeout=120)

    def versions() -> dict[str, str]:
        out = {}
        for kind in ("lws", "service", "podmonitor", "kk3d"):
            obj = cluster.get(kind, "steady", namespace)
            assert obj is not None
            out[kind] = obj["metadata"]["resourceVersion"]
        return out

    import time

    time.sleep(6)  # let one resync pass after Available
    before = versions()
    operator.stop()
    operator.start()
    time.sleep(12)  # the first pass from fresh caches and two resync ticks
    assert versions() == before, "nothing written"
    assert operator.reconciles() >= 3, (
        "the restarted operator did reconcile: the first pass and resyncs"
    )
    assert "Traceback" not in operator.log.read_text()


@pytest.mark.timing_sensitive
def test_a_node_deleted_under_a_running_group_is_named_then_the_group_recovers(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    """The operator runs with a 5 s resync; the node's deletion reaches it by its watch."""
    cluster.apply(kimi("k3", **SMALL), namespace)
    wait_condition("k3", namespace, "Available", "True", "Available", timeout=120)
    worker = next(
        p
        for p in pods_of(cluster, namespace, "k3")
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    )
    node = worker["spec"]["nodeName"]
    saved = cluster.get("node", node, "default")
    assert saved is not None
    try:
        cluster.kubectl("delete", "node", node, "--wait=false")
        body = wait_condition("k3", namespace, "Degraded", "True", "NodeLost", timeout=15)
        message = condition(body, "Degraded")["message"]
        assert f"node {node}, which is gone" in message and "group 0" in message
        assert condition(body, "Available")["status"] == "False"
        assert (
            f"group 0: pod {worker['metadata']['name']} on node {node}"
            in (condition(body, "Available")["message"])
        )
        # The pod GC removes the orphaned pod; LWS recreates the group on the other nodes.
        body = wait_condition("k3", namespace, "Available", "True", "Available", timeout=180)
        assert all(p["spec"].get("nodeName") != node for p in pods_of(cluster, namespace, "k3"))
        assert condition(body, "Degraded")["status"] == "False"
    finally:
        meta = saved["metadata"]
        restored = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if k in meta},
            "spec": {},
            "status": {
                "capacity": saved["status"]["capacity"],
                "allocatable": saved["status"]["allocatable"],
            },
        }
        cluster.apply(restored, "default")


def test_a_deployment_and_its_namespace_delete_with_the_operator_stopped(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("k3", **SMALL), namespace)
    body = wait_condition("k3", namespace, "Available", "True", "Available", timeout=120)
    assert not body["metadata"].get("finalizers"), "no finalizer on a KimiK3Deployment"
    operator.stop()
    cluster.kubectl("delete", "kk3d", "k3", "-n", namespace, "--timeout=30s")
    wait_for(
        lambda: (
            cluster.get("lws", "k3", namespace) is None
            and cluster.get("service", "k3", namespace) is None
        ),
        60,
        "garbage collection of the children",
    )
    cluster.apply(kimi("k4", **SMALL), namespace)
    cluster.kubectl("delete", "namespace", namespace, "--timeout=60s")
    assert cluster.get("namespace", namespace, "default") is None


def test_another_teams_service_is_never_taken_over(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    """A Service of another team, unlabelled, not in the operator's caches: a
    KimiK3Deployment named after it is refused, and the Service keeps every field."""
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "shared", "labels": {"team": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    cluster.apply(theirs, namespace)
    before = cluster.get("service", "shared", namespace)
    assert before is not None
    cluster.apply(kimi("shared", **SMALL), namespace)
    body = wait_condition("shared", namespace, "Degraded", "True", "NameConflict", timeout=60)
    assert "Service/shared" in condition(body, "Degraded")["message"]
    after = cluster.get("service", "shared", namespace)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "ownerReferences" not in after["metadata"]
    assert cluster.get("lws", "shared", namespace) is None, "nothing half made"
    events = cluster.events(namespace, "reason=NameConflict")
    assert "Warning" in {e["type"] for e in events}

    # The other team removes its Service: the deployment goes ahead at the next resync.
    cluster.kubectl("delete", "service", "shared", "-n", namespace)
    wait_condition("shared", namespace, "Available", "True", "Available", timeout=120)


def test_the_longest_name_serves_with_children_named_within_their_limits(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    name = "k" * 49
    cluster.apply(kimi(name, **SMALL), namespace)
    wait_condition(name, namespace, "Available", "True", "Available", timeout=120)
    sets = [s["metadata"]["name"] for s in cluster.items("statefulsets", namespace)]
    assert sets and all(len(s) <= 52 for s in sets), sets
