"""Other tenants' scrape rate beside a hostile tenant, with the scrape pool shared as before
(first come, first served; a deployment's leaders read one after another) and as now (fair
between namespaces; a deployment's leaders read at once under one deadline).

The operator's real manager, fair pool and acceptance reader run against an in-memory API;
the leaders' answers come from a function: a well-behaved leader answers at once with vLLM's
counters, a hostile one only at the fetch's deadline. Time is compressed: one scrape tick a
second instead of 15 s, and a deadline of 1 s instead of 6 s. Three other tenants (one
namespace, one deployment and two leaders each) beside a hostile namespace with four
deployments of 16 groups whose leaders never answer. Also printed: the CPU one scrape of an
answer at the fetch's size limit costs the parser, whole and as now (only the spec-decode
lines). Prints figures; asserts nothing.

    .venv/bin/python bench/scrape_fairness.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator" / "tests")]

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from conftest import FakeKube  # noqa: E402 - the unit tier's fake API
from conftest import resource as kk3d  # noqa: E402
from e2e.support.vllm_exporter import FakeLeader  # noqa: E402
from kimik3_operator.config import Settings  # noqa: E402
from kimik3_operator.controller.reconcile import reconcile_for_runtime  # noqa: E402
from kimik3_operator.observation.acceptance import parse_metrics  # noqa: E402
from kimik3_operator.runtime import readers  # noqa: E402
from kimik3_operator.runtime.bounded_http import DEFAULT_MAX_BYTES  # noqa: E402
from kimik3_operator.runtime.manager import Manager  # noqa: E402
from kimik3_operator.runtime.readers import AcceptanceReader  # noqa: E402
from kimik3_operator.runtime.scrapes import FairScrapes  # noqa: E402

DEADLINE = 1.0
OTHERS = ("team-a", "team-b", "team-c")
HOSTILE, HOSTILE_DEPLOYMENTS, HOSTILE_GROUPS = "hostile", 4, 16


def leader(namespace: str, owner: str, group: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{owner}-{group}",
            "namespace": namespace,
            "uid": f"{namespace}-{owner}-{group}",
            "labels": {
                "app.kubernetes.io/instance": owner,
                "app.kubernetes.io/component": "leader",
                "app.kubernetes.io/managed-by": "kimik3-operator",
                "leaderworkerset.sigs.k8s.io/group-index": str(group),
            },
            # What a hostile tenant can forge in its own namespace: the leader set's name.
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner, "controller": True}
            ],
        },
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def run(seconds: float, hostile: bool, fair: bool) -> float:
    """Scrapes per minute of each other tenant's deployment."""
    exporter = FakeLeader(started=time.time() - 600)
    scraped: Counter[str] = Counter()
    lock = threading.Lock()

    def fetch(url: str) -> str:
        namespace = url.split("/")[2]
        if namespace == HOSTILE:
            time.sleep(DEADLINE)  # answers only at the deadline
            raise OSError("no answer before the deadline")
        with lock:
            scraped[namespace] += 1
        return exporter.exposition()

    acceptance = AcceptanceReader(
        fetch=fetch, url_override="http://{namespace}/{pod}", concurrency=16 if fair else 1
    )
    manager = Manager(
        api=FakeKube(),
        api_client=None,
        settings=Settings(gpu_inventory=False, scrape_workers=4),
        acceptance=acceptance,
        reconciler=reconcile_for_runtime,
        scrapes=None,
    )
    assert manager.scrapes is not None
    manager.scrapes.shutdown()
    # As before: one pool, first come first served (every namespace may take every worker).
    manager.scrapes = FairScrapes(4, manager._scrape_one, share=None if fair else 4)
    drafter = {"method": "eagle3", "repo": "x/y", "numSpeculativeTokens": 3}
    for namespace in OTHERS:
        body = kk3d("k3", drafter=drafter, replicas=2)
        body["metadata"]["namespace"] = namespace
        manager.store.upsert("KimiK3Deployment", body)
        for group in range(2):
            manager.store.upsert("Pod", leader(namespace, "k3", group))
    if hostile:
        for index in range(HOSTILE_DEPLOYMENTS):
            name = f"h{index}"
            body = kk3d(name, drafter=drafter, replicas=HOSTILE_GROUPS)
            body["metadata"]["namespace"] = HOSTILE
            manager.store.upsert("KimiK3Deployment", body)
            for group in range(HOSTILE_GROUPS):
                manager.store.upsert("Pod", leader(HOSTILE, name, group))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        manager.submit_scrapes()
        time.sleep(1.0)
    manager.stop()
    per_deployment = [scraped[n] / 2 for n in OTHERS]  # two leaders a deployment
    return sum(per_deployment) / len(per_deployment) * 60 / seconds


def parse_cost() -> tuple[float, float]:
    exposition = FakeLeader(started=time.time() - 600).exposition()
    filler = "".join(f'other_metric{{i="{i}"}} {i}\n' for i in range(200_000))
    cut = filler[: DEFAULT_MAX_BYTES - len(exposition)]
    answer = exposition + cut[: cut.rindex("\n") + 1]
    started = time.process_time()
    for _ in text_string_to_metric_families(answer):
        pass
    whole = time.process_time() - started
    started = time.process_time()
    parse_metrics(answer, at=time.time())
    now = time.process_time() - started
    return whole, now


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    seconds = parser.parse_args().seconds
    readers.SCRAPE_DEADLINE_SECONDS = DEADLINE + 0.2
    print(f"one tick a second, {seconds:.0f} s each; other tenants' scrapes per minute:")
    for fair in (False, True):
        label = "now (fair, concurrent)" if fair else "before (FIFO, one by one)"
        alone = run(seconds, hostile=False, fair=fair)
        beside = run(seconds, hostile=True, fair=fair)
        print(
            f"  {label:28} alone {alone:5.1f}/min   beside the hostile tenant {beside:5.1f}/min"
            f"   ({100 * beside / alone:5.1f} % of alone)"
        )
    whole, now = parse_cost()
    print(
        f"CPU to parse a {DEFAULT_MAX_BYTES >> 20} MiB answer: whole {whole:.2f} s, "
        f"spec-decode lines only {now:.3f} s"
    )


if __name__ == "__main__":
    main()
