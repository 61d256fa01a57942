"""Pod Security on the real API server: what the operator predicts for a namespace's enforced
level is what the API server's PodSecurity admission then does, and a namespace that would
refuse the pods gets PodSecurityRefused before any child exists.

Real: the API server and its PodSecurity admission, the LeaderWorkerSet and StatefulSet
controllers that create the pods. KWOK stands in for the GPU nodes' kubelets (admission
happens before any kubelet sees a pod)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from e2e.support.cluster import (
    ROOT,
    Cluster,
    OperatorProcess,
    create_test_namespace,
    kimi,
    wait_for,
)
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.pods import pod_specs
from kimik3_operator.controller.admission import predict
from kimik3_operator.observation.pod_security import ENFORCE_LABEL, LEVELS, Policy

pytestmark = pytest.mark.kwok

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SMALL = {
    "drafter": {"method": "dspark"},
    "engine": {"image": "vllm/vllm-openai:v0.33.0"},
    "preflight": {"probe": False},
}


def _example_specs() -> dict[str, dict[str, Any]]:
    """Each example, and the first one as an RDMA fabric needs it and as root."""
    specs = {p.stem: yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES}
    base = specs[EXAMPLES[0].stem]
    rdma = copy.deepcopy(base)
    rdma.setdefault("engine", {})["addCapabilities"] = ["IPC_LOCK", "SYS_NICE"]
    root = copy.deepcopy(base)
    root["securityContext"] = {"runAsNonRoot": False, "runAsUser": 0}
    return {**specs, "rdma": rdma, "root": root}


@pytest.fixture
def level_namespaces(cluster: Cluster) -> Iterator[dict[str, str]]:
    """One namespace per Pod Security level, each enforcing it."""
    made = {}
    for level in LEVELS:
        name = create_test_namespace(cluster, f"e2e-pss-{level[:4]}-{uuid.uuid4().hex[:6]}")
        cluster.kubectl("label", "namespace", name, f"{ENFORCE_LABEL}={level}")
        made[level] = name
    for name in made.values():
        # The ServiceAccount admission plugin refuses a pod until the namespace has one.
        wait_for(
            lambda name=name: cluster.get("serviceaccount", "default", name),
            30,
            f"the default ServiceAccount of {name}",
        )
    yield made
    for name in made.values():
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _admitted(cluster: Cluster, namespace: str, pod_spec: dict[str, Any]) -> tuple[bool, str]:
    """The API server's answer to creating this pod (a server-side dry run: every admission
    plugin runs, nothing is stored)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"probe-{uuid.uuid4().hex[:8]}"},
        "spec": pod_spec,
    }
    out = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(pod),
        check=False,
    )
    return out.returncode == 0, out.stderr


def test_the_prediction_is_what_podsecurity_admission_does(
    cluster: Cluster, level_namespaces: dict[str, str]
) -> None:
    # The fleet example names a RuntimeClass and a PriorityClass; their admission plugins
    # refuse a pod that names one that does not exist.
    for named in (
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "inference-high"},
            "value": 1000,
        },
    ):
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(named))
    compared = 0
    for case, raw in _example_specs().items():
        spec = parse_spec(raw)
        for level, namespace in level_namespaces.items():
            owner = Owner("k3", namespace, "uid-1")
            refusal = predict(spec, owner, Policy(level))
            refused_kinds = {what for what, _ in refusal.found} if refusal else set()
            for what, pod in pod_specs(spec, owner):
                admitted, error = _admitted(cluster, namespace, pod)
                if not admitted:
                    assert "violates PodSecurity" in error, f"{case}/{what}: {error}"
                assert admitted == (what not in refused_kinds), (
                    f"{case}: {what} in a {level} namespace: the API server "
                    f"{'admitted' if admitted else 'refused'} it ({error.strip()[:400]}), the "
                    f"operator predicted {'a refusal' if what in refused_kinds else 'admission'}"
                )
                compared += 1
    # Every case under every level, each of its kinds of pod.
    assert compared >= len(_example_specs()) * len(LEVELS) * 2
    # The examples meet restricted; RDMA's capabilities need privileged; root needs baseline.
    for case, needs in (("rdma", "privileged"), ("root", "baseline")):
        spec = parse_spec(_example_specs()[case])
        refusal = predict(spec, Owner("k3", "x", "u"), Policy("restricted"))
        assert refusal is not None and refusal.needed == needs


def test_a_restricted_namespace_runs_the_default_and_refuses_capabilities_before_any_child(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    wait_condition: Callable[..., dict[str, Any]],
) -> None:
    cluster.kubectl("label", "namespace", namespace, f"{ENFORCE_LABEL}=restricted")
    cluster.apply(kimi("plain", **SMALL), namespace)
    rdma = copy.deepcopy(SMALL)
    rdma["engine"] = {**SMALL["engine"], "addCapabilities": ["IPC_LOCK"]}
    cluster.apply(kimi("rdma", **rdma), namespace)

    # The default spec's pods pass the API server's restricted admission and run.
    wait_condition("plain", namespace, "Available", "True", "Available", timeout=120)
    pods = cluster.items("pods", namespace, "app.kubernetes.io/instance=plain")
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    body = wait_condition("rdma", namespace, "Degraded", "True", "PodSecurityRefused")
    message = next(c["message"] for c in body["status"]["conditions"] if c["type"] == "Degraded")
    assert f"namespace {namespace} enforces Pod Security restricted" in message
    assert "spec.engine.addCapabilities" in message and "IPC_LOCK" in message
    assert f"{ENFORCE_LABEL}=privileged" in message
    assert body["status"]["reason"] == "PodSecurityRefused"
    # Nothing was made for it: no group, no Job, no Service.
    for kind in ("lws", "jobs", "services"):
        mine = cluster.items(kind, namespace, "app.kubernetes.io/instance=rdma")
        assert mine == [], f"{kind} created for a spec the namespace refuses"
    events = cluster.events(namespace, "involvedObject.name=rdma,reason=PodSecurityRefused")
    assert "Warning" in {e["type"] for e in events}

    # Dropping the capabilities is the fix the message names: the same resource deploys.
    cluster.kubectl(
        "patch",
        "kk3d",
        "rdma",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"addCapabilities":[]}}}',
    )
    wait_for(
        lambda: cluster.get("lws", "rdma", namespace),
        60,
        "the LeaderWorkerSet once the capabilities are gone",
    )
