"""Names of the children of one KimiK3Deployment. Builders never format names themselves."""

from __future__ import annotations

import hashlib


def leader_worker_set(name: str) -> str:
    return name


def service(name: str) -> str:
    return name


def pod_monitor(name: str) -> str:
    return name


def preflight_job(name: str, cache_key: str) -> str:
    digest = hashlib.sha256(cache_key.encode()).hexdigest()[:10]
    return f"{name[:40]}-preflight-{digest}"


def probe_config_map(name: str) -> str:
    return f"{name[:40]}-preflight-probe"


def model_cache_claim(name: str) -> str:
    return f"{name[:40]}-model-cache"


def download_job(name: str, cache_key: str) -> str:
    digest = hashlib.sha256(cache_key.encode()).hexdigest()[:10]
    return f"{name[:40]}-download-{digest}"


def download_config_map(name: str) -> str:
    return f"{name[:40]}-download-script"


def endpoint(name: str, namespace: str, port: int) -> str:
    return f"http://{service(name)}.{namespace}.svc:{port}"
