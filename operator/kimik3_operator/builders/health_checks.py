"""The leader's health checks (the startup, readiness and liveness probes of its pod), with
a start-up budget derived from the weight size.

Start-up budget (seconds) = ENGINE_INIT_SECONDS + the weights' time, where the weights' time
  from a volume (a PVC source or the model cache) = weight_bytes / nodes_per_replica / 1 GB/s:
    each node reads only its own shard;
  from the Hub = weight_bytes / 250 MB/s: every pod downloads the whole checkpoint into its
    own storage before it loads its shard, so more nodes do not make it shorter.
With the model cache the weight size is the one its download measured.
For Kimi-K3 (about 1.7 TB) on 2 nodes from the cache: 900 + 1.7e12 / 2 / 1e9 = 1750 s;
from the Hub: 900 + 1.7e12 / 250e6 = 7700 s.
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
    weights = weight_bytes or KIMI_K3_WEIGHT_BYTES
    if from_volume:
        load = weights / spec.nodes_per_replica / VOLUME_LOAD_BYTES_PER_SECOND
    else:
        load = weights / HUB_LOAD_BYTES_PER_SECOND
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
