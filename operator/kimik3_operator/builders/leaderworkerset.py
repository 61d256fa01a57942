"""The LeaderWorkerSet: one group of ``nodes_per_replica`` pods per serving replica."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from math import ceil
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.pairing import ResolvedDrafter
from kimik3_operator.api.quantities import decimal_quantity, quantity_bytes
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.builders.command import MODEL_MOUNT, SERVE, Role, Transfer, serve_args
from kimik3_operator.builders.common import (
    SERVING_TMP_SIZE,
    Owner,
    drafter_volume,
    hardened,
    labels,
    metadata,
    serving_run_as,
    token_and_engine_env,
)
from kimik3_operator.builders.health_checks import KIMI_K3_WEIGHT_BYTES, leader_health_checks
from kimik3_operator.builders.model_cache import CACHE_MOUNT, HUB_CACHE, cache_claim_name
from kimik3_operator.builders.sidecar import routing_sidecar

CONTAINER_NAME = "vllm"


# A pod stopped (a group removed by a scale-down, a rollout) drains its requests for up to
# DRAIN_SECONDS, then vLLM has the rest of the grace period to stop.
GRACE_SECONDS = 120
DRAIN_SECONDS = 90


@cache
def _launch_script() -> str:
    """Read once: every build of a LeaderWorkerSet, at every reconcile, quotes it."""
    return resources.files("kimik3_operator.programs").joinpath("launch.py").read_text()


def serving_command() -> list[str]:
    """``vllm serve`` under the launcher that writes its decisive lines to the termination
    log when it fails (programs/launch.py), given inline: no ConfigMap to keep."""
    return ["python3", "-c", _launch_script(), *SERVE]


GIB = 2**30
# vLLM's host process beside the shared memory: the API server, tokenizer, CUDA context,
# pinned staging buffers. The default memory request is sharedMemory plus this.
MEMORY_HEADROOM_GIB = 32
PORT_NAME = "http"
HF_HOME = "/cache/huggingface"


@dataclass(frozen=True)
class Rollout:
    """Where a rollout stands, for the LeaderWorkerSet: groups at or above ``partition``
    take the pod template; ``stable`` (JSON) is the spec the other groups run."""

    partition: int = 0
    stable: str = ""
    # The spec the pods are made from, when not the resource's own (a rollback restores
    # the stable one); the number of groups and the rollout settings stay the resource's.
    pods_from: KimiK3DeploymentSpec | None = None
    pods_weight_bytes: int | None = None
    # The leaderWorkerTemplate already built for these pods (the rollout step hashes it).
    template: Mapping[str, Any] | None = field(default=None, compare=False)


NO_ROLLOUT = Rollout()


def build_leader_worker_set(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    drafter: ResolvedDrafter | None,
    weight_bytes: int | None = None,
    rollout: Rollout = NO_ROLLOUT,
    admission_held: bool = False,
) -> dict[str, Any]:
    """``weight_bytes``: what the model cache measured, for the start-up budget;
    ``admission_held``: Kueue admits no group until the operator lifts its gate."""
    meta = metadata(owner, names.leader_worker_set(owner.name), c.COMPONENT_SERVING)
    if spec.placement.topology_key:
        meta["annotations"] = {c.LWS_EXCLUSIVE_TOPOLOGY: spec.placement.topology_key}
    meta["labels"].update(queue_labels(spec))
    if admission_held:
        meta.setdefault("annotations", {})[c.KUEUE_ADMISSION_GATED_BY] = c.KUEUE_PREFLIGHT_GATE
    if rollout.stable:
        meta.setdefault("annotations", {})[c.STABLE_SPEC_ANNOTATION] = rollout.stable
    if rollout.template is not None:
        template = copy.deepcopy(dict(rollout.template))
    elif rollout.pods_from is None:
        template = pod_templates(spec, owner, drafter, weight_bytes)
    else:
        source = rollout.pods_from
        template = pod_templates(source, owner, source.paired_drafter, rollout.pods_weight_bytes)
    return {
        "apiVersion": f"{c.LWS_GROUP}/{c.LWS_VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": leader_worker_set_spec(spec, template, rollout.partition),
    }


def leader_worker_set_spec(
    spec: KimiK3DeploymentSpec, template: dict[str, Any], partition: int | None
) -> dict[str, Any]:
    """A LeaderWorkerSet's spec around its ``template``: the deployment's own, or a role's
    of a DisaggregatedSet (``partition`` None: the set rolls its roles, and its webhook
    refuses a partition)."""
    rolling: dict[str, Any] = {
        "maxSurge": spec.rollout.max_surge,
        "maxUnavailable": spec.rollout.max_unavailable,
    }
    if partition is not None:
        rolling["partition"] = partition
    return {
        "replicas": spec.replicas,
        # The leader cannot become ready before its workers join: LeaderReady deadlocks.
        "startupPolicy": "LeaderCreated",
        # The shared policy makes LWS create a headless Service named after the LWS, the
        # name of the leaders' Service: one of them would lose, and with it the workers'
        # DNS name for the leader. Per replica, LWS names them <name>-<group>.
        "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling},
        "leaderWorkerTemplate": template,
    }


def queue_labels(spec: KimiK3DeploymentSpec) -> dict[str, str]:
    """The LeaderWorkerSet's labels that Kueue reads: its LocalQueue and priority."""
    scheduling = spec.scheduling
    found: dict[str, str] = {}
    if scheduling.queue_name:
        found[c.KUEUE_QUEUE_LABEL] = scheduling.queue_name
    if scheduling.workload_priority_class_name:
        found[c.KUEUE_PRIORITY_CLASS_LABEL] = scheduling.workload_priority_class_name
    return found


def topology_annotations(spec: KimiK3DeploymentSpec) -> dict[str, str]:
    """A pod template's annotations for Kueue's topology-aware scheduling: the leader's and
    the workers' pod sets in one group, so that the whole group lands in one domain."""
    topology = spec.scheduling.topology
    if not spec.queued or topology is None:
        return {}
    found: dict[str, str] = {}
    if topology.required:
        found[c.KUEUE_REQUIRED_TOPOLOGY] = topology.required
    elif topology.preferred:
        found[c.KUEUE_PREFERRED_TOPOLOGY] = topology.preferred
    if spec.nodes_per_replica > 1:
        found[c.KUEUE_PODSET_GROUP] = PODSET_GROUP
    return found


# The value is Kueue's key for the group within one Workload; one Workload is one group.
PODSET_GROUP = "group"


def pod_templates(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    drafter: ResolvedDrafter | None,
    weight_bytes: int | None = None,
    transfer: Transfer | None = None,
) -> dict[str, Any]:
    """The LeaderWorkerSet's leaderWorkerTemplate, each pod labelled with its hash; for a
    side of a prefill/decode pair, its KV transfer."""
    multi_node = spec.nodes_per_replica > 1
    leader = _pod_template(spec, owner, drafter, "leader", weight_bytes, transfer)
    template: dict[str, Any] = {
        "size": spec.nodes_per_replica,
        # Every rank of the mp backend must start together, and a restarted rank cannot
        # rejoin a running group: restart the whole group.
        "restartPolicy": "RecreateGroupOnPodRestart",
    }
    if multi_node:
        template["leaderTemplate"] = leader
        template["workerTemplate"] = _pod_template(
            spec, owner, drafter, "worker", weight_bytes, transfer
        )
    else:
        template["workerTemplate"] = leader
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
    for role in ("leaderTemplate", "workerTemplate"):
        if role in template:
            template[role]["metadata"]["labels"][c.TEMPLATE_HASH_LABEL] = digest
    return template


def template_hash(lws: Mapping[str, Any]) -> str:
    """The hash the pods of a built or live LeaderWorkerSet's template carry ("" if none)."""
    template = ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("workerTemplate")
    labels = ((template or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get(c.TEMPLATE_HASH_LABEL, ""))


def _pod_template(
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    drafter: ResolvedDrafter | None,
    role: Role,
    weight_bytes: int | None,
    transfer: Transfer | None = None,
) -> dict[str, Any]:
    component = c.COMPONENT_LEADER if role == "leader" else c.COMPONENT_WORKER
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image,
        "command": serving_command(),
        "args": serve_args(spec, drafter, role, transfer),
        "env": _env(spec),
        # Beside env, which wins over it for every variable the operator sets.
        **({"envFrom": [dict(e) for e in spec.pod.env_from]} if spec.pod.env_from else {}),
        "resources": _resources(spec),
        "volumeMounts": _volume_mounts(spec),
        # The last lines of a crash land in the pod's status, where the operator reads them.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # A stop waits for the leader's requests to finish (programs/launch.py), within the
    # grace period less the engine's own teardown.
    leader_metrics = "127.0.0.1" if role == "leader" else "{leader}"
    # (spec.engine.env, after these, may change the drain.)
    container["env"] = [
        {
            "name": "KIMIK3_DRAIN_URL",
            "value": f"http://{leader_metrics}:{spec.service.port}/metrics",
        },
        {"name": "KIMIK3_DRAIN_SECONDS", "value": str(DRAIN_SECONDS)},
        *(_transfer_env() if transfer is not None else []),
        *container["env"],
    ]
    if transfer is not None:
        container["ports"] = [
            {"name": "nixl", "containerPort": c.NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}
        ]
    if role == "leader":
        container["ports"] = [
            {"name": PORT_NAME, "containerPort": spec.service.port, "protocol": "TCP"},
            *container.get("ports", []),
        ]
        container.update(leader_health_checks(spec, PORT_NAME, weight_bytes))
    sidecars = (
        [routing_sidecar(transfer, spec.service.port)]
        if role == "leader" and transfer is not None and transfer.sidecar_image
        else []
    )
    pod_spec: dict[str, Any] = hardened(
        {
            **({"initContainers": sidecars} if sidecars else {}),
            "containers": [container],
            "volumes": _volumes(spec, owner),
            # The drain, then shard and NCCL teardown: do not cut them short.
            "terminationGracePeriodSeconds": GRACE_SECONDS,
        },
        serving_run_as(spec),
        SERVING_TMP_SIZE,
        add=spec.engine.add_capabilities,
    )
    placement = spec.placement
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if placement.scheduler_name:
        pod_spec["schedulerName"] = placement.scheduler_name
    if placement.priority_class_name:
        pod_spec["priorityClassName"] = placement.priority_class_name
    pod = spec.pod
    if pod.affinity:
        # Copies: the leader's and the workers' templates share nothing (nor does YAML).
        pod_spec["affinity"] = copy.deepcopy(dict(pod.affinity))
    if pod.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = copy.deepcopy(
            [dict(t) for t in pod.topology_spread_constraints]
        )
    if pod.runtime_class_name:
        pod_spec["runtimeClassName"] = pod.runtime_class_name
    if pod.service_account_name:
        pod_spec["serviceAccountName"] = pod.service_account_name
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s["name"]} for s in pod.image_pull_secrets]
    # The operator's labels over the platform's: the pods stay found by them.
    metadata: dict[str, Any] = {"labels": {**pod.labels, **labels(owner, component)}}
    if transfer is not None:
        metadata["labels"].update(role_labels(transfer.role))
    annotations = {**pod.annotations, **topology_annotations(spec)}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def role_labels(role: str) -> dict[str, str]:
    """A side of a prefill/decode pair: the operator's key, and llm-d's, which its P/D
    router selects by."""
    return {c.LABEL_ROLE: role, c.LLM_D_ROLE_LABEL: role}


def _transfer_env() -> list[dict[str, Any]]:
    """vLLM's NIXL side channel on the pod's own IP (its default, localhost, is unreachable
    from the other role), and the recurrent state's layout the transfer of a hybrid model
    (Kimi-K3's KDA layers) reads and writes alike on both sides."""
    return [
        {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        },
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(c.NIXL_SIDE_CHANNEL_PORT)},
        {"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"},
    ]


def _env(spec: KimiK3DeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HF_HOME}]
    # With the model cache the pods read offline: the token stays with the download Job.
    env += token_and_engine_env(spec, fetches=spec.model.cache is None)
    if spec.model.cache is not None:
        # The weights are in the cache, verified: read them there and never from the Hub.
        env += [
            {"name": "HF_HUB_CACHE", "value": HUB_CACHE},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ]
    return env


def _resources(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    gpus = {spec.placement.gpu_resource: spec.gpus_per_pod}
    extended = {name: str(amount) for name, amount in spec.pod.extra_resources.items()}
    requests: dict[str, Any] = {**extended, **gpus}
    limits: dict[str, Any] = {**extended, **gpus}
    if spec.resources.cpu:
        # A request only: a CPU limit throttles the threads that feed the GPUs.
        requests["cpu"] = spec.resources.cpu
    if spec.resources.cpu_limit:
        limits["cpu"] = spec.resources.cpu_limit
        requests.setdefault("cpu", spec.resources.cpu_limit)
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    else:
        # Never BestEffort (the first evicted) while holding a node's GPUs: the shared
        # memory is charged to the pod, and vLLM's host process needs room besides. A request
        # only, so page cache from reading the weights is never an OOM kill.
        requests["memory"] = default_memory_request(spec.resources.shared_memory)
    if downloads_per_pod(spec):
        # Each pod downloads every weight into its own emptyDir. In the API server's canonical
        # form ("1700G", not "1700000000000"): the stored object then matches what is built,
        # and an unchanged spec is not applied again at every resync.
        requests["ephemeral-storage"] = decimal_quantity(KIMI_K3_WEIGHT_BYTES)
    return {"requests": requests, "limits": limits}


def downloads_per_pod(spec: KimiK3DeploymentSpec) -> bool:
    """Neither the model cache nor a volume of weights: each pod fetches into hf-cache."""
    return spec.model.cache is None and spec.model.source.pvc is None


# hf-cache when the weights are elsewhere: the Hub's small files (tokenizer, remote code).
HF_CACHE_SMALL = "4Gi"


def default_memory_request(shared_memory: str) -> str:
    """spec.resources.sharedMemory plus MEMORY_HEADROOM_GIB, in Gi."""
    return f"{ceil(quantity_bytes(shared_memory) / GIB) + MEMORY_HEADROOM_GIB}Gi"


def _volumes(spec: KimiK3DeploymentSpec, owner: Owner) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shared_memory},
        },
        {
            "name": "hf-cache",
            "emptyDir": {
                "sizeLimit": decimal_quantity(KIMI_K3_WEIGHT_BYTES)
                if downloads_per_pod(spec)
                else HF_CACHE_SMALL
            },
        },
    ]
    cache = spec.model.cache
    if cache is not None:
        volumes.append(
            {
                "name": "model-cache",
                "persistentVolumeClaim": {
                    "claimName": cache_claim_name(owner, cache),
                    "readOnly": True,
                },
            }
        )
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
    drafter = drafter_volume(spec)
    if drafter is not None:
        volumes.append(drafter[0])
    # The platform's, after the operator's: their names and paths are refused where they
    # would meet (api/validation.py and the CRD).
    return volumes + copy.deepcopy([dict(v) for v in spec.pod.volumes])


def _volume_mounts(spec: KimiK3DeploymentSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "hf-cache", "mountPath": HF_HOME},
    ]
    if spec.model.cache is not None:
        mounts.append({"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True})
    if spec.model.source.pvc is not None:
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    drafter = drafter_volume(spec)
    if drafter is not None:
        mounts.append(drafter[1])
    return mounts + [dict(m) for m in spec.pod.volume_mounts]
