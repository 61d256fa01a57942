"""Acceptance from the leaders' counters: deltas over a window, resets, idle windows, a
missing per-position series, unreachable pods, and writes only when a value moved."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import FakeKube, key_of, resource
from e2e.support.vllm_exporter import FakeLeader
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.observation.acceptance import (
    LeaderWindow,
    Snapshot,
    aggregate,
    parse_metrics,
    speculative_section,
)
from kimik3_operator.observation.readings import Readings
from kimik3_operator.runtime.readers import AcceptanceReader

API = "serving.kimik3.io/v1alpha1"


def snap(
    at: float, drafts: float, k: int = 8, rate: float = 0.7, positions: bool = True
) -> Snapshot:
    per = {i: drafts * 0.7 for i in range(k)} if positions else {}
    return Snapshot(at, drafts, drafts * k, drafts * k * rate, per)


def test_parse_sums_engines_and_reads_positions() -> None:
    leader = FakeLeader(started=0.0)
    parsed = parse_metrics(leader.exposition(now=100.0), 100.0)
    assert parsed is not None
    assert parsed.drafts == pytest.approx(1000)
    assert parsed.draft_tokens == pytest.approx(8000)
    assert parsed.accepted == pytest.approx(5600)
    assert parsed.per_position[7] == pytest.approx(300)
    assert parse_metrics(FakeLeader(spec_decode=False).exposition(), 0.0) is None


def test_window_delta_gives_rate_length_and_positions() -> None:
    leader = FakeLeader(started=0.0)
    window = LeaderWindow()
    for t in (0.0, 100.0, 200.0, 300.0, 400.0):
        parsed = parse_metrics(leader.exposition(now=t), t)
        assert parsed is not None
        window.add(parsed, 300.0)
    result = aggregate([window], 300.0)
    assert result.rate == pytest.approx(0.7)
    assert result.mean_length == pytest.approx(6.6)
    assert result.per_position == pytest.approx(list(leader.per_position))
    assert result.window_covered
    assert window.samples[0].at == 100.0, "samples older than the window are dropped"


def test_aggregate_weights_leaders_by_their_drafts() -> None:
    busy, quiet = LeaderWindow(), LeaderWindow()
    busy.add(snap(0, 0), 300)
    busy.add(snap(300, 900, rate=0.8), 300)
    quiet.add(snap(0, 0), 300)
    quiet.add(snap(300, 100, rate=0.4), 300)
    assert aggregate([busy, quiet], 300).rate == pytest.approx((900 * 0.8 + 100 * 0.4) / 1000)


def test_counter_reset_starts_the_window_afresh() -> None:
    window = LeaderWindow()
    window.add(snap(0, 1000), 300)
    window.add(snap(30, 2000), 300)
    window.add(snap(60, 10, rate=0.5), 300)  # the pod restarted
    assert len(window.samples) == 1
    assert window.delta() is None
    window.add(snap(90, 110, rate=0.5), 300)
    assert aggregate([window], 300).rate == pytest.approx(0.5)


def test_idle_window_has_no_values_not_zero() -> None:
    window = LeaderWindow()
    window.add(snap(0, 500), 300)
    window.add(snap(300, 500), 300)
    result = aggregate([window], 300)
    assert (result.rate, result.mean_length, result.per_position) == (None, None, None)


def test_missing_per_position_series() -> None:
    window = LeaderWindow()
    window.add(snap(0, 0, positions=False), 300)
    window.add(snap(300, 100, positions=False), 300)
    result = aggregate([window], 300)
    assert result.rate == pytest.approx(0.7) and result.per_position is None


def test_section_is_written_only_when_moved_or_old() -> None:
    window = LeaderWindow()
    window.add(snap(0, 0), 300)
    window.add(snap(300, 100), 300)
    acceptance = aggregate([window], 300)
    first = speculative_section({"method": "dspark"}, acceptance, now=300, sampled_at="t1")
    assert first is not None and first["acceptanceRate"] == 0.7
    assert speculative_section(first, acceptance, now=330, sampled_at="t2", last_write=300) is None
    assert (
        speculative_section(first, acceptance, now=700, sampled_at="t3", last_write=300) is not None
    ), "refreshed when old"
    window.add(snap(600, 200, rate=0.6), 300)
    moved = speculative_section(
        first, aggregate([window], 300), now=600, sampled_at="t4", last_write=300
    )
    assert moved is not None and moved["acceptanceRate"] == pytest.approx(0.5)


def test_unreachable_keeps_the_last_value_and_says_so() -> None:
    last = {
        "method": "dspark",
        "acceptanceRate": 0.7,
        "meanAcceptanceLength": 6.6,
        "sampledAt": "t0",
    }
    idle = aggregate([], 300)
    stale = speculative_section(last, idle, now=1, sampled_at="t1", unreachable=["k3-0"])
    assert stale is not None
    assert stale["acceptanceRate"] == 0.7 and stale["sampledAt"] == "t0"
    assert "k3-0" in str(stale["stale"])


def leader_pod(name: str = "k3-0", ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "labels": {
                "app.kubernetes.io/instance": "k3",
                "app.kubernetes.io/component": "leader",
                "app.kubernetes.io/managed-by": "kimik3-operator",
                "leaderworkerset.sigs.k8s.io/group-index": name.rsplit("-", 1)[-1],
            },
            # As LeaderWorkerSet makes it: its leader StatefulSet has the LWS's name.
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "k3",
                    "uid": "sts",
                    "controller": True,
                }
            ],
        },
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def condition(kube: FakeKube, type_: str) -> tuple[str, str]:
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    assert body is not None
    found = next(c for c in body["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


def scrape(kube: FakeKube, reader: AcceptanceReader) -> bool:
    """What the manager does: the reader records; a reading that would change the status
    enqueues the resource, and its reconcile (the status's only writer) writes it."""
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    writes = len(kube.writes)
    wanted = reader.tick(kube, body)
    assert len(kube.writes) == writes, "the reader writes nothing"
    if wanted:
        readings = Readings(acceptance=reader.reading(key_of(body)))
        reconcile(
            kube, key_of(body), Context(clock=lambda: "2026-12-03T00:00:00Z", readings=readings)
        )
    return wanted


def settled(kube: FakeKube) -> None:
    """The first reconcile: children and the status, before any reading."""
    reconcile(kube, ("llm", "k3"), Context(clock=lambda: "2026-12-03T00:00:00Z"))
    kube.writes.clear()


def test_reading_reaches_the_status_and_condition_then_nothing() -> None:
    kube = FakeKube()
    kube.put(resource(monitoring={"minAcceptanceRate": 0.5}))
    kube.put(leader_pod())
    settled(kube)
    leader = FakeLeader(started=0.0)
    clock = [0.0]
    urls: list[str] = []

    def fetch(url: str) -> str:
        urls.append(url)
        return leader.exposition(now=clock[0])

    reader = AcceptanceReader(window_seconds=60, fetch=fetch, clock=lambda: clock[0])
    assert scrape(kube, reader)  # one sample, no window yet: still measuring
    assert condition(kube, "SpeculationEffective") == ("Unknown", "MeasuringAcceptance")
    clock[0] = 60.0
    assert scrape(kube, reader)
    status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]  # type: ignore[index]
    assert status["speculative"]["acceptanceRate"] == pytest.approx(0.7)
    assert status["speculative"]["perPositionAcceptance"] == pytest.approx(
        list(leader.per_position)
    )
    assert status["speculative"]["sampledAt"] == "1970-01-01T00:01:00Z"
    assert condition(kube, "SpeculationEffective") == ("True", "AcceptanceAboveMinimum")
    assert urls[0] == "http://10.0.0.1:8000/metrics"
    kube.writes.clear()
    clock[0] = 90.0
    assert not scrape(kube, reader)
    assert [w for w in kube.writes if w[0] != "create"] == []
    # A reconcile for another reason with the same reading writes nothing either.
    body = kube.get(API, "KimiK3Deployment", "k3", "llm")
    readings = Readings(acceptance=reader.reading(key_of(body)))
    reconcile(kube, key_of(body), Context(clock=lambda: "2026-12-03T00:00:00Z", readings=readings))
    assert [w for w in kube.writes if w[0] != "create"] == []
    # The numbers are refreshed once they are older than the thresholds' age, as before.
    clock[0] = 60.0 + 301
    assert scrape(kube, reader)


def test_a_restarted_operator_keeps_the_verdict_until_its_first_window() -> None:
    """The operator restarts with no samples: the verdict it finds stays (no write, no event
    for every deployment), and the first whole window of the new reader replaces it."""
    kube = FakeKube()
    kube.put(resource(monitoring={"minAcceptanceRate": 0.9}))
    kube.put(leader_pod())
    settled(kube)
    leader = FakeLeader(started=0.0)
    clock = [0.0]

    def reader() -> AcceptanceReader:
        return AcceptanceReader(
            window_seconds=60,
            fetch=lambda _: leader.exposition(now=clock[0]),
            clock=lambda: clock[0],
            url_override="http://127.0.0.1:9/{pod}",
        )

    first = reader()
    scrape(kube, first)
    clock[0] = 61.0
    scrape(kube, first)
    assert condition(kube, "SpeculationEffective") == ("False", "AcceptanceBelowMinimum")
    # The drafter was fixed while the operator was down.
    leader = FakeLeader(started=0.0, per_position=(0.99, 0.99, 0.99))
    restarted = reader()
    clock[0] = 100.0
    kube.writes.clear()
    assert not scrape(kube, restarted)
    assert condition(kube, "SpeculationEffective") == ("False", "AcceptanceBelowMinimum")
    assert [w for w in kube.writes if w[0] != "create"] == []
    clock[0] = 161.0
    assert scrape(kube, restarted)
    assert condition(kube, "SpeculationEffective") == ("True", "AcceptanceAboveMinimum")


def test_acceptance_below_minimum_for_a_whole_window() -> None:
    kube = FakeKube()
    kube.put(resource(monitoring={"minAcceptanceRate": 0.9}))
    kube.put(leader_pod())
    settled(kube)
    leader = FakeLeader(started=0.0)
    clock = [0.0]
    reader = AcceptanceReader(
        window_seconds=60,
        fetch=lambda _: leader.exposition(now=clock[0]),
        clock=lambda: clock[0],
        url_override="http://127.0.0.1:9/{pod}",
    )
    scrape(kube, reader)
    clock[0] = 30.0
    scrape(kube, reader)
    assert condition(kube, "SpeculationEffective") == ("Unknown", "MeasuringAcceptance")
    clock[0] = 61.0
    scrape(kube, reader)
    assert condition(kube, "SpeculationEffective") == ("False", "AcceptanceBelowMinimum")


def test_unreachable_leader_is_reported_stale() -> None:
    kube = FakeKube()
    kube.put(resource())
    kube.put(leader_pod())
    settled(kube)
    leader = FakeLeader(started=0.0)
    clock = [0.0]
    down = [False]

    def fetch(_: str) -> str:
        if down[0]:
            raise OSError("connection refused")
        return leader.exposition(now=clock[0])

    reader = AcceptanceReader(window_seconds=60, fetch=fetch, clock=lambda: clock[0])
    scrape(kube, reader)
    clock[0] = 60.0
    scrape(kube, reader)
    down[0] = True
    clock[0] = 90.0
    scrape(kube, reader)
    spec_status = kube.get(API, "KimiK3Deployment", "k3", "llm")["status"]["speculative"]  # type: ignore[index]
    assert spec_status["acceptanceRate"] == pytest.approx(0.7)
    assert "k3-0" in spec_status["stale"]
