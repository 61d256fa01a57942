"""Real containers in the test cluster: one node with containerd, runc and a kubelet beside
the KWOK GPU nodes, and the operator's image (built by buildah from images/operator/Dockerfile
on a local Debian base) installed by the chart and running as a pod.

Real: the kubelet, containerd, runc, the bridge network, the image and the operator process in
it. Stood in for: the registry (images are loaded into containerd) and the service proxy (the
operator pod is told the API server's address through the chart's extraEnv)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.support.chart import CHART, SMALL, helm
from e2e.support.cluster import ROOT, Cluster, create_test_namespace, kimi, wait_for
from e2e.support.real_node import (
    KUBECTL_IMAGE,
    NODE_LABEL,
    OPERATOR_IMAGE,
    RealNode,
    build_images,
    http_get,
    start_real_node,
)

pytestmark = pytest.mark.real_node


@pytest.fixture(scope="module")
def real_node(cluster: Cluster) -> RealNode:
    started = time.monotonic()
    node = start_real_node(cluster.env)
    print(f"real node Ready in {time.monotonic() - started:.1f}s")
    return node


def _pod(name: str, node: RealNode, command: list[str], image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **node.placement(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}
            ],
        },
    }


def test_the_real_node_is_cpu_only_and_kept_for_pods_that_ask(
    cluster: Cluster, real_node: RealNode
) -> None:
    node = json.loads(cluster.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    assert node["metadata"]["labels"][NODE_LABEL] == "true"
    assert {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_a_container_really_runs_there(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    build_images(cluster.env, "operator")
    started = time.monotonic()
    cluster.apply(
        _pod("hello", real_node, ["sh", "-c", "echo hello from $(hostname)"], OPERATOR_IMAGE),
        namespace,
    )

    def succeeded() -> bool:
        pod = cluster.get("pod", "hello", namespace) or {}
        return pod.get("status", {}).get("phase") == "Succeeded"

    wait_for(succeeded, 60, "the pod to run to completion on the real node")
    print(f"pod created to Succeeded: {time.monotonic() - started:.1f}s")
    assert cluster.kubectl("logs", "hello", "-n", namespace).stdout.strip() == "hello from hello"


def test_a_non_root_container_loses_the_capabilities_it_adds(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """Why serving pods with engine.addCapabilities run as the image's user by default: the
    kubelet and containerd give a container its added capabilities, but no ambient set, so a
    non-root process has none of them once it has started its command."""
    build_images(cluster.env, "operator")
    sys_nice = 1 << 23
    read = ["sh", "-c", "grep CapEff /proc/self/status"]
    for name, user in (("as-root", 0), ("as-user", 1000)):
        pod = _pod(name, real_node, read, OPERATOR_IMAGE)
        pod["spec"]["securityContext"] = {"runAsUser": user}
        pod["spec"]["containers"][0]["securityContext"] = {
            "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]}
        }
        cluster.apply(pod, namespace)

    def effective(name: str) -> int | None:
        pod = cluster.get("pod", name, namespace) or {}
        if pod.get("status", {}).get("phase") != "Succeeded":
            return None
        line = cluster.kubectl("logs", name, "-n", namespace).stdout.strip()
        return int(line.split()[-1], 16)

    as_root = wait_for(
        lambda: effective("as-root") is not None and effective("as-root"), 60, "root"
    )
    assert as_root & sys_nice, f"root holds SYS_NICE: CapEff {as_root:#x}"
    wait_for(lambda: effective("as-user") is not None, 60, "the non-root pod to finish")
    assert effective("as-user") == 0, "a non-root process holds no added capability"


@pytest.fixture
def release_namespaces(cluster: Cluster) -> Iterator[tuple[str, str, str]]:
    suffix = uuid.uuid4().hex[:6]
    system, watched = f"kimik3-real-{suffix}", f"llm-real-{suffix}"
    for ns in (system, watched):
        create_test_namespace(cluster, ns)
    name = f"kimik3-operator-{suffix}"
    yield name, system, watched
    helm(cluster, "uninstall", name, "-n", system, "--wait", check=False)
    for ns in (system, watched):
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_operator_image_from_the_chart_runs_as_a_pod(
    cluster: Cluster, real_node: RealNode, release_namespaces: tuple[str, str, str]
) -> None:
    timings = build_images(cluster.env, "operator", "kubectl")
    print(timings)
    name, system, watched = release_namespaces
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    started = time.monotonic()
    helm(
        cluster,
        "install",
        name,
        str(CHART),
        "-n",
        system,
        "--wait",
        "--timeout",
        "180s",
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "replicas=1",
        "--set",
        "leaderElection.enabled=false",
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--set-json",
        f"nodeSelector={json.dumps(real_node.placement()['nodeSelector'])}",
        "--set-json",
        f"tolerations={json.dumps(real_node.placement()['tolerations'])}",
        "--set-json",
        f"extraEnv={json.dumps(real_node.api_env())}",
        "--set",
        f"test.image.repository={KUBECTL_IMAGE.rsplit(':', 1)[0]}",
        "--set",
        f"test.image.tag={KUBECTL_IMAGE.rsplit(':', 1)[1]}",
        "--set",
        "test.image.pullPolicy=Never",
    )
    print(f"chart install to operator pod Ready: {time.monotonic() - started:.1f}s")
    pods = cluster.items("pod", system, f"app.kubernetes.io/instance={name}")
    assert len(pods) == 1
    pod = pods[0]
    pod_name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["spec"]["serviceAccountName"] == name

    # The chart's hardening holds in the running container.
    def exec_(*command: str) -> tuple[int, str]:
        result = cluster.kubectl("exec", pod_name, "-n", system, "--", *command, check=False)
        return result.returncode, (result.stdout + result.stderr).strip()

    assert exec_("id", "-u") == (0, "10001")
    assert exec_("id", "-g") == (0, "10001")
    code, output = exec_("touch", "/usr/local/written")
    assert code != 0 and "Read-only file system" in output
    assert exec_("python3", "-c", "import vllm")[0] != 0, "vLLM never ships in the operator"

    # The CLI its install steps put there, with the data it reads: a rendered deployment, and
    # the static preflight's refusal of the old image (exit code 2).
    def cli(example: str, *command: str) -> subprocess.CompletedProcess[str]:
        text = (ROOT / "examples" / example).read_text()
        return cluster.kubectl(
            "exec", "-i", pod_name, "-n", system, "--", "kimik3", *command, input=text, check=False
        )

    rendered = cli("kimi-k3-text-dspark.yaml", "render", "-f", "-")
    assert rendered.returncode == 0 and "kind: LeaderWorkerSet" in rendered.stdout, rendered
    verdict = cli("kimi-k3-text-dspark-old-vllm.yaml", "preflight", "-f", "-")
    assert verdict.returncode == 2 and "TargetLacksEagle3" in verdict.stdout, verdict

    # Its probes answer (the pod is Ready through /healthz) and so does its metrics port.
    ip = pod["status"]["podIP"]
    assert "kimik3_" in http_get(f"http://{ip}:8081/metrics")
    assert http_get(f"http://{ip}:8080/healthz")

    # It works, as its ServiceAccount: a resource in its namespace gets its children.
    cluster.apply(kimi("k3", **SMALL), watched)
    wait_for(
        lambda: cluster.get("leaderworkerset", "k3", watched),
        60,
        "the operator pod to create the LeaderWorkerSet",
        lambda: cluster.kubectl("logs", pod_name, "-n", system, check=False).stdout[-3000:],
    )
    logs = cluster.kubectl("logs", pod_name, "-n", system).stdout
    assert "Forbidden" not in logs and "Traceback" not in logs

    # `helm test` for real: its Job runs kubectl (no shell) on this node as its own
    # ServiceAccount, with only the access the chart gives it.
    started = time.monotonic()
    tested = helm(cluster, "test", name, "-n", system, "--timeout", "180s", "--logs")
    print(f"helm test: {time.monotonic() - started:.1f}s")
    assert "Succeeded" in tested.stdout, tested.stdout + tested.stderr
