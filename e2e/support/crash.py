"""The seed's crash on the real nodes: the gemma target and a random EAGLE3 head, the probe's
refusal, the parked deployment."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from e2e.support.cluster import Cluster, OperatorProcess, condition, describe, kimi, wait_for
from e2e.support.fake_hub import FakeHub
from e2e.support.real_node import RealNode
from e2e.support.serving import forget_model_volume, model_volume, serving_spec

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


def gemma_spec(node: RealNode) -> dict[str, Any]:
    spec: dict[str, Any] = serving_spec(node)
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
