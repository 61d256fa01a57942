"""Each builder field a user relies on, stated explicitly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import spec_of
from kimik3_operator.api.constants import SPEC_HASH_ANNOTATION, TEMPLATE_HASH_LABEL
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.children import Part, desired_children
from kimik3_operator.builders.command import serve_args
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.health_checks import startup_budget_seconds
from kimik3_operator.builders.leaderworkerset import build_leader_worker_set
from kimik3_operator.builders.podmonitor import build_pod_monitor
from kimik3_operator.builders.service import build_service

# The LeaderWorkerSet, its Service and PodMonitor.
SERVED: tuple[Part, ...] = ("groups", "serving")

OWNER = Owner("k3", "llm", "uid-1")


def lws_of(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    return build_leader_worker_set(spec, OWNER, spec.paired_drafter)


def container(template: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = template["spec"]["containers"][0]
    return found


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_two_node_group_for_tp16_on_8_gpu_nodes() -> None:
    lws = lws_of(spec_of())
    spec = lws["spec"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert spec["replicas"] == 1
    assert spec["startupPolicy"] == "LeaderCreated"
    # LWS's headless Services go per group, leaving <name> to the leaders' Service.
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1, "partition": 0},
    }


def test_leader_and_worker_commands_differ_in_rank_and_headless() -> None:
    tmpl = lws_of(spec_of())["spec"]["leaderWorkerTemplate"]
    leader, worker = container(tmpl["leaderTemplate"]), container(tmpl["workerTemplate"])
    assert leader["command"][:2] == ["python3", "-c"]
    assert leader["command"][3:] == ["vllm", "serve"], "vllm serve under the launcher"
    la, wa = leader["args"], worker["args"]
    assert la[0] == wa[0] == "moonshotai/Kimi-K3"
    assert flag(la, "--tensor-parallel-size") == "16"
    assert flag(la, "--pipeline-parallel-size") == "1"
    assert flag(la, "--nnodes") == flag(wa, "--nnodes") == "$(LWS_GROUP_SIZE)"
    assert flag(la, "--master-addr") == flag(wa, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert flag(la, "--node-rank") == "0"
    assert flag(wa, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert "--headless" in wa and "--headless" not in la
    assert flag(la, "--served-model-name") == "moonshotai/Kimi-K3"
    assert flag(la, "--port") == "8000"
    assert [a for a in la if a not in ("0", "$(LWS_WORKER_INDEX)", "--headless")] == [
        a for a in wa if a not in ("0", "$(LWS_WORKER_INDEX)", "--headless")
    ]


def test_speculative_config_names_the_method_explicitly() -> None:
    args = serve_args(spec_of(), spec_of().paired_drafter, "leader")
    config = json.loads(flag(args, "--speculative-config") or "{}")
    assert config == {
        "method": "dspark",
        "model": "RedHatAI/Kimi-K3-speculator.dspark",
        "num_speculative_tokens": 8,
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
    }


def test_given_drafter_settings_pass_through() -> None:
    spec = spec_of(
        drafter={
            "method": "eagle3",
            "repo": "me/eagle",
            "revision": "v2",
            "numSpeculativeTokens": 3,
            "draftTensorParallelSize": 1,
        }
    )
    config = json.loads(
        flag(serve_args(spec, spec.paired_drafter, "leader"), "--speculative-config") or "{}"
    )
    assert config == {
        "method": "eagle3",
        "model": "me/eagle",
        "revision": "v2",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1,
    }


def test_no_drafter_means_no_speculative_config() -> None:
    spec = spec_of(drafter={"method": "none"})
    assert "--speculative-config" not in serve_args(spec, spec.paired_drafter, "leader")


def test_single_node_group_has_no_multi_node_flags() -> None:
    spec = spec_of(parallelism={"tensor": 8})
    tmpl = lws_of(spec)["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 1
    assert "leaderTemplate" not in tmpl
    args = container(tmpl["workerTemplate"])["args"]
    for multi in ("--nnodes", "--node-rank", "--master-addr", "--headless"):
        assert multi not in args
    # the single pod is the leader: it serves HTTP and has the probes
    assert "readinessProbe" in container(tmpl["workerTemplate"])


def test_multimodal_architecture_is_served_as_text() -> None:
    spec = spec_of(model={"architecture": "KimiK3ForConditionalGeneration"})
    assert "--language-model-only" in serve_args(spec, None, "leader")
    assert "--language-model-only" not in serve_args(spec_of(), None, "leader")


def test_parallel_options() -> None:
    spec = spec_of(parallelism={"tensor": 8, "pipeline": 2, "decodeContext": 2, "expert": True})
    args = serve_args(spec, None, "worker")
    assert flag(args, "--pipeline-parallel-size") == "2"
    assert flag(args, "--decode-context-parallel-size") == "2"
    assert "--enable-expert-parallel" in args
    assert "--headless" in args


def test_gpu_resources_shm_and_placement() -> None:
    spec = spec_of(
        placement={
            "nodeSelector": {"pool": "h200"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "schedulerName": "kai",
            "priorityClassName": "high",
            "topologyKey": "topology.kubernetes.io/zone",
        },
        resources={"cpu": "32", "memory": "512Gi", "sharedMemory": "32Gi"},
    )
    lws = lws_of(spec)
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == (
        "topology.kubernetes.io/zone"
    )
    for role in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][role]
        c = container(pod)
        want = {"nvidia.com/gpu": 8, "memory": "512Gi"}
        # Each pod downloads the weights itself here: its disk is asked for. The CPU is a
        # request only.
        asked = {**want, "cpu": "32", "ephemeral-storage": "1700G"}
        assert c["resources"] == {"requests": asked, "limits": want}
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in (
            pod["spec"]["volumes"]
        )
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert pod["spec"]["nodeSelector"] == {"pool": "h200"}
        assert pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        assert pod["spec"]["schedulerName"] == "kai"
        assert pod["spec"]["priorityClassName"] == "high"
    assert "exclusive-topology" not in json.dumps(lws_of(spec_of())["metadata"])


def test_hf_token_is_a_secret_reference_never_a_value() -> None:
    spec = spec_of(model={"hfTokenSecretRef": {"name": "hf", "key": "tok"}})
    env = container(lws_of(spec)["spec"]["leaderWorkerTemplate"]["leaderTemplate"])["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}} in env


def test_pvc_source_mounts_the_claim_and_serves_the_path() -> None:
    spec = spec_of(model={"source": {"pvc": {"claimName": "weights", "path": "kimi/k3"}}})
    pod = lws_of(spec)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    c = container(pod)
    assert c["args"][0] == "/models/kimi/k3"
    assert "--revision" not in c["args"]
    assert flag(c["args"], "--served-model-name") == "moonshotai/Kimi-K3"
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in pod["spec"]["volumes"]


def test_probes_on_the_leader_only_with_a_budget_from_the_weights() -> None:
    tmpl = lws_of(spec_of())["spec"]["leaderWorkerTemplate"]
    leader, worker = container(tmpl["leaderTemplate"]), container(tmpl["workerTemplate"])
    assert leader["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": "http"}
    assert leader["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = leader["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 4300
    for probe in ("readinessProbe", "livenessProbe", "startupProbe", "ports"):
        assert probe not in worker


def test_startup_budget_counts_every_pods_whole_download_and_shrinks_with_nodes_on_a_volume() -> (
    None
):
    two = startup_budget_seconds(spec_of())
    four = startup_budget_seconds(spec_of(parallelism={"tensor": 32}))
    pvc = startup_budget_seconds(spec_of(model={"source": {"pvc": {"claimName": "w"}}}))
    pvc_four = startup_budget_seconds(
        spec_of(model={"source": {"pvc": {"claimName": "w"}}}, parallelism={"tensor": 32})
    )
    # From the Hub each pod downloads all 1.7 TB at 250 MB/s, however many nodes share it.
    assert two == four == 900 + 6800
    # From a volume each node reads its shard at 1 GB/s.
    assert pvc == 900 + 850
    assert pvc_four == 900 + 425


def test_extra_args_and_env_come_after_the_generated_ones() -> None:
    spec = spec_of(
        engine={
            "extraArgs": ["--moe-backend", "marlin"],
            "env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}],
        }
    )
    c = container(lws_of(spec)["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    assert c["args"][-2:] == ["--moe-backend", "marlin"]
    assert c["env"][-1] == {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}


def test_service_selects_the_leaders() -> None:
    svc = build_service(spec_of(service={"port": 9000, "type": "NodePort"}), OWNER)
    assert svc["spec"]["selector"] == {
        "app.kubernetes.io/instance": "k3",
        "app.kubernetes.io/component": "leader",
    }
    assert svc["spec"]["type"] == "NodePort"
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_pod_monitor_scrapes_leader_metrics() -> None:
    pm = build_pod_monitor(spec_of(), OWNER)
    assert pm["kind"] == "PodMonitor"
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "leader"
    assert pm["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert pm["spec"]["podTargetLabels"] == ["app.kubernetes.io/instance"]


def test_children_carry_owner_labels_and_hash() -> None:
    children = desired_children(spec_of(), OWNER, parts=SERVED)
    assert [c["kind"] for c in children] == ["LeaderWorkerSet", "Service", "PodMonitor"]
    for child in children:
        meta = child["metadata"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "serving.kimik3.io/v1alpha1",
                "kind": "KimiK3Deployment",
                "name": "k3",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kimik3-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == "k3"
        assert meta["namespace"] == "llm"
        assert SPEC_HASH_ANNOTATION in meta["annotations"]
    no_monitor = desired_children(spec_of(monitoring={"podMonitor": False}), OWNER, parts=SERVED)
    assert [c["kind"] for c in no_monitor] == ["LeaderWorkerSet", "Service"]
    no_crd = desired_children(spec_of(), OWNER, pod_monitor_available=False, parts=SERVED)
    assert [c["kind"] for c in no_crd] == ["LeaderWorkerSet", "Service"]


def test_hash_changes_with_the_spec() -> None:
    def lws_hash(spec: KimiK3DeploymentSpec) -> str:
        return str(
            desired_children(spec, OWNER, parts=SERVED)[0]["metadata"]["annotations"][
                SPEC_HASH_ANNOTATION
            ]
        )

    assert lws_hash(spec_of()) == lws_hash(spec_of())
    assert lws_hash(spec_of()) != lws_hash(spec_of(engine={"image": "vllm/vllm-openai:v0.34.0"}))


def test_pairing_fills_the_known_drafter() -> None:
    paired = spec_of().paired_drafter
    assert paired is not None and paired.auto_paired
    assert paired.repo == "RedHatAI/Kimi-K3-speculator.dspark"
    given = spec_of(drafter={"repo": "Inferact/Kimi-K3-DSpark"}).paired_drafter
    assert given is not None and not given.auto_paired
    assert spec_of(drafter={"method": "none"}).paired_drafter is None
    unknown = spec_of(model={"repo": "me/other"}).paired_drafter
    assert unknown is not None and unknown.repo == ""


def _every_pod_spec(spec: Any) -> list[dict[str, Any]]:
    from kimik3_operator.builders.model_cache import build_download_job
    from kimik3_operator.builders.preflight_job import build_probe_job

    owner = Owner("k3", "llm", "uid-1")
    lws = lws_of(spec)
    pods = [
        lws["spec"]["leaderWorkerTemplate"][r]["spec"] for r in ("leaderTemplate", "workerTemplate")
    ]
    pods.append(build_probe_job(spec, owner)["spec"]["template"]["spec"])
    pods.append(build_download_job(spec, owner)["spec"]["template"]["spec"])
    return pods


def test_every_pod_is_hardened() -> None:
    """What checkov, kube-score and the restricted Pod Security level ask of a pod: no token,
    seccomp, non-root, no escalation, no caps, a read-only image, size-limited scratch."""
    spec = spec_of(model={"cache": {}})
    for pod in _every_pod_spec(spec):
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"] == {
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
        for c in pod["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
            }
            assert c["resources"]["requests"]["memory"], "never BestEffort"
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["HOME"] == "/tmp" and env["USER"], "a writable HOME, a name for getpass"
        for volume in pod["volumes"]:
            if "emptyDir" in volume:
                assert volume["emptyDir"]["sizeLimit"], f"{volume['name']} has no size limit"


def test_capabilities_run_as_the_images_user_unless_told_otherwise() -> None:
    """A non-root process loses added capabilities when it starts vLLM: with them, the
    serving pods default to the image's user; the Jobs stay non-root."""
    spec = spec_of(model={"cache": {}}, engine={"addCapabilities": ["IPC_LOCK"]})
    serving, _, probe, download = _every_pod_spec(spec)
    assert serving["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for job in (probe, download):
        assert job["securityContext"]["runAsNonRoot"] is True
        assert job["securityContext"]["runAsUser"] == 1000
    told = spec_of(
        engine={"addCapabilities": ["SYS_NICE"]},
        securityContext={"runAsNonRoot": True, "runAsUser": 2000, "readOnlyRootFilesystem": False},
    )
    pod = lws_of(told)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 2000
    assert pod["securityContext"]["runAsGroup"] == 1000, "the documented default group"
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    root = spec_of(model={"cache": {}}, securityContext={"runAsNonRoot": False, "runAsUser": 0})
    probe_pod = _every_pod_spec(root)[2]
    assert probe_pod["securityContext"]["runAsUser"] == 1000, "a Job never runs as root"


def test_cpu_is_a_request_and_a_limit_only_when_asked() -> None:
    c = container(
        lws_of(spec_of(resources={"cpu": "16"}))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    )
    assert c["resources"]["requests"]["cpu"] == "16"
    assert "cpu" not in c["resources"]["limits"]
    c = container(
        lws_of(spec_of(resources={"cpu": "16", "cpuLimit": "32"}))["spec"]["leaderWorkerTemplate"][
            "leaderTemplate"
        ]
    )
    assert (c["resources"]["requests"]["cpu"], c["resources"]["limits"]["cpu"]) == ("16", "32")


def test_hf_cache_is_sized_for_what_it_holds() -> None:
    def hf_cache(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
        pod = lws_of(spec)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        return next(v["emptyDir"] for v in pod["volumes"] if v["name"] == "hf-cache")

    assert hf_cache(spec_of()) == {"sizeLimit": "1700G"}, "each pod downloads the weights"
    assert hf_cache(spec_of(model={"cache": {}})) == {"sizeLimit": "4Gi"}


def test_serving_pods_ask_for_shared_memory_plus_headroom() -> None:
    lws = lws_of(spec_of(resources={"sharedMemory": "64Gi"}))
    c = container(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    assert c["resources"]["requests"]["memory"] == "96Gi"
    assert "memory" not in c["resources"]["limits"], "a request, never an OOM limit by default"
    lws = lws_of(spec_of(resources={"sharedMemory": "1500M"}))
    c = container(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    assert c["resources"]["requests"]["memory"] == "34Gi"


def test_only_pods_that_fetch_get_the_token() -> None:
    token = {"hfTokenSecretRef": {"name": "hf"}}
    cached = spec_of(model={"cache": {}, **token})
    pods = _every_pod_spec(cached)
    names = [[e["name"] for e in p["containers"][0].get("env", [])] for p in pods]
    assert "HF_TOKEN" not in names[0] and "HF_TOKEN" not in names[1], "serving offline"
    assert "HF_TOKEN" in names[2] and "HF_TOKEN" in names[3], "the probe and the download fetch"
    fetching = lws_of(spec_of(model=token))
    env = container(fetching["spec"]["leaderWorkerTemplate"]["leaderTemplate"])["env"]
    assert "HF_TOKEN" in [e["name"] for e in env]
    cache_disk = container(lws_of(cached)["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    assert "ephemeral-storage" not in cache_disk["resources"]["requests"]


def test_a_serving_pod_gets_back_only_the_capabilities_asked_for() -> None:
    lws = lws_of(spec_of(engine={"addCapabilities": ["IPC_LOCK"]}))
    for role in ("leaderTemplate", "workerTemplate"):
        c = container(lws["spec"]["leaderWorkerTemplate"][role])
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_quantities_are_written_as_the_api_server_writes_them_back() -> None:
    """A quantity in another form than the stored one reads as a change at every resync
    (measured: 1700000000000 came back as 1700G, and every LeaderWorkerSet was applied
    again every 30 s)."""
    from kimik3_operator.api.quantities import decimal_quantity

    assert decimal_quantity(1_700_000_000_000) == "1700G"
    assert decimal_quantity(2 * 10**12) == "2T"
    assert decimal_quantity(3000) == "3k"
    assert decimal_quantity(1234) == "1234"
    assert decimal_quantity(0) == "0"


IN_H200 = {"key": "gpu.product", "operator": "In", "values": ["H200"]}
H200 = {"nodeSelectorTerms": [{"matchExpressions": [IN_H200]}]}
ZONES = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
}
NCCL_TOPOLOGY = {"name": "nccl-topo", "configMap": {"name": "nccl-topology"}}
FLEET_POD = {
    "labels": {"team": "gpu", "cost-centre": "llm"},
    "annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "registry"}],
    "extraResources": {"rdma/ib": 1},
    "envFrom": [{"configMapRef": {"name": "nccl"}, "prefix": ""}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpu.product", "operator": "In", "values": ["H200"]}
                        ]
                    }
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
        }
    ],
    "volumes": [{"name": "nccl-topo", "configMap": {"name": "nccl-topology"}}],
    "volumeMounts": [{"name": "nccl-topo", "mountPath": "/etc/nccl", "readOnly": True}],
}


def test_a_fleets_pod_settings_reach_leader_and_workers() -> None:
    spec = spec_of(pod=FLEET_POD, service={"annotations": {"lb.example/internal": "1"}})
    template = lws_of(spec)["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = template[role]
        assert pod["metadata"]["labels"]["team"] == "gpu"
        assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
        assert pod["spec"]["runtimeClassName"] == "nvidia"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
        resources = container(pod)["resources"]
        assert resources["requests"]["rdma/ib"] == resources["limits"]["rdma/ib"] == "1"
        assert resources["limits"]["nvidia.com/gpu"] == 8
        assert container(pod)["envFrom"] == [{"configMapRef": {"name": "nccl"}, "prefix": ""}]
        assert pod["spec"]["affinity"] == FLEET_POD["affinity"]
        assert pod["spec"]["topologySpreadConstraints"] == FLEET_POD["topologySpreadConstraints"]
        assert NCCL_TOPOLOGY in pod["spec"]["volumes"]
        assert {"name": "nccl-topo", "mountPath": "/etc/nccl", "readOnly": True} in container(pod)[
            "volumeMounts"
        ]
        # The operator's own volumes stay, first.
        assert {"dshm", "hf-cache", "tmp"} <= {v["name"] for v in pod["spec"]["volumes"]}
    service = build_service(spec, Owner("k3", "llm", "uid-1"))
    assert service["metadata"]["annotations"] == {"lb.example/internal": "1"}


def test_no_pod_setting_changes_what_the_preflight_judged() -> None:
    """Image, command, flags, the operator's env and labels: the same with and without the
    fleet's settings (the spec.pod fields come under the operator's own)."""
    plain = lws_of(spec_of())["spec"]["leaderWorkerTemplate"]
    fitted = lws_of(spec_of(pod=FLEET_POD))["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        before, after = container(plain[role]), container(fitted[role])
        for key in ("image", "command", "args", "env"):
            assert before[key] == after[key], key
        operator_labels = {
            k: v for k, v in plain[role]["metadata"]["labels"].items() if k != TEMPLATE_HASH_LABEL
        }
        assert operator_labels.items() <= fitted[role]["metadata"]["labels"].items()


def test_pod_settings_that_would_override_the_operators_are_refused() -> None:
    import pytest

    from kimik3_operator.api.types import SpecError

    for pod, named in (
        ({"labels": {"app.kubernetes.io/instance": "other"}}, "spec.pod.labels"),
        ({"labels": {"serving.kimik3.io/template-hash": "x"}}, "spec.pod.labels"),
        (
            {"annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}},
            "spec.pod.annotations",
        ),
        ({"extraResources": {"nvidia.com/gpu": 8}}, "spec.pod.extraResources"),
        ({"extraResources": {"memory": "1"}}, "spec.pod.extraResources"),
        ({"envFrom": [{"prefix": "X"}]}, "spec.pod.envFrom[0]"),
    ):
        with pytest.raises(SpecError, match=named.replace("[", r"\[").replace(".", r"\.")):
            spec_of(pod=pod)


def test_a_group_across_nodes_without_a_fabric_is_told_never_refused() -> None:
    from kimik3_operator.controller.conditions import fabric_condition

    assert fabric_condition(spec_of(parallelism={"tensor": 8})) is None, "one node: no fabric"
    bare = fabric_condition(spec_of())
    assert bare is not None and (bare.status, bare.reason) == ("False", "NoRDMAFabric")
    rdma = fabric_condition(spec_of(pod={"extraResources": {"rdma/ib": 1}}))
    assert rdma is not None and (rdma.status, rdma.reason) == ("True", "RDMARequested")
    multus = fabric_condition(
        spec_of(pod={"annotations": {"k8s.v1.cni.cncf.io/networks": "ib-net"}})
    )
    assert multus is not None and (multus.status, multus.reason) == ("True", "SecondaryNetwork")


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        (
            {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
            "spec.pod.volumes[0].hostPath",
        ),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "spec.pod.volumes[0].name"),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/models/extra"}],
            },
            "spec.pod.volumeMounts[0].mountPath",
        ),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/"}],
            },
            "spec.pod.volumeMounts[0].mountPath",
        ),
        ({"volumeMounts": [{"name": "y", "mountPath": "/etc/y"}]}, "spec.pod.volumeMounts[0].name"),
    ],
)
def test_a_pod_volume_that_would_meet_the_operators_is_refused(
    pod: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as refused:
        spec_of(pod=pod)
    assert refused.value.path == field


def test_a_stopped_pod_drains_its_groups_requests_first() -> None:
    spec = spec_of(parallelism={"tensor": 16})
    template = lws_of(spec)["spec"]["leaderWorkerTemplate"]
    leader = container(template["leaderTemplate"])
    worker = container(template["workerTemplate"])
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert env["KIMIK3_DRAIN_URL"] == "http://127.0.0.1:8000/metrics"
    # A worker's shard serves its leader's requests: it waits on the leader.
    worker_env = {e["name"]: e.get("value") for e in worker["env"]}
    assert worker_env["KIMIK3_DRAIN_URL"] == "http://{leader}:8000/metrics"
    drain = int(env["KIMIK3_DRAIN_SECONDS"])
    grace = template["leaderTemplate"]["spec"]["terminationGracePeriodSeconds"]
    assert 0 < drain < grace
