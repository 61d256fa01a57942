"""The CRD on the real API server: accepted, documented, and rejecting bad specs at apply."""

from __future__ import annotations

import contextlib
import io
import pathlib
from typing import Any

import pytest
import yaml

from e2e.support.cluster import ROOT, Cluster, kimi
from kimik3_operator.cli import main

pytestmark = pytest.mark.kwok

BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    (
        "tp-not-whole-nodes",
        {"parallelism": {"tensor": 12}},
        "spec.parallelism: Invalid value: parallelism.tensor x parallelism.pipeline",
    ),
    (
        "draft-tp",
        {"drafter": {"draftTensorParallelSize": 4}},
        "spec.drafter.draftTensorParallelSize: Invalid value: drafter."
        "draftTensorParallelSize must be 1 or parallelism.tensor",
    ),
    (
        "none-with-repo",
        {"drafter": {"method": "none", "repo": "a/b"}},
        "drafter.repo is set while drafter.method is none",
    ),
    (
        "pvc-without-claim",
        {"model": {"source": {"pvc": {"path": "x"}}}},
        "spec.model.source.pvc.claimName: Required value",
    ),
    (
        "two-sources",
        {"model": {"source": {"huggingFace": {}, "pvc": {"claimName": "w"}}}},
        "model.source names both huggingFace and pvc",
    ),
    (
        "owned-flag",
        {"engine": {"extraArgs": ["--tensor-parallel-size=8"]}},
        "engine.extraArgs sets a flag the operator generates",
    ),
    (
        "owned-flag-underscores",
        {"engine": {"extraArgs": ["--tensor_parallel_size=4"]}},
        "engine.extraArgs spells a flag name with _",
    ),
    (
        "owned-flag-mixed",
        {"engine": {"extraArgs": ["--speculative_config.method=x"]}},
        "engine.extraArgs spells a flag name with _",
    ),
    (
        "owned-flag-dotted",
        {"engine": {"extraArgs": ["--speculative-config.num_speculative_tokens=64"]}},
        "engine.extraArgs sets a flag the operator generates",
    ),
    (
        "owned-flag-abbreviated",
        {"engine": {"extraArgs": ["--tensor-parallel=4"]}},
        "engine.extraArgs sets a flag the operator generates",
    ),
    (
        "owned-flag-separate",
        {"engine": {"extraArgs": ["--speculative-config", "{}"]}},
        "engine.extraArgs sets a flag the operator generates",
    ),
    (
        "bad-method",
        {"drafter": {"method": "medusa"}},
        'spec.drafter.method: Unsupported value: "medusa"',
    ),
    (
        "bad-architecture",
        {"model": {"architecture": "llama; rm -rf /"}},
        "spec.model.architecture: Invalid value",
    ),
    (
        "ngram-with-repo",
        {"drafter": {"method": "ngram", "repo": "a/b", "numSpeculativeTokens": 3}},
        "drafter.repo is set while drafter.method is ngram",
    ),
    (
        "ngram-without-tokens",
        {"drafter": {"method": "ngram"}},
        "drafter.method ngram needs numSpeculativeTokens",
    ),
    (
        "none-with-source",
        {"drafter": {"method": "none", "source": {"pvc": {"claimName": "d"}}}},
        "drafter.source is set while drafter.method is ngram or none",
    ),
    (
        "drafter-repo-and-source",
        {
            "drafter": {
                "method": "draft_model",
                "repo": "a/b",
                "source": {"pvc": {"claimName": "d"}},
            }
        },
        "drafter names both repo and source",
    ),
    (
        "drafter-path-outside",
        {
            "drafter": {
                "method": "draft_model",
                "source": {"pvc": {"claimName": "d", "path": "a b"}},
            }
        },
        "spec.drafter.source.pvc.path: Invalid value",
    ),
    (
        "zero-tp",
        {"parallelism": {"tensor": 0}},
        "spec.parallelism.tensor: Invalid value: 0: spec.parallelism.tensor in body should be "
        "greater than or equal to 1",
    ),
    (
        "memory-fraction",
        {"engine": {"gpuMemoryUtilization": 1.5}},
        "spec.engine.gpuMemoryUtilization: Invalid value",
    ),
    ("bad-mode", {"preflight": {"mode": "Maybe"}}, "spec.preflight.mode: Unsupported value"),
    (
        "topology-without-queue",
        {"scheduling": {"topology": {"required": "topology.kimik3.io/domain"}}},
        "scheduling.topology is placed by Kueue's topology-aware scheduling",
    ),
    (
        "two-topologies",
        {"scheduling": {"queueName": "q", "topology": {"required": "a", "preferred": "b"}}},
        "scheduling.topology takes exactly one of required and preferred",
    ),
    ("bad-queue", {"scheduling": {"queueName": "GPUs"}}, "spec.scheduling.queueName: Invalid"),
    (
        "kueue-pod-label",
        {"pod": {"labels": {"kueue.x-k8s.io/queue-name": "gpus"}}},
        "pod.labels sets a kueue.x-k8s.io/ key",
    ),
    ("negative-replicas", {"replicas": -1}, "spec.replicas: Invalid value: -1"),
    ("bad-version", {"engine": {"version": "latest"}}, "spec.engine.version: Invalid value"),
    (
        "spec-tokens",
        {"drafter": {"numSpeculativeTokens": 0}},
        "spec.drafter.numSpeculativeTokens: Invalid value: 0",
    ),
    (
        "root-but-non-root",
        {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}},
        "spec.securityContext.runAsUser: Invalid value: securityContext.runAsUser is 0 (root) "
        "while runAsNonRoot is true",
    ),
    (
        "negative-user",
        {"securityContext": {"runAsUser": -1}},
        "spec.securityContext.runAsUser: Invalid value: -1",
    ),
    ("cpu-limit", {"resources": {"cpuLimit": "lots"}}, "spec.resources.cpuLimit: Invalid value"),
    (
        "canary-window",
        {"rollout": {"canary": {"window": "7h"}}},
        'spec.rollout.canary.window: Invalid value: "7h": the canary window is at most 6h',
    ),
    (
        "env-both",
        {
            "engine": {
                "env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
            }
        },
        "an env entry takes value or valueFrom, not both",
    ),
    (
        "env-total",
        {"engine": {"env": [{"name": f"V{i}", "value": "x" * 30000} for i in range(3)]}},
        "the env values together are over 64 KiB",
    ),
    (
        "extra-args-total",
        {"engine": {"extraArgs": [f"--x{i}=" + "a" * 4000 for i in range(9)]}},
        "engine.extraArgs together are over 32 KiB",
    ),
    (
        "config-too-long",
        {"drafter": {"config": '{"a": "' + "x" * 33000 + '"}'}},
        "spec.drafter.config: Too long",
    ),
    ("typo-field", {"drafter": {"methd": "eagle3"}}, 'unknown field "spec.drafter.methd"'),
    ("typo-value", {"drafter": {"method": "eagel3"}}, "spec.drafter.method: Unsupported value"),
    ("wrong-type", {"replicas": "two"}, "spec.replicas: Invalid value"),
    (
        "pod-label-of-the-operator",
        {"pod": {"labels": {"app.kubernetes.io/instance": "other"}}},
        "pod.labels sets a label the operator or LeaderWorkerSet sets",
    ),
    (
        "pod-apparmor",
        {"pod": {"annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "x"}}},
        "pod.annotations sets an AppArmor or seccomp profile",
    ),
    (
        "pod-gpu-as-extra",
        {"pod": {"extraResources": {"nvidia.com/gpu": 8}}},
        "pod.extraResources names the GPU resource",
    ),
    (
        "pod-memory-as-extra",
        {"pod": {"extraResources": {"memory": "1"}}},
        "pod.extraResources names an extended resource",
    ),
    (
        "pod-fractional-resource",
        {"pod": {"extraResources": {"rdma/ib": "1.5"}}},
        "pod.extraResources takes whole numbers",
    ),
    (
        "pod-env-from-both",
        {"pod": {"envFrom": [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]}},
        "an envFrom entry takes one of configMapRef and secretRef",
    ),
    (
        "pod-host-path",
        {"pod": {"volumes": [{"name": "host", "hostPath": {"path": "/var"}}]}},
        "pod.volumes takes no hostPath",
    ),
    (
        "pod-volume-named-like-the-operators",
        {"pod": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
        "pod.volumes uses a name the operator's own volumes have",
    ),
    (
        "pod-mount-over-the-models",
        {
            "pod": {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/models"}],
            }
        },
        "pod.volumeMounts mounts at, above or below a path of the operator's",
    ),
    (
        "pod-mount-of-no-volume",
        {"pod": {"volumeMounts": [{"name": "x", "mountPath": "/etc/x"}]}},
        "pod.volumeMounts names a volume that spec.pod.volumes does not have",
    ),
    (
        "pd-with-canary",
        {"rollout": {"canary": {}}, "disaggregation": {}},
        "disaggregation cannot be combined with rollout.canary",
    ),
    (
        "pd-role-owned-flag",
        {"disaggregation": {"decode": {"extraArgs": ["--kv-transfer-config={}"]}}},
        "a role's extraArgs sets a flag the operator generates",
    ),
    (
        "pd-unknown-connector",
        {"disaggregation": {"connector": "Mooncake"}},
        'Unsupported value: "Mooncake"',
    ),
]

FLEET_POD = {
    "labels": {"team": "gpu", "cost-centre": "llm"},
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
    "runtimeClassName": "nvidia",
    "serviceAccountName": "weights-reader",
    "imagePullSecrets": [{"name": "registry"}],
    "extraResources": {"rdma/ib": 1},
    "envFrom": [{"configMapRef": {"name": "nccl"}}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"team": "other"}},
                    },
                }
            ]
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "fleet"}},
        }
    ],
    "volumes": [{"name": "nccl-topo", "configMap": {"name": "nccl-topology"}}],
    "volumeMounts": [{"name": "nccl-topo", "mountPath": "/etc/nccl", "readOnly": True}],
}


def render_on_the_server(
    cluster: Cluster, namespace: str, resource: dict[str, Any], tmp_path: pathlib.Path
) -> Any:
    """Every child `kimik3 render` makes of ``resource``, through the API server's dry run
    (its admission and the LeaderWorkerSet's own schema); the kubectl result."""
    path = tmp_path / "resource.yaml"
    path.write_text(yaml.safe_dump(resource))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["render", "-f", str(path), "-n", namespace]) == 0
    children = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=out.getvalue(),
        check=False,
    )  # fmt: skip
    assert children.returncode == 0, children.stderr
    return children


def test_a_fleets_pod_settings_are_accepted_and_render_what_the_api_server_admits(
    cluster: Cluster, namespace: str, tmp_path: pathlib.Path
) -> None:
    """The resource with every spec.pod field, and every child `kimik3 render` makes of it,
    pass the real API server's validation (dry run: the LeaderWorkerSet's own schema too)."""
    resource = kimi("fleet", pod=FLEET_POD, service={"annotations": {"lb.example/internal": "1"}})
    applied = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(resource),
        check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    children = render_on_the_server(cluster, namespace, resource, tmp_path)
    assert "leaderworkerset.leaderworkerset.x-k8s.io/fleet created (server dry run)" in (
        children.stdout
    )


def cli_exit(resource: dict[str, Any], tmp_path: pathlib.Path) -> int:
    """``kimik3 preflight -f`` on ``resource``, offline: 0 pass, 1 refused as input, 2 fail."""
    path = tmp_path / "resource.yaml"
    path.write_text(yaml.safe_dump(resource))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["preflight", "-f", str(path)])


@pytest.mark.parametrize(("case", "spec", "error"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_is_rejected_at_apply_naming_the_field_and_by_the_cli(
    cluster: Cluster,
    namespace: str,
    case: str,
    spec: dict[str, Any],
    error: str,
    tmp_path: pathlib.Path,
) -> None:
    """kubectl apply (strict field validation, the schema, its CEL rules) and the offline
    CLI refuse the same specs."""
    result = cluster.apply(kimi(case, **spec), namespace, check=False)
    assert result.returncode != 0, f"{case} was accepted"
    assert error in result.stderr, result.stderr
    assert cli_exit(kimi(case, **spec), tmp_path) in (1, 2), f"the CLI passed {case}"


def test_what_kubectl_apply_takes_the_cli_takes(
    cluster: Cluster, namespace: str, tmp_path: pathlib.Path
) -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        resource = yaml.safe_load(example.read_text())
        applied = cluster.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", str(example), check=False
        )
        assert applied.returncode == 0, applied.stderr
        assert cli_exit(resource, tmp_path) in (0, 2, 3), f"the CLI refused {example.name}"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("k" * 50, "metadata.name may have at most 49 characters"),
        ("k3.v2", "metadata.name must be a DNS-1035 label"),
        ("3k", "metadata.name must be a DNS-1035 label"),
    ],
)
def test_a_name_that_cannot_name_every_child_is_rejected(
    cluster: Cluster, namespace: str, name: str, error: str
) -> None:
    result = cluster.apply(kimi(name), namespace, check=False)
    assert result.returncode != 0, f"{name} was accepted"
    assert error in result.stderr, result.stderr


def test_the_longest_name_is_accepted(
    cluster: Cluster, namespace: str, tmp_path: pathlib.Path
) -> None:
    """49 characters: stored as given, and every child named after it (the longest is the
    probe's ConfigMap) passes the API server's own name rules."""
    name = "k" * 49
    resource = kimi(name, replicas=0, model={"cache": {}}, preflight={"probe": True})
    cluster.apply(resource, namespace)
    stored = cluster.get("kk3d", name, namespace)
    assert stored is not None and stored["metadata"]["name"] == name
    render_on_the_server(cluster, namespace, resource, tmp_path)
    cluster.kubectl("delete", "kk3d", name, "-n", namespace)


def test_defaults_are_applied_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    cluster.apply(kimi("defaults"), namespace)
    body = cluster.get("kk3d", "defaults", namespace)
    assert body is not None
    spec = body["spec"]
    assert spec["parallelism"] == {
        "tensor": 16,
        "pipeline": 1,
        "decodeContext": 1,
        "expert": False,
        "data": 1,
    }
    assert spec["drafter"]["method"] == "dspark"
    assert spec["model"]["source"] == {"huggingFace": {}}
    assert spec["preflight"] == {"mode": "Enforce", "probe": True}


def test_explain_documents_the_fields(cluster: Cluster) -> None:
    out = cluster.kubectl("explain", "kimik3deployment.spec.drafter").stdout
    assert "pairs the target with its known DSpark drafter" in out
    assert "numSpeculativeTokens" in out
    short = cluster.kubectl("explain", "kk3d.spec.parallelism.tensor").stdout
    assert "must divide the 96 attention heads" in short


def test_flags_the_operator_does_not_own_are_accepted(cluster: Cluster, namespace: str) -> None:
    args = ["--max-num-seqs", "5", "--compilation-config.level=3", "-O3", "--chat-template", "x_y"]
    result = cluster.apply(kimi("free-flags", engine={"extraArgs": args}), namespace, check=False)
    assert result.returncode == 0, result.stderr


def test_the_queue_is_fixed_once_the_deployment_exists(cluster: Cluster, namespace: str) -> None:
    """Kueue keeps a LeaderWorkerSet in the queue it was made in: the API server refuses
    a queue set, changed or removed later, naming the field and the way out."""
    cluster.apply(kimi("queued", scheduling={"queueName": "gpus"}), namespace)
    cluster.apply(kimi("plain"), namespace)
    for name, scheduling in (("queued", {"queueName": "other"}), ("plain", {"queueName": "gpus"})):
        result = cluster.apply(kimi(name, scheduling=scheduling), namespace, check=False)
        assert result.returncode != 0, f"{name}: the queue changed"
        assert "spec.scheduling.queueName: Forbidden" in result.stderr, result.stderr
        assert "delete and re-create the KimiK3Deployment" in result.stderr
    same = cluster.apply(kimi("queued", scheduling={"queueName": "gpus"}, replicas=2), namespace)
    assert same.returncode == 0
