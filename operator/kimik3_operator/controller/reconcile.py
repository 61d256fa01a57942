"""One reconcile of a KimiK3Deployment: snapshot, decide, act.

``take_snapshot`` reads (the store, and the API server only for a name the decision would
create that the store does not hold); ``decide`` is pure; ``act`` is the only code that
writes. A reconcile that changes nothing writes nothing, so one call serves every trigger:
a change of the resource, a child's event, the periodic resync.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.builders.routing import PickerSettings
from kimik3_operator.controller.act import ReconcileResult, act, write_status
from kimik3_operator.controller.decide import Decision, decide, failed
from kimik3_operator.controller.snapshot import (
    Context,
    GpuCounter,
    Snapshot,
    take_snapshot,
    with_server_reads,
)
from kimik3_operator.kube import Kube
from kimik3_operator.observation.readings import Readings

__all__ = ["Context", "ReconcileResult", "reconcile", "reconcile_for_runtime"]


def reconcile(kube: Kube, key: tuple[str, str], context: Context | None = None) -> ReconcileResult:
    """One reconcile of the resource ``key`` (namespace, name). The queue never runs two
    for one key at once, and nothing else writes its status."""
    with metrics.RECONCILE_SECONDS.time():
        snap = take_snapshot(kube, key, context or Context())
        if snap is None:
            return ReconcileResult()
        try:
            snap, decision = checked_decision(kube, snap)
            result = act(kube, snap, decision)
        except Exception as exc:
            metrics.RECONCILES.labels("error").inc()
            # Whatever step failed, the user reads it in the status; the queue retries.
            write_status(kube, snap, failed(snap, exc))
            raise
        metrics.RECONCILES.labels("invalid" if result.invalid else "ok").inc()
        return result


def checked_decision(kube: Kube, snap: Snapshot) -> tuple[Snapshot, Decision]:
    """The decision, once every name it would create is known: a name the store does not
    hold is asked of the API server, and the decision made again with the answer."""
    decision = decide(snap)
    if decision.unread:
        snap = with_server_reads(kube, snap, decision.unread)
        decision = decide(snap)
    return snap, decision


def reconcile_for_runtime(
    kube: Kube,
    key: tuple[str, str],
    *,
    readings: Readings,
    ledger: GpuCounter | None,
    namespace_labels: Callable[[Kube, str], Mapping[str, str] | None],
    pod_monitor_labels: Mapping[str, str],
    kueue_admission_gate: bool = False,
    service_accounts: tuple[str, ...] = (),
    prometheus_url: str = c.DEFAULT_PROMETHEUS_URL,
    epp_image: str = c.DEFAULT_EPP_IMAGE,
    epp_cluster_role: str = c.DEFAULT_EPP_CLUSTER_ROLE,
    pd_picker_image: str = c.DEFAULT_PD_PICKER_IMAGE,
    routing_sidecar_image: str = c.DEFAULT_ROUTING_SIDECAR_IMAGE,
) -> ReconcileResult:
    """``reconcile`` as the runtime's manager calls it (its Reconciler)."""
    context = Context(
        ledger=ledger,
        readings=readings,
        namespace_labels=namespace_labels,
        pod_monitor_labels=pod_monitor_labels,
        kueue_admission_gate=kueue_admission_gate,
        service_accounts=service_accounts,
        prometheus_url=prometheus_url,
        picker=PickerSettings(epp_image, epp_cluster_role, pd_picker_image, routing_sidecar_image),
    )
    return reconcile(kube, key, context)
