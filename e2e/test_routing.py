"""Routing on the real control plane: the Gateway API Inference Extension's CRDs and its
endpoint picker (EPP v1.5.0, built from its module) against the real API server, the
operator run with the chart's RBAC and admission policy, the real LeaderWorkerSet
controller and scheduler, and KWOK GPU nodes (fake: no kubelet, no GPU).

Stand-ins (e2e/support/epp.py): the gateway is the project's ext_proc client, since no Envoy
can be installed here; each leader's vLLM is a model server on its pod IP (added to the
loopback interface), whose queue the test sets and whose drafter's acceptance the operator
reads from the same address, as it reads a real leader's.
"""

from __future__ import annotations

import collections
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from e2e.support.chart import FAST_READS, chart_operator
from e2e.support.cluster import (
    RUN,
    Cluster,
    OperatorProcess,
    condition,
    kimi,
    service_account_kubeconfig,
    wait_for,
)
from e2e.support.epp import Gateway, ModelServer, Picker, install_crds, remove_crds
from e2e.support.vllm_exporter import FakeLeader

pytestmark = pytest.mark.kwok

GOOD = (0.9, 0.8, 0.7, 0.6)
BAD = (0.1, 0.05, 0.0, 0.0)
NAME = "k3"


@pytest.fixture(scope="module")
def inference_crds(cluster: Cluster) -> Iterator[None]:
    install_crds(cluster)
    yield
    remove_crds(cluster)


@pytest.fixture
def routed_operator(
    cluster: Cluster, inference_crds: None
) -> Iterator[tuple[OperatorProcess, str, str]]:
    """The chart installed (its RBAC, the picker's ClusterRole, the admission policy) and
    the operator run with its ServiceAccount's token, reading the leaders' own addresses."""
    with chart_operator(
        cluster,
        "-routing",
        lambda release: {**FAST_READS, "KIMIK3_EPP_CLUSTER_ROLE": f"{release}-endpoint-picker"},
    ) as running:
        yield running


def spec(replicas: int) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "drafter": {"method": "dspark"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        # Two nodes per group: each group has a worker, which must never be picked. Two GPUs
        # a pod, so the test fits beside what other tests of the tier still hold.
        "parallelism": {"tensor": 4},
        "placement": {"gpusPerNode": 2},
        "preflight": {"probe": False},
        "routing": {"maxAcceptanceDrop": 0.5},
    }


class Fleet:
    """A model server on each serving pod's address (leaders and workers alike: a picked
    worker would answer, and the test would see it)."""

    def __init__(self) -> None:
        self.servers: dict[str, ModelServer] = {}

    def sync(self, cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
        pods = cluster.items("pods", namespace, f"app.kubernetes.io/instance={NAME}")
        found = {}
        for pod in pods:
            address = pod.get("status", {}).get("podIP")
            component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
            if not address or component not in ("leader", "worker"):
                continue
            found[address] = pod
            if address not in self.servers:
                server = ModelServer(address, leader=FakeLeader(per_position=GOOD, running=0))
                server.start()
                self.servers[address] = server
        return found

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def leader_addresses(cluster: Cluster, namespace: str) -> dict[int, str]:
    pods = cluster.items(
        "pods", namespace, f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=leader"
    )
    return {
        int(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]): p["status"][
            "podIP"
        ]
        for p in pods
        if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
    }


def routable(cluster: Cluster, namespace: str) -> dict[int, str]:
    pods = cluster.items(
        "pods",
        namespace,
        f"app.kubernetes.io/instance={NAME},serving.kimik3.io/routable=true",
    )
    return {
        int(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]): "true"
        for p in pods
    }


def picked(gateway: Gateway, count: int = 12) -> collections.Counter[str]:
    """Where ``count`` requests with distinct prompts went (ip, or the error status)."""
    found: collections.Counter[str] = collections.Counter()
    for _ in range(count):
        status, endpoint, _seconds = gateway.post(f"tell me about {uuid.uuid4().hex}")
        found[endpoint.rsplit(":", 1)[0] if status == 200 else f"status {status}"] += 1
    return found


def eventually(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    wait_for(check, timeout, what)


def test_the_picker_routes_to_the_least_loaded_leader_and_never_to_a_collapsed_group(
    cluster: Cluster, routed_operator: tuple[OperatorProcess, str, str]
) -> None:
    operator, namespace, _ = routed_operator
    cluster.apply(kimi(NAME, **spec(2)), namespace)
    fleet = Fleet()
    picker: Picker | None = None
    gateway: Gateway | None = None
    try:
        wait_for(
            lambda: (
                len(leader_addresses(cluster, namespace)) == 2
                and cluster.get("deployment", f"{NAME}-epp", namespace) is not None
                and len(fleet.sync(cluster, namespace)) == 4
            ),
            180,
            "two groups of two pods, and the picker's Deployment",
            lambda: json.dumps((cluster.get("kk3d", NAME, namespace) or {}).get("status"))[-3000:],
        )
        pool = cluster.get("inferencepool", NAME, namespace) or {}
        assert pool["spec"]["selector"]["matchLabels"]["serving.kimik3.io/routable"] == "true"
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
        eventually(lambda: routable(cluster, namespace) == {0: "true", 1: "true"}, "both routable")
        eventually(
            lambda: (
                condition(cluster.get("kk3d", NAME, namespace), "Routing").get("reason")
                == "RoutingActive"
            ),
            "Routing=True, RoutingActive (the picker's Deployment Ready)",
        )

        # The picker runs as the operator made it, with the token of the account the
        # operator bound to the chart's ClusterRole.
        kubeconfig = service_account_kubeconfig(
            cluster, namespace, f"{NAME}-epp", RUN / f"sa-{namespace}-epp.kubeconfig"
        )
        picker = Picker(cluster, namespace, f"{NAME}-epp", kubeconfig)
        picker.start()
        gateway = Gateway(picker.grpc)
        leaders = leader_addresses(cluster, namespace)
        workers = set(fleet.servers) - set(leaders.values())
        assert len(workers) == 2

        # The least-loaded leader takes the requests, each way round; no worker ever does.
        fleet.servers[leaders[0]].extra_waiting = 6
        wait_for(
            lambda: picked(gateway, 6) == collections.Counter({leaders[1]: 6}),
            60,
            "the requests on group 1 while group 0 has a queue",
            picker.tail,
        )
        fleet.servers[leaders[0]].extra_waiting = 0
        fleet.servers[leaders[1]].extra_waiting = 6
        wait_for(
            lambda: picked(gateway, 6) == collections.Counter({leaders[0]: 6}),
            60,
            "the requests on group 0 once group 1 has the queue",
            picker.tail,
        )
        assert not any(fleet.servers[w].served for w in workers), "a worker was picked"
        # The pool gauges the serving dashboard reads, as the real picker names them.
        wait_for(
            lambda: 'inference_pool_ready_pods{name="k3"} 2' in picker.metrics_text(),
            30,
            "the picker's inference_pool_ready_pods",
            picker.tail,
        )
        assert 'inference_pool_average_queue_size{name="k3"}' in picker.metrics_text()

        # Group 1's drafter collapses: it leaves the pool, though its queue is now the
        # shortest, with an event and a metric; its requests go to group 0.
        fleet.servers[leaders[1]].extra_waiting = 0
        fleet.servers[leaders[0]].extra_waiting = 6
        fleet.servers[leaders[1]].leader = FakeLeader(per_position=BAD, running=0)
        eventually(lambda: routable(cluster, namespace) == {0: "true"}, "group 1 out of routing")
        body = cluster.get("kk3d", NAME, namespace) or {}
        routing = condition(body, "Routing")
        assert routing["reason"] == "GroupsOutOfRouting", routing
        assert "group 1" in routing["message"] and "median" in routing["message"]
        assert body["status"]["routing"]["routableGroups"] == 1
        went = picked(gateway, 8)
        assert went == collections.Counter({leaders[0]: 8}), went
        events = cluster.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=GroupLeftRouting",
            "-o",
            "json",
        ).stdout
        assert "group 1" in json.dumps(json.loads(events)["items"])
        left = (
            f'kimik3_routing_changes_total{{change="left",name="{NAME}",namespace="{namespace}"}}'
        )
        assert operator.metric(left) == 1.0, operator.metrics_text("kimik3_routing")

        # It recovers: back in the pool, and the requests follow the shorter queue again.
        fleet.servers[leaders[1]].leader = FakeLeader(per_position=GOOD, running=0)
        eventually(lambda: routable(cluster, namespace) == {0: "true", 1: "true"}, "group 1 back")
        wait_for(
            lambda: picked(gateway, 6) == collections.Counter({leaders[1]: 6}),
            60,
            "the requests on group 1 again",
            picker.tail,
        )

        # The pool follows the replicas: scaled to one group, group 1's leader is gone (its
        # server still answers, with the shortest queue) and is never picked; scaled back,
        # the new group 1 takes the requests once Ready and labelled.
        cluster.kubectl(
            "patch",
            "kk3d",
            NAME,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"replicas":1}}',
        )
        eventually(lambda: set(leader_addresses(cluster, namespace)) == {0}, "one group left")
        wait_for(
            lambda: picked(gateway, 6) == collections.Counter({leaders[0]: 6}),
            60,
            "every request on group 0 once group 1 is gone",
            picker.tail,
        )
        cluster.kubectl(
            "patch",
            "kk3d",
            NAME,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"replicas":2}}',
        )
        eventually(
            lambda: (
                len(fleet.sync(cluster, namespace)) >= 4
                and routable(cluster, namespace) == {0: "true", 1: "true"}
            ),
            "group 1 made again and routable",
            120,
        )
        again = leader_addresses(cluster, namespace)
        fleet.servers[again[1]].extra_waiting = 0
        wait_for(
            lambda: picked(gateway, 6) == collections.Counter({again[1]: 6}),
            60,
            "the requests on the new group 1",
            picker.tail,
        )
        log = operator.log.read_text()
        assert "Forbidden" not in log and "denied" not in log, log[-3000:]

        # The chart's fence around the operator's token: of a pod only the routable label,
        # and a Deployment only of the picker's image.
        def as_operator(*args: str, manifest: dict[str, Any] | None = None) -> str:
            result = subprocess.run(
                [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(operator.kubeconfig), *args],
                input=yaml.safe_dump(manifest) if manifest else None,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            return result.stdout + result.stderr

        pod = f"{NAME}-0"
        assert "changes only the label serving.kimik3.io/routable" in as_operator(
            "label", "pod", pod, "-n", namespace, "team=other", "--overwrite"
        )
        assert "Forbidden" not in as_operator(
            "label", "pod", pod, "-n", namespace, "serving.kimik3.io/routable=true", "--overwrite"
        )
        picker_deployment = cluster.get("deployment", f"{NAME}-epp", namespace) or {}
        other = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": f"{NAME}-epp",
                "namespace": namespace,
                "labels": picker_deployment["metadata"]["labels"],
            },
            "spec": {**picker_deployment["spec"]},
        }
        other["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/miner:1"
        assert "run only the endpoint pickers' images" in as_operator(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "--field-manager=kimik3-operator",
            "-f",
            "-",
            manifest=other,
        )
    finally:
        if gateway is not None:
            gateway.stop()
        if picker is not None:
            picker.stop()
        fleet.stop()
        cluster.kubectl("delete", "kk3d", "--all", "-n", namespace, "--wait=false", check=False)


def test_removing_routing_removes_the_pool_and_the_picker(
    cluster: Cluster,
    routed_operator: tuple[OperatorProcess, str, str],
) -> None:
    _, namespace, _ = routed_operator
    routed = spec(1)
    routed["routing"] = {"gateway": {"name": "inference"}}
    cluster.apply(kimi(NAME, **routed), namespace)
    eventually(
        lambda: (
            cluster.get("httproute", NAME, namespace) is not None
            and cluster.get("rolebinding", f"{NAME}-epp", namespace) is not None
        ),
        "the HTTPRoute and the picker's RoleBinding",
    )
    route = cluster.get("httproute", NAME, namespace) or {}
    assert route["spec"]["rules"][0]["backendRefs"][0]["kind"] == "InferencePool"
    del routed["routing"]
    cluster.apply(kimi(NAME, **routed), namespace)
    for kind, name in (
        ("inferencepool", NAME),
        ("httproute", NAME),
        ("deployment", f"{NAME}-epp"),
        ("rolebinding", f"{NAME}-epp"),
        ("serviceaccount", f"{NAME}-epp"),
        ("configmap", f"{NAME}-epp"),
        ("service", f"{NAME}-epp"),
    ):
        eventually(lambda k=kind, n=name: cluster.get(k, n, namespace) is None, f"{kind} gone")
    body = cluster.get("kk3d", NAME, namespace) or {}
    assert "routing" not in body.get("status", {})
    assert not condition(body, "Routing")
