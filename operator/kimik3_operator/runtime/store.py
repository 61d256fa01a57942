"""Watch-fed, in-memory state: the objects the reconcile reads, and the GPU ledger.

``StoreKube`` serves every read from memory and sends only writes to the API server; what a
write returns goes back into memory at once, so the next reconcile sees its own write before
the watch event arrives.
"""

from __future__ import annotations

import builtins
import json
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kimik3_operator.api.constants import KIND, LABEL_INSTANCE
from kimik3_operator.kube import Kube, Obj
from kimik3_operator.observe import GpuInventory

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


class NotLeaderError(RuntimeError):
    """A write refused because leadership was lost while a reconcile ran."""


# Anyone may label an object as the operator's; an object over this size cannot be one it
# made (its largest, the download script's ConfigMap, is some 20 KiB), so only its identity
# is kept. 200 labelled 1 MiB ConfigMaps then cost the operator kilobytes, not 600 MiB.
MAX_STORED_BYTES = 256 * 1024
KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
)


def trimmed(kind: str, obj: Mapping[str, Any]) -> Obj:
    """What the store keeps of an object: the metadata the operator reads; of a pod, only
    the node it is bound to and its status; of anything too large to be the operator's
    own, only its identity (a reconcile then finds it differs, or is not its own)."""
    meta = obj.get("metadata") or {}
    kept: Obj = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind") or kind,
        "metadata": {k: meta[k] for k in KEPT_METADATA if k in meta},
    }
    if kind == "Pod":
        kept["spec"] = {"nodeName": (obj.get("spec") or {}).get("nodeName")}
        kept["status"] = obj.get("status") or {}
        return kept
    if kind == "CustomResourceDefinition":
        return kept  # only whether it exists matters
    rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if kind == KIND:
        # The resource itself is read whole: a stub would read as a default spec.
        kept.update(rest)
        return kept
    if len(json.dumps(rest, separators=(",", ":"))) > MAX_STORED_BYTES:
        log.warning(
            "%s %s/%s is over %d bytes: only its identity is kept",
            kind,
            meta.get("namespace"),
            meta.get("name"),
            MAX_STORED_BYTES,
        )
        kept["metadata"].pop("annotations", None)
        return kept
    kept.update(rest)
    return kept


def parse_selector(selector: str) -> dict[str, str]:
    """Equality label selectors (``a=b,c=d``), the only kind the operator writes."""
    pairs: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        pairs[key.strip()] = value.strip().lstrip("=")
    return pairs


def matches(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class Store:
    """Objects by kind, namespace and name, replaced per (kind, scope) on every list, with
    client-go-style indexes so no read scans the whole store: by kind, by owner (the
    ``app.kubernetes.io/instance`` label a child carries, within its namespace) and, for
    pods, by node."""

    def __init__(self) -> None:
        self._objects: dict[Key, Obj] = {}
        self._by_kind: dict[str, set[Key]] = defaultdict(set)
        self._by_owner: dict[tuple[str, str, str], set[Key]] = defaultdict(set)
        self._by_node: dict[str, set[Key]] = defaultdict(set)
        self._lock = threading.Lock()

    @staticmethod
    def key(kind: str, obj: Mapping[str, Any]) -> Key:
        meta = obj.get("metadata") or {}
        return kind, meta.get("namespace") or "", meta.get("name", "")

    @staticmethod
    def _terms(key: Key, obj: Mapping[str, Any]) -> tuple[tuple[str, str, str] | None, str | None]:
        owner = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_INSTANCE)
        node = (obj.get("spec") or {}).get("nodeName") if key[0] == "Pod" else None
        return ((key[0], key[1], owner) if owner else None), (node or None)

    def _put(self, key: Key, obj: Obj) -> None:
        self._drop(key)
        self._objects[key] = obj
        self._by_kind[key[0]].add(key)
        owner, node = self._terms(key, obj)
        if owner is not None:
            self._by_owner[owner].add(key)
        if node is not None:
            self._by_node[node].add(key)

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is None:
            return
        self._by_kind[key[0]].discard(key)
        owner, node = self._terms(key, old)
        if owner is not None:
            self._by_owner[owner].discard(key)
            if not self._by_owner[owner]:
                del self._by_owner[owner]
        if node is not None:
            self._by_node[node].discard(key)
            if not self._by_node[node]:
                del self._by_node[node]

    def upsert(self, kind: str, obj: Mapping[str, Any], trim: bool = True) -> None:
        """``trim=False`` for objects an informer has trimmed already."""
        with self._lock:
            key = self.key(kind, obj)
            old = self._objects.get(key)
            if old is not None and _newer(old, obj):
                return  # a watch event older than a write already recorded
            self._put(key, trimmed(kind, obj) if trim else dict(obj))

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        with self._lock:
            self._drop((kind, namespace or "", name))

    def replace(
        self,
        kind: str,
        namespace: str | None,
        items: Iterable[Mapping[str, Any]],
        trim: bool = True,
    ) -> None:
        """A fresh list: drop what the scope held, keep exactly what was listed."""
        with self._lock:
            for key in [k for k in self._by_kind[kind] if namespace is None or k[1] == namespace]:
                self._drop(key)
            for obj in items:
                self._put(self.key(kind, obj), trimmed(kind, obj) if trim else dict(obj))

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get((kind, namespace or "", name))

    def list(self, kind: str, namespace: str | None = None, selector: str = "") -> list[Obj]:
        wanted = parse_selector(selector)
        owner = wanted.get(LABEL_INSTANCE)
        with self._lock:
            if owner is not None and namespace is not None:
                candidates = self._by_owner.get((kind, namespace, owner), set())
            else:
                candidates = self._by_kind.get(kind, set())
            return [
                self._objects[key]
                for key in sorted(candidates)
                if (namespace is None or key[1] == namespace)
                and matches(self._objects[key], wanted)
            ]

    def pods_on_node(self, node: str) -> builtins.list[Obj]:
        with self._lock:
            return [self._objects[key] for key in self._by_node.get(node, set())]

    def keys(self, kind: str) -> builtins.list[tuple[str, str]]:
        with self._lock:
            return [(ns, name) for (_, ns, name) in sorted(self._by_kind.get(kind, set()))]


def _newer(held: Mapping[str, Any], incoming: Mapping[str, Any]) -> bool:
    """Whether ``held`` is a later version of the same object than ``incoming``.

    resourceVersions are opaque, but on one object from one etcd they grow; compare as
    integers where both parse, and never skip an object with a different uid.
    """
    a, b = held.get("metadata") or {}, incoming.get("metadata") or {}
    if a.get("uid") != b.get("uid"):
        return False
    try:
        return int(a.get("resourceVersion", 0)) > int(b.get("resourceVersion", 0))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeGpus:
    labels: Mapping[str, str]
    schedulable: bool
    allocatable: Mapping[str, int]
    taints: tuple[Taint, ...] = ()


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """The scheduler's toleration match, for the effects that keep a pod off a node."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = toleration.get("key") or ""
        if toleration.get("operator") == "Exists":
            if not key or key == taint.key:
                return True
        elif key == taint.key and (toleration.get("value") or "") == taint.value:
            return True
    return False


def _extended(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """Extended resources (``vendor/name``) as integers: GPUs and the like."""
    found: dict[str, int] = {}
    for name, value in (resources or {}).items():
        if "/" in name:
            try:
                found[name] = int(str(value))
            except ValueError:
                continue
    return found


def node_gpus(node: Mapping[str, Any]) -> NodeGpus:
    spec = node.get("spec") or {}
    return NodeGpus(
        labels=dict((node.get("metadata") or {}).get("labels") or {}),
        schedulable=not spec.get("unschedulable"),
        allocatable=_extended((node.get("status") or {}).get("allocatable")),
        taints=tuple(
            Taint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
            for t in spec.get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
        ),
    )


def pod_gpus(pod: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """(node, extended-resource requests) of a bound, running pod; None for anything else."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests")
        for name, amount in _extended(requests).items():
            total[name] = total.get(name, 0) + amount
    return (node, total) if total else None


def ledger_pod_fields(pod: Mapping[str, Any]) -> Obj:
    """Only what the ledger reads of a pod, so a list of 20,000 pods stays small."""
    spec = pod.get("spec") or {}
    return {
        "metadata": {"uid": (pod.get("metadata") or {}).get("uid", "")},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"resources": {"requests": (c.get("resources") or {}).get("requests") or {}}}
                for c in spec.get("containers") or []
            ],
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def ledger_node_fields(node: Mapping[str, Any]) -> Obj:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return {
        "metadata": {"name": meta.get("name", ""), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {"allocatable": (node.get("status") or {}).get("allocatable") or {}},
    }


class GpuLedger:
    """Per node the allocatable GPUs, per pod what it holds: numbers, never whole objects."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeGpus] = {}
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}
        self._listed = False
        self._lock = threading.Lock()

    def has_node(self, name: str) -> bool:
        """Whether the node exists; before the first list, assume it does."""
        with self._lock:
            return not self._listed or name in self._nodes

    def node_event(self, kind: str, node: Mapping[str, Any]) -> bool:
        """Record a node's event; True when what the inventory counts changed."""
        name = (node.get("metadata") or {}).get("name", "")
        with self._lock:
            before = self._nodes.get(name)
            if kind == "DELETED":
                self._nodes.pop(name, None)
                return before is not None
            self._nodes[name] = after = node_gpus(node)
            return before != after

    def nodes_listed(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._nodes = {(n.get("metadata") or {}).get("name", ""): node_gpus(n) for n in nodes}
            self._listed = True

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """Record a pod's event; True when the GPUs it holds changed (never for the many
        pods that hold none)."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        held = None if kind == "DELETED" else pod_gpus(pod)
        with self._lock:
            before = self._pods.pop(uid, None) if held is None else self._pods.get(uid)
            if held is not None:
                self._pods[uid] = held
            return before != held

    def pods_listed(self, pods: Iterable[Mapping[str, Any]]) -> None:
        held = {(p.get("metadata") or {}).get("uid", ""): pod_gpus(p) for p in pods}
        with self._lock:
            self._pods = {uid: h for uid, h in held.items() if h is not None}

    def inventory(
        self,
        resource: str,
        node_selector: Mapping[str, str],
        tolerations: Iterable[Mapping[str, Any]] = (),
    ) -> GpuInventory:
        """GPUs on the nodes this placement could use: what the scheduler had to work with."""
        tolerated = list(tolerations)
        with self._lock:
            used: dict[str, int] = {}
            for bound_to, requests in self._pods.values():
                used[bound_to] = used.get(bound_to, 0) + requests.get(resource, 0)
            allocatable = free = largest = count = 0
            for node_name, gpus in self._nodes.items():
                amount = gpus.allocatable.get(resource, 0)
                if not gpus.schedulable or amount == 0:
                    continue
                if any(gpus.labels.get(k) != v for k, v in node_selector.items()):
                    continue
                if not all(tolerates(tolerated, taint) for taint in gpus.taints):
                    continue
                count += 1
                allocatable += amount
                left = max(0, amount - used.get(node_name, 0))
                free += left
                largest = max(largest, left)
        return GpuInventory(allocatable, free, largest, count)


class StoreKube:
    """Reads from the store, writes through to the API server (and back into the store).

    Events go out from a thread of their own: they are best effort, and a reconcile should
    not wait on five of them before the next resource's LeaderWorkerSet.
    """

    def __init__(self, api: Kube, store: Store, background_events: bool = False) -> None:
        self.api = api
        self.store = store
        # With leader election: whether this replica leads; no write goes out when not.
        self.may_write: Callable[[], bool] = lambda: True
        self._events: queue.Queue[Mapping[str, Any]] | None = None
        if background_events:
            self._events = queue.Queue(maxsize=10000)
            threading.Thread(target=self._post_events, name="events", daemon=True).start()

    def _post_events(self) -> None:
        assert self._events is not None
        while True:
            event = self._events.get()
            try:
                self.api.create(event)
            except Exception as exc:  # best effort, like every event
                log.warning("could not post event %s: %s", event.get("reason"), exc)

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        return self.store.get(kind, namespace, name)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        return self.store.list(kind, namespace, label_selector)

    def _fence(self) -> None:
        if not self.may_write():
            raise NotLeaderError("this replica no longer holds the Lease: nothing is written")

    def get_from_server(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        return self.api.get(api_version, kind, name, namespace)

    def apply(self, manifest: Mapping[str, Any], force: bool = True) -> Obj:
        self._fence()
        result = self.api.apply(manifest, force)
        self.store.upsert(str(manifest["kind"]), result)
        return result

    def patch_status(
        self, api_version: str, kind: str, name: str, namespace: str, status: Mapping[str, Any]
    ) -> Obj:
        self._fence()
        result = self.api.patch_status(api_version, kind, name, namespace, status)
        self.store.upsert(kind, result)
        return result

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str, patch: Mapping[str, Any]
    ) -> Obj:
        self._fence()
        result = self.api.patch(api_version, kind, name, namespace, patch)
        self.store.upsert(kind, result)
        return result

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        self._fence()
        self.api.delete(api_version, kind, name, namespace)
        self.store.remove(kind, namespace, name)

    def create(self, manifest: Mapping[str, Any]) -> Obj:
        self._fence()
        if self._events is not None and manifest.get("kind") == "Event":
            try:
                self._events.put_nowait(manifest)
            except queue.Full:
                log.warning("event queue full; dropped %s", manifest.get("reason"))
            return dict(manifest)
        return self.api.create(manifest)
