"""Kueue admission on the real control plane: Kueue v0.17.0 built from its module and run as
a host process with its webhooks, the real LeaderWorkerSet controller and scheduler, and
KWOK GPU nodes in two racks (fake: no kubelet, no GPU, since neither can exist here).

A Kimi-K3 group is 16 GPUs on two nodes: Kueue admits it whole inside one rack or not at all;
a second deployment waits for quota and says so; quota is held until the preflight passes;
a spec the preflight refuses never holds quota; a rolling update under Kueue completes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from e2e.support.cluster import (
    ROOT,
    Cluster,
    OperatorProcess,
    condition,
    kimi,
    wait_for,
)
from e2e.support.kueue import (
    NAMESPACE_LABEL,
    POOL_LABEL,
    RACK_LABEL,
    Kueue,
    local_queue,
    priority_classes,
    quota_objects,
)
from e2e.support.play_probe import finished_probe_pod, play, terminated_status

pytestmark = pytest.mark.kwok

SMALL = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
}
QUEUED = {**SMALL, "scheduling": {"queueName": "gpus", "topology": {"required": RACK_LABEL}}}
GROUP_GPUS = 16
GATE = "kueue.x-k8s.io/admission"
NODES = 4


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[Kueue]:
    """Kueue running, four 8-GPU nodes of its own in two racks, and a ClusterQueue with the
    GPUs of one group. The nodes carry no taint (Kueue's topology-aware scheduling would
    count a taint that only the flavor's tolerations tolerate as a failed node); the KWOK
    tier's other tests run before or after this module, never beside it."""
    found = Kueue(cluster)
    nodes = subprocess.run(
        [
            sys.executable,
            str(ROOT / "e2e/cluster/nodes.py"),
            "--count", str(NODES), "--prefix", "kueue-node", "--domains", "2",
            "--label", f"{POOL_LABEL}=kueue",
        ],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=nodes)
    ready = "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}"
    wait_for(
        lambda: (
            cluster.kubectl("get", "nodes", "-l", f"{POOL_LABEL}=kueue", "-o", ready)
            .stdout.split()
            .count("True")
            == NODES
        ),
        60,
        "the Kueue pool's nodes Ready",
    )
    found.start()
    made = [*quota_objects(GROUP_GPUS), *priority_classes()]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(made))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    wait_for(
        lambda: cluster.kubectl("get", "clusterqueue", "gpus", "-o", active).stdout == "True",
        60,
        "the ClusterQueue Active",
    )
    yield found
    found.stop()
    cluster.kubectl("delete", "nodes", "-l", f"{POOL_LABEL}=kueue", "--wait=false", check=False)


@contextlib.contextmanager
def queued_operator(
    cluster: Cluster, namespace: str, env: dict[str, str] | None = None
) -> Iterator[OperatorProcess]:
    """The namespace labelled for Kueue's webhooks with a LocalQueue, and an operator on it.
    At the end its deployments go, and the test waits until their Workloads have given their
    quota back: the next test's groups need the same GPUs, and a namespace deleted without
    waiting frees them only when the garbage collector gets there."""
    cluster.kubectl("label", "namespace", namespace, f"{NAMESPACE_LABEL}=true", "--overwrite")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(local_queue(namespace)))
    operator = OperatorProcess(cluster, namespace, extra_env=env)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        cluster.kubectl("delete", "kk3d", "--all", "-n", namespace, "--wait=false", check=False)
        wait_for(
            lambda: not workloads(cluster, namespace), 180, f"the Workloads of {namespace} gone"
        )


def pods_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return cluster.items(
        "pods", namespace, f"app.kubernetes.io/instance={name},app.kubernetes.io/component in "
        "(leader,worker)",
    )  # fmt: skip


def rack_of(cluster: Cluster, node: str) -> str:
    found = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)
    return str(found["metadata"]["labels"].get(RACK_LABEL))


def workloads(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return cluster.items("workloads.kueue.x-k8s.io", namespace)


def cli_status(name: str, namespace: str, cluster: Cluster) -> str:
    return subprocess.run(
        [sys.executable, "-m", "kimik3_operator", "status", name, "-n", namespace],
        check=True, capture_output=True, text=True, env=cluster.env,
    ).stdout  # fmt: skip


def test_without_kueue_a_queued_deployment_makes_nothing_and_says_why(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    Kueue(cluster).stop()  # what an interrupted earlier run may have left
    cluster.apply(kimi("queued", **QUEUED), namespace)
    body = wait_condition("queued", namespace, "Admitted", "False", "KueueNotInstalled", 60)
    assert "workloads.kueue.x-k8s.io" in condition(body, "Admitted")["message"]
    assert condition(body, "Degraded")["reason"] == "KueueNotInstalled"
    assert cluster.get("lws", "queued", namespace) is None, "no group runs outside the queue"


def test_a_group_is_admitted_whole_in_one_rack_the_next_waits_and_a_rollout_completes(
    cluster: Cluster,
    kueue: Kueue,
    namespace: str,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    with queued_operator(cluster, namespace):
        cluster.apply(kimi("first", **QUEUED), namespace)
        body = wait_condition("first", namespace, "Admitted", "True", "Admitted", 120)
        assert "ClusterQueue gpus" in condition(body, "Admitted")["message"]
        wait_condition("first", namespace, "Available", "True", timeout=120)
        pods = pods_of(cluster, namespace, "first")
        assert len(pods) == 2
        racks = {rack_of(cluster, p["spec"]["nodeName"]) for p in pods}
        assert len(racks) == 1, f"one group across racks {racks}"
        assert all(p["spec"]["nodeName"].startswith("kueue-node-") for p in pods)
        lws = cluster.get("lws", "first", namespace)
        assert lws is not None
        assert lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"

        # The quota holds one group: the next deployment waits, in Kueue's words, and its
        # gated pods are waiting, not failing.
        cluster.apply(kimi("second", **QUEUED), namespace)
        wait_condition("second", namespace, "Admitted", "False", "WaitingForQuota", 120)

        def quota_message() -> dict[str, Any] | None:
            body = cluster.get("kk3d", "second", namespace)
            return body if "nvidia.com/gpu" in condition(body, "Admitted")["message"] else None

        body = wait_for(quota_message, 60, "Kueue's word on the GPU quota in Admitted")
        message = condition(body, "Admitted")["message"]
        assert "0 of 1 group(s) admitted by LocalQueue gpus" in message
        assert condition(body, "Progressing")["reason"] == "WaitingForQuota"
        assert condition(body, "Degraded")["status"] == "False"
        waiting = pods_of(cluster, namespace, "second")
        assert waiting and all(
            GATE in [g["name"] for g in p["spec"].get("schedulingGates", [])] for p in waiting
        )
        shown = cli_status("second", namespace, cluster)
        assert "Queue: gpus" in shown and "Pending" in shown

        # The first goes: its quota is the second's.
        cluster.kubectl("delete", "kk3d", "first", "-n", namespace)
        wait_condition("second", namespace, "Admitted", "True", "Admitted", 180)
        wait_condition("second", namespace, "Available", "True", timeout=120)

        # A change of the pods rolls under Kueue, to the end.
        before = {
            p["metadata"]["labels"]["serving.kimik3.io/template-hash"]
            for p in pods_of(cluster, namespace, "second")
        }
        patch = {"spec": {"engine": {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}}}
        cluster.kubectl(
            "patch", "kk3d", "second", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )

        def rolled() -> bool:
            pods = pods_of(cluster, namespace, "second")
            hashes = {p["metadata"]["labels"]["serving.kimik3.io/template-hash"] for p in pods}
            ready = all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", [])
                )
                for p in pods
            )
            return len(pods) == 2 and ready and not hashes & before

        wait_for(rolled, 180, "the rolling update under Kueue to complete")
        body = wait_condition("second", namespace, "Available", "True", timeout=60)
        assert condition(body, "Admitted")["status"] == "True"

        # Kueue refuses a change of the pods' shape on a queued set: said, and the group keeps
        # serving.
        patch = {"spec": {"resources": {"cpu": "8"}}}
        cluster.kubectl(
            "patch", "kk3d", "second", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )
        body = wait_condition("second", namespace, "Degraded", "True", "ApplyFailed", 60)
        assert "immutable" in condition(body, "Degraded")["message"]
        assert condition(body, "Available")["status"] == "True"


def test_quota_is_held_until_the_probe_passes_and_a_refused_spec_never_holds_it(
    cluster: Cluster,
    kueue: Kueue,
    namespace: str,
    wait_condition: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # the probe's player's kubectl
    probed = {**QUEUED, "preflight": {"probe": True}}
    with queued_operator(cluster, namespace, {"KIMIK3_KUEUE_ADMISSION_GATE": "true"}):
        cluster.apply(kimi("held", **probed), namespace)
        body = wait_condition(
            "held", namespace, "Admitted", "False", "AdmissionHeldForPreflight", 120
        )
        assert body["status"]["admission"]["held"] is True
        lws = cluster.get("lws", "held", namespace)
        assert lws is not None
        gate = lws["metadata"]["annotations"]["kueue.x-k8s.io/admission-gated-by"]
        assert gate == "serving.kimik3.io/preflight"
        made = wait_for(lambda: workloads(cluster, namespace), 60, "the group's Workload")
        for workload in made:
            reserved = [
                c for c in workload.get("status", {}).get("conditions", [])
                if c["type"] == "QuotaReserved" and c["status"] == "True"
            ]  # fmt: skip
            assert not reserved, "quota taken before the preflight passed"

        play(namespace)
        wait_condition("held", namespace, "CapabilitiesVerified", "True", timeout=90)
        wait_condition("held", namespace, "Admitted", "True", "Admitted", 120)
        lws = cluster.get("lws", "held", namespace)
        assert lws is not None
        annotations = lws["metadata"].get("annotations") or {}
        assert "kueue.x-k8s.io/admission-gated-by" not in annotations
        wait_condition("held", namespace, "Available", "True", timeout=120)
        cluster.kubectl("delete", "kk3d", "held", "-n", namespace)
        wait_for(lambda: not workloads(cluster, namespace), 180, "the held group's Workload gone")

        # The probe of this one fails: the groups held for it go, and no Workload of it ever
        # reserves quota.
        cluster.apply(kimi("refused", **probed), namespace)
        wait_condition("refused", namespace, "Admitted", "False", "AdmissionHeldForPreflight", 120)
        pod = wait_for(lambda: finished_probe_pod(namespace), 60, "the finished probe pod")
        failed = terminated_status(pod, {"exitCode": 1, "reason": "Error"}, "")
        cluster.kubectl(
            "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"containerStatuses": [failed]}}),
        )  # fmt: skip
        wait_condition("refused", namespace, "CapabilitiesVerified", "False", "ProbeFailed", 90)
        wait_for(
            lambda: cluster.get("lws", "refused", namespace) is None, 60, "the held groups gone"
        )
        wait_for(lambda: not workloads(cluster, namespace), 180, "its Workload gone")


def test_a_group_preempted_for_a_higher_priority_is_reported_and_not_charged(
    cluster: Cluster,
    kueue: Kueue,
    namespace: str,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    def at(priority: str) -> dict[str, Any]:
        scheduling = {**QUEUED["scheduling"], "workloadPriorityClassName": priority}
        return {**QUEUED, "scheduling": scheduling}

    with queued_operator(cluster, namespace):
        cluster.apply(kimi("batch", **at("batch")), namespace)
        wait_condition("batch", namespace, "Available", "True", timeout=120)
        cluster.apply(kimi("serving", **at("serving")), namespace)
        body = wait_condition("batch", namespace, "Admitted", "False", "Preempted", 120)
        assert "preempted by Kueue" in condition(body, "Admitted")["message"]
        assert condition(body, "Degraded")["reason"] == "Preempted"
        wait_condition("serving", namespace, "Admitted", "True", "Admitted", 120)
        wait_condition("serving", namespace, "Available", "True", timeout=120)
        body = cluster.get("kk3d", "batch", namespace)
        assert (body or {}).get("status", {}).get("startupFailures", {}).get("count", 0) == 0
        assert condition(body, "Available")["status"] == "False"


def test_an_autoscaled_queued_deployment_gets_only_the_groups_its_quota_admits(
    cluster: Cluster,
    kueue: Kueue,
    namespace: str,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    """The quota is read from Kueue's own objects (the LocalQueue's ClusterQueue, its
    reservations): with room for one group, a scale to three makes one and waits for quota
    with no group created to sit in the queue. KEDA does not run in this module: the test
    scales through the scale subresource as KEDA's HPA would, and the condition says KEDA is
    absent while status.autoscaling carries the clamp."""
    with queued_operator(cluster, namespace):
        spec = {**QUEUED, "autoscaling": {"maxReplicas": 3}}
        cluster.apply(kimi("scaled", **spec), namespace)
        wait_condition("scaled", namespace, "Admitted", "True", "Admitted", 120)
        cluster.kubectl("scale", "kk3d", "scaled", "-n", namespace, "--replicas=3")

        def clamped() -> dict[str, Any] | None:
            body = cluster.get("kk3d", "scaled", namespace) or {}
            scaling = body.get("status", {}).get("autoscaling") or {}
            return body if scaling.get("desiredReplicas") == 3 else None

        body = wait_for(clamped, 60, "the scale to three seen")
        assert body["status"]["autoscaling"]["acceptedReplicas"] == 1
        assert condition(body, "Autoscaling")["reason"] == "KedaNotInstalled"
        time.sleep(10)
        lws = cluster.get("lws", "scaled", namespace) or {}
        assert lws["spec"]["replicas"] == 1
        assert len(workloads(cluster, namespace)) == 1, "no group made to wait in the queue"
