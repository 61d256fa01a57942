"""One skewed load through three routings, side by side in one run on the local control plane
(make cluster-up): four groups, one of whose drafters has collapsed (it verifies 1.15
tokens a step instead of 4, so each request holds it 3.5 times as long), under the same
open-loop arrivals:

1. a plain Service: kube-proxy's random choice of a leader;
2. the endpoint picker (the Gateway API Inference Extension's EPP v1.5.0, with the config
   the operator gives it), every group in its pool;
3. the same picker with the operator's acceptance-gated membership: the operator's own
   decision (controller/routing.py) over each leader's spec-decode counters sets the
   routable label, and the pool's selector drops the collapsed group.

The leaders are KWOK pods whose made-up addresses are added to the loopback interface, each
with a model server there (e2e/support/epp.py) that serves a few requests at once, queues the
rest and reports vLLM's queue and KV-cache gauges from what it holds; the picker reads them
as it reads vLLM. A request's answer comes whole, so its time to first token is its latency.
Prints p50 and p99 time to first token and the throughput of each; asserts nothing.

    make cluster-up && .venv/bin/python bench/routing.py [--rate 30] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter  # noqa: E402

from e2e.support.cluster import (  # noqa: E402
    Cluster,
    create_test_namespace,
    tools_bin,
    wait_for,
)
from e2e.support.epp import (  # noqa: E402
    Gateway,
    ModelServer,
    Picker,
    install_crds,
    model_servers,
)
from e2e.support.vllm_exporter import FakeLeader  # noqa: E402
from kimik3_operator.api import constants as c  # noqa: E402
from kimik3_operator.api.parse import parse_spec  # noqa: E402
from kimik3_operator.builders.common import Owner  # noqa: E402
from kimik3_operator.builders.routing import PickerSettings, routing_children  # noqa: E402
from kimik3_operator.controller.routing import (  # noqa: E402
    GroupInput,
    RoutingInput,
    routing_plan,
)

KUBECONFIG = ROOT / "e2e" / ".run" / "kubeconfig"
NAME = "bench-routing"
GROUPS = 4
COLLAPSED = 3
GOOD = (0.9, 0.8, 0.7, 0.6)  # 3.0 accepted a draft: 4 tokens a step
BAD = (0.1, 0.05, 0.0, 0.0)  # 0.15 accepted: 1.15 tokens a step
SECONDS_PER_REQUEST = 0.2  # a good group's request
SLOTS = 4  # requests a group serves at once


def leader_pod(namespace: str, group: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-{group}",
            "namespace": namespace,
            "labels": {
                c.LABEL_INSTANCE: NAME,
                c.LABEL_COMPONENT: c.COMPONENT_LEADER,
                c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
                c.LWS_GROUP_INDEX_LABEL: str(group),
                c.LABEL_ROUTABLE: "true",
            },
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
    }


def without_owner(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["metadata"].pop("ownerReferences", None)
    return manifest


def label(cluster: Cluster, namespace: str, group: int, value: str) -> None:
    cluster.kubectl(
        "label",
        "pod",
        f"{NAME}-{group}",
        "-n",
        namespace,
        f"{c.LABEL_ROUTABLE}={value}",
        "--overwrite",
    )


def gated_membership(servers: list[ModelServer]) -> dict[int, str]:
    """The operator's decision on each group, from its leader's acceptance."""
    groups = tuple(
        GroupInput(
            index=i,
            leader=f"{NAME}-{i}",
            ready=True,
            label="true",
            acceptance=server.leader.expected()["acceptance_rate"],  # type: ignore[arg-type]
        )
        for i, server in enumerate(servers)
    )
    plan = routing_plan(RoutingInput(groups, 0.5, picker_ready=True))
    return {change.group: change.value for change in plan.labels}


def run_load(send: Any, rate: float, seconds: float) -> tuple[list[float], int, float]:
    """Open-loop arrivals (exponential gaps) for ``seconds``; each latency is measured from
    the request's arrival, so waiting for a free client counts too."""
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    rng = random.Random(7)

    def one(arrived: float) -> None:
        nonlocal failures
        ok = send()
        took = time.monotonic() - arrived
        with lock:
            if ok:
                latencies.append(took)
            else:
                failures += 1

    began = time.monotonic()
    with ThreadPoolExecutor(256) as pool:
        at = began
        while at - began < seconds:
            at += rng.expovariate(rate)
            pause = at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            pool.submit(one, at)
    return latencies, failures, time.monotonic() - began


def drained(servers: list[ModelServer]) -> None:
    """Until no server holds a request: each routing starts from empty queues."""
    wait_for(lambda: all(s.held == 0 for s in servers), 600, "the queues to drain")


FAILURES: Counter[str] = Counter()


def post(url: str) -> bool:
    body = f'{{"model": "moonshotai/Kimi-K3", "prompt": "{uuid.uuid4().hex}", "max_tokens": 64}}'
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()
            return answer.status == 200
    except urllib.error.HTTPError as err:
        FAILURES[f"{err.code} {err.read()[:120].decode(errors='replace').strip()}"] += 1
        return False
    except OSError as err:
        FAILURES[type(err).__name__ + ": " + str(err)[:80]] += 1
        return False


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="requests a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="per routing")
    args = parser.parse_args()
    cluster = Cluster(KUBECONFIG, tools_bin())
    os.environ["KUBECONFIG"] = str(KUBECONFIG)
    install_crds(cluster)
    namespace = create_test_namespace(cluster, f"bench-routing-{uuid.uuid4().hex[:6]}")
    owner = Owner(NAME, namespace, "bench")
    spec = parse_spec({"routing": {}})
    for child in routing_children(spec, owner, PickerSettings(), gateway_api=False):
        if child["kind"] in ("ConfigMap", "Deployment", "InferencePool"):
            cluster.apply(without_owner(child), namespace)
    for group in range(GROUPS):
        cluster.apply(leader_pod(namespace, group), namespace)

    def addresses() -> list[str]:
        pods = [cluster.get("pod", f"{NAME}-{g}", namespace) or {} for g in range(GROUPS)]
        return [str(p.get("status", {}).get("podIP") or "") for p in pods]

    wait_for(lambda: all(addresses()), 120, "the leaders' addresses")
    slow = SECONDS_PER_REQUEST * (1 + sum(GOOD)) / (1 + sum(BAD))
    servers = [
        ModelServer(
            address,
            capacity=SLOTS,
            seconds_per_request=slow if group == COLLAPSED else SECONDS_PER_REQUEST,
            leader=FakeLeader(per_position=BAD if group == COLLAPSED else GOOD, running=0),
        )
        for group, address in enumerate(addresses())
    ]
    picker = Picker(cluster, namespace, f"{NAME}-epp", KUBECONFIG)
    results: dict[str, tuple[list[float], int, float]] = {}
    with model_servers(servers):
        picker.start()
        gateway = Gateway(picker.grpc)
        try:
            urls = [f"http://{s.address}:{s.port}/v1/completions" for s in servers]
            rng = random.Random(11)
            time.sleep(3)
            results["plain Service (random leader)"] = run_load(
                lambda: post(rng.choice(urls)), args.rate, args.seconds
            )
            drained(servers)
            through = f"http://{gateway.address}/v1/completions"
            results["endpoint picker, every group"] = run_load(
                lambda: post(through), args.rate, args.seconds
            )
            for group, value in gated_membership(servers).items():
                label(cluster, namespace, group, value)
            drained(servers)
            time.sleep(2)  # the picker's watch sees the label
            results["endpoint picker, acceptance-gated (ours)"] = run_load(
                lambda: post(through), args.rate, args.seconds
            )
        finally:
            gateway.stop()
            picker.stop()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    served = ", ".join(f"group {i}: {s.served}" for i, s in enumerate(servers))
    print(
        f"\n{GROUPS} groups, group {COLLAPSED}'s drafter collapsed ({slow:.2f}s a request "
        f"against {SECONDS_PER_REQUEST:.2f}s), {args.rate:g} requests/s for {args.seconds:g}s "
        f"each; requests served per group over the whole run: {served}\n"
    )
    print(f"{'routing':<44} {'p50 TTFT':>9} {'p99 TTFT':>9} {'req/s':>7} {'failed':>7}")
    plain_p99 = quantile(results["plain Service (random leader)"][0], 0.99)
    for name, (latencies, failures, spent) in results.items():
        print(
            f"{name:<44} {quantile(latencies, 0.5):>8.2f}s {quantile(latencies, 0.99):>8.2f}s "
            f"{len(latencies) / spent:>7.1f} {failures:>7}"
        )
    if FAILURES:
        print("failed requests, by answer: " + "; ".join(f"{n} x {k}" for k, n in FAILURES.items()))
    ours = quantile(results["endpoint picker, acceptance-gated (ours)"][0], 0.99)
    print(f"\np99 ours / plain Service: {ours / plain_p99:.2f} (goal 0.5 or less)")
    mean = statistics.mean(results["endpoint picker, every group"][0] or [float("nan")])
    print(f"mean TTFT through the picker with every group: {mean:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
