"""The manager's parts: the coalescing queue, the watch-fed store, the readers' hand-off to
the reconcile, event types, and the migration off kopf's finalizer."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest

from conftest import FakeKube, key_of, resource
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import LEGACY_KOPF_FINALIZER, ConditionType
from kimik3_operator.controller.reconcile import reconcile
from kimik3_operator.events import event_type
from kimik3_operator.runtime.queue import WorkQueue
from kimik3_operator.runtime.store import Store, StoreKube, parse_selector


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


def test_a_slow_reconcile_is_logged_with_how_long_it_waited_for_a_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator's log says where a slow reconcile spent its time: waiting for a worker
    after it was due, or running."""
    from kimik3_operator.runtime import manager as manager_module

    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.1, clock=clock)
    queue.add("llm/k3")
    clock.now = 2.6
    assert queue.get(timeout=0) == "llm/k3"
    assert queue.waited("llm/k3") == pytest.approx(2.5)
    queue.done("llm/k3")
    assert queue.waited("llm/k3") == 0.0

    manager, recorder = manager_for(("llm",))
    for informer in manager.informers:
        list_done(informer)
    manager.queue.add(("llm", "slow"))
    caplog.set_level("INFO", logger=manager_module.__name__)
    recorder.sleep = manager_module.SLOW_RECONCILE_SECONDS
    worker = threading.Thread(target=manager._work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while "llm/slow" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.stop()
    # Its wait is the worker's pick-up only (a few milliseconds on a busy machine).
    assert re.search(r"reconcile of llm/slow: waited 0\.0\ds for a worker, took 2\.", caplog.text)


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


def test_a_tenants_burst_does_not_delay_another_tenants_change() -> None:
    """200 resources applied at once in one namespace, then one change in another: the
    other tenant's key is handed out second, not 201st; within a namespace, first come
    first served; the queue's default (one group) stays first come first served."""
    clock = Clock()
    queue: WorkQueue[tuple[str, str]] = WorkQueue(delay=0.0, clock=clock, fair_by=lambda k: k[0])
    for n in range(200):
        queue.add(("noisy", f"r{n}"))
    clock.now = 1.0
    queue.add(("quiet", "mine"))
    order = [queue.get(timeout=0) for _ in range(201)]
    assert order[:3] == [("noisy", "r0"), ("quiet", "mine"), ("noisy", "r1")]
    assert [k for k in order if k and k[0] == "noisy"] == [("noisy", f"r{n}") for n in range(200)]
    assert queue.get(timeout=0) is None
    plain: WorkQueue[str] = WorkQueue(delay=0.0, clock=clock)
    for key in ("a", "b", "c"):
        plain.add(key)
        clock.now += 1
    assert [plain.get(timeout=0) for _ in range(3)] == ["a", "b", "c"]


def test_one_tenant_never_holds_every_worker() -> None:
    """Eight workers: a namespace alone holds at most seven at once, so another tenant's
    change starts at once; with two namespaces at work each holds at most four."""
    clock = Clock()
    queue: WorkQueue[tuple[str, str]] = WorkQueue(
        delay=0.0, clock=clock, fair_by=lambda k: k[0], workers=8
    )
    for n in range(20):
        queue.add(("noisy", f"r{n}"))
    running = [queue.get(timeout=0) for _ in range(8)]
    assert running[:7] == [("noisy", f"r{n}") for n in range(7)]
    assert running[7] is None, "the eighth worker is kept for another namespace"
    queue.add(("quiet", "mine"))
    assert queue.get(timeout=0) == ("quiet", "mine")
    # Two namespaces at work: the noisy one, at seven, gets no worker until it is under its
    # four.
    for n in range(4):
        queue.done(("noisy", f"r{n}"))
        if n < 3:
            assert queue.get(timeout=0) is None
    assert queue.get(timeout=0) == ("noisy", "r7")
    assert queue.get(timeout=0) is None
    # Alone again: seven (four running, three more).
    queue.done(("quiet", "mine"))
    more = [queue.get(timeout=0) for _ in range(4)]
    assert more == [("noisy", "r8"), ("noisy", "r9"), ("noisy", "r10"), None]


def test_a_key_held_at_its_share_goes_to_a_waiting_worker_when_one_ends() -> None:
    queue: WorkQueue[tuple[str, str]] = WorkQueue(delay=0.0, fair_by=lambda k: k[0], workers=2)
    queue.add(("a", "x"))
    queue.add(("a", "y"))
    assert queue.get(timeout=0) == ("a", "x")
    got: list[tuple[str, str] | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get(timeout=5)))
    worker.start()
    queue.done(("a", "x"))
    worker.join(timeout=5)
    assert got == [("a", "y")]


def test_a_key_waiting_its_turn_is_still_coalesced() -> None:
    clock = Clock()
    queue: WorkQueue[tuple[str, str]] = WorkQueue(delay=0.0, clock=clock, fair_by=lambda k: k[0])
    queue.add(("a", "x"))
    queue.add(("a", "y"))
    assert queue.get(timeout=0) == ("a", "x")
    queue.add(("a", "y"))  # due already, waiting for its turn: not added twice
    assert queue.get(timeout=0) == ("a", "y")
    assert queue.get(timeout=0) is None


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
    kube = StoreKube(api, store)
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
    reconcile(kube, key_of(body))
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


OWNED = [
    {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "name": "k3",
        "uid": "o",
        "controller": True,
    }
]


def config_map(name: str, size: int, owned: bool = True, namespace: str = "a") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"u-{name}"}
    if owned:
        meta["ownerReferences"] = OWNED
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "#" * size}}


def test_the_store_keeps_what_the_operator_reads_and_no_more() -> None:
    """A labelled ConfigMap over the size bound, or one no resource controls, costs its
    identity; a pod, its node and status; the resource, its spec, its status and the
    annotations of the operator's group."""
    from kimik3_operator.runtime.store import MAX_STORED_BYTES, Store

    store = Store()
    big = config_map("x", MAX_STORED_BYTES + 1)
    big["metadata"]["managedFields"] = [{}] * 10
    store.upsert("ConfigMap", big)
    kept = store.get("ConfigMap", "a", "x") or {}
    assert "data" not in kept
    assert kept["metadata"] == {
        "name": "x",
        "namespace": "a",
        "uid": "u-x",
        "ownerReferences": OWNED,
    }
    store.upsert("ConfigMap", config_map("y", 2))
    assert (store.get("ConfigMap", "a", "y") or {})["data"] == {"k": "##"}
    store.upsert("ConfigMap", config_map("stray", 2, owned=False))
    assert "data" not in (store.get("ConfigMap", "a", "stray") or {}), "no resource controls it"
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
    resource = {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {
            "name": "k3",
            "namespace": "a",
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "#" * 200000,
                "serving.kimik3.io/retry": "1",
            },
        },
        "spec": {"engine": {"env": [{"name": "X", "value": "#" * 60000}]}},
        "status": {"readyReplicas": 1},
    }
    store.upsert("KimiK3Deployment", resource)
    kept = store.get("KimiK3Deployment", "a", "k3") or {}
    assert kept["metadata"]["annotations"] == {"serving.kimik3.io/retry": "1"}
    assert kept["spec"] == resource["spec"] and kept["status"] == {"readyReplicas": 1}


def test_a_resource_over_its_bounds_is_kept_as_refused_not_whole() -> None:
    """A spec stored before the schema's totals, or a status the operator did not write,
    at 1 MiB: the store keeps a few bytes, and the reconcile reads a refusal naming why."""
    from kimik3_operator.api.parse import parse_spec
    from kimik3_operator.api.types import SpecError
    from kimik3_operator.runtime.store import Store

    store = Store()
    store.upsert(
        "KimiK3Deployment",
        {
            "apiVersion": "serving.kimik3.io/v1alpha1",
            "kind": "KimiK3Deployment",
            "metadata": {"name": "k3", "namespace": "a"},
            "spec": {"engine": {"env": [{"name": "X", "value": "#" * (1 << 20)}]}},
            "status": {"capabilities": {"x": "#" * (1 << 20)}},
        },
    )
    kept = store.get("KimiK3Deployment", "a", "k3") or {}
    assert len(json.dumps(kept)) < 1000 and "status" not in kept
    with pytest.raises(SpecError, match="is over 256 KiB"):
        parse_spec(kept["spec"])


def test_a_namespace_holds_bodies_up_to_its_budget_and_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1,000 labelled, owner-claiming 250 KiB ConfigMaps in one namespace: the store holds
    the budget's worth of bodies there and identities past it, and says so once, not at
    each update; another namespace's objects are kept whole; deleting gives the budget
    back."""
    from kimik3_operator.runtime.store import NAMESPACE_BUDGET_BYTES, Store

    store = Store()
    store.upsert("ConfigMap", config_map("theirs", 2, namespace="b"))
    for n in range(1000):
        store.upsert("ConfigMap", config_map(f"m{n}", 250 * 1024))
    for n in range(20):  # the kept ones updated, each time leaving room for one more
        store.upsert("ConfigMap", config_map(f"m{n}", 250 * 1024 - 1))
        store.upsert("ConfigMap", config_map(f"m{999 - n}", 250 * 1024))
    assert caplog.text.count("only identities are kept there") == 1
    assert store.spent("a") <= NAMESPACE_BUDGET_BYTES
    held = sum(len(json.dumps(o)) for o in store.list("ConfigMap", "a"))
    assert held < NAMESPACE_BUDGET_BYTES + 1000 * 300
    assert len(store.list("ConfigMap", "a")) == 1000, "every identity is kept"
    assert "data" in (store.get("ConfigMap", "b", "theirs") or {})
    assert "data" not in (store.get("ConfigMap", "a", "m999") or {})
    for n in range(1000):
        store.remove("ConfigMap", "a", f"m{n}")
    assert store.spent("a") == 0
    store.upsert("ConfigMap", config_map("later", 2))
    assert "data" in (store.get("ConfigMap", "a", "later") or {})


def test_a_list_holds_no_more_than_the_budget_before_the_store_takes_it() -> None:
    """At start-up the 1,000 ConfigMaps arrive in one list: its transform spends the
    namespace budget as the pages arrive, each list afresh."""
    from kimik3_operator.runtime.store import NAMESPACE_BUDGET_BYTES, list_budget

    for _ in range(2):
        keep = list_budget("ConfigMap")
        items = [keep(config_map(f"m{n}", 250 * 1024)) for n in range(1000)]
        held = sum(len(json.dumps(o)) for o in items)
        assert NAMESPACE_BUDGET_BYTES - 300 * 1024 < held < NAMESPACE_BUDGET_BYTES + 1000 * 300
        assert all(o["metadata"]["name"] == f"m{n}" for n, o in enumerate(items))


def test_a_failing_key_backs_off_exponentially_and_a_success_resets_it() -> None:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.0, clock=clock, retry_base=0.01, retry_max=1.0)
    delays = []
    for _ in range(9):
        queue.add("k")
        assert queue.get(timeout=0) == "k"
        queue.done("k")
        delays.append(queue.add_after_failure("k"))
        clock.now += 10  # long enough for any backoff; the bucket refills meanwhile
        assert queue.get(timeout=0) == "k"
        queue.done("k")
    assert delays == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]
    assert queue.failures("k") == 9
    queue.forget("k")
    assert queue.add_after_failure("k") == 0.01, "a success starts the backoff afresh"


def test_many_failing_keys_at_once_are_held_to_the_overall_rate() -> None:
    clock = Clock()
    queue: WorkQueue[int] = WorkQueue(clock=clock, retry_qps=10.0, retry_burst=100)
    delays = [queue.add_after_failure(n) for n in range(300)]
    assert max(delays[:100]) == 0.01, "the burst goes at once"
    assert delays[-1] == pytest.approx(20.0), "then 10 a second: 200 more take 20 s"


def test_the_queue_reports_the_workqueue_metrics() -> None:
    from prometheus_client import REGISTRY

    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(delay=0.0, clock=clock)
    adds = REGISTRY.get_sample_value("kimik3_workqueue_adds_total") or 0.0
    queue.add("a")
    queue.add("b")
    assert REGISTRY.get_sample_value("kimik3_workqueue_depth") == 2
    assert queue.get(timeout=0) == "a"
    clock.now = 3.0
    assert REGISTRY.get_sample_value("kimik3_workqueue_longest_running_processor_seconds") == 3.0
    queue.done("a")
    assert REGISTRY.get_sample_value("kimik3_workqueue_adds_total") == adds + 2
    assert (REGISTRY.get_sample_value("kimik3_workqueue_work_duration_seconds_count") or 0) >= 1
    retries = REGISTRY.get_sample_value("kimik3_workqueue_retries_total") or 0.0
    queue.add_after_failure("a")
    assert REGISTRY.get_sample_value("kimik3_workqueue_retries_total") == retries + 1


class SilentInformer:
    """A watch that has not listed (RBAC refused, the API server away)."""

    def __init__(self) -> None:
        self.synced = threading.Event()
        self.name = "pods in llm"

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_health_check_waits_for_every_watch_and_the_workers_start_at_once() -> None:
    from kimik3_operator.config import Settings
    from kimik3_operator.controller.reconcile import reconcile_for_runtime
    from kimik3_operator.runtime.manager import Manager
    from kimik3_operator.runtime.readers import AcceptanceReader

    silent = SilentInformer()
    controller = Manager(
        api=FakeKube(),
        api_client=None,
        settings=Settings(gpu_inventory=False),
        acceptance=AcceptanceReader(),
        reconciler=reconcile_for_runtime,
    )
    controller.build_informers = lambda: [silent]  # type: ignore[method-assign, list-item]
    controller.start(sync_timeout=0.1)
    time.sleep(0.5)
    assert not controller.ready.is_set(), "not ready, never 'starting anyway'"
    assert not any(t.name == "periodic" for t in threading.enumerate())
    assert any(t.name.startswith("reconcile-") for t in threading.enumerate())
    silent.synced.set()
    assert controller.ready.wait(5)
    assert any(t.name == "periodic" for t in threading.enumerate())
    controller.stop()


class Recorder:
    """A reconciler that records the keys it ran and raises what it is told to."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []
        self.raises: BaseException | None = None
        self.sleep = 0.0

    def __call__(self, kube: Any, key: tuple[str, str], **_: Any) -> None:
        self.ran.append(key)
        time.sleep(self.sleep)
        if self.raises is not None:
            raise self.raises


def manager_for(namespaces: tuple[str, ...], gpus: bool = False) -> tuple[Any, Recorder]:
    from kimik3_operator.config import Settings
    from kimik3_operator.runtime.manager import Manager
    from kimik3_operator.runtime.readers import AcceptanceReader

    recorder = Recorder()
    manager = Manager(
        api=FakeKube(),
        api_client=None,
        settings=Settings(namespaces=namespaces, gpu_inventory=gpus),
        acceptance=AcceptanceReader(),
        reconciler=recorder,
    )
    manager.informers = manager.build_informers()
    manager.queue.delay = 0.0
    manager.set_active(True)
    return manager, recorder


def list_done(informer: Any) -> None:
    """What the informer does once a list is in the store."""
    informer.synced.set()
    informer.on_listed()


def drained(manager: Any) -> set[tuple[str, str]]:
    found = set()
    while (key := manager.queue.get(timeout=0.2)) is not None:
        found.add(key)
        manager.queue.done(key)
    return found


def test_a_resource_waits_for_its_namespaces_watches_and_no_other_namespaces() -> None:
    """One tenant's slow list (1,000 large ConfigMaps) delays only that tenant's resources
    at a start: another namespace's go as soon as its own watches and the cluster-wide ones
    have listed, and the waiting ones go when their last watch has."""
    manager, recorder = manager_for(("slow", "quick"))
    slow_configmaps = next(i for i in manager.informers if i.name == "configmaps in slow")
    for informer in manager.informers:
        if informer is not slow_configmaps:
            list_done(informer)
    assert manager.listed_for("quick") and not manager.listed_for("slow")
    manager.reconcile_key(("slow", "a"))
    manager.reconcile_key(("quick", "b"))
    assert recorder.ran == [("quick", "b")], "the slow namespace's resource waits"
    assert drained(manager) == set(), "nothing queued while its list runs"
    list_done(slow_configmaps)
    assert drained(manager) == {("slow", "a")}, "queued once its namespace has listed"
    manager.reconcile_key(("slow", "a"))
    assert recorder.ran[-1] == ("slow", "a")


def test_a_cluster_wide_watch_holds_every_resource_until_it_has_listed() -> None:
    manager, recorder = manager_for(())
    crd = next(i for i in manager.informers if i.name.startswith("crd "))
    for informer in manager.informers:
        if informer is not crd:
            list_done(informer)
    manager.reconcile_key(("any", "a"))
    assert recorder.ran == [] and drained(manager) == set()
    list_done(crd)
    assert drained(manager) == {("any", "a")}


def deployment_in(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kimik3.io/v1alpha1",
        "kind": "KimiK3Deployment",
        "metadata": {"name": name, "namespace": namespace, "uid": f"u-{namespace}-{name}"},
        "spec": {},
    }


def every_namespace_but_config_maps() -> tuple[Any, Recorder, Any, list[str]]:
    """An operator watching every namespace whose cluster-wide list of ConfigMaps (one
    tenant's 1,000 of 250 KiB) has not ended; every other watch has listed. A namespace's
    own list of ConfigMaps answers from ``answers`` by namespace, and each is recorded."""
    manager, recorder = manager_for(())
    config_maps = next(i for i in manager.informers if i.name == "configmaps in all namespaces")
    for informer in manager.informers:
        if informer is not config_maps:
            list_done(informer)
    asked: list[str] = []
    return manager, recorder, config_maps, asked


def test_watching_every_namespace_a_resource_goes_on_its_namespaces_own_list() -> None:
    """Watching every namespace, a resource whose namespace is small is reconciled on that
    namespace's own list of a kind whose cluster-wide list still runs, read once; when the
    whole list arrives it replaces what that list read and the resource is reconciled
    again on it."""
    manager, recorder, config_maps, asked = every_namespace_but_config_maps()
    own = config_map("cm", 10, namespace="quick")

    def list_namespace(path: str, budget: Any) -> list[dict[str, Any]]:
        asked.append(path)
        return [own]

    config_maps.list_namespace = list_namespace
    manager.store.upsert("KimiK3Deployment", deployment_in("quick", "b"), trim=False)
    assert not manager.listed_for("quick")
    manager.reconcile_key(("quick", "b"))
    manager.reconcile_key(("quick", "c"))
    assert recorder.ran == [("quick", "b"), ("quick", "c")]
    assert asked == ["/api/v1/namespaces/quick/configmaps"], "one list of the namespace"
    assert manager.store.get("ConfigMap", "quick", "cm") is not None
    assert not manager.listed_for("other"), "another namespace is not listed by it"
    drained(manager)
    config_maps.on_sync([config_map("cm2", 10, namespace="quick")])
    list_done(config_maps)
    assert manager.store.get("ConfigMap", "quick", "cm") is None, "the whole list wins"
    assert ("quick", "b") in drained(manager), "reconciled again on the whole list"


def test_a_namespace_over_the_list_budget_waits_for_the_cluster_wide_list() -> None:
    """The tenant whose ConfigMaps make the cluster-wide list long is not read twice: its
    own list stops at the byte budget, is not tried again, and its resources go when the
    cluster-wide list has ended."""
    from kimik3_operator.runtime.informer import ListTooLargeError

    manager, recorder, config_maps, asked = every_namespace_but_config_maps()

    def list_namespace(path: str, budget: Any) -> list[dict[str, Any]]:
        asked.append(path)
        raise ListTooLargeError

    config_maps.list_namespace = list_namespace
    # A second worker waits for the first one's list of the namespace, and then lists nothing.
    lock = manager._namespace_locks.setdefault("hostile", threading.Lock())
    with lock:
        waiting = threading.Thread(target=manager.reconcile_key, args=(("hostile", "b"),))
        waiting.start()
        time.sleep(0.2)
        manager._too_large.add("hostile")  # what the first worker's list found
    waiting.join(5)
    manager._too_large.clear()
    manager.reconcile_key(("hostile", "a"))
    manager.reconcile_key(("hostile", "b"))
    assert recorder.ran == [] and len(asked) == 1, "tried once"
    assert drained(manager) == set()
    config_maps.on_sync([])
    list_done(config_maps)
    assert drained(manager) == {("hostile", "a"), ("hostile", "b")}


def test_a_namespaces_list_older_than_the_whole_list_is_dropped() -> None:
    manager, _, config_maps, _ = every_namespace_but_config_maps()

    def list_namespace(path: str, budget: Any) -> list[dict[str, Any]]:
        # The cluster-wide list lands while this one is read: this one is older.
        config_maps.on_sync([config_map("new", 10, namespace="quick")])
        return [config_map("old", 10, namespace="quick")]

    config_maps.list_namespace = list_namespace
    manager.reconcile_key(("quick", "b"))
    assert manager.store.get("ConfigMap", "quick", "old") is None
    assert manager.store.get("ConfigMap", "quick", "new") is not None


def test_a_kind_the_api_server_does_not_serve_is_an_empty_list_for_a_namespace() -> None:
    from kimik3_operator.runtime.informer import NotServedError

    manager, recorder, config_maps, _ = every_namespace_but_config_maps()

    def list_namespace(path: str, budget: Any) -> list[dict[str, Any]]:
        raise NotServedError

    config_maps.list_namespace = list_namespace
    manager.reconcile_key(("quick", "b"))
    assert recorder.ran == [("quick", "b")]


def test_the_first_list_of_resources_makes_each_namespace_due_once_passed() -> None:
    """The cluster-wide list of KimiK3Deployments (one tenant's 200 of 300 KiB first) hands
    over each namespace it has passed: its resources are in the store and due before the
    list ends; once the whole list is there, a late hand-over changes nothing."""
    manager, _ = manager_for(())
    resources = next(
        i for i in manager.informers if i.name == "kimik3deployments in all namespaces"
    )
    assert resources.on_namespace_listed is not None
    resources.on_namespace_listed("quick", [deployment_in("quick", "b")])
    assert manager.store.get("KimiK3Deployment", "quick", "b") is not None
    assert drained(manager) == {("quick", "b")}
    resources.on_sync([deployment_in("quick", "c")])
    list_done(resources)
    drained(manager)
    resources.on_namespace_listed("quick", [deployment_in("quick", "b")])
    assert manager.store.get("KimiK3Deployment", "quick", "b") is None
    assert drained(manager) == set()


def test_watching_some_namespaces_nothing_is_listed_twice() -> None:
    manager, recorder = manager_for(("llm",))
    config_maps = next(i for i in manager.informers if i.name == "configmaps in llm")
    for informer in manager.informers:
        if informer is not config_maps:
            list_done(informer)
    config_maps.list_namespace = lambda *_: pytest.fail("listed twice")
    manager.reconcile_key(("llm", "a"))
    assert recorder.ran == []
    assert all(i.on_namespace_listed is None for i in manager.informers)


def test_only_a_resource_that_counts_gpus_waits_for_the_ledgers_pods() -> None:
    """The cluster's pods are the largest list of all (200,000 pods: minutes): a resource
    whose reconcile needs no GPU count goes without it; one that needs a count waits for it
    (counted before, the GPUs those pods hold would look free), quietly, with no retry, and
    goes when the pods are listed, not on another watch's list."""
    from kimik3_operator.runtime.gpu_ledger import GpuLedger, LedgerNotListedError

    manager, recorder = manager_for(("llm",), gpus=True)
    pods = next(i for i in manager.informers if i.name == "pods (GPU ledger)")
    for informer in manager.informers:
        if informer is not pods:
            list_done(informer)
    manager.reconcile_key(("llm", "plain"))
    assert recorder.ran == [("llm", "plain")]
    with pytest.raises(LedgerNotListedError):
        GpuLedger().counts("nvidia.com/gpu", {})
    recorder.raises = LedgerNotListedError("not yet")
    manager.reconcile_key(("llm", "counting"))
    assert manager.queue.failures(("llm", "counting")) == 0, "not a failure"
    list_done(next(i for i in manager.informers if i.name == "configmaps in llm"))
    assert drained(manager) == set(), "another watch's list does not release it"
    recorder.raises = None
    list_done(pods)
    assert drained(manager) == {("llm", "counting")}


def test_the_store_indexes_children_by_owner_and_pods_by_node() -> None:
    store = Store()

    def pod(name: str, owner: str, node: str, namespace: str = "llm") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/instance": owner, "role": "x"},
            },
            "spec": {"nodeName": node},
        }

    store.replace(
        "Pod",
        None,
        [
            pod("a-0", "a", "n1"),
            pod("a-1", "a", "n2"),
            pod("b-0", "b", "n1"),
            pod("a-0", "a", "n1", namespace="other"),
        ],
    )
    names = [
        p["metadata"]["name"] for p in store.list("Pod", "llm", "app.kubernetes.io/instance=a")
    ]
    assert names == ["a-0", "a-1"]
    assert sorted(p["metadata"]["name"] for p in store.pods_on_node("n1")) == ["a-0", "a-0", "b-0"]
    # A pod moved (recreated on another node) and one removed leave no stale index entry.
    store.upsert("Pod", pod("a-1", "a", "n1"))
    store.remove("Pod", "llm", "b-0")
    assert sorted(p["metadata"]["name"] for p in store.pods_on_node("n1")) == ["a-0", "a-0", "a-1"]
    assert store.pods_on_node("n2") == []
    assert store.list("Pod", "llm", "app.kubernetes.io/instance=b") == []
    store.replace("Pod", "other", [])
    assert [p["metadata"]["namespace"] for p in store.pods_on_node("n1")] == ["llm", "llm"]


class Reader:
    """A reader that reports a change for one deployment and records what it was given."""

    def __init__(self, changed: set[str]) -> None:
        self.changed = changed
        self.seen: list[str] = []
        self.url_override = ""

    def tick(self, kube: Any, body: dict[str, Any]) -> bool:
        self.seen.append(body["metadata"]["name"])
        return body["metadata"]["name"] in self.changed

    def forget(self, namespace: str, name: str) -> None:
        pass

    def known(self) -> set[tuple[str, str]]:
        return set()

    def reading(self, key: tuple[str, str]) -> None:
        return None


def test_a_reading_that_would_change_the_status_enqueues_only_that_resource() -> None:
    """The readers never write: the manager enqueues the resource, its reconcile writes."""
    from kimik3_operator.config import Settings
    from kimik3_operator.controller.reconcile import reconcile_for_runtime
    from kimik3_operator.runtime.manager import Manager

    api = FakeKube()
    manager = Manager(
        api=api,
        api_client=None,
        settings=Settings(gpu_inventory=False),
        acceptance=Reader({"moved"}),  # type: ignore[arg-type]
        reconciler=reconcile_for_runtime,
        progress=Reader(set()),  # type: ignore[arg-type]
    )
    manager.set_active(True)
    while manager.queue.get(timeout=0) is not None:
        pass
    for name in ("moved", "still"):
        manager.store.upsert("KimiK3Deployment", resource(name))
        manager._scrape_one(("llm", name))
    assert api.writes == []
    manager.queue.delay = 0.0
    queued = {manager.queue.get(timeout=1)}
    assert queued == {("llm", "moved")}
    assert manager.queue.get(timeout=0.2) is None


def test_a_new_list_of_pods_or_nodes_that_frees_gpus_wakes_the_deployments_waiting_for_them() -> (
    None
):
    """After a watch outage the ledger learns of freed GPUs from a list, not from events: the
    deployments parked on InsufficientGPUs are reconciled then, the others are not; a list
    that changes nothing the ledger counts wakes none; a node a list no longer has takes its
    groups down at once."""
    from kimik3_operator.api import constants as c
    from kimik3_operator.config import Settings
    from kimik3_operator.controller.reconcile import reconcile_for_runtime
    from kimik3_operator.runtime.manager import Manager
    from kimik3_operator.runtime.readers import AcceptanceReader

    manager = Manager(
        api=FakeKube(),
        api_client=None,
        settings=Settings(gpu_inventory=True),
        acceptance=AcceptanceReader(),
        reconciler=reconcile_for_runtime,
    )
    informers = {i.name: i for i in manager.build_informers()}
    pods, nodes = informers["pods (GPU ledger)"], informers["nodes (GPU ledger)"]
    node = {
        "metadata": {"name": "gpu-1", "labels": {}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    holder = {
        "metadata": {"uid": "u1"},
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": "Running"},
    }
    nodes._sync([node])  # what a list hands the informer
    pods.on_sync([holder])
    waiting, serving = resource("waiting"), resource("serving")
    waiting["status"] = {"reason": c.Reason.INSUFFICIENT_GPUS}
    serving["status"] = {"reason": "Serving"}
    for item in (waiting, serving):
        manager.store.upsert(c.KIND, item)
    group_pod = {
        "metadata": {
            "name": "serving-0",
            "namespace": "llm",
            "uid": "p1",
            "labels": {c.LABEL_MANAGED_BY: c.OPERATOR_NAME, c.LABEL_INSTANCE: "serving"},
        },
        "spec": {"nodeName": "gpu-1"},
    }
    manager.store.upsert("Pod", group_pod)

    def queued() -> set[tuple[str, str]]:
        found = set()
        while (key := manager.queue.get(timeout=0.2)) is not None:
            found.add(key)
            manager.queue.done(key)
        return found

    manager.queue.delay = 0.0
    manager.set_active(True)
    assert queued() == {("llm", "waiting"), ("llm", "serving")}, "the start's reconcile"
    pods.on_sync([holder])
    assert queued() == set(), "the same pods: nothing moved"
    pods.on_sync([])
    assert queued() == {("llm", "waiting")}, "the 8 GPUs are free"
    nodes._sync([])
    assert ("llm", "serving") in queued(), "its node is gone"
