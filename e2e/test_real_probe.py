"""The image probe run for real: the operator's preflight Job runs on the real node in an
image holding the real vLLM 0.33.0 package (CPU use only, as the probe needs), reads the
target's and the drafter's config.json from a local fake Hub (HF_ENDPOINT), and its report
decides CapabilitiesVerified, the same report the KWOK tests replay from the fixture.

Stood in for: the registry (the image is built by buildah on a local Debian base and loaded
into containerd) and the Hub (e2e/fake_hub.py serves the two config.json files)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.conftest import ROOT, Cluster, OperatorProcess, describe, kimi, wait_for
from e2e.fake_hub import FakeHub
from e2e.k3_configs import DRAFTER_CONFIG, TARGET_CONFIG
from e2e.real_node import SETTINGS, RealNode, build_images, start_real_node

VLLM_IMAGE = SETTINGS["VLLM_IMAGE"]
FIXTURE = ROOT / "operator" / "tests" / "fixtures" / "probe-report-vllm-0.33.0-nvidia.json"


@pytest.fixture
def hub_with_configs(cluster: Cluster) -> Iterator[tuple[RealNode, FakeHub]]:
    node = start_real_node(cluster.env)
    hub = FakeHub(host=node.host_address)
    hub.add_repo("moonshotai/Kimi-K3", {"config.json": json.dumps(TARGET_CONFIG).encode()})
    hub.add_repo(
        "RedHatAI/Kimi-K3-speculator.dspark",
        {"config.json": json.dumps(DRAFTER_CONFIG).encode()},
    )
    hub.start()
    yield node, hub
    hub.stop()


def test_the_probe_runs_in_the_real_vllm_image(
    cluster: Cluster, namespace: str, hub_with_configs: tuple[RealNode, FakeHub]
) -> None:
    node, hub = hub_with_configs
    print(build_images(cluster.env, "vllm"))
    operator = OperatorProcess(cluster, namespace)
    operator.start()
    try:
        started = time.monotonic()
        spec = {
            "engine": {
                "image": VLLM_IMAGE,
                "env": [{"name": "HF_ENDPOINT", "value": hub.url}],
            },
            # Two nodes per group, as the recorded report: a leader and a worker command line.
            "parallelism": {"tensor": 16},
            "placement": {"jobs": node.placement()},
            "preflight": {"probe": True},
        }
        cluster.apply(kimi("k3", **spec), namespace)

        def verified() -> dict[str, Any] | None:
            body = cluster.get("kk3d", "k3", namespace) or {}
            capabilities = (body.get("status") or {}).get("capabilities") or {}
            return body if capabilities.get("source") == "Probe" else None

        body = wait_for(
            verified, 600, "the real probe's report", lambda: describe(cluster, "k3", namespace)
        )
        print(f"apply to probed capabilities: {time.monotonic() - started:.1f}s")
        conditions = {c["type"]: c for c in body["status"]["conditions"]}
        assert conditions["CapabilitiesVerified"]["status"] == "True"
        assert conditions["DrafterPaired"]["status"] == "True"
        pods = cluster.items("pod", namespace, "app.kubernetes.io/component=preflight")
        assert [p["spec"]["nodeName"] for p in pods] == [node.name]
        assert pods[0]["spec"]["containers"][0]["image"] == VLLM_IMAGE

        # The live report is the one the KWOK tests replay.
        live = body["status"]["capabilities"]["probe"]["report"]
        assert live["vllmVersion"] == "0.33.0"
        assert live["targetConfig"]["num_attention_heads"] == 96
        assert live["drafterConfig"]["architectures"] == ["K3DSparkModel"]
        recorded = json.loads(FIXTURE.read_text())
        skip = ("targetConfig", "drafterConfig")
        assert {k: v for k, v in live.items() if k not in skip} == {
            k: v for k, v in recorded.items() if k not in skip
        }
        assert any(path.startswith("/moonshotai/Kimi-K3/resolve/") for path in hub.requested), (
            "the probe read the target's config.json from the Hub"
        )
        wait_for(
            lambda: cluster.get("leaderworkerset", "k3", namespace),
            60,
            "the LeaderWorkerSet after the probe passed",
        )
        assert "Traceback" not in operator.log.read_text()
    finally:
        operator.stop()
