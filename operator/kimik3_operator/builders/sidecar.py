"""llm-d's P/D routing sidecar, in front of each decode leader's engine.

The P/D router (spec.routing) sends a request to a decode leader and names, in the header
``x-prefiller-host-port``, the prefill leader that prefills it; the sidecar asks that one
with ``kv_transfer_params.do_remote_decode`` and one token, then hands the request on to the
local engine with the prefill's answer (``do_remote_prefill``, its engine, blocks and side
channel), and the engine pulls the KV cache. Without the header it hands the request on
unchanged. It runs as a native sidecar (an init container that keeps running), started
before the engine and stopped after it."""

from __future__ import annotations

from typing import Any, Final

from kimik3_operator.api import constants as c
from kimik3_operator.builders.command import Transfer

SIDECAR_NAME: Final = "routing-proxy"
# The user of the distroless image, named so runAsNonRoot can be checked.
SIDECAR_USER: Final = 65532


def sidecar_args(transfer: Transfer, engine_port: int) -> list[str]:
    """Its flags, named in full so an image's defaults cannot differ; plain HTTP, as vLLM
    serves it behind (TLS, where wanted, is the gateway's)."""
    return [
        f"--port={transfer.sidecar_port}",
        f"--vllm-port={engine_port}",
        f"--kv-connector={c.SIDECAR_KV_CONNECTORS[transfer.connector]}",
        "--secure-proxy=false",
    ]


def routing_sidecar(transfer: Transfer, engine_port: int) -> dict[str, Any]:
    assert transfer.sidecar_image is not None
    return {
        "name": SIDECAR_NAME,
        "image": transfer.sidecar_image,
        "args": sidecar_args(transfer, engine_port),
        # A native sidecar: up before the engine, down after it, restarted on its own.
        "restartPolicy": "Always",
        "ports": [
            {
                "name": c.SIDECAR_PORT_NAME,
                "containerPort": transfer.sidecar_port,
                "protocol": "TCP",
            }
        ],
        "readinessProbe": {
            "tcpSocket": {"port": c.SIDECAR_PORT_NAME},
            "periodSeconds": 5,
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "2", "memory": "512Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_USER,
            "runAsGroup": SIDECAR_USER,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
