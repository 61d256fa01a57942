"""Prefill/decode disaggregation on the real control plane: the operator, run with the
chart's RBAC and admission policy, makes a DisaggregatedSet; the real LeaderWorkerSet
controller (v0.9.0, built from its module) makes a LeaderWorkerSet per role, and the real
StatefulSet controller and scheduler place the pods on KWOK GPU nodes (fake: no kubelet, no
GPU, no vLLM).

Stand-ins (e2e/support/epp.py, vllm_exporter.py): each leader's vLLM is a model server on
its pod IP (added to the loopback interface), whose drafter's acceptance the operator reads
from that address as it reads a real leader's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.support.chart import FAST_READS, chart_operator
from e2e.support.cluster import (
    Cluster,
    OperatorProcess,
    condition,
    kimi,
    wait_for,
)
from e2e.support.epp import ModelServer, install_crds, remove_crds
from e2e.support.vllm_exporter import FakeLeader

pytestmark = pytest.mark.kwok

NAME = "pd"
GOOD = (0.9, 0.8, 0.7, 0.6)
# The drafter guessing without the prefill side's state: the silent loss the condition names.
LOST = (0.2, 0.05, 0.0, 0.0)
DS_LABEL = "disaggregatedset.x-k8s.io/name"


@pytest.fixture(scope="module")
def inference_crds(cluster: Cluster) -> Iterator[None]:
    install_crds(cluster)
    yield
    remove_crds(cluster)


@pytest.fixture
def pd_operator(
    cluster: Cluster, inference_crds: None
) -> Iterator[tuple[OperatorProcess, str, str]]:
    with chart_operator(
        cluster,
        "-pd",
        lambda release: {**FAST_READS, "KIMIK3_EPP_CLUSTER_ROLE": f"{release}-endpoint-picker"},
    ) as running:
        yield running


def spec() -> dict[str, Any]:
    return {
        "drafter": {"method": "dspark"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "placement": {"gpusPerNode": 2},
        "parallelism": {"tensor": 2},
        "preflight": {"probe": False},
        # llm-d's P/D router over both roles' leaders (its Deployment lands on a KWOK node).
        "routing": {},
        "disaggregation": {
            # A two-node prefill group, two one-node decode groups: few GPUs, so the test
            # fits beside what other tests of the tier hold.
            "prefill": {"replicas": 1, "parallelism": {"tensor": 4}},
            "decode": {"replicas": 2},
        },
    }


def pods_by_role(cluster: Cluster, namespace: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
    for pod in cluster.items("pods", namespace, f"app.kubernetes.io/instance={NAME}"):
        role = pod["metadata"]["labels"].get("serving.kimik3.io/role")
        if role in found and not pod["metadata"].get("deletionTimestamp"):
            found[role].append(pod)
    return found


def status_of(cluster: Cluster, namespace: str) -> str:
    return json.dumps((cluster.get("kk3d", NAME, namespace) or {}).get("status"))[-3000:]


def test_a_disaggregated_deployment_runs_both_roles_from_one_set(
    cluster: Cluster, pd_operator: tuple[OperatorProcess, str, str]
) -> None:
    operator, namespace, _ = pd_operator
    cluster.apply(kimi(NAME, **spec()), namespace)
    servers: dict[str, ModelServer] = {}
    try:
        wait_for(
            lambda: (
                condition(cluster.get("kk3d", NAME, namespace), "Disaggregated").get("status")
                == "True"
            ),
            180,
            "Disaggregated=True: both roles' groups ready",
            lambda: status_of(cluster, namespace),
        )
        body = cluster.get("kk3d", NAME, namespace) or {}
        status = body["status"]
        assert condition(body, "Available")["status"] == "True"
        roles = {r["name"]: r for r in status["disaggregation"]["roles"]}
        assert (roles["prefill"]["readyReplicas"], roles["decode"]["readyReplicas"]) == (1, 2)
        assert status["ready"] == "2/2", "the decode side's groups are the deployment's"

        # The operator made the set; LeaderWorkerSet's controller made a set per role.
        ds = cluster.get("disaggregatedset", NAME, namespace) or {}
        assert ds["metadata"]["ownerReferences"][0]["kind"] == "KimiK3Deployment"
        sets = cluster.items("lws", namespace, f"{DS_LABEL}={NAME}")
        by_role = {s["metadata"]["labels"]["disaggregatedset.x-k8s.io/role"]: s for s in sets}
        assert sorted(by_role) == ["decode", "prefill"]
        assert by_role["prefill"]["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert by_role["decode"]["spec"]["replicas"] == 2
        assert cluster.get("lws", NAME, namespace) is None, "no LeaderWorkerSet of its own"

        pods = pods_by_role(cluster, namespace)
        assert (len(pods["prefill"]), len(pods["decode"])) == (2, 2)
        for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            for pod in pods[role]:
                container = pod["spec"]["containers"][0]
                args = container["args"]
                config = json.loads(args[args.index("--kv-transfer-config") + 1])
                assert config["kv_role"] == kv_role
                env = {e["name"]: e for e in container["env"]}
                host = env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]
                assert host["fieldPath"] == "status.podIP"

        # The Service answers from the decode leaders only.
        service = cluster.get("service", NAME, namespace) or {}
        assert service["spec"]["selector"]["serving.kimik3.io/role"] == "decode"
        decode_leaders = {
            p["status"]["podIP"]
            for p in pods["decode"]
            if p["metadata"]["labels"]["app.kubernetes.io/component"] == "leader"
        }

        def endpoints() -> set[str]:
            slices = cluster.items(
                "endpointslices", namespace, f"kubernetes.io/service-name={NAME}"
            )
            return {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}

        wait_for(lambda: endpoints() == decode_leaders, 60, "the Service's endpoints")
        # ... on their routing sidecars' port, the engines' moved behind them.
        for pod in pods["decode"]:
            if pod["metadata"]["labels"]["app.kubernetes.io/component"] != "leader":
                continue
            (sidecar,) = pod["spec"]["initContainers"]
            assert sidecar["name"] == "routing-proxy" and sidecar["restartPolicy"] == "Always"
            assert "--vllm-port=8200" in sidecar["args"]
        ports = {
            p["port"]
            for s in cluster.items(
                "endpointslices", namespace, f"kubernetes.io/service-name={NAME}"
            )
            for p in s.get("ports") or []
        }
        assert ports == {8000}, ports

        # The P/D router: llm-d's image and profiles, one pool of both roles' routable
        # leaders, each leader labelled by its own role's decision.
        picker = cluster.get("deployment", f"{NAME}-epp", namespace) or {}
        image = picker["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
        config = cluster.get("configmap", f"{NAME}-epp", namespace) or {}
        assert "kind: EndpointPickerConfig" in config["data"]["config.yaml"]
        assert "decode-filter" in config["data"]["config.yaml"]
        pool = cluster.get("inferencepool", NAME, namespace) or {}
        assert "serving.kimik3.io/role" not in pool["spec"]["selector"]["matchLabels"]

        def routable() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {}
            for role, members in pods_by_role(cluster, namespace).items():
                found[role] = sorted(
                    p["metadata"]["labels"].get("serving.kimik3.io/routable", "")
                    for p in members
                    if p["metadata"]["labels"]["app.kubernetes.io/component"] == "leader"
                )
            return found

        wait_for(
            lambda: routable() == {"prefill": ["true"], "decode": ["true", "true"]},
            60,
            "each role's leaders routable",
            lambda: json.dumps(routable()),
        )
        section = (cluster.get("kk3d", NAME, namespace) or {})["status"]["routing"]
        assert section["routableGroups"] == 3 and sorted(section["roles"]) == ["decode", "prefill"]

        # The decode side accepts far less than the deployment's floor: a transfer that lost
        # the drafter's state, which nothing else shows (the answers keep coming).
        for role, pattern in (("prefill", GOOD), ("decode", LOST)):
            for pod in pods[role]:
                address = pod["status"]["podIP"]
                if pod["metadata"]["labels"]["app.kubernetes.io/component"] != "leader":
                    continue
                # A decode leader's engine serves behind its routing sidecar, on 8200.
                port = 8200 if role == "decode" else 8000
                server = ModelServer(address, port, leader=FakeLeader(per_position=pattern))
                server.start()
                servers[address] = server
        wait_for(
            lambda: (
                condition(cluster.get("kk3d", NAME, namespace), "TransferIntegrity").get("reason")
                == "DrafterStateNotTransferred"
            ),
            90,
            "TransferIntegrity=False, DrafterStateNotTransferred",
            lambda: status_of(cluster, namespace),
        )
        message = condition(cluster.get("kk3d", NAME, namespace), "TransferIntegrity")["message"]
        assert "spec.monitoring.minAcceptanceRate" in message

        # The chart's fence holds the operator's token to hardened pods in a set too.
        privileged = json.loads(json.dumps(ds))
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
            privileged["metadata"].pop(key, None)
        privileged.pop("status", None)
        pod_spec = privileged["spec"]["roles"][1]["spec"]["leaderWorkerTemplate"]["workerTemplate"][
            "spec"
        ]
        pod_spec["containers"][0]["securityContext"]["privileged"] = True
        refused = subprocess.run(
            [
                str(cluster.bin_dir / "kubectl"),
                "--kubeconfig",
                str(operator.kubeconfig),
                "apply",
                "--server-side",
                "--dry-run=server",
                "--force-conflicts",
                "--field-manager=kimik3-operator",
                "-f",
                "-",
            ],
            input=yaml.safe_dump(privileged),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "are not privileged" in refused.stdout + refused.stderr

        # Back to aggregated serving: the set goes, the deployment's own set comes back.
        plain = spec()
        del plain["disaggregation"]
        plain["parallelism"] = {"tensor": 2}
        cluster.apply(kimi(NAME, **plain), namespace)
        wait_for(
            lambda: (
                cluster.get("disaggregatedset", NAME, namespace) is None
                and cluster.get("lws", NAME, namespace) is not None
                and "disaggregation"
                not in ((cluster.get("kk3d", NAME, namespace) or {}).get("status") or {})
            ),
            120,
            "the set deleted, the LeaderWorkerSet made, status.disaggregation gone",
            lambda: status_of(cluster, namespace),
        )
        body = cluster.get("kk3d", NAME, namespace) or {}
        types = {x["type"] for x in body["status"]["conditions"]}
        assert not types & {"Disaggregated", "TransferIntegrity"}
    finally:
        for server in servers.values():
            server.stop()
