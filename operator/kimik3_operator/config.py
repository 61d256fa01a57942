"""Operator settings from KIMIK3_* environment variables, in one place."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    resync_seconds: float = 30.0
    health_endpoint: str = "http://0.0.0.0:8080/healthz"
    metrics_port: int = 8081  # 0: no metrics server
    metrics_address: str = "0.0.0.0"
    # Leader election on a Lease of this name (empty: standalone, always active), in
    # lease_namespace; lease_seconds after the leader's last renewal another may take over.
    lease_name: str = ""
    lease_namespace: str = "default"
    lease_seconds: float = 12.0
    identity: str = ""  # this replica's name in the Lease: the pod's name
    scrape_seconds: float = 30.0
    acceptance_window_seconds: float = 300.0
    # Where pods have no network (the end-to-end tests), read every leader's metrics here;
    # {pod} and {namespace} are filled in.
    scrape_url: str = ""
    # Likewise for the download Job's /progress.
    download_progress_url: str = ""
    # Read Nodes and GPU pods cluster-wide to say how many GPUs are free (chart: gpuInventory).
    gpu_inventory: bool = True
    workers: int = 8  # reconciles that may run at once (one per resource at a time)
    scrape_workers: int = 4
    coalesce_seconds: float = 0.1  # events for one resource within this become one reconcile
    # A failed reconcile is retried after 10 ms, doubling each time, up to this.
    retry_max_seconds: float = 300.0
    # Test clusters without GPUs only: a --speculative-config (JSON) used verbatim for
    # resources whose preflight is Disabled, so vLLM's CPU build can run a method it has.

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        namespaces = tuple(
            n.strip() for n in env.get("KIMIK3_NAMESPACES", "").split(",") if n.strip()
        )
        return cls(
            namespaces=namespaces,
            resync_seconds=float(env.get("KIMIK3_RESYNC_SECONDS", cls.resync_seconds)),
            health_endpoint=env.get("KIMIK3_HEALTH_ENDPOINT", cls.health_endpoint),
            metrics_port=int(env.get("KIMIK3_METRICS_PORT", cls.metrics_port)),
            metrics_address=env.get("KIMIK3_METRICS_ADDRESS", cls.metrics_address),
            scrape_seconds=float(env.get("KIMIK3_SCRAPE_SECONDS", cls.scrape_seconds)),
            acceptance_window_seconds=float(
                env.get("KIMIK3_ACCEPTANCE_WINDOW_SECONDS", cls.acceptance_window_seconds)
            ),
            scrape_url=env.get("KIMIK3_SCRAPE_URL", cls.scrape_url),
            download_progress_url=env.get(
                "KIMIK3_DOWNLOAD_PROGRESS_URL", cls.download_progress_url
            ),
            gpu_inventory=_flag(env.get("KIMIK3_GPU_INVENTORY"), cls.gpu_inventory),
            workers=int(env.get("KIMIK3_WORKERS", cls.workers)),
            coalesce_seconds=float(env.get("KIMIK3_COALESCE_SECONDS", cls.coalesce_seconds)),
            retry_max_seconds=float(env.get("KIMIK3_RETRY_MAX_SECONDS", cls.retry_max_seconds)),
            lease_name=env.get("KIMIK3_LEASE_NAME", cls.lease_name),
            lease_namespace=env.get("KIMIK3_LEASE_NAMESPACE") or cls.lease_namespace,
            lease_seconds=float(env.get("KIMIK3_LEASE_SECONDS", cls.lease_seconds)),
            identity=env.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
        )


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")
