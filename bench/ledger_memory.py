"""What the GPU ledger's list of a cluster's pods costs the operator, side by side in one run:
the informer as it is configured now (pages of 500 decoded as a stream, only the pods that
hold GPUs kept, nothing remembered of the others) against the configuration before it (pages
of 20, every pod kept until the list ends and remembered by the informer).

The pods are served from memory as the API server writes them (a 3 KiB pod with managed
fields, env and status), through the informer's own list and sync code, so only the
operator's side is measured. Printed per configuration and cluster: requests, seconds, the
memory held once the list is synced (tracemalloc: what stays), the peak during the list, and
per pod. Prints figures; asserts nothing.

    .venv/bin/python bench/ledger_memory.py [--pods 100000] [--holding 0.1]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import pathlib
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kimik3_operator.runtime.gpu_ledger import GpuLedger, pods_informer  # noqa: E402


def pod(number: int, holds_gpus: bool) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"}
    if holds_gpus:
        requests["nvidia.com/gpu"] = "8"
    return {
        "metadata": {
            "name": f"worker-{number}",
            "namespace": f"team-{number % 50}",
            "uid": f"{number:08d}-0000-4000-8000-000000000000",
            "resourceVersion": str(1000 + number),
            "creationTimestamp": "2026-12-06T00:00:00Z",
            "labels": {"app": "batch", "job-name": f"job-{number // 4}"},
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update",
                 "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                              "f:spec": {"f:containers": {'k:{"name":"main"}': {}}}}}
            ],
        },
        "spec": {
            "nodeName": f"node-{number % 2000}",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/batch:1.0",
                    "env": [{"name": f"SETTING_{i}", "value": "x" * 40} for i in range(12)],
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": t, "status": "True"} for t in ("Ready", "Initialized")],
        },
    }  # fmt: skip


class Response:
    def __init__(self, body: bytes) -> None:
        self.status = 200
        self.response = self
        self._body = body

    def stream(self, size: int, decode_content: bool = True) -> Iterator[bytes]:
        for at in range(0, len(self._body), size):
            yield self._body[at : at + size]

    def release_conn(self) -> None:
        pass


class Pods:
    """Answers the informer's paged list from ``count`` pods, generated page by page."""

    def __init__(self, count: int, holding: float) -> None:
        self.count = count
        self.every = round(1 / holding) if holding > 0 else 0
        self.requests = 0

    def param_serialize(self, **kwargs: Any) -> tuple[Any, ...]:
        return (dict(kwargs["query_params"]),)

    def call_api(self, query: dict[str, str], _request_timeout: Any = None) -> Response:
        self.requests += 1
        start, limit = int(query.get("continue") or 0), int(query["limit"])
        end = min(self.count, start + limit)
        items = [pod(n, self.every > 0 and n % self.every == 0) for n in range(start, end)]
        more = {"continue": str(end)} if end < self.count else {}
        return Response(
            json.dumps({"metadata": {"resourceVersion": "9", **more}, "items": items}).encode()
        )


def measure(now: bool, count: int, holding: float) -> tuple[int, float, float, float, int]:
    api = Pods(count, holding)
    ledger = GpuLedger()
    informer = pods_informer(api, ledger.pods_listed, lambda kind, obj: None)
    if not now:  # pages of 20, every pod kept and remembered
        informer = dataclasses.replace(informer, page=20, list_transform=None, track=True)
    gc.collect()
    tracemalloc.start()
    started = time.perf_counter()
    items, _ = informer._list()
    informer._sync(items)
    del items
    took = time.perf_counter() - started
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = len(ledger._pods)
    return api.requests, took, held / 2**20, peak / 2**20, kept


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--holding", type=float, default=0.1, help="share holding GPUs")
    args = parser.parse_args()
    print(f"{'':44} {'requests':>8} {'seconds':>8} {'held':>9} {'peak':>9} {'per pod':>9}")
    for holding in (args.holding, 1.0):
        for now in (False, True):
            requests, took, held, peak, kept = measure(now, args.pods, holding)
            name = f"{'now' if now else 'before'}: {args.pods:,} pods, {kept:,} holding GPUs"
            print(
                f"{name:44} {requests:>8} {took:>7.1f}s {held:>6.1f} MiB {peak:>6.1f} MiB "
                f"{held * 2**20 / args.pods:>5.0f} B"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
