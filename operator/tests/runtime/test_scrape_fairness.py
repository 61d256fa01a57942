"""One tenant cannot starve another's scrapes: which leaders are read, how long a
deployment's scrape may take, and how the pool is shared between namespaces."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from conftest import spec_of
from kimik3_operator.observation.acceptance import (
    MAX_SPEC_DECODE_LINES,
    parse_metrics,
    spec_decode_lines,
)
from kimik3_operator.runtime import readers
from kimik3_operator.runtime.readers import AcceptanceReader, scraped_leaders
from kimik3_operator.runtime.scrapes import FairScrapes


def leader(group: str, owner: str = "k3", kind: str = "StatefulSet", ready: bool = True) -> Any:
    return {
        "metadata": {
            "name": f"k3-{group}",
            "namespace": "llm",
            "uid": f"u-{group}-{owner}-{kind}",
            "labels": {"leaderworkerset.sigs.k8s.io/group-index": group},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": owner, "controller": True}
            ],
        },
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_only_the_leader_sets_pods_one_per_group_and_no_more_groups_than_the_spec() -> None:
    spec = spec_of(replicas=2)
    pods = [
        leader("0"),
        leader("0", owner="k3"),  # a second pod claiming group 0: one is read
        leader("1"),
        leader("1", owner="other"),  # another StatefulSet's pod
        leader("1", kind="ReplicaSet", owner="k3"),
        leader("2"),  # beyond replicas (and no surge)
        leader("x"),
        leader("0", ready=False),
    ]
    chosen = scraped_leaders(pods, "k3", spec)
    assert [p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] for p in chosen] == [
        "0",
        "1",
    ]
    assert chosen[1]["metadata"]["uid"] == "u-1-k3-StatefulSet"
    surge = spec_of(replicas=2, rollout={"maxSurge": "50%"})
    assert len(scraped_leaders([leader(str(i)) for i in range(5)], "k3", surge)) == 3
    labelled_only = leader("0")
    del labelled_only["metadata"]["ownerReferences"]
    assert scraped_leaders([labelled_only], "k3", spec) == []


def test_a_deployments_leaders_are_read_at_once_under_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deadline = 0.5  # the deadline scaled down, as the fetch's own bound would be
    monkeypatch.setattr(readers, "SCRAPE_DEADLINE_SECONDS", deadline)
    release = threading.Event()
    started: list[str] = []

    def silent(url: str) -> str:
        started.append(url)
        release.wait(10)
        return ""

    reader = AcceptanceReader(fetch=silent)
    urls = [f"http://10.0.0.{i}:8000/metrics" for i in range(16)]
    began = time.monotonic()
    answers = reader._fetch_all(urls)
    took = time.monotonic() - began
    release.set()
    assert len(started) == 16, "every leader asked at once"
    assert took < deadline + 0.5, f"16 silent leaders took {took:.1f}s, not one deadline"
    assert all(isinstance(a, TimeoutError) for a in answers)


def test_the_parser_sees_only_spec_decode_lines_and_a_bounded_number() -> None:
    answer = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        "vllm:spec_decode_num_drafts_total 10\n"
        "vllm:spec_decode_num_draft_tokens_total 30\n"
        "vllm:spec_decode_num_accepted_tokens_total 20\n" + "other_metric 1\n" * 100_000
    )
    assert spec_decode_lines(answer).count("\n") == 4
    snapshot = parse_metrics(answer, at=1.0)
    assert snapshot is not None and snapshot.accepted == 20
    flood = "vllm:spec_decode_num_drafts_total 1\n" * (MAX_SPEC_DECODE_LINES + 1)
    with pytest.raises(ValueError, match="spec-decode lines"):
        parse_metrics(flood, at=1.0)


def test_a_namespace_holds_no_more_than_its_share_of_the_workers() -> None:
    release = threading.Event()
    done: list[tuple[str, str]] = []
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()

    def scrape(key: tuple[str, str]) -> None:
        with lock:
            running[key[0]] = running.get(key[0], 0) + 1
            most[key[0]] = max(most.get(key[0], 0), running[key[0]])
        if key[0] == "hostile":
            release.wait(10)  # leaders that answer only at the deadline
        with lock:
            running[key[0]] -= 1
            done.append(key)

    pool = FairScrapes(4, scrape)
    try:
        hostile = [("hostile", f"d{i}") for i in range(8)]
        others = [("team-a", "k3"), ("team-b", "k3")]
        assert pool.submit(hostile + others) == 10
        deadline = time.monotonic() + 5
        while len([k for k in done if k[0] != "hostile"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {k for k in done if k[0] != "hostile"} == set(others), (
            "the other tenants are scraped while the hostile one's scrapes hang"
        )
        assert most["hostile"] == 1, "three namespaces: a share of one worker each"
        while pool.running() > 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the other tenants' scrapes are wound up
        assert pool.submit(hostile + others) == 2, "only the finished ones are queued again"
    finally:
        release.set()
        pool.shutdown()
