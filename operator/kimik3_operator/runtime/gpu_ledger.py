"""The GPU ledger: per node its allocatable GPUs, per pod the GPUs it holds, fed by two
cluster-wide watches. It keeps numbers, never objects, so 20,000 pods cost a few MiB, and
answers how many GPUs a placement could use and how many are free."""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kimik3_operator.kube import Obj
from kimik3_operator.observation.workload import GpuCounts
from kimik3_operator.runtime.informer import Informer, OnEvent, OnSync


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
    if HELD in pod:
        held: tuple[str, dict[str, int]] = pod[HELD]
        return held
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests")
        for name, amount in _extended(requests).items():
            total[name] = total.get(name, 0) + amount
    # Interned: thousands of pods on a few hundred nodes share the names.
    return (sys.intern(str(node)), total) if total else None


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


# What a list keeps of a pod that holds GPUs: its (node, requests), read by ``pod_gpus``.
HELD = "held"


def ledger_pod_listed(pod: Mapping[str, Any]) -> Obj | None:
    """A listed pod as the ledger keeps it, its uid and what it holds, or None for one that
    holds no GPUs: most of a cluster's pods, which a list then does not keep at all."""
    held = pod_gpus(pod)
    if held is None:
        return None
    return {"metadata": {"uid": (pod.get("metadata") or {}).get("uid", "")}, HELD: held}


def ledger_pod_hook(found: dict[str, Any]) -> Any:
    """Trims a pod while it is decoded (decode.loads' object hook), innermost object first:
    a container to its requests, the pod's spec to its node and containers, its metadata to
    its identity, its status to its phase. A page of pods with megabytes of env values then
    holds one container's worth of them at a time. ``ledger_pod_fields`` reads the result."""
    if "containers" in found:
        return {"nodeName": found.get("nodeName"), "containers": found["containers"]}
    if "image" in found and "name" in found:
        resources = found.get("resources")
        requests = resources.get("requests") if isinstance(resources, dict) else None
        return {"resources": {"requests": requests or {}}}
    if "uid" in found and "creationTimestamp" in found:
        return {k: found[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in found}
    if "phase" in found:
        return {"phase": found["phase"]}
    return found


def pods_informer(api_client: Any, on_sync: OnSync, on_event: OnEvent) -> Informer:
    """The cluster's bound pods that still hold their resources, as the ledger reads them:
    trimmed while decoded, a list keeping only the pods that hold GPUs (not the cluster's
    others) and remembering nothing per pod (the ledger's list replaces all it holds)."""
    return Informer(
        api_client,
        "/api/v1/pods",
        on_sync=on_sync,
        on_event=on_event,
        transform=ledger_pod_fields,
        list_transform=lambda: ledger_pod_listed,
        object_hook=ledger_pod_hook,
        track=False,
        field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        name="pods (GPU ledger)",
    )


def ledger_node_fields(node: Mapping[str, Any]) -> Obj:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return {
        "metadata": {"name": meta.get("name", ""), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {"allocatable": (node.get("status") or {}).get("allocatable") or {}},
    }


class LedgerNotListedError(RuntimeError):
    """The cluster's pods are not listed yet: counted now, GPUs they hold would look free."""


class GpuLedger:
    """Per node the allocatable GPUs, per pod what it holds: numbers, never whole objects."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeGpus] = {}
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}
        self._listed = False
        self._pods_listed = False
        self._lock = threading.Lock()

    def has_node(self, name: str) -> bool:
        """Whether the node exists; before the first list, assume it does."""
        with self._lock:
            return not self._listed or name in self._nodes

    def node_event(self, kind: str, node: Mapping[str, Any]) -> bool:
        """Record a node's event; True when what the ledger counts changed."""
        name = (node.get("metadata") or {}).get("name", "")
        with self._lock:
            before = self._nodes.get(name)
            if kind == "DELETED":
                self._nodes.pop(name, None)
                return before is not None
            self._nodes[name] = after = node_gpus(node)
            return before != after

    def nodes_listed(self, nodes: Iterable[Mapping[str, Any]]) -> bool:
        """Replace every node the ledger holds; True when what it counts changed."""
        found = {(n.get("metadata") or {}).get("name", ""): node_gpus(n) for n in nodes}
        with self._lock:
            before, self._nodes = self._nodes, found
            self._listed = True
            return before != found

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

    def pods_listed(self, pods: Iterable[Mapping[str, Any]]) -> bool:
        """Replace every pod the ledger holds; True when what it counts changed."""
        held = {(p.get("metadata") or {}).get("uid", ""): pod_gpus(p) for p in pods}
        with self._lock:
            before = self._pods
            self._pods = {uid: h for uid, h in held.items() if h is not None}
            self._pods_listed = True
            return before != self._pods

    def counts(
        self,
        resource: str,
        node_selector: Mapping[str, str],
        tolerations: Iterable[Mapping[str, Any]] = (),
        per_pod: int = 0,
        own: Collection[str] | None = None,
    ) -> GpuCounts:
        """GPUs on the nodes this placement could use: what the scheduler had to work with;
        with ``per_pod``, how many pods of that many GPUs the free ones can still place; with
        ``own`` (pod uids), how many of those pods the ledger holds on a node. Raises
        LedgerNotListedError before the first list of pods (the cluster's largest list, which the
        reconciles that need no count do not wait for)."""
        tolerated = list(tolerations)
        with self._lock:
            if not self._pods_listed:
                raise LedgerNotListedError("the GPU ledger has not listed the cluster's pods yet")
            held = None if own is None else sum(1 for uid in own if uid in self._pods)
            used: dict[str, int] = {}
            for bound_to, requests in self._pods.values():
                used[bound_to] = used.get(bound_to, 0) + requests.get(resource, 0)
            allocatable = free = largest = count = fit = 0
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
                fit += left // per_pod if per_pod > 0 else 0
        return GpuCounts(allocatable, free, largest, count, fit, held)
