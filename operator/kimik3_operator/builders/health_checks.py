"""The leader's health checks (the startup, readiness and liveness probes of its pod), with
a start-up budget derived from the weight size.

Start-up budget (seconds) = ENGINE_INIT_SECONDS
    + weight_bytes / nodes_per_replica / load_bytes_per_second_per_node

Each node loads only its own shard of the weights, so the load time falls with the node
count. Loading from the Hub is slower than from a volume (a PVC source or the model cache),
so the two differ; with the model cache the weight size is the one its download measured.
For Kimi-K3 (about 1.7 TB) on 2 nodes from the Hub: 900 + 1.7e12 / 2 / 250e6 = 4300 s;
from the cache: 900 + 1.7e12 / 2 / 1e9 = 1750 s.
"""

from __future__ import annotations

import math
from typing import Any, Final

from kimik3_operator.api.spec import KimiK3DeploymentSpec

KIMI_K3_WEIGHT_BYTES: Final = 1_700_000_000_000
ENGINE_INIT_SECONDS: Final = 900  # engine start, torch.compile, CUDA graphs, drafter load
HUB_LOAD_BYTES_PER_SECOND: Final = 250_000_000
VOLUME_LOAD_BYTES_PER_SECOND: Final = 1_000_000_000
STARTUP_PERIOD_SECONDS: Final = 30


def startup_budget_seconds(spec: KimiK3DeploymentSpec, weight_bytes: int | None = None) -> int:
    from_volume = spec.model.source.pvc is not None or spec.model.cache is not None
    rate = VOLUME_LOAD_BYTES_PER_SECOND if from_volume else HUB_LOAD_BYTES_PER_SECOND
    load = (weight_bytes or KIMI_K3_WEIGHT_BYTES) / spec.nodes_per_replica / rate
    return ENGINE_INIT_SECONDS + math.ceil(load)


def _http_get(path: str, port: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}}


def leader_health_checks(
    spec: KimiK3DeploymentSpec, port_name: str, weight_bytes: int | None = None
) -> dict[str, Any]:
    budget = startup_budget_seconds(spec, weight_bytes)
    return {
        "startupProbe": {
            **_http_get("/health", port_name),
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": math.ceil(budget / STARTUP_PERIOD_SECONDS),
            "timeoutSeconds": 5,
        },
        # /health answers before the model is usable; /v1/models only once it is.
        "readinessProbe": {
            **_http_get("/v1/models", port_name),
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
        "livenessProbe": {
            **_http_get("/health", port_name),
            "periodSeconds": 30,
            "failureThreshold": 5,
            "timeoutSeconds": 10,
        },
    }
