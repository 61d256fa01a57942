"""The preflight on the real control plane: refusal before any GPU pod, the fix that
deploys, and the image probe as a real Job whose container's part the test plays (KWOK runs
no container: the test writes the report the real probe printed for vllm 0.33.0, recorded in
operator/tests/fixtures and checked against a live run in the vllm tier)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from e2e.support.cluster import (
    RUN,
    Cluster,
    OperatorProcess,
    cache_volume,
    condition,
    play_download,
    wait_for,
)
from e2e.support.play_probe import play

pytestmark = pytest.mark.kwok

ROOT = pathlib.Path(__file__).resolve().parents[1]


def example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return loaded


def test_incompatible_example_is_refused_before_any_gpu_then_fixed(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    bad = example("kimi-k3-text-dspark-old-vllm.yaml")
    name = bad["metadata"]["name"]
    cluster.apply(bad, namespace)
    body = wait_condition(name, namespace, "CapabilitiesVerified", "False", "TargetLacksEagle3")
    message = condition(body, "CapabilitiesVerified")["message"]
    assert "vLLM 0.28.0 fixed it on nvidia" in message
    assert body["status"]["reason"] == "TargetLacksEagle3"
    assert condition(body, "DrafterPaired")["reason"] == "AutoPaired"
    assert cluster.get("lws", name, namespace) is None
    assert cluster.items("pods", namespace) == []
    posted = cluster.events(namespace, "reason=TargetLacksEagle3")
    assert posted, "an event for the failure"
    assert {e["type"] for e in posted} == {"Warning"}, "a refusal is a Warning, never Normal"
    table = cluster.kubectl("get", "kk3d", name, "-n", namespace).stdout
    assert "TargetLacksEagle3" in table

    cluster.kubectl(
        "patch",
        "kk3d",
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                    "preflight": {"probe": False},
                }
            }
        ),
    )
    body = wait_condition(name, namespace, "Available", "True", "Available", timeout=120)
    assert condition(body, "CapabilitiesVerified")["status"] == "True"
    assert condition(body, "Degraded")["status"] == "False"


def test_a_drafter_its_method_cannot_load_is_refused_with_a_warning(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    resource = example("kimi-k3-text-dspark.yaml")
    resource["spec"]["drafter"]["method"] = "eagle3"
    resource["spec"]["preflight"] = {"probe": False}
    name = resource["metadata"]["name"]
    cluster.apply(resource, namespace)
    reason = "DrafterArchitectureUnsupportedByMethod"
    body = wait_condition(name, namespace, "DrafterPaired", "False", reason)
    message = condition(body, "DrafterPaired")["message"]
    assert "Eagle3K3DSparkModel" in message and "drafter.method: dspark" in message
    assert cluster.get("lws", name, namespace) is None
    assert {e["type"] for e in cluster.events(namespace, f"reason={reason}")} == {"Warning"}


def test_a_drafter_config_given_in_the_spec_is_judged_before_any_child(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    """spec.drafter.config: a DSpark config.json whose options vLLM's config class refuses
    is refused from the spec alone, before the probe Job, the cache or any group."""
    from e2e.support.k3_configs import DRAFTER_CONFIG

    resource = example("kimi-k3-text-dspark.yaml")
    drafter = {**DRAFTER_CONFIG, "mla_use_output_gate": True}
    resource["spec"]["drafter"]["config"] = json.dumps(drafter)
    name = resource["metadata"]["name"]
    cluster.apply(resource, namespace)
    body = wait_condition(name, namespace, "DrafterPaired", "False", "DrafterConfigRefused")
    message = condition(body, "DrafterPaired")["message"]
    assert "spec.drafter.config" in message and "mla_use_output_gate" in message
    assert cluster.get("lws", name, namespace) is None
    assert cluster.items("jobs", namespace) == []
    assert {e["type"] for e in cluster.events(namespace, "reason=DrafterConfigRefused")} == {
        "Warning"
    }


def test_image_probe_job_then_report_then_deploy(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
    volumes: list[str],
) -> None:
    resource = example("kimi-k3-text-dspark.yaml")
    name = resource["metadata"]["name"]
    cluster.apply(resource, namespace)
    wait_condition(name, namespace, "CapabilitiesVerified", "Unknown", timeout=60)
    jobs = cluster.items("jobs", namespace)
    assert len(jobs) == 1
    job = jobs[0]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.33.0"
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    assert cluster.get("lws", name, namespace) is None, "no GPU pod before the probe answers"

    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    os.environ["PATH"] = cluster.env["PATH"]
    play(namespace)
    # The example fills a model cache first: a volume for its claim, and on KWOK, where no
    # container runs, the download's report played into its finished pod.
    claim = f"{name}-model-cache"
    cache_volume(cluster, namespace, claim, RUN / "volumes" / namespace, capacity="2Ti")
    volumes.append(namespace)
    key = wait_for(
        lambda: (
            (cluster.get("kk3d", name, namespace) or {}).get("status", {}).get("modelCache") or {}
        ).get("key"),
        60,
        "the example's download Job",
    )
    report = {
        "phase": "Ready",
        "bytesTotal": 1000,
        "repos": [{"repo": "moonshotai/Kimi-K3", "commit": "a" * 40}],
    }
    play_download(cluster, namespace, key, report)
    body = wait_condition(name, namespace, "Available", "True", "Available", timeout=120)
    caps = body["status"]["capabilities"]
    assert caps["source"] == "Probe"
    assert caps["vllmVersion"] == "0.33.0"
    assert caps["supportsEagle3"] is True
    assert body["status"]["modelCache"]["phase"] == "Ready"
    assert condition(body, "CapabilitiesVerified")["status"] == "True"
