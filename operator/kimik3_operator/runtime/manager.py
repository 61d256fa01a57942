"""The manager: watches fill the store, events become keys in one coalescing queue, worker
threads reconcile, and one operator-wide loop does the periodic work.

Nothing here is per-object in kopf's sense, so kopf puts no finalizer on a resource: a
KimiK3Deployment or its namespace deletes with the operator stopped, its children go by
garbage collection, and the operator's own state for it (metrics series, the readers'
windows) is dropped on the delete event or when the loop no longer finds it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import now_rfc3339
from kimik3_operator.api.kinds import CHILDREN, KINDS, Kind
from kimik3_operator.config import Settings
from kimik3_operator.events import post_event, too_deep_condition
from kimik3_operator.kube import Kube, KubeError
from kimik3_operator.observation.readings import Readings
from kimik3_operator.runtime import decode
from kimik3_operator.runtime.gpu_ledger import (
    GpuLedger,
    LedgerNotListedError,
    ledger_node_fields,
    pods_informer,
)
from kimik3_operator.runtime.informer import (
    ByteBudget,
    Informer,
    ListTooLargeError,
    NotServedError,
    Obj,
)
from kimik3_operator.runtime.namespaces import NamespaceLabels
from kimik3_operator.runtime.queue import WorkQueue
from kimik3_operator.runtime.readers import AcceptanceReader, ProgressReader
from kimik3_operator.runtime.scrapes import FairScrapes
from kimik3_operator.runtime.store import Store, StoreKube, list_budget, trimmed

log = logging.getLogger(__name__)
Key = tuple[str, str]
MANAGED_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
REJECTED_REMEMBERED = 10_000
# A reconcile that waited and ran this long in all is logged (INFO), with where it waited.
SLOW_RECONCILE_SECONDS = 2.0
# What a namespace's own lists may read, all kinds together, while the cluster-wide ones run:
# a namespace holding more waits for those (it would cost the API server its objects twice).
NAMESPACE_LIST_BYTES = 16 << 20
NAMESPACE_LISTS_AT_ONCE = 4


# CRDs whose presence changes what the operator builds.
WATCHED_CRDS = {
    c.LWS_CRD: "LeaderWorkerSet",
    c.DS_CRD: "DisaggregatedSet",
    c.PODMONITOR_CRD: "PodMonitor",
    c.KUEUE_WORKLOAD_CRD: "Workload",
    c.KEDA_SCALEDOBJECT_CRD: "ScaledObject",
    c.INFERENCEPOOL_CRD: "InferencePool",
    c.HTTPROUTE_CRD: "HTTPRoute",
}


def owner_key(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(c.LABEL_INSTANCE)
    namespace = meta.get("namespace")
    return (namespace, name) if name and namespace else None


class Reconciler(Protocol):
    """What the manager runs for one due key: the controller's reconcile, handed in by the
    host, so the runtime knows nothing of what a reconcile does."""

    def __call__(
        self,
        kube: Kube,
        key: Key,
        *,
        readings: Readings,
        ledger: GpuLedger | None,
        namespace_labels: Callable[[Kube, str], Mapping[str, str] | None],
        pod_monitor_labels: Mapping[str, str],
        kueue_admission_gate: bool,
        service_accounts: tuple[str, ...],
        prometheus_url: str,
        epp_image: str,
        epp_cluster_role: str,
        pd_picker_image: str,
        routing_sidecar_image: str,
    ) -> object: ...


@dataclass
class Manager:
    api: Kube
    api_client: Any
    settings: Settings
    acceptance: AcceptanceReader
    reconciler: Reconciler
    store: Store = field(default_factory=Store)
    ledger: GpuLedger | None = None
    # Due resources in turns between namespaces, each namespace at most its share of the
    # workers: one tenant's burst or slow reconciles delay only its own.
    queue: WorkQueue[Key] = field(default_factory=lambda: WorkQueue(fair_by=lambda k: k[0]))
    active: threading.Event = field(default_factory=threading.Event)
    informers: list[Informer] = field(default_factory=list)
    progress: ProgressReader = field(default_factory=ProgressReader)
    _stop: threading.Event = field(default_factory=threading.Event)
    # Every watch has listed and the workers run.
    ready: threading.Event = field(default_factory=threading.Event)
    scrapes: FairScrapes | None = None
    _rejected_lock: threading.Lock = field(default_factory=threading.Lock)
    namespace_labels: NamespaceLabels = field(default_factory=NamespaceLabels)
    # (uid, resourceVersion) of refused objects already told of, so a relist repeats nothing.
    _rejected_seen: set[tuple[str, str]] = field(default_factory=set)
    # The watches a reconcile reads, each with its namespace (None: all of them).
    _needed: list[tuple[str | None, Informer]] = field(default_factory=list)
    # Resources due before what they read was listed: their namespace's watches, or the GPU
    # ledger's pods. Each list handed to the store releases those it was the last one for.
    _parked: dict[Key, bool] = field(default_factory=dict)  # key -> parked on the ledger
    _parked_lock: threading.Lock = field(default_factory=threading.Lock)
    _ledger_pods: Informer | None = None
    # Watching every namespace: the cluster-wide watches of namespaced kinds, by name, and
    # the namespaces each holds in the store from a list of its own (or, for the
    # KimiK3Deployments, handed over by the first list as it passed them) until its own
    # list is there. ``_whole``: the watches whose own list the store holds.
    _by_namespace: dict[str, tuple[Informer, Kind]] = field(default_factory=dict)
    _listed_namespaces: dict[str, set[str]] = field(default_factory=dict)
    _whole: set[str] = field(default_factory=set)
    _too_large: set[str] = field(default_factory=set)
    _lists_lock: threading.Lock = field(default_factory=threading.Lock)
    _namespace_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kube = StoreKube(self.api, self.store, background_events=True)
        self.progress.url_override = (
            self.progress.url_override or self.settings.download_progress_url
        )
        self.queue.delay = self.settings.coalesce_seconds
        self.queue.workers = self.settings.workers
        self.queue.retry_max = self.settings.retry_max_seconds
        if self.settings.gpu_inventory and self.ledger is None:
            self.ledger = GpuLedger()
        if self.scrapes is None:
            self.scrapes = FairScrapes(self.settings.scrape_workers, self._scrape_one)

    # --- the watches --------------------------------------------------------------------

    def build_informers(self) -> list[Informer]:
        """The watches, and of them the ones a reconcile needs listed first (``_needed``,
        by namespace): every one but the GPU ledger's pods, which only a count waits for."""
        scopes: tuple[str | None, ...] = self.settings.namespaces or (None,)
        needed: list[tuple[str | None, Informer]] = []
        by_kind: dict[str, list[Informer]] = {}
        for namespace in scopes:
            namespaced = [(KINDS[c.KIND], "")] + [(child, MANAGED_SELECTOR) for child in CHILDREN]
            # Claims the user names for the model cache carry no label of ours.
            namespaced.append((KINDS["PersistentVolumeClaim"], ""))
            for watched, selector in namespaced:
                informer = self._informer(watched, namespace, selector)
                by_kind.setdefault(watched.kind, []).append(informer)
                needed.append((namespace, informer))
                if namespace is None:
                    self._by_namespace[informer.name] = (informer, watched)
                    self._listed_namespaces[informer.name] = set()
                if namespace is None and watched.kind == c.KIND:
                    informer.on_namespace_listed = partial(self._resources_listed, informer.name)
        for crd, kind in WATCHED_CRDS.items():
            needed.append((None, self._crd_informer(crd, by_kind.get(kind, []))))
        made = [informer for _, informer in needed]
        if self.ledger is not None:
            ledger = self.ledger
            nodes = Informer(
                self.api_client,
                "/api/v1/nodes",
                on_sync=self._gpu_sync(ledger.nodes_listed),
                on_event=self._gpu_change(ledger.node_event, nodes=True),
                transform=ledger_node_fields,
                name="nodes (GPU ledger)",
            )
            needed.append((None, nodes))
            pods = pods_informer(
                self.api_client,
                self._gpu_sync(ledger.pods_listed),
                self._gpu_change(ledger.pod_event),
            )
            self._ledger_pods = pods
            made += [nodes, pods]
        for informer in made:
            informer.on_listed = self._release
        self._needed = needed
        return made

    # --- resources due before their watches have listed ---------------------------------

    def listed_for(self, namespace: str) -> bool:
        """Whether every watch a reconcile in ``namespace`` reads has listed, or, for a
        cluster-wide one, the store holds that namespace's objects of its kind from a list of
        their own: a reconcile before the store holds the truth would report absences it made
        up. With watches per namespace, one namespace's large list delays only its own
        resources; watching every namespace, only the resources of a namespace over
        NAMESPACE_LIST_BYTES wait for the cluster-wide lists."""
        return all(
            informer.synced.is_set()
            or (scope is None and namespace in self._listed_namespaces.get(informer.name, ()))
            for scope, informer in self._needed
            if scope is None or scope == namespace
        )

    def _resources_listed(self, name: str, namespace: str, items: list[Obj]) -> None:
        """The first cluster-wide list of KimiK3Deployments (watch ``name``) has passed
        ``namespace``: its resources are due now, not when the list of every namespace ends."""
        with self._lists_lock:
            if name in self._whole:
                return
            self.store.replace(c.KIND, namespace, items, trim=False)
            self._listed_namespaces[name].add(namespace)
        metrics.NAMESPACES_LISTED_EARLY.labels("handed_over").inc()
        for item in items:
            self._enqueue(Store.key(c.KIND, item)[1:])

    def _list_namespace(self, namespace: str) -> bool:
        """Lists ``namespace``'s objects of each cluster-wide watch still listing, side by
        side, up to NAMESPACE_LIST_BYTES in all, into the store; whether every watch its
        reconcile reads is then listed for it. One worker at a time lists a namespace; one
        over the bytes is not listed again (its resources wait for the cluster-wide lists)."""
        if not self._by_namespace or namespace in self._too_large:
            return False
        with self._lists_lock:
            lock = self._namespace_locks.setdefault(namespace, threading.Lock())
        with lock:
            if namespace in self._too_large:  # found so by the worker this one waited for
                return False
            pending = [
                (name, informer, kind)
                for name, (informer, kind) in self._by_namespace.items()
                if not informer.synced.is_set() and namespace not in self._listed_namespaces[name]
            ]
            if not pending:
                return self.listed_for(namespace)
            budget = ByteBudget(NAMESPACE_LIST_BYTES)
            started = time.monotonic()
            with ThreadPoolExecutor(min(NAMESPACE_LISTS_AT_ONCE, len(pending))) as pool:
                lists = [
                    (name, kind, pool.submit(informer.list_namespace, kind.path(namespace), budget))
                    for name, informer, kind in pending
                ]
                found: list[tuple[str, Kind, list[Obj]]] = []
                for name, kind, future in lists:
                    try:
                        found.append((name, kind, future.result()))
                    except NotServedError:  # its CRD is not installed: none of it
                        found.append((name, kind, []))
                    except ListTooLargeError:
                        self._too_large.add(namespace)
                    except Exception as exc:
                        log.info("list of %s in %s failed: %s", kind.plural, namespace, exc)
            if namespace in self._too_large:
                metrics.NAMESPACES_LISTED_EARLY.labels("too_large").inc()
                log.info(
                    "namespace %s holds over %d MiB of watched objects: its resources wait for "
                    "the cluster-wide lists",
                    namespace,
                    NAMESPACE_LIST_BYTES >> 20,
                )
                return False
            with self._lists_lock:
                for name, kind, items in found:
                    # Its own list arrived meanwhile: that is newer than this one.
                    if name not in self._whole:
                        self.store.replace(kind.kind, namespace, items, trim=False)
                        self._listed_namespaces[name].add(namespace)
            metrics.NAMESPACES_LISTED_EARLY.labels("own_lists").inc()
            log.info(
                "namespace %s: %d of %d kinds listed on their own in %.2fs (%d KiB) while the "
                "cluster-wide lists run",
                namespace,
                len(found),
                len(pending),
                time.monotonic() - started,
                (NAMESPACE_LIST_BYTES - budget.left) >> 10,
            )
        return self.listed_for(namespace)

    def _park(self, key: Key, ledger: bool = False) -> None:
        with self._parked_lock:
            self._parked[key] = ledger or self._parked.get(key, False)
        # A list may have ended while this one was decided: look again.
        self._release()

    def _release(self) -> None:
        """Queues the parked resources that may go now: their namespace's watches have
        listed, and for those that count GPUs the ledger's pods too."""
        pods = self._ledger_pods
        counted = pods is None or pods.synced.is_set()
        with self._parked_lock:
            going = [
                key
                for key, on_ledger in self._parked.items()
                if (counted or not on_ledger) and self.listed_for(key[0])
            ]
            for key in going:
                del self._parked[key]
        for key in going:
            self._enqueue(key, delay=0.0)

    def _informer(self, watched: Kind, namespace: str | None, selector: str) -> Informer:
        kind, plural = watched.kind, watched.plural

        name = f"{plural} in {namespace or 'all namespaces'}"

        def on_sync(items: list[Obj]) -> None:
            with self._lists_lock:
                self.store.replace(kind, namespace, items, trim=False)  # trimmed on arrival
                self._whole.add(name)
                early = self._listed_namespaces.get(name, set())
            if early and kind != c.KIND:
                # Read from their own lists before: reconciled again on the whole truth.
                for key in self.store.keys(c.KIND):
                    if key[0] in early:
                        self._enqueue(key)
            if kind == c.KIND:
                self._forget_missing()
                for item in items:
                    self._enqueue(Store.key(kind, item)[1:])
            else:
                for item in items:
                    self._enqueue_owner(item)

        def on_event(event: str, obj: Obj) -> None:
            meta = obj.get("metadata") or {}
            if event == "DELETED":
                self.store.remove(kind, meta.get("namespace"), meta.get("name", ""))
            else:
                self.store.upsert(kind, obj, trim=False)
            if kind == c.KIND:
                key = (meta.get("namespace", ""), meta.get("name", ""))
                if event == "DELETED":
                    self.forget(*key)
                else:
                    # The user's own change: no burst to wait for.
                    self._enqueue(key, delay=0.0)
            else:
                self._enqueue_owner(obj)

        return Informer(
            self.api_client,
            watched.path(namespace),
            on_sync=on_sync,
            on_event=on_event,
            label_selector=selector,
            name=name,
            transform=partial(trimmed, kind),
            list_transform=partial(list_budget, kind),
            on_rejected=partial(self.rejected, kind),
            # Its status fields are open: only the API server's 10,000 levels bound them.
            strict=kind == c.KIND,
        )

    def rejected(self, kind: str, identity: Obj) -> None:
        """An object the informer could not take: counted, and a KimiK3Deployment told why
        on an event (once per version of it)."""
        metrics.REJECTED_OBJECTS.labels(kind).inc()
        meta = identity.get("metadata") or {}
        if kind != c.KIND or not meta.get("name") or not meta.get("namespace"):
            return
        seen = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
        with self._rejected_lock:
            if seen in self._rejected_seen:
                return
            if len(self._rejected_seen) >= REJECTED_REMEMBERED:
                self._rejected_seen.clear()
            self._rejected_seen.add(seen)
        post_event(self.kube, identity, too_deep_condition(decode.OBJECT_LIMIT), now_rfc3339())

    def _crd_informer(self, crd: str, dependents: list[Informer]) -> Informer:
        kind = "CustomResourceDefinition"

        def changed() -> None:
            for informer in dependents:
                informer.wake()
            self.enqueue_all()

        def record(found: Obj | None) -> None:
            had = self.store.get(kind, None, crd) is not None
            if found is None:
                self.store.remove(kind, None, crd)
            else:
                self.store.upsert(kind, found)
            if had != (found is not None):
                changed()

        return Informer(
            self.api_client,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            on_sync=lambda items: record(items[0] if items else None),
            on_event=lambda event, obj: record(None if event == "DELETED" else obj),
            field_selector=f"metadata.name={crd}",
            name=f"crd {crd}",
        )

    def _gpu_change(
        self, record: Callable[[str, Obj], bool], nodes: bool = False
    ) -> Callable[[str, Obj], None]:
        def on_event(event: str, obj: Obj) -> None:
            if record(event, obj):
                self._gpus_moved()
            if nodes and event == "DELETED":
                # A group on a node that is gone is down now, not after the pod GC (also for
                # a node a new list no longer has, which the ledger has dropped already).
                node = (obj.get("metadata") or {}).get("name")
                for pod in self.store.pods_on_node(str(node)):
                    self._enqueue_owner(pod)

        return on_event

    def _gpu_sync(self, replace: Callable[[list[Obj]], bool]) -> Callable[[list[Obj]], None]:
        def on_sync(items: list[Obj]) -> None:
            if replace(items):
                self._gpus_moved()

        return on_sync

    def _gpus_moved(self) -> None:
        """Free GPUs moved: a deployment waiting for them may fit now."""
        for namespace, name in self.store.keys(c.KIND):
            status = (self.store.get(c.KIND, namespace, name) or {}).get("status")
            if isinstance(status, dict) and status.get("reason") == c.Reason.INSUFFICIENT_GPUS:
                self._enqueue((namespace, name))

    # --- the queue ----------------------------------------------------------------------

    def _enqueue(self, key: Key, delay: float | None = None) -> None:
        if self.active.is_set():
            self.queue.add(key, delay=delay)

    def _enqueue_owner(self, obj: Mapping[str, Any]) -> None:
        key = owner_key(obj)
        if key is not None and self.store.get(c.KIND, *key) is not None:
            self._enqueue(key)

    def enqueue_all(self) -> None:
        for key in self.store.keys(c.KIND):
            self._enqueue(key)

    def forget(self, namespace: str, name: str) -> None:
        metrics.forget(namespace, name)
        self.acceptance.forget(namespace, name)
        self.progress.forget(namespace, name)

    def _forget_missing(self) -> None:
        present = set(self.store.keys(c.KIND))
        for key in (self.acceptance.known() | metrics.known()) - present:
            self.forget(*key)

    def reconcile_key(self, key: Key) -> None:
        namespace, name = key
        if not self.listed_for(namespace) and not self._list_namespace(namespace):
            self._park(key)
            return
        try:
            self.reconciler(
                self.kube,
                key,
                readings=Readings(self.acceptance.reading(key), self.progress.reading(key)),
                ledger=self.ledger,
                namespace_labels=self.namespace_labels,
                pod_monitor_labels=dict(self.settings.pod_monitor_labels),
                kueue_admission_gate=self.settings.kueue_admission_gate,
                service_accounts=self.settings.service_accounts,
                prometheus_url=self.settings.prometheus_url,
                epp_image=self.settings.epp_image,
                epp_cluster_role=self.settings.epp_cluster_role,
                pd_picker_image=self.settings.pd_picker_image,
                routing_sidecar_image=self.settings.routing_sidecar_image,
            )
        except LedgerNotListedError:
            # Its count waits for the cluster's pods; the other resources do not.
            self._park(key, ledger=True)
        except Exception as exc:
            delay = self.queue.add_after_failure(key)
            attempt = self.queue.failures(key)
            if attempt == 1 and not isinstance(exc, KubeError):
                log.exception(
                    "reconcile of %s/%s failed; retrying in %.2fs", namespace, name, delay
                )
            else:
                # The trace was logged once; each later attempt is one line.
                log.warning(
                    "reconcile of %s/%s failed (attempt %d): %s; retrying in %.2fs",
                    namespace,
                    name,
                    attempt,
                    exc,
                    delay,
                )
        else:
            self.queue.forget(key)

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            started = time.monotonic()
            try:
                if self.active.is_set():
                    self.reconcile_key(key)
            finally:
                took, waited = time.monotonic() - started, self.queue.waited(key)
                self.queue.done(key)
            if took + waited >= SLOW_RECONCILE_SECONDS:
                log.info(
                    "reconcile of %s/%s: waited %.2fs for a worker, took %.2fs",
                    *key,
                    waited,
                    took,
                )

    # --- the periodic loop --------------------------------------------------------------

    def _loop(self) -> None:
        next_resync = time.monotonic() + self.settings.resync_seconds
        next_scrape = time.monotonic() + min(5.0, self.settings.scrape_seconds)
        while not self._stop.wait(0.5):
            if not self.active.is_set():
                continue
            now = time.monotonic()
            if now >= next_resync:
                next_resync = now + self.settings.resync_seconds
                self._forget_missing()
                self.enqueue_all()
            if now >= next_scrape:
                next_scrape = now + self.settings.scrape_seconds
                self.submit_scrapes()

    def submit_scrapes(self) -> int:
        """Queues every deployment's scrape on the fair pool and returns at once: a slow or
        hostile leader holds one worker up to the scrape's deadline, never this loop, and a
        namespace never more than its share of the workers. A deployment whose last scrape
        still waits or runs is not queued again."""
        assert self.scrapes is not None
        return self.scrapes.submit(self.store.keys(c.KIND))

    def _scrape_one(self, key: Key) -> None:
        """Each reader records what it read; a reading that would change the status
        enqueues the resource, whose reconcile writes it."""
        body = self.store.get(c.KIND, *key)
        if body is None:
            return
        changed = False
        for reader in (self.progress, self.acceptance):
            try:
                changed = reader.tick(self.kube, body) or changed
            except Exception:  # one deployment's scrape never stops the others
                log.exception("%s of %s/%s failed", type(reader).__name__, *key)
        if changed:
            self._enqueue(key)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, sync_timeout: float = 60.0) -> None:
        """Starts the watches and the workers; a resource is reconciled once the watches it
        reads have listed (``listed_for``), the periodic loop and the health check once all
        have."""
        self.informers = self.build_informers()
        for number in range(self.settings.workers):
            self._spawn(self._work, f"reconcile-{number}")
        for informer in self.informers:
            informer.start()
        self._spawn(lambda: self._start_when_synced(sync_timeout), "manager")

    def _start_when_synced(self, sync_timeout: float) -> None:
        deadline = time.monotonic() + sync_timeout
        for informer in self.informers:
            if informer.synced.wait(max(0.0, deadline - time.monotonic())):
                continue
            log.error(
                "informer %s has not listed in %.0fs: not ready (the health endpoint fails) "
                "until it has; check the operator's RBAC and the API server",
                informer.name,
                sync_timeout,
            )
            while not informer.synced.wait(1.0):
                if self._stop.is_set():
                    return
        self._spawn(self._loop, "periodic")
        self.ready.set()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        threading.Thread(target=target, name=name, daemon=True).start()

    def set_active(self, active: bool) -> None:
        metrics.LEADING.set(1 if active else 0)
        if active and not self.active.is_set():
            self.active.set()
            self.enqueue_all()
        elif not active:
            self.active.clear()

    def stop(self) -> None:
        self._stop.set()
        self.queue.close()
        if self.scrapes is not None:
            self.scrapes.shutdown()
        for informer in self.informers:
            informer.stop()
