"""The controller's parts: the coalescing queue, the watch-fed store, event types, and the
migration off kopf's finalizer."""

from __future__ import annotations

import threading
from typing import Any

from conftest import FakeKube, resource
from kimik3_operator.api.constants import LEGACY_KOPF_FINALIZER, ConditionType
from kimik3_operator.cache import CachedKube, Store, parse_selector
from kimik3_operator.conditions import Condition
from kimik3_operator.handlers.events import event_type
from kimik3_operator.handlers.queue import WorkQueue
from kimik3_operator.handlers.reconcile import reconcile


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_events_for_one_resource_is_one_reconcile() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.1, clock=clock)
    for _ in range(16):
        queue.add("llm/k3")
    queue.add("llm/other")
    assert queue.get(timeout=0) is None  # not due yet: the burst may still grow
    clock.now = 0.2
    assert {queue.get(timeout=0), queue.get(timeout=0)} == {"llm/k3", "llm/other"}
    assert queue.get(timeout=0) is None
    assert queue.coalesced == 15


def test_a_key_added_while_it_runs_runs_once_more_afterwards_never_twice_at_once() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.0, clock=clock)
    queue.add("k")
    assert queue.get(timeout=0) == "k"
    queue.add("k")
    queue.add("k")
    assert queue.get(timeout=0) is None  # still running: not handed out a second time
    queue.done("k")
    assert queue.get(timeout=0) == "k"
    queue.done("k")
    assert queue.get(timeout=0) is None


def test_an_earlier_due_time_wins() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.0, clock=clock)
    queue.add("k", delay=5.0)
    queue.add("k")
    assert queue.get(timeout=0) == "k"


def test_close_releases_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    queue.close()
    worker.join(timeout=5)
    assert got == [None]


def pod(name: str, version: str, uid: str = "u", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": uid,
            "resourceVersion": version,
            "labels": labels,
            "managedFields": [{"manager": "x"}],
        }
    }


def test_store_lists_by_selector_and_keeps_no_managed_fields() -> None:
    store = Store()
    store.replace("Pod", "llm", [pod("a", "1", app="x"), pod("b", "1", app="y")])
    assert [p["metadata"]["name"] for p in store.list("Pod", "llm", "app=x")] == ["a"]
    assert "managedFields" not in store.get("Pod", "llm", "a")["metadata"]  # type: ignore[index]
    assert parse_selector("a=b, c==d") == {"a": "b", "c": "d"}


def test_a_list_replaces_the_scope_so_deletions_missed_by_the_watch_disappear() -> None:
    store = Store()
    store.replace("Pod", "llm", [pod("a", "1"), pod("b", "1")])
    store.upsert(
        "Pod", {**pod("c", "1"), "metadata": {**pod("c", "1")["metadata"], "namespace": "x"}}
    )
    store.replace("Pod", "llm", [pod("b", "2")])
    assert set(store.keys("Pod")) == {("x", "c"), ("llm", "b")}


def test_an_event_older_than_our_own_write_does_not_roll_the_cache_back() -> None:
    store = Store()
    store.upsert("Pod", pod("a", "7"))
    store.upsert("Pod", pod("a", "5"))
    assert store.get("Pod", "llm", "a")["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    store.upsert("Pod", pod("a", "3", uid="new"))  # recreated under the same name
    assert store.get("Pod", "llm", "a")["metadata"]["uid"] == "new"  # type: ignore[index]


def test_cached_reads_make_no_request_and_writes_land_in_the_cache() -> None:
    api = FakeKube()
    store = Store()
    kube = CachedKube(api, store)
    body = resource()
    store.upsert(body["kind"], body)
    api.put(body)
    assert kube.get(body["apiVersion"], body["kind"], "k3", "llm") is not None
    assert api.writes == []
    kube.patch_status(body["apiVersion"], body["kind"], "k3", "llm", {"reason": "X"})
    assert store.get(body["kind"], "llm", "k3")["status"]["reason"] == "X"  # type: ignore[index]


def test_every_condition_that_reports_trouble_is_a_warning() -> None:
    def cond(type_: str, status: str) -> Condition:
        return Condition(type_, status, "AnyReason", "")

    for type_ in (
        ConditionType.CAPABILITIES_VERIFIED,
        ConditionType.DRAFTER_PAIRED,
        ConditionType.AVAILABLE,
        ConditionType.SPECULATION_EFFECTIVE,
    ):
        assert event_type(cond(type_, "False")) == "Warning"
        assert event_type(cond(type_, "True")) == "Normal"
        assert event_type(cond(type_, "Unknown")) == "Normal"
    assert event_type(cond(ConditionType.DEGRADED, "True")) == "Warning"
    assert event_type(cond(ConditionType.DEGRADED, "False")) == "Normal"
    assert event_type(cond(ConditionType.PROGRESSING, "False")) == "Normal"


def test_a_resource_made_by_an_earlier_release_loses_kopfs_finalizer() -> None:
    kube = FakeKube()
    body = resource()
    body["metadata"]["finalizers"] = [LEGACY_KOPF_FINALIZER, "example.com/other"]
    kube.put(body)
    reconcile(kube, body)
    stored = kube.get(body["apiVersion"], body["kind"], "k3", "llm")
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["example.com/other"]
    assert ("patch", "KimiK3Deployment", "k3") in kube.writes


def test_a_retry_asked_for_while_running_keeps_its_delay() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.1, clock=clock)
    queue.add("k", delay=0.0)
    assert queue.get(timeout=0) == "k"
    queue.add("k", delay=5.0)  # the reconcile failed: retry in 5 s, not at once
    queue.done("k")
    clock.now = 1.0
    assert queue.get(timeout=0) is None
    clock.now = 5.0
    assert queue.get(timeout=0) == "k"


def test_the_store_keeps_what_the_operator_reads_and_no_more() -> None:
    """A labelled 1 MiB ConfigMap costs its identity; a pod, its node and status; the
    resource itself is kept whole (a stub would read as a default spec)."""
    from kimik3_operator.cache import MAX_STORED_BYTES, Store

    store = Store()
    big = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "a", "uid": "u", "managedFields": [{}] * 10},
        "data": {"k": "#" * (1024 * 1024)},
    }
    store.upsert("ConfigMap", big)
    kept = store.get("ConfigMap", "a", "x") or {}
    assert "data" not in kept and kept["metadata"] == {"name": "x", "namespace": "a", "uid": "u"}
    small = {**big, "data": {"k": "ok"}}
    store.upsert("ConfigMap", {**small, "metadata": {**small["metadata"], "name": "y"}})
    assert (store.get("ConfigMap", "a", "y") or {})["data"] == {"k": "ok"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a", "labels": {"x": "y"}},
        "spec": {"nodeName": "n1", "containers": [{"args": ["#" * 100000]}]},
        "status": {"phase": "Running"},
    }
    store.upsert("Pod", pod)
    assert store.get("Pod", "a", "p") == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a", "labels": {"x": "y"}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    huge = {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {"name": "k3", "namespace": "a"},
        "spec": {"engine": {"env": [{"name": "X", "value": "#" * (MAX_STORED_BYTES + 1)}]}},
    }
    store.upsert("KimiK3Deployment", huge)
    assert store.get("KimiK3Deployment", "a", "k3") == huge
