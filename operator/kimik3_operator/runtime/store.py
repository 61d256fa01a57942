"""Watch-fed, in-memory state: the objects the reconcile reads.

``StoreKube`` serves every read from memory and sends only writes to the API server; what a
write returns goes back into memory at once, so the next reconcile sees its own write before
the watch event arrives.
"""

from __future__ import annotations

import builtins
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kimik3_operator.api.constants import (
    GROUP,
    KIND,
    LABEL_INSTANCE,
    MAX_SPEC_BYTES,
    OVERSIZED_SPEC_KEY,
)
from kimik3_operator.kube import Kube, Obj
from kimik3_operator.runtime.decode import encoded_size

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


class NotLeaderError(RuntimeError):
    """A write refused because leadership was lost while a reconcile ran."""


# Anyone may label an object as the operator's, and name their resource as its owner. What
# the store holds of such objects is bounded three ways: an object the operator did not
# make (no controller reference to a KimiK3Deployment) keeps only its identity; one over
# MAX_STORED_BYTES (the largest the operator makes, a LeaderWorkerSet at the schema's
# limits, is under 400 KiB) keeps only its identity; and the bodies kept per namespace
# stop at NAMESPACE_BUDGET_BYTES (some 45 deployments at the schema's limits, hundreds of
# ordinary ones). 1,000 labelled 250 KiB ConfigMaps then cost at most the budget.
MAX_STORED_BYTES = 512 * 1024
NAMESPACE_BUDGET_BYTES = 16 * 1024 * 1024
OVER_BUDGET_LOG_SECONDS = 600.0
# A KimiK3Deployment's status over this size (the operator's own is a few KiB) is not kept.
MAX_STATUS_BYTES = 256 * 1024
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
IDENTITY = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences")
# Kinds kept apart from the namespace budget: pods keep a bounded part, a KimiK3Deployment
# its own bounds, a claim the user names carries no owner of ours.
UNBUDGETED = frozenset({"Pod", KIND, "PersistentVolumeClaim", "CustomResourceDefinition"})


def controlled_by_resource(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` names a KimiK3Deployment as its controller, as every child the
    operator makes does (an owner reference is the writer's claim, not proof; the reconcile
    still checks the uid)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == KIND
        for ref in refs
    )


def _identity(kind: str, obj: Mapping[str, Any]) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind") or kind,
        "metadata": {k: meta[k] for k in IDENTITY if k in meta},
    }


def _resource(obj: Mapping[str, Any], kept: Obj) -> Obj:
    """A KimiK3Deployment as the reconcile reads it: the annotations of the operator's own
    group (kubectl's last-applied copy of the spec is not one), the spec, and the status
    when it is of a size the operator writes."""
    meta = kept["metadata"]
    own = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(GROUP + "/")}
    meta.pop("annotations", None)
    if own:
        meta["annotations"] = own
    spec = obj.get("spec")
    size = encoded_size(spec)
    if size > MAX_SPEC_BYTES:
        log.warning(
            "%s %s/%s: its spec is %d bytes; kept as refused",
            KIND,
            meta.get("namespace"),
            meta.get("name"),
            size,
        )
        spec = {OVERSIZED_SPEC_KEY: size}
    if spec is not None:
        kept["spec"] = spec
    status = obj.get("status")
    if status is not None and encoded_size(status) <= MAX_STATUS_BYTES:
        kept["status"] = status
    elif status is not None:
        log.warning(
            "%s %s/%s: its status is over %d bytes (not the operator's): not kept",
            KIND,
            meta.get("namespace"),
            meta.get("name"),
            MAX_STATUS_BYTES,
        )
    return kept


def trimmed(kind: str, obj: Mapping[str, Any]) -> Obj:
    """What the store keeps of an object: the metadata the operator reads; of a pod, only
    the node it is bound to and its status; of a KimiK3Deployment, its spec and status
    within their bounds; of anything else not the operator's or too large to be, only its
    identity (a reconcile then finds it differs, or is not its own)."""
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
    if kind == KIND:
        return _resource(obj, kept)
    if kind != "PersistentVolumeClaim" and not controlled_by_resource(obj):
        return _identity(kind, obj)
    rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if encoded_size(rest) > MAX_STORED_BYTES:
        log.warning(
            "%s %s/%s is over %d bytes: only its identity is kept",
            kind,
            meta.get("namespace"),
            meta.get("name"),
            MAX_STORED_BYTES,
        )
        return _identity(kind, obj)
    kept.update(rest)
    return kept


def list_budget(kind: str) -> Callable[[Mapping[str, Any]], Obj]:
    """``trimmed`` for one list of ``kind``, with the namespace budget applied as the pages
    arrive: a list of 1,000 large labelled objects holds the budget's worth of bodies, not
    all of them until the store takes them."""
    spent: dict[str, int] = defaultdict(int)

    def keep(obj: Mapping[str, Any]) -> Obj:
        kept = trimmed(kind, obj)
        if kind in UNBUDGETED:
            return kept
        namespace = str((kept.get("metadata") or {}).get("namespace") or "")
        size = encoded_size(kept)
        if spent[namespace] + size > NAMESPACE_BUDGET_BYTES:
            return _identity(kind, kept)
        spent[namespace] += size
        return kept

    return keep


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
        # Bytes of the bodies kept per namespace, and each budgeted object's share of them.
        self._spent: dict[str, int] = defaultdict(int)
        self._sizes: dict[Key, int] = {}
        # When each namespace over its budget was last logged: once in OVER_BUDGET_LOG_SECONDS
        # (a namespace at its budget would otherwise log each update of its objects).
        self._over_budget: dict[str, float] = {}
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
        if key[0] not in UNBUDGETED:
            obj = self._within_budget(key, obj)
        self._objects[key] = obj
        self._by_kind[key[0]].add(key)
        owner, node = self._terms(key, obj)
        if owner is not None:
            self._by_owner[owner].add(key)
        if node is not None:
            self._by_node[node].add(key)

    def _within_budget(self, key: Key, obj: Obj) -> Obj:
        """``obj``, or its identity once its namespace's bodies have spent the budget (an
        identity is always kept, and not counted)."""
        size = encoded_size(obj)
        namespace = key[1]
        if self._spent[namespace] + size > NAMESPACE_BUDGET_BYTES:
            now = time.monotonic()
            if now - self._over_budget.get(namespace, -OVER_BUDGET_LOG_SECONDS) >= (
                OVER_BUDGET_LOG_SECONDS
            ):
                self._over_budget[namespace] = now
                log.warning(
                    "namespace %s: the objects that claim to be the operator's hold over %d "
                    "bytes; from %s %s on, only identities are kept there",
                    namespace,
                    NAMESPACE_BUDGET_BYTES,
                    key[0],
                    key[2],
                )
            return _identity(key[0], obj)
        self._spent[namespace] += size
        self._sizes[key] = size
        return obj

    def spent(self, namespace: str) -> int:
        """Bytes of the budgeted bodies the store holds in ``namespace``."""
        with self._lock:
            return self._spent.get(namespace, 0)

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is None:
            return
        size = self._sizes.pop(key, 0)
        if size:
            self._spent[key[1]] -= size
            if self._spent[key[1]] <= 0:
                del self._spent[key[1]]
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

    def list_from_server(
        self, api_version: str, kind: str, namespace: str, label_selector: str, limit: int
    ) -> builtins.list[Obj]:
        return self.api.list_from_server(api_version, kind, namespace, label_selector, limit)

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
