"""The ``vllm serve`` command lines of the leader and the workers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from kimik3_operator.api import constants as c
from kimik3_operator.api.pairing import ResolvedDrafter
from kimik3_operator.api.spec import KimiK3DeploymentSpec

Role = Literal["leader", "worker"]
SERVE = ("vllm", "serve")  # the command the arguments below are for
MODEL_MOUNT = "/models"
# Kubernetes expands $(VAR) in args from the container's env; LWS injects these.
GROUP_SIZE = "$(LWS_GROUP_SIZE)"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"


KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class Transfer:
    """One side of a prefill/decode pair, as its command line and environment say it."""

    role: Literal["prefill", "decode"]
    connector: str = "Nixl"
    # The decode leader's routing sidecar: its image (None: none) and the port it takes,
    # the deployment's service port.
    sidecar_image: str | None = None
    sidecar_port: int = 8000

    def args(self) -> list[str]:
        config = {
            "kv_connector": c.KV_CONNECTOR_CLASSES[self.connector],
            "kv_role": KV_ROLES[self.role],
            # The KV cache moves GPU to GPU (UCX); "cpu" stages it through host memory.
            "kv_buffer_device": "cuda",
        }
        # Explicit, so that a configuration vLLM cannot run it in is refused at start-up
        # instead of served with the hybrid KV-cache manager silently off: a hybrid model's
        # recurrent state moves only with it (a model that is not hybrid is not changed).
        return [
            "--kv-transfer-config",
            json.dumps(config, separators=(",", ":"), sort_keys=True),
            "--no-disable-hybrid-kv-cache-manager",
        ]


def model_location(spec: KimiK3DeploymentSpec) -> str:
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.repo
    return f"{MODEL_MOUNT}/{pvc.path.strip('/')}".rstrip("/")


def serve_args(
    spec: KimiK3DeploymentSpec,
    drafter: ResolvedDrafter | None,
    role: Role,
    transfer: Transfer | None = None,
) -> list[str]:
    """Arguments after ``vllm serve``; workers differ only in rank and ``--headless``; a
    side of a prefill/decode pair adds its KV transfer."""
    par = spec.parallelism
    args = [model_location(spec), "--served-model-name", spec.served_model_name]
    if spec.model.source.pvc is None:
        args += ["--revision", spec.model.revision]
    args += [
        "--tensor-parallel-size",
        str(par.tensor),
        "--pipeline-parallel-size",
        str(par.pipeline),
    ]
    if par.decode_context > 1:
        args += ["--decode-context-parallel-size", str(par.decode_context)]
    if par.data > 1:
        args += ["--data-parallel-size", str(par.data)]
    if par.expert:
        args.append("--enable-expert-parallel")
    if spec.nodes_per_replica > 1:
        rank = "0" if role == "leader" else WORKER_INDEX
        args += [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            GROUP_SIZE,
            "--node-rank",
            rank,
            "--master-addr",
            LEADER_ADDRESS,
        ]
        if role == "worker":
            args.append("--headless")
    args += [
        "--port",
        str(spec.service.port),
        "--max-model-len",
        str(spec.engine.max_model_len),
        "--gpu-memory-utilization",
        _number(spec.engine.gpu_memory_utilization),
        "--kv-cache-dtype",
        spec.engine.kv_cache_dtype,
    ]
    if spec.model.multimodal:
        # The drafters are text-only; the multimodal class serves as text with this flag.
        args.append("--language-model-only")
    if drafter is not None:
        config = json.dumps(drafter.speculative_config(), separators=(",", ":"), sort_keys=True)
        args += ["--speculative-config", config]
    if transfer is not None:
        args += transfer.args()
    args += list(spec.engine.extra_args)
    return args


def expanded_serve_args(
    spec: KimiK3DeploymentSpec,
    drafter: ResolvedDrafter | None,
    role: Role,
    transfer: Transfer | None = None,
) -> list[str]:
    """The arguments as the kubelet hands them to vLLM, with LWS's variables filled in (the
    worker as rank 1): what the image probe parses."""
    values = {
        GROUP_SIZE: str(spec.nodes_per_replica),
        LEADER_ADDRESS: "leader.invalid",
        WORKER_INDEX: "1",
    }
    return [values.get(arg, arg) for arg in serve_args(spec, drafter, role, transfer)]


def _number(value: float) -> str:
    return f"{value:g}"
