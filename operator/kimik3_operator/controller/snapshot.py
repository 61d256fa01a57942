"""Step one of a reconcile: everything about one KimiK3Deployment, read once.

The store answers (the owner index: every child and pod that carries the resource's
instance label); the API server is asked only for a name the decision would create and the
store does not hold, since the store keeps only labelled objects.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.conditions import now_rfc3339
from kimik3_operator.api.kinds import CHILDREN, KINDS
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import SpecError
from kimik3_operator.builders.common import Owner
from kimik3_operator.builders.model_cache import cache_claim_name
from kimik3_operator.builders.routing import PickerSettings
from kimik3_operator.kube import Kube, KubeError, Obj, namespace_labels_from_server
from kimik3_operator.observation.kueue import admitted_groups, quota_free, read_limit
from kimik3_operator.observation.readings import Readings
from kimik3_operator.observation.status_input import with_readable_status
from kimik3_operator.observation.workload import GpuCounts, serving_pod_uids, wants_gpu_counts

# (apiVersion, kind, name) of an object in the resource's namespace.
Ref = tuple[str, str, str]
LWS_API = f"{c.LWS_GROUP}/{c.LWS_VERSION}"
DS_API = f"{c.DS_GROUP}/{c.DS_VERSION}"
PODMONITOR_API = f"{c.MONITORING_GROUP}/v1"
KUEUE_API = f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}"
KEDA_API = f"{c.KEDA_GROUP}/{c.KEDA_VERSION}"
CRD_API = "apiextensions.k8s.io/v1"
# What the snapshot reads by the owner index: the children besides the pods, and the claims.
CHILD_KINDS: tuple[tuple[str, str], ...] = tuple(
    (k.api_version, k.kind) for k in (*CHILDREN, KINDS["PersistentVolumeClaim"]) if k.kind != "Pod"
)


class GpuCounter(Protocol):
    """The runtime's GPU ledger, as a reconcile reads it."""

    def has_node(self, name: str) -> bool: ...

    def counts(
        self,
        resource: str,
        node_selector: Mapping[str, str],
        tolerations: Sequence[Any],
        per_pod: int = 0,
        own: Collection[str] | None = None,
    ) -> GpuCounts: ...


@dataclass(frozen=True)
class Context:
    """What a reconcile reads besides the API: the clock (as status text and as seconds),
    the GPU ledger, the readers' latest readings, the namespaces' labels (the runtime keeps
    them a while rather than asking at every reconcile) and the operator's settings."""

    clock: Callable[[], str] = now_rfc3339
    seconds: Callable[[], float] = time.time
    ledger: GpuCounter | None = None
    readings: Readings = field(default_factory=Readings)
    namespace_labels: Callable[[Kube, str], Mapping[str, str] | None] = namespace_labels_from_server
    # Labels on every PodMonitor the operator makes.
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    # Kueue runs with its AdmissionGatedBy feature gate: a new LeaderWorkerSet of a queued
    # deployment is created gated while the preflight is pending.
    kueue_admission_gate: bool = False
    # The ServiceAccounts spec.pod.serviceAccountName may name.
    service_accounts: tuple[str, ...] = ()
    # Where the ScaledObjects of spec.autoscaling ask Prometheus for the leaders' load.
    prometheus_url: str = c.DEFAULT_PROMETHEUS_URL
    # The endpoint picker spec.routing runs, and the ClusterRole it is bound to.
    picker: PickerSettings = field(default_factory=PickerSettings)


@dataclass(frozen=True)
class Snapshot:
    body: Obj
    owner: Owner
    now: str
    seconds: float
    readings: Readings = field(default_factory=Readings)
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    # Status fields of the wrong type, read as absent.
    dropped_status: tuple[str, ...] = ()
    spec: KimiK3DeploymentSpec | None = None
    # Why the name or the spec cannot be served (then nothing else is read).
    invalid: str | None = None
    namespace_labels: Mapping[str, str] | None = None
    lws_installed: bool = False
    # LeaderWorkerSet's DisaggregatedSet (v0.9.0 on) served: read for spec.disaggregation.
    ds_installed: bool = False
    pod_monitor_installed: bool = False
    kueue_installed: bool = False
    kueue_admission_gate: bool = False
    service_accounts: tuple[str, ...] = ()
    keda_installed: bool = False
    prometheus_url: str = c.DEFAULT_PROMETHEUS_URL
    # spec.routing: the Inference Extension's CRDs, and the Gateway API's HTTPRoute, served.
    pool_installed: bool = False
    gateway_api: bool = False
    picker: PickerSettings = field(default_factory=PickerSettings)
    # Kueue's Workloads of the LeaderWorkerSet (read only for a spec that names a queue).
    workloads: tuple[Obj, ...] = ()
    # The GPUs left in the quota of the queue's ClusterQueue (autoscaled and queued only).
    quota_free_gpus: int | None = None
    pods: tuple[Obj, ...] = ()
    live: Mapping[Ref, Obj] = field(default_factory=dict)
    # Names asked of the API server and absent there too.
    absent: frozenset[Ref] = frozenset()
    gpus: GpuCounts | None = None
    gone_nodes: frozenset[str] = frozenset()

    @property
    def status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}

    def get(self, ref: Ref) -> Obj | None:
        return self.live.get(ref)

    def known(self, ref: Ref) -> bool:
        """Whether the snapshot can say if ``ref`` exists (store or server)."""
        return ref in self.live or ref in self.absent

    def children(self, api_version: str, kind: str) -> list[Obj]:
        return [
            obj for (a, k, _), obj in sorted(self.live.items()) if (a, k) == (api_version, kind)
        ]


def instance_selector(owner: Owner) -> str:
    return f"{c.LABEL_INSTANCE}={owner.name},{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"


def take_snapshot(kube: Kube, key: tuple[str, str], context: Context) -> Snapshot | None:
    """None when the resource is gone or being deleted (its children go with it)."""
    namespace, name = key
    found = kube.get(c.API_VERSION, c.KIND, name, namespace)
    if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
        return None
    body, dropped = with_readable_status(found)
    meta = body["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    snap = Snapshot(
        body=body,
        owner=owner,
        now=context.clock(),
        seconds=context.seconds(),
        readings=context.readings,
        pod_monitor_labels=context.pod_monitor_labels,
        dropped_status=tuple(dropped),
    )
    problem = names.name_error(owner.name)
    if problem is not None:
        return dataclasses.replace(snap, invalid=f"{problem}. No child was created.")
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as err:
        return dataclasses.replace(snap, invalid=f"{err}. No child was created or changed.")
    pods = tuple(kube.list("v1", "Pod", namespace, label_selector=instance_selector(owner)))
    ledger = context.ledger
    gone = frozenset(
        node
        for node in (p.get("spec", {}).get("nodeName") for p in pods)
        if node and ledger is not None and not ledger.has_node(node)
    )
    placement = spec.placement
    # The ledger is summed only for a pod the scheduler turned away for want of GPUs, and
    # for the groups autoscaling may add.
    gpus = (
        ledger.counts(
            placement.gpu_resource,
            placement.node_selector,
            placement.tolerations,
            per_pod=spec.gpus_per_pod,
            own=serving_pod_uids(pods),
        )
        if ledger is not None and (spec.autoscaled or wants_gpu_counts(pods, spec))
        else None
    )
    lws_installed = _crd_exists(kube, c.LWS_CRD)
    # Asked for every deployment: a spec that dropped disaggregation still has a set to delete.
    ds_installed = _crd_exists(kube, c.DS_CRD)
    pod_monitor_installed = _crd_exists(kube, c.PODMONITOR_CRD)
    kinds = [
        (api_version, kind)
        for api_version, kind in CHILD_KINDS
        if (kind != "LeaderWorkerSet" or lws_installed)
        and (kind != "DisaggregatedSet" or ds_installed)
        and (kind != "PodMonitor" or pod_monitor_installed)
        and (kind != "ScaledObject" or _crd_exists(kube, c.KEDA_SCALEDOBJECT_CRD))
        and (kind != "InferencePool" or _crd_exists(kube, c.INFERENCEPOOL_CRD))
        and (kind != "HTTPRoute" or _crd_exists(kube, c.HTTPROUTE_CRD))
    ]
    live = _children(kube, spec, owner, kinds)
    kueue_installed = spec.queued and _crd_exists(kube, c.KUEUE_WORKLOAD_CRD)
    keda_installed = spec.autoscaled and _crd_exists(kube, c.KEDA_SCALEDOBJECT_CRD)
    lws = live.get((LWS_API, "LeaderWorkerSet", names.leader_worker_set(owner.name)))
    workloads = _workloads(kube, spec, lws) if kueue_installed else ()
    return dataclasses.replace(
        snap,
        spec=spec,
        namespace_labels=context.namespace_labels(kube, namespace),
        lws_installed=lws_installed,
        ds_installed=ds_installed,
        pod_monitor_installed=pod_monitor_installed,
        kueue_installed=kueue_installed,
        kueue_admission_gate=context.kueue_admission_gate,
        service_accounts=context.service_accounts,
        keda_installed=keda_installed,
        prometheus_url=context.prometheus_url,
        pool_installed=spec.routed and _crd_exists(kube, c.INFERENCEPOOL_CRD),
        gateway_api=spec.routed and _crd_exists(kube, c.HTTPROUTE_CRD),
        picker=context.picker,
        workloads=workloads,
        quota_free_gpus=_quota(kube, spec, namespace, workloads)
        if kueue_installed and spec.autoscaled
        else None,
        pods=pods,
        live=live,
        gpus=gpus,
        gone_nodes=gone,
    )


def _workloads(kube: Kube, spec: KimiK3DeploymentSpec, lws: Obj | None) -> tuple[Obj, ...]:
    """The LeaderWorkerSet's Workloads, one per group, from the API server (the operator
    watches no Workload): bounded by the groups asked for."""
    meta = (lws or {}).get("metadata") or {}
    if not meta.get("uid"):
        return ()
    selector = f"{c.KUEUE_JOB_UID_LABEL}={meta['uid']}"
    found = kube.list_from_server(
        KUEUE_API, "Workload", str(meta.get("namespace")), selector, read_limit(spec)
    )
    return tuple(found)


def _quota(
    kube: Kube, spec: KimiK3DeploymentSpec, namespace: str, workloads: Sequence[Obj]
) -> int | None:
    """The free GPUs of the ClusterQueue behind the spec's LocalQueue: two reads from the API
    server, for autoscaled queued specs only; None where either cannot be read."""
    try:
        local = kube.get_from_server(
            KUEUE_API, "LocalQueue", str(spec.scheduling.queue_name), namespace
        )
        name = str(((local or {}).get("spec") or {}).get("clusterQueue") or "")
        if not name:
            return None
        cluster_queue = kube.get_from_server(KUEUE_API, "ClusterQueue", name)
    except KubeError:
        return None
    held = admitted_groups(workloads) * spec.gpus_per_replica
    return quota_free(cluster_queue, spec.placement.gpu_resource, held)


def with_server_reads(kube: Kube, snap: Snapshot, refs: Iterable[Ref]) -> Snapshot:
    """The snapshot with ``refs`` read from the API server: the store holds only labelled
    objects, and a name taken by somebody else's is never created over."""
    live = dict(snap.live)
    absent = set(snap.absent)
    for ref in refs:
        api_version, kind, name = ref
        found = kube.get_from_server(api_version, kind, name, snap.owner.namespace)
        if found is None:
            absent.add(ref)
        else:
            live[ref] = found
    return dataclasses.replace(snap, live=live, absent=frozenset(absent))


def _children(
    kube: Kube, spec: KimiK3DeploymentSpec, owner: Owner, kinds: Sequence[tuple[str, str]]
) -> dict[Ref, Obj]:
    selector = instance_selector(owner)
    live: dict[Ref, Obj] = {}
    for api_version, kind in kinds:
        for obj in kube.list(api_version, kind, owner.namespace, label_selector=selector):
            live[(api_version, kind, obj["metadata"]["name"])] = obj
    if spec.model.cache is not None:
        # A claim the user names carries no label of ours.
        claim = cache_claim_name(owner, spec.model.cache)
        found = kube.get("v1", "PersistentVolumeClaim", claim, owner.namespace)
        if found is not None:
            live[("v1", "PersistentVolumeClaim", claim)] = found
    return live


def _crd_exists(kube: Kube, name: str) -> bool:
    return kube.get(CRD_API, "CustomResourceDefinition", name) is not None
