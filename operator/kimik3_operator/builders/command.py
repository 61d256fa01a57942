"""The ``vllm serve`` command lines of the leader and the workers."""

from __future__ import annotations

import json
from typing import Literal

from kimik3_operator.api.pairing import ResolvedDrafter
from kimik3_operator.api.spec import KimiK3DeploymentSpec

Role = Literal["leader", "worker"]
SERVE = ("vllm", "serve")  # the command the arguments below are for
MODEL_MOUNT = "/models"
# Kubernetes expands $(VAR) in args from the container's env; LWS injects these.
GROUP_SIZE = "$(LWS_GROUP_SIZE)"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"


def model_location(spec: KimiK3DeploymentSpec) -> str:
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.repo
    return f"{MODEL_MOUNT}/{pvc.path.strip('/')}".rstrip("/")


def serve_args(
    spec: KimiK3DeploymentSpec,
    drafter: ResolvedDrafter | None,
    role: Role,
) -> list[str]:
    """Arguments after ``vllm serve``; workers differ only in rank and ``--headless``."""
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
    args += list(spec.engine.extra_args)
    return args


def expanded_serve_args(
    spec: KimiK3DeploymentSpec, drafter: ResolvedDrafter | None, role: Role
) -> list[str]:
    """The arguments as the kubelet hands them to vLLM, with LWS's variables filled in (the
    worker as rank 1): what the image probe parses."""
    values = {
        GROUP_SIZE: str(spec.nodes_per_replica),
        LEADER_ADDRESS: "leader.invalid",
        WORKER_INDEX: "1",
    }
    return [values.get(arg, arg) for arg in serve_args(spec, drafter, role)]


def _number(value: float) -> str:
    return f"{value:g}"
