"""The acceptance-gated rollout on the real control plane: the real LeaderWorkerSet controller
updates only the groups at or above the partition the operator sets, and the operator
promotes or rolls back from what the leaders' metrics show.

Stand-ins: KWOK's pods run nothing, so every leader's /metrics is served by a fake vLLM
exporter (e2e/support/vllm_exporter.py, vLLM's metric names) whose acceptance follows the image of
the pod it answers for, as a drafter that suits one engine and not another would."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.support.cluster import Cluster, OperatorProcess, condition, describe, kimi, wait_for
from e2e.support.leaders import leaders, ready
from e2e.support.vllm_exporter import FakeLeader, serve_text

pytestmark = pytest.mark.kwok

OLD = "vllm/vllm-openai:v0.33.0"
NEW = "vllm/vllm-openai:v0.34.0"
GOOD = (0.9, 0.8, 0.7, 0.6)  # 75% of drafted tokens accepted
BAD = (0.1, 0.05, 0.0, 0.0)  # under 4%


class Fleet:
    """One fake leader per pod uid (counters start when the pod does); the acceptance of
    each follows (deployment, image) in ``quality``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.quality: dict[tuple[str, str], tuple[float, ...]] = {}
        self.leaders: dict[str, FakeLeader] = {}
        self.lock = threading.Lock()

    def exposition(self, namespace: str, pod_name: str) -> str | None:
        pod = self.cluster.get("pod", pod_name, namespace)
        if pod is None:
            return None
        deployment = pod["metadata"]["labels"].get("app.kubernetes.io/instance", "")
        image = pod["spec"]["containers"][0]["image"]
        with self.lock:
            leader = self.leaders.get(pod["metadata"]["uid"])
            if leader is None:
                per_position = self.quality.get((deployment, image), GOOD)
                leader = FakeLeader(per_position=per_position, drafts_per_second=20.0)
                self.leaders[pod["metadata"]["uid"]] = leader
        return leader.exposition()


@pytest.fixture
def fleet(cluster: Cluster) -> Iterator[tuple[Fleet, int]]:
    fleet = Fleet(cluster)

    def text_for(path: str) -> str | None:
        _, namespace, pod = path.split("/", 2)
        return fleet.exposition(namespace, pod)

    server = serve_text(text_for)
    yield fleet, server.server_address[1]
    server.shutdown()


@pytest.fixture
def canary_operator(
    cluster: Cluster, namespace: str, fleet: tuple[Fleet, int]
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(
        cluster,
        namespace,
        extra_env={
            "KIMIK3_SCRAPE_URL": f"http://127.0.0.1:{fleet[1]}/{{namespace}}/{{pod}}",
            "KIMIK3_SCRAPE_SECONDS": "1",
            "KIMIK3_ACCEPTANCE_WINDOW_SECONDS": "5",
            "KIMIK3_RESYNC_SECONDS": "2",
        },
        label="-canary",
    )
    operator.start()
    yield operator
    operator.stop()


def spec() -> dict[str, Any]:
    return {
        "replicas": 2,
        "drafter": {"method": "dspark"},
        "engine": {"image": OLD},
        "parallelism": {"tensor": 8},
        "preflight": {"probe": False},
        "rollout": {"canary": {"window": "10s", "minAcceptanceRate": 0.5}},
    }


def start(cluster: Cluster, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    cluster.apply(kimi(name, **spec()), namespace)
    explain: Callable[[], str] = lambda: describe(cluster, name, namespace)  # noqa: E731

    def both_ready() -> dict[int, dict[str, Any]] | None:
        found = leaders(cluster, namespace, name)
        return found if len(found) == 2 and all(ready(p) for p in found.values()) else None

    pods: dict[int, dict[str, Any]] = wait_for(both_ready, 120, "two Ready groups", explain)
    return pods


def change_image(cluster: Cluster, namespace: str, name: str) -> float:
    patch = {"spec": {"engine": {"image": NEW}}}
    cluster.kubectl("patch", "kk3d", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    return time.monotonic()


def rollout(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = cluster.get("kk3d", name, namespace) or {}
    section: dict[str, Any] = body.get("status", {}).get("rollout") or {}
    return section


def test_a_change_that_lowers_acceptance_is_rolled_back_on_the_canary_group_only(
    cluster: Cluster,
    namespace: str,
    fleet: tuple[Fleet, int],
    canary_operator: OperatorProcess,
) -> None:
    fleet[0].quality[("worse", NEW)] = BAD
    before = start(cluster, namespace, "worse")
    stable_uid = before[0]["metadata"]["uid"]
    explain: Callable[[], str] = lambda: describe(cluster, "worse", namespace)  # noqa: E731
    changed = change_image(cluster, namespace, "worse")
    seen_stable: set[str] = set()

    def canary_on_new() -> bool:
        pods = leaders(cluster, namespace, "worse")
        seen_stable.update(p["metadata"]["uid"] for g, p in pods.items() if g == 0)
        lws = cluster.get("lws", "worse", namespace) or {}
        partition = lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"]
        return (
            partition == 1
            and 1 in pods
            and pods[1]["spec"]["containers"][0]["image"] == NEW
            and ready(pods[1])
        )

    wait_for(canary_on_new, 120, "group 1 on the new image, group 0 held by the partition", explain)
    canary_at = time.monotonic() - changed
    assert leaders(cluster, namespace, "worse")[0]["spec"]["containers"][0]["image"] == OLD

    def rolled_back() -> dict[str, Any] | None:
        pods = leaders(cluster, namespace, "worse")
        seen_stable.update(p["metadata"]["uid"] for g, p in pods.items() if g == 0)
        section = rollout(cluster, namespace, "worse")
        return section if section.get("phase") == "RolledBack" else None

    section = wait_for(rolled_back, 120, "the canary rolled back", explain)
    decided_at = time.monotonic() - changed

    def restored() -> bool:
        pods = leaders(cluster, namespace, "worse")
        seen_stable.update(p["metadata"]["uid"] for g, p in pods.items() if g == 0)
        images = {p["spec"]["containers"][0]["image"] for p in pods.values()}
        return len(pods) == 2 and images == {OLD} and all(ready(p) for p in pods.values())

    wait_for(restored, 120, "both groups on the old image again", explain)
    restored_at = time.monotonic() - changed
    print(
        f"canary Ready {canary_at:.1f}s after the change, rolled back at {decided_at:.1f}s, "
        f"both groups on the old pods at {restored_at:.1f}s; {section}"
    )
    # Group 0 never restarted: one pod, the same uid, all along.
    assert seen_stable == {stable_uid}
    assert section["canaryGroups"] == [1] and section["decision"] == "RolledBack"
    assert section["canaryAcceptance"] < 0.05 and section["stableAcceptance"] > 0.7
    assert f"engine.image: {OLD} -> {NEW}" in section["change"]
    body = cluster.get("kk3d", "worse", namespace)
    verified = condition(body, "CanaryVerified")
    assert (verified["status"], verified["reason"]) == ("False", "CanaryRolledBack")
    assert NEW in verified["message"] and "below the bar 0.5" in verified["message"]
    events = cluster.events(namespace, "reason=CanaryRolledBack")
    warnings = [e for e in events if e["type"] == "Warning"]
    assert warnings and "CanaryVerified=False" in warnings[0]["message"]
    wide = cluster.kubectl("get", "kk3d", "worse", "-n", namespace, "-o", "wide").stdout
    assert "ROLLOUT" in wide.splitlines()[0] and "RolledBack" in wide.splitlines()[1]
    shown = subprocess.run(
        [sys.executable, "-m", "kimik3_operator", "status", "worse", "-n", namespace],
        capture_output=True,
        text=True,
        env=cluster.env,
        check=True,
    ).stdout
    assert "Rollout: RolledBack  canary group(s) 1" in shown, shown
    # The refused change stays refused: the spec still asks for it, the groups stay old.
    time.sleep(6)
    pods = leaders(cluster, namespace, "worse")
    assert {p["spec"]["containers"][0]["image"] for p in pods.values()} == {OLD}
    assert pods[0]["metadata"]["uid"] == stable_uid


def test_a_change_that_keeps_acceptance_is_promoted_to_every_group(
    cluster: Cluster,
    namespace: str,
    fleet: tuple[Fleet, int],
    canary_operator: OperatorProcess,
) -> None:
    fleet[0].quality[("better", OLD)] = BAD  # the new image lifts acceptance
    start(cluster, namespace, "better")
    explain: Callable[[], str] = lambda: describe(cluster, "better", namespace)  # noqa: E731
    changed = change_image(cluster, namespace, "better")

    def promoted() -> dict[str, Any] | None:
        section = rollout(cluster, namespace, "better")
        return section if section.get("decision") == "Promoted" else None

    section = wait_for(promoted, 150, "the canary promoted", explain)
    decided_at = time.monotonic() - changed

    def complete() -> dict[str, Any] | None:
        section = rollout(cluster, namespace, "better")
        pods = leaders(cluster, namespace, "better")
        images = {p["spec"]["containers"][0]["image"] for p in pods.values()}
        done = section.get("phase") == "Complete" and images == {NEW} and len(pods) == 2
        return section if done else None

    final = wait_for(complete, 150, "every group on the new image", explain)
    print(
        f"promoted {decided_at:.1f}s after the change, complete at "
        f"{time.monotonic() - changed:.1f}s; {final}"
    )
    assert section["canaryAcceptance"] > 0.7 and section["stableAcceptance"] < 0.05
    lws = cluster.get("lws", "better", namespace) or {}
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] == 0
    verified = condition(cluster.get("kk3d", "better", namespace), "CanaryVerified")
    assert (verified["status"], verified["reason"]) == ("True", "CanaryPromoted")
