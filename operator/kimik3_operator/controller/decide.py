"""Step two of a reconcile, pure: from the snapshot to one Decision (what to write, in
order; the status patch; the events). Nothing here reads or writes the API."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.conditions import Condition, changed
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DISAGGREGATED_ROLES
from kimik3_operator.builders.children import Part, desired_children
from kimik3_operator.builders.common import with_spec_hash
from kimik3_operator.builders.model_cache import (
    build_collect_job,
    cache_claim_name,
    cache_key,
)
from kimik3_operator.builders.preflight_job import probe_key
from kimik3_operator.builders.scaled_object import Bounds
from kimik3_operator.controller.admission import predict
from kimik3_operator.controller.autoscaling import ScalingInput, ScalingPlan, scaling_plan
from kimik3_operator.controller.conditions import Findings, final_conditions
from kimik3_operator.controller.disaggregation import (
    baseline,
    baseline_section,
    transfer_condition,
)
from kimik3_operator.controller.drift import needs_apply
from kimik3_operator.controller.rollout import RolloutStep, rollout_step
from kimik3_operator.controller.routing import (
    GroupInput,
    RolePlans,
    RoutingInput,
    RoutingPlan,
    canary_groups,
    group_acceptance,
    routing_plan,
)
from kimik3_operator.controller.snapshot import (
    DS_API,
    KEDA_API,
    LWS_API,
    PODMONITOR_API,
    Ref,
    Snapshot,
)
from kimik3_operator.controller.status import (
    RolloutStatus,
    StatusParts,
    desired_status,
    speculation_update,
    status_delta,
)
from kimik3_operator.kube import KubeError, Obj
from kimik3_operator.observation.canary import CANARY
from kimik3_operator.observation.crashes import failure_budget, parked_message, startup_failures
from kimik3_operator.observation.kueue import admitted_groups, held_by_operator, queue_state
from kimik3_operator.observation.model_cache import (
    CacheState,
    cache_state,
    ready_since,
    startup_section,
    wants_collection,
    with_collection,
)
from kimik3_operator.observation.pod_security import namespace_policy
from kimik3_operator.observation.pods import from_leader_set, from_role_set, pod_ready
from kimik3_operator.observation.workload import (
    Observation,
    RoleObservation,
    observe,
    observe_roles,
    roles_condition,
    serving_pods,
)
from kimik3_operator.preflight.gate import Gate, evaluate
from kimik3_operator.preflight.probe import ProbeState, probe_state, report_state
from kimik3_operator.preflight.table import load_table
from kimik3_operator.redact import redact, redact_tree

Verb = Literal["apply", "create", "delete", "patch", "patch_status"]
PROBE: tuple[Part, ...] = ("probe",)
CACHE: tuple[Part, ...] = ("cache",)
SERVING: tuple[Part, ...] = ("serving",)
GROUPS_AND_SERVING: tuple[Part, ...] = ("groups", "serving")
SCALING: tuple[Part, ...] = ("scaling",)
ROUTING: tuple[Part, ...] = ("routing",)


@dataclass(frozen=True)
class Write:
    """One write. ``apply`` forces only over a live object this resource controls;
    ``create`` is for children whose spec is immutable once made (a Job, a claim)."""

    verb: Verb
    ref: Ref
    body: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False

    @property
    def label(self) -> str:
        return f"{self.ref[1]}/{self.ref[2]}"


@dataclass(frozen=True)
class Decision:
    writes: tuple[Write, ...] = ()
    status_patch: Mapping[str, Any] = field(default_factory=dict)
    # Conditions that changed, each an event.
    events: tuple[Condition, ...] = ()
    # For the metrics: every final condition and the whole status wanted.
    conditions: tuple[Condition, ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)
    tracks: Mapping[str, Any] | None = None
    invalid: bool = False
    # Names the decision writes that the snapshot cannot place: read them from the server
    # and decide again.
    unread: tuple[Ref, ...] = ()


def ref_of(manifest: Mapping[str, Any]) -> Ref:
    return (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"])


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the object whose uid is ``uid`` controls ``obj``: a label is anyone's to set
    in a namespace, a controller's uid is not."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(
        isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid") == uid for ref in refs
    )


def uid_of(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _describe_controller(obj: Mapping[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return f"controlled by {ref.get('kind')}/{ref.get('name')}"
    return "not controlled by this KimiK3Deployment"


@dataclass
class _Plan:
    """The writes of one decision as they are gathered, in the order they are made."""

    snap: Snapshot
    writes: list[Write] = field(default_factory=list)

    def apply(self, manifests: Sequence[Obj]) -> None:
        for manifest in manifests:
            live = self.snap.get(ref_of(manifest))
            if needs_apply(manifest, live):
                self.writes.append(Write("apply", ref_of(manifest), manifest, live is not None))

    def create(self, manifest: Obj) -> None:
        if self.snap.get(ref_of(manifest)) is None:
            self.writes.append(Write("create", ref_of(manifest), manifest))

    def delete_owned(self, ref: Ref) -> None:
        live = self.snap.get(ref)
        refs = ((live or {}).get("metadata") or {}).get("ownerReferences") or []
        if live is not None and any(r.get("uid") == self.snap.owner.uid for r in refs):
            self.writes.append(Write("delete", ref))

    def conflicts(self) -> list[str]:
        found = []
        for write in self.writes:
            live = self.snap.get(write.ref)
            made = write.verb in ("apply", "create")
            if made and live is not None and not controlled_by(live, self.snap.owner.uid):
                found.append(f"{write.label} ({_describe_controller(live)})")
        return found

    def unread(self) -> tuple[Ref, ...]:
        return tuple(
            w.ref
            for w in self.writes
            if w.verb in ("apply", "create") and not self.snap.known(w.ref)
        )


def decide(snap: Snapshot) -> Decision:
    """The whole reconcile's outcome for this snapshot."""
    housekeeping, notices = _housekeeping(snap)
    if snap.invalid is not None or snap.spec is None:
        found = Findings(invalid=snap.invalid or "the spec could not be read")
        return _finish(snap, housekeeping, notices, found, StatusParts(), invalid=True)
    spec = snap.spec
    account = _service_account_refusal(snap, spec)
    if account is not None:
        found = Findings(spec=spec, service_account=account)
        return _finish(snap, housekeeping, notices, found, StatusParts(spec=spec))
    refusal = _pod_security(snap, spec)
    if refusal is not None:
        # Before any child: a Job or a group the namespace refuses would only fail later,
        # pod by pod, in events of objects the user does not watch.
        found = Findings(spec=spec, pod_security=refusal)
        return _finish(snap, housekeeping, notices, found, StatusParts(spec=spec))
    plan = _Plan(snap)
    gate = _preflight(snap, spec, plan)
    failures = _failure_budget(snap, spec)
    parked = failures is not None and bool(failures.get("parked"))
    cache: CacheState | None = None
    rollout: RolloutStep | None = None
    lws_ref: Ref = (LWS_API, "LeaderWorkerSet", names.leader_worker_set(snap.owner.name))
    held = _admission_held(snap, spec, gate, snap.get(lws_ref))
    numbers, speculation = speculation_update(spec, snap.status, snap.readings.acceptance)
    scaling = _scaling(snap, spec, gate, parked, speculation, snap.get(lws_ref))
    asked = spec
    if scaling is not None:
        # From here on the spec asks for the groups accepted of those KEDA wants.
        spec = dataclasses.replace(spec, replicas=scaling.replicas)
    # A spec that names a queue while Kueue is absent would run unqueued: nothing is made.
    queue_missing = spec.queued and not snap.kueue_installed
    if snap.lws_installed and not queue_missing and (gate.deploy or held):
        cache = _model_cache(snap, spec, plan) if gate.deploy else None
        rollout = _serving(snap, spec, cache, parked, plan, admission_held=held)
    if gate.failed and held_by_operator(snap.get(lws_ref)):
        # A refused spec never waits in a queue: the groups held for it go.
        plan.delete_owned(lws_ref)
    _autoscaler(snap, asked, scaling, gate, cache, plan)
    rollout_section = rollout.plan.section if rollout is not None else snap.status.get("rollout")
    routing = _routing(snap, spec, gate, rollout_section, plan)
    unread = plan.unread()
    conflicts = plan.conflicts()
    if conflicts:
        # Retried by the periodic resync; a user's change of the name reconciles at once.
        found = Findings(spec=spec, name_conflict=_conflict_message(conflicts))
        decision = _finish(snap, housekeeping, notices, found, StatusParts(spec=spec))
        return dataclasses.replace(decision, unread=unread)
    roles: tuple[RoleObservation, ...] = ()
    held_to = baseline(spec, snap.status)
    if spec.disaggregated:
        pods, roles = observe_roles(
            spec,
            ds_crd_installed=snap.ds_installed,
            ds=snap.get(_ds_ref(snap)),
            pods=list(snap.pods),
            gpus=snap.gpus,
            gone_nodes=snap.gone_nodes,
        )
    else:
        pods = observe(
            spec,
            lws_crd_installed=snap.lws_installed,
            lws=snap.get(lws_ref),
            pods=list(snap.pods),
            gpus=snap.gpus,
            name=snap.owner.name,
            gone_nodes=snap.gone_nodes,
        )
    settled = rollout is None or rollout.settled
    if cache is not None and snap.lws_installed and gate.deploy and settled:
        cache = _collect_old_revisions(snap, spec, cache, pods, plan)
    queue = queue_state(
        spec, installed=snap.kueue_installed, lws=snap.get(lws_ref), workloads=snap.workloads
    )
    found = Findings(
        pods=pods,
        spec=spec,
        gate=gate,
        parked=parked_message(failures or {}) if parked else None,
        cache=cache,
        canary=rollout.plan.condition if rollout is not None else None,
        speculation=speculation,
        queue=queue,
        autoscaling=scaling.condition if scaling is not None else None,
        routing=routing.condition if routing is not None else None,
        disaggregated=roles_condition(roles),
        transfer=transfer_condition(spec, snap.readings, snap.pods, held_to) if roles else None,
    )
    final = final_conditions(found)
    parts = StatusParts(
        spec=spec,
        gate=gate,
        cache=cache,
        startup=startup_section(cache, list(snap.pods), spec.replicas, final.ready_replicas),
        readings=snap.readings,
        speculative_numbers=numbers,
        startup_failures=failures,
        rollout=RolloutStatus(rollout.plan.section, rollout.render.pods_from)
        if rollout is not None
        else RolloutStatus(snap.status.get("rollout")),
        queue=queue,
        autoscaling=scaling.section() if scaling is not None else None,
        routing=routing.section() if routing is not None else None,
        disaggregation=_disaggregation_section(snap, spec, roles, held_to)
        if spec.disaggregated
        else None,
    )
    if routing is not None:
        notices = [*notices, *routing.notices]
    decision = _finish(snap, [*housekeeping, *plan.writes], notices, found, parts, final=final)
    return dataclasses.replace(
        decision,
        unread=unread,
        tracks=rollout.plan.tracks if rollout is not None else None,
    )


def failed(snap: Snapshot, exc: Exception) -> Decision:
    """The status when a step raised: Degraded says which, and the controller retries."""
    if isinstance(exc, KubeError):
        reason, what = Reason.APPLY_FAILED, f"writing a child failed: {exc}"
    else:
        reason, what = Reason.RECONCILE_FAILED, f"the reconcile failed: {type(exc).__name__}"
        if str(exc):
            what += f": {exc}"
    message = redact(f"{what[:600]}; the operator retries")
    degraded = Observation(0, (Condition(ConditionType.DEGRADED, "True", reason, message),), reason)
    return _finish(snap, [], [], Findings(spec=snap.spec), StatusParts(spec=snap.spec), degraded)


def _finish(
    snap: Snapshot,
    writes: Sequence[Write],
    notices: Sequence[Condition],
    found: Findings,
    parts: StatusParts,
    final: Observation | None = None,
    invalid: bool = False,
) -> Decision:
    final = final if final is not None else final_conditions(found)
    status = desired_status(snap.body, final, snap.now, parts)
    delta = status_delta(snap.status, status)
    old = snap.status.get("conditions", []) or []
    events = [cond for cond in final.conditions if delta and changed(old, cond)]
    return Decision(
        writes=tuple(writes),
        status_patch=delta,
        events=(*notices, *events),
        conditions=final.conditions,
        status=status,
        invalid=invalid,
    )


def _housekeeping(snap: Snapshot) -> tuple[list[Write], list[Condition]]:
    """Kopf's finalizer of earlier releases dropped (it would block a deletion while the
    operator is down); status fields of the wrong type removed and named in an event."""
    writes: list[Write] = []
    notices: list[Condition] = []
    meta = snap.body["metadata"]
    ref: Ref = (c.API_VERSION, c.KIND, meta["name"])
    finalizers = list(meta.get("finalizers") or [])
    if c.LEGACY_KOPF_FINALIZER in finalizers:
        kept = [f for f in finalizers if f != c.LEGACY_KOPF_FINALIZER]
        body = {"metadata": {"finalizers": kept, "resourceVersion": meta.get("resourceVersion")}}
        writes.append(Write("patch", ref, body))
    if snap.dropped_status:
        removal = _status_removal(snap.dropped_status)
        if removal:
            writes.append(Write("patch_status", ref, removal))
        message = (
            f"ignored {', '.join(snap.dropped_status)}: not of the type the operator writes; "
            "the operator writes these fields itself, nothing else should"
        )
        notices.append(
            Condition(ConditionType.DEGRADED, "True", Reason.STATUS_FIELD_IGNORED, message)
        )
    return writes, notices


def _status_removal(dropped: Sequence[str]) -> dict[str, Any]:
    removal: dict[str, Any] = {}
    for path in dropped:
        parts = path.split(".")[1:]
        if not parts or "[" in path:
            continue  # the whole status, or list items: the list is written whole anyway
        if len(parts) == 1:
            removal[parts[0]] = None
        elif isinstance(removal.setdefault(parts[0], {}), dict):
            removal[parts[0]][parts[1]] = None  # a merge patch removes a key named with null
    return removal


def _service_account_refusal(snap: Snapshot, spec: KimiK3DeploymentSpec) -> str | None:
    """Why the serving pods may not run as spec.pod.serviceAccountName: only the accounts the
    operator's settings list, so that a resource cannot lend its pods an account its author
    could not give a pod of their own."""
    name = spec.pod.service_account_name
    if not name or name in snap.service_accounts:
        return None
    allowed = ", ".join(snap.service_accounts) or "none"
    return (
        f"spec.pod.serviceAccountName={name!r} is not among the ServiceAccounts the operator "
        f"may run serving pods as ({allowed}); nothing is created. Name one of them, remove "
        "the field (the namespace's default account), or have the cluster admin add it to "
        "the chart's servingServiceAccounts"
    )


def _pod_security(snap: Snapshot, spec: KimiK3DeploymentSpec) -> str | None:
    """Why the namespace's enforced level would refuse a pod this spec makes; None when it
    admits them all, or its labels cannot be read."""
    if snap.namespace_labels is None:
        return None
    refusal = predict(spec, snap.owner, namespace_policy(snap.namespace_labels))
    return refusal.message(snap.owner.namespace) if refusal is not None else None


def _conflict_message(objects: Sequence[str]) -> str:
    return (
        f"{', '.join(objects)} already exists in the namespace and is not this "
        "KimiK3Deployment's; the operator changes nothing of it and creates nothing else. "
        "Rename this KimiK3Deployment, or remove that object if it is unused"
    )


def _preflight(snap: Snapshot, spec: KimiK3DeploymentSpec, plan: _Plan) -> Gate:
    """The static stage, then (when asked and not already failed) the image probe, whose
    verdict is read from the probe Job's own pod every time, never from the status."""
    table = load_table()
    static = evaluate(spec, table, snap.now)
    if spec.preflight.mode == "Disabled" or not spec.preflight.probe or static.failed:
        return static
    owner = snap.owner
    key = probe_key(spec)
    children = desired_children(spec, owner, parts=PROBE)
    plan.apply(children)
    job_name = names.preflight_job(owner.name, key)
    job = snap.get(("batch/v1", "Job", job_name))
    kept = ((job or {}).get("metadata", {}).get("annotations") or {}).get(c.PROBE_REPORT_ANNOTATION)
    if kept:
        state = report_state(kept, spec.engine.image)
    else:
        # Only the Job's own pods speak for the image: the label is anyone's to set.
        pods = [
            pod
            for pod in snap.pods
            if (pod["metadata"].get("labels") or {}).get(c.PROBE_KEY_LABEL) == key
            and controlled_by(pod, uid_of(job))
        ]
        state = probe_state(job, pods, spec.engine.image)
        if state.phase == "Done" and job is not None:
            # Kept on the Job, so the verdict outlives the pod's garbage collection; without
            # the credentials its errors may quote.
            text = json.dumps(redact_tree(state.report), separators=(",", ":"), sort_keys=True)
            patch = {"metadata": {"annotations": {c.PROBE_REPORT_ANNOTATION: text}}}
            plan.writes.append(Write("patch", ("batch/v1", "Job", job_name), patch))
    try:
        return evaluate(spec, table, snap.now, state, key)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        # A report of the right outline with the wrong things inside.
        unreadable = ProbeState(
            "Failed",
            Reason.PROBE_FAILED,
            f"the probe's report in {spec.engine.image} could not be read "
            f"({type(exc).__name__}: {str(exc)[:200]})",
        )
        return evaluate(spec, table, snap.now, unreadable, key)


def _admission_held(
    snap: Snapshot, spec: KimiK3DeploymentSpec, gate: Gate, live: Obj | None
) -> bool:
    """Whether the groups are made now, held in Kueue's queue until the preflight passes:
    for a queued spec whose probe is still running, on a Kueue with the AdmissionGatedBy
    gate, when the LeaderWorkerSet is new or still held (Kueue refuses a gate added to a
    LeaderWorkerSet that exists). With the model cache the groups wait for the weights,
    which wait for the preflight, so nothing is held."""
    if not (spec.queued and snap.kueue_admission_gate and spec.model.cache is None):
        return False
    if gate.deploy or gate.failed:
        return False
    return live is None or held_by_operator(live)


def _scaling(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    gate: Gate,
    parked: bool,
    speculation: Condition | None,
    live_lws: Obj | None,
) -> ScalingPlan | None:
    """spec.autoscaling against what the reconcile found (None without it)."""
    if spec.autoscaling is None:
        return None
    live = int(((live_lws or {}).get("spec") or {}).get("replicas") or 0) if live_lws else 0
    ready = int(((live_lws or {}).get("status") or {}).get("readyReplicas") or 0)
    collapsed = _acceptance_collapsed(snap, speculation)
    phase = (snap.status.get("rollout") or {}).get("phase")
    gpus = snap.gpus
    # The groups' pods not yet on a node, made or still to be made: the ledger counts their
    # GPUs as free. Which are on a node is the ledger's word where it gave it, so that the
    # free GPUs and the pods holding them come from one view.
    if gpus is not None and gpus.own_pods_held is not None:
        bound = gpus.own_pods_held
    else:
        bound = sum(1 for p in serving_pods(snap.pods) if (p.get("spec") or {}).get("nodeName"))
    unbound = max(0, live * spec.nodes_per_replica - bound)
    found = ScalingInput(
        live_replicas=live,
        ready_replicas=min(ready, live),
        keda_installed=snap.keda_installed,
        preflight_passed=gate.deploy and not gate.failed,
        parked=parked,
        canary_judged=phase == CANARY,
        acceptance_collapsed=collapsed is not None,
        acceptance_message=collapsed or "",
        pods_that_fit=gpus.pods_that_fit if gpus is not None else None,
        free_gpus=gpus.free if gpus is not None else None,
        unbound_pods=unbound,
        quota_free_gpus=snap.quota_free_gpus,
        unadmitted_groups=max(0, live - admitted_groups(snap.workloads)),
    )
    return scaling_plan(spec, found)


def _acceptance_collapsed(snap: Snapshot, update: Condition | None) -> str | None:
    """SpeculationEffective's message while it says the acceptance fell below the minimum
    (the new reading's word, else the stored one)."""
    if update is not None:
        current: Mapping[str, Any] = {
            "status": update.status,
            "reason": str(update.reason),
            "message": update.message,
        }
    else:
        stored = snap.status.get("conditions") or []
        current = next(
            (
                cond
                for cond in stored
                if isinstance(cond, Mapping)
                and cond.get("type") == ConditionType.SPECULATION_EFFECTIVE
            ),
            {},
        )
    if (
        current.get("status") == "False"
        and current.get("reason") == Reason.ACCEPTANCE_BELOW_MINIMUM
    ):
        return str(current.get("message") or "")[:300]
    return None


def _autoscaler(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    scaling: ScalingPlan | None,
    gate: Gate,
    cache: CacheState | None,
    plan: _Plan,
) -> None:
    """The ScaledObject as decided, or none once spec.autoscaling is gone. A spec that has
    never passed the preflight gets none (nothing is made for it); one that exists is held."""
    ref: Ref = (KEDA_API, "ScaledObject", names.scaled_object(snap.owner.name))
    if scaling is None:
        plan.delete_owned(ref)
        return
    if not snap.keda_installed or (snap.get(ref) is None and not gate.deploy):
        return
    bounds = Bounds(
        scaling.min_replica_count,
        scaling.max_replica_count,
        scaling.pause_scale_out,
        scaling.pause_scale_in,
    )
    weight_bytes = cache.bytes_total if cache is not None and cache.ready else None
    plan.apply(
        desired_children(
            spec,
            snap.owner,
            parts=SCALING,
            scaling=bounds,
            prometheus_url=snap.prometheus_url,
            weight_bytes=weight_bytes,
        )
    )


def _routing_refs(owner_name: str) -> list[Ref]:
    picker = names.endpoint_picker(owner_name)
    return [
        (f"{c.INFERENCE_GROUP}/{c.INFERENCE_VERSION}", "InferencePool", owner_name),
        (f"{c.GATEWAY_GROUP}/v1", "HTTPRoute", names.http_route(owner_name)),
        ("apps/v1", "Deployment", picker),
        ("v1", "Service", picker),
        ("v1", "ConfigMap", picker),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", picker),
        ("v1", "ServiceAccount", picker),
        (f"{c.MONITORING_GROUP}/v1", "PodMonitor", picker),
    ]


# A pool's parents (gateways) read into the status, at most.
MAX_PARENTS = 8


def _routing(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    gate: Gate,
    rollout_section: Mapping[str, Any] | None,
    plan: _Plan,
) -> RoutingPlan | RolePlans | None:
    """spec.routing's children and the routable label on each leader; None without it
    (then its children go). Nothing is made for a spec that has not passed the preflight."""
    refs = _routing_refs(snap.owner.name)
    if spec.routing is None:
        for ref in refs:
            plan.delete_owned(ref)
        return None
    pool_ref, route_ref, picker_ref = refs[0], refs[1], refs[2]
    if not snap.pool_installed:
        return routing_plan(
            RoutingInput((), spec.routing.max_acceptance_drop, pool_installed=False)
        )
    if gate.deploy:
        plan.apply(
            desired_children(
                spec,
                snap.owner,
                parts=ROUTING,
                picker=snap.picker,
                gateway_api=snap.gateway_api,
                pod_monitor_available=snap.pod_monitor_installed,
                pod_monitor_labels=snap.pod_monitor_labels,
            )
        )
        if spec.routing.gateway is None:
            plan.delete_owned(route_ref)
        if not spec.monitoring.pod_monitor:
            plan.delete_owned(refs[-1])
    judged, failed = canary_groups(rollout_section)
    readings = snap.readings.acceptance
    rates = (
        group_acceptance(list(readings.series.values()), readings.window_seconds)
        if readings is not None
        else {}
    )
    picker = snap.get(picker_ref)
    ready = int(((picker or {}).get("status") or {}).get("readyReplicas") or 0)
    found = RoutingInput(
        groups=(),
        max_acceptance_drop=spec.routing.max_acceptance_drop,
        canary_judged=judged,
        canary_failed=failed,
        picker_ready=None if picker is None else ready > 0,
        parents=_pool_parents(snap.get(pool_ref)),
    )
    decided: RoutingPlan | RolePlans
    if spec.disaggregated:
        decided = RolePlans(
            {
                role: routing_plan(
                    dataclasses.replace(
                        found,
                        groups=_routing_groups(
                            snap,
                            spec.role_spec(role),
                            # Prefill answers one token per request: it drafts nothing.
                            rates if role == "decode" else {},
                            _role_set(snap.owner.name, role),
                        ),
                    )
                )
                for role in DISAGGREGATED_ROLES
            }
        )
    else:
        owner_set = names.leader_worker_set(snap.owner.name)
        decided = routing_plan(
            dataclasses.replace(
                found,
                groups=_routing_groups(
                    snap, spec, rates, lambda meta: from_leader_set(meta, owner_set)
                ),
            )
        )
    for change in decided.labels:
        body = {"metadata": {"labels": {c.LABEL_ROUTABLE: change.value}}}
        plan.writes.append(Write("patch", ("v1", "Pod", change.pod), body))
    return decided


def _routing_groups(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    rates: Mapping[int, float],
    owned: Callable[[Mapping[str, Any]], bool],
) -> tuple[GroupInput, ...]:
    """Each group's leader: only pods the LeaderWorkerSet's leader StatefulSet controls (a
    namespace user's pod with our labels is never labelled), one per group index. A group is
    ready when all its pods are: a leader whose workers are missing or not Ready cannot
    serve, whatever its own probe says."""
    # By LeaderWorkerSet and index: a DisaggregatedSet's roles (and revisions) repeat indices.
    ready_pods: dict[tuple[str, str], int] = {}
    for pod in snap.pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if (
            labels.get(c.LABEL_COMPONENT) in (c.COMPONENT_LEADER, c.COMPONENT_WORKER)
            and not meta.get("deletionTimestamp")
            and pod_ready(pod)
        ):
            key = _group_key(labels)
            ready_pods[key] = ready_pods.get(key, 0) + 1
    chosen: dict[int, GroupInput] = {}
    for pod in snap.pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        index = str(labels.get(c.LWS_GROUP_INDEX_LABEL, ""))
        if (
            labels.get(c.LABEL_COMPONENT) != c.COMPONENT_LEADER
            or meta.get("deletionTimestamp")
            or not owned(meta)
            or not (index.isdigit() and len(index) <= 6)
        ):
            continue
        group = int(index)
        chosen.setdefault(
            group,
            GroupInput(
                index=group,
                leader=str(meta.get("name")),
                ready=pod_ready(pod)
                and ready_pods.get(_group_key(labels), 0) >= spec.nodes_per_replica,
                label=str(labels.get(c.LABEL_ROUTABLE, "")),
                acceptance=rates.get(group),
            ),
        )
    return tuple(chosen[i] for i in sorted(chosen))


def _role_set(owner_name: str, role: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda meta: from_role_set(meta, owner_name, role)


def _group_key(labels: Mapping[str, Any]) -> tuple[str, str]:
    return (str(labels.get(c.LWS_NAME_LABEL, "")), str(labels.get(c.LWS_GROUP_INDEX_LABEL, "")))


def _pool_parents(pool: Obj | None) -> tuple[Mapping[str, Any], ...]:
    """The InferencePool's parents (gateways) and their Accepted and ResolvedRefs."""
    parents = ((pool or {}).get("status") or {}).get("parents") or []
    found = []
    for parent in parents[:MAX_PARENTS]:
        if not isinstance(parent, Mapping):
            continue
        ref = parent.get("parentRef") or {}
        conditions = [
            {key: str(cond.get(key, ""))[:300] for key in ("type", "status", "reason", "message")}
            for cond in parent.get("conditions") or []
            if isinstance(cond, Mapping) and cond.get("type") in ("Accepted", "ResolvedRefs")
        ]
        found.append({"name": str(ref.get("name", ""))[:253], "conditions": conditions})
    return tuple(found)


def _failure_budget(snap: Snapshot, spec: KimiK3DeploymentSpec) -> dict[str, Any] | None:
    """status.startupFailures after counting the serving pods' start-up failures."""
    serving = [
        p
        for p in snap.pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(c.LABEL_COMPONENT)
        in (c.COMPONENT_LEADER, c.COMPONENT_WORKER)
    ]
    meta = snap.body["metadata"]
    retry = (meta.get("annotations") or {}).get(c.RETRY_ANNOTATION, "")
    return failure_budget(
        snap.status.get("startupFailures") or {},
        startup_failures(serving) if snap.lws_installed else [],
        generation=int(meta.get("generation", 0) or 0),
        retry=str(retry)[:63],
        budget=spec.rollout.max_startup_failures,
    )


def _model_cache(snap: Snapshot, spec: KimiK3DeploymentSpec, plan: _Plan) -> CacheState | None:
    """The claim and the download Job for this spec's weights, and where they stand."""
    if spec.model.cache is None:
        return None
    owner = snap.owner
    key = cache_key(spec, owner)
    claim_name = cache_claim_name(owner, spec.model.cache)
    job_ref: Ref = ("batch/v1", "Job", names.download_job(owner.name, key))
    stored = snap.status.get("modelCache") or {}
    made = {child["kind"]: child for child in desired_children(spec, owner, parts=CACHE)}
    if "PersistentVolumeClaim" in made:
        plan.create(made["PersistentVolumeClaim"])
    claim = snap.get(("v1", "PersistentVolumeClaim", claim_name))
    claim_uid = ((claim or {}).get("metadata") or {}).get("uid")
    replaced = bool(stored.get("claimUID")) and bool(claim_uid) and stored["claimUID"] != claim_uid
    job = snap.get(job_ref)
    if replaced and job is not None and not (job.get("metadata") or {}).get("deletionTimestamp"):
        # A new, empty volume: the finished Job that filled the old one runs again.
        plan.delete_owned(job_ref)
    elif replaced or not (stored.get("key") == key and stored.get("phase") == "Ready"):
        plan.apply([made["ConfigMap"]])
        plan.create(made["Job"])
    _delete_other_downloads(snap, key, plan)
    pods = [
        pod
        for pod in snap.pods
        if (pod["metadata"].get("labels") or {}).get(c.CACHE_KEY_LABEL) == key
        and controlled_by(pod, uid_of(job))
    ]
    found = cache_state(
        key=key,
        claim_name=claim_name,
        job_name=job_ref[2],
        claim=claim,
        job=job,
        pods=pods,
        stored=stored,
    )
    return ready_since(found, snap.now)


def _delete_other_downloads(snap: Snapshot, key: str, plan: _Plan) -> None:
    """A download for a revision no longer asked for only takes bandwidth from this one; a
    collection made for another revision would keep the wrong one."""
    for component, label in (
        (c.COMPONENT_DOWNLOAD, c.CACHE_KEY_LABEL),
        (c.COMPONENT_COLLECT, c.COLLECT_KEY_LABEL),
    ):
        for job in snap.children("batch/v1", "Job"):
            labels = job["metadata"].get("labels") or {}
            if labels.get(c.LABEL_COMPONENT) == component and labels.get(label) != key:
                plan.delete_owned(ref_of(job))


def _serving(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    cache: CacheState | None,
    parked: bool,
    plan: _Plan,
    admission_held: bool = False,
) -> RolloutStep | None:
    """The LeaderWorkerSet, the Service and the PodMonitor; the rollout step, unless the
    weights are not in the cache yet (then a running LeaderWorkerSet keeps serving its
    revision)."""
    owner = snap.owner
    # No serving pod may start on a replaced, empty volume, not even one LWS recreates; a
    # parked deployment frees its accelerators.
    serving = (
        dataclasses.replace(spec, replicas=0)
        if parked or (cache is not None and cache.volume_replaced)
        else spec
    )
    weight_bytes = cache.bytes_total if cache is not None and cache.ready else None
    waiting_for_cache = cache is not None and not cache.ready and not cache.volume_replaced
    lws_ref: Ref = (LWS_API, "LeaderWorkerSet", names.leader_worker_set(owner.name))
    if spec.disaggregated:
        _disaggregated_serving(snap, serving, weight_bytes, waiting_for_cache, lws_ref, plan)
        return None
    if snap.ds_installed and snap.get(_ds_ref(snap)) is not None:
        # The spec dropped spec.disaggregation: its set goes, the LeaderWorkerSet comes back.
        plan.delete_owned(_ds_ref(snap))
    live_lws = snap.get(lws_ref)
    step = rollout_step(
        snap.body, serving, owner, live_lws, snap.pods, weight_bytes, snap.readings, snap.seconds
    )
    children = desired_children(
        serving,
        owner,
        parts=SERVING if waiting_for_cache else GROUPS_AND_SERVING,
        pod_monitor_available=snap.pod_monitor_installed,
        weight_bytes=weight_bytes,
        rollout=step.render,
        pod_monitor_labels=snap.pod_monitor_labels,
        admission_held=admission_held,
    )
    plan.apply(children)
    if snap.pod_monitor_installed and not any(ch["kind"] == "PodMonitor" for ch in children):
        plan.delete_owned((PODMONITOR_API, "PodMonitor", names.pod_monitor(owner.name)))
    return None if waiting_for_cache else step


def _ds_ref(snap: Snapshot) -> Ref:
    return (DS_API, "DisaggregatedSet", names.disaggregated_set(snap.owner.name))


def _disaggregated_serving(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    weight_bytes: int | None,
    waiting_for_cache: bool,
    lws_ref: Ref,
    plan: _Plan,
) -> None:
    """spec.disaggregation: the DisaggregatedSet (its controller rolls both roles together,
    so the operator's own rollout step does not run), the Service of the decode leaders and
    the PodMonitor. The LeaderWorkerSet the spec ran before goes."""
    if snap.get(lws_ref) is not None:
        plan.delete_owned(lws_ref)
    if not snap.ds_installed:
        return
    children = desired_children(
        spec,
        snap.owner,
        parts=SERVING if waiting_for_cache else GROUPS_AND_SERVING,
        pod_monitor_available=snap.pod_monitor_installed,
        weight_bytes=weight_bytes,
        pod_monitor_labels=snap.pod_monitor_labels,
    )
    plan.apply(children)


def _disaggregation_section(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    roles: Sequence[RoleObservation],
    held_to: tuple[float, str],
) -> dict[str, Any]:
    disaggregation = spec.disaggregation
    section: dict[str, Any] = {
        "disaggregatedSet": names.disaggregated_set(snap.owner.name),
        "connector": disaggregation.connector if disaggregation is not None else "",
        "roles": [r.section() for r in roles],
    }
    if spec.paired_drafter is not None:
        section["baseline"] = baseline_section(held_to)
    return section


def _collect_old_revisions(
    snap: Snapshot,
    spec: KimiK3DeploymentSpec,
    cache: CacheState,
    pods: Observation,
    plan: _Plan,
) -> CacheState:
    """Once the rollout to this revision is complete, a Job deletes what only the revisions
    no longer asked for use, in a claim the operator made (one somebody else named may hold
    other deployments' weights)."""
    if spec.model.cache is None or spec.model.cache.claim_name:
        return cache
    if not wants_collection(cache, list(snap.pods), spec.replicas, pods.ready_replicas):
        return cache
    keep = [
        {"repo": str(r.get("repo")), "commit": str(r.get("commit"))}
        for r in cache.repos
        if r.get("repo") and r.get("commit")
    ]
    if not keep:
        return cache
    plan.create(with_spec_hash(build_collect_job(spec, snap.owner, cache.key, keep)))
    collect_pods = [
        p
        for p in snap.pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(c.COLLECT_KEY_LABEL) == cache.key
    ]
    return with_collection(cache, collect_pods)
