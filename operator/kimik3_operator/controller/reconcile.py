"""One reconcile of a KimiK3Deployment: parse, preflight, build, apply what changed,
observe, write the status that changed.

Reads go through ``Kube`` (in the operator, the watch store), writes only where something
differs, so one call serves every trigger: a change of the resource, a child's event, the
periodic resync.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.api import names
from kimik3_operator.api.conditions import Condition, changed, now_rfc3339
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec, SpecError, parse_spec
from kimik3_operator.builders.children import build_children
from kimik3_operator.builders.common import Owner, with_spec_hash
from kimik3_operator.builders.model_cache import (
    build_cache_claim,
    build_collect_job,
    build_download_config_map,
    build_download_job,
    cache_claim_name,
    cache_key,
)
from kimik3_operator.builders.preflight_job import (
    build_probe_config_map,
    build_probe_job,
    probe_key,
)
from kimik3_operator.controller.admission import predict
from kimik3_operator.controller.drift import needs_apply
from kimik3_operator.controller.rollout import RolloutStep, rollout_step, with_rollout
from kimik3_operator.controller.status import (
    Readings,
    RolloutStatus,
    desired_status,
    final_observation,
    speculation_update,
    status_delta,
)
from kimik3_operator.events import post_event
from kimik3_operator.kube import Kube, KubeError, Obj
from kimik3_operator.observation.crashes import failure_budget, parked_message, startup_failures
from kimik3_operator.observation.model_cache import (
    CacheState,
    cache_state,
    ready_since,
    startup_section,
    wants_collection,
    with_collection,
)
from kimik3_operator.observation.pod_security import namespace_policy
from kimik3_operator.observation.status_input import with_readable_status
from kimik3_operator.observation.workload import (
    Observation,
    blocked,
    invalid_spec,
    observe,
    wants_gpu_counts,
)
from kimik3_operator.preflight.gate import Gate, evaluate
from kimik3_operator.preflight.probe import ProbeState, probe_state, report_state
from kimik3_operator.preflight.table import load_table
from kimik3_operator.redact import redact, redact_tree

if TYPE_CHECKING:  # the runtime feeds the ledger; the reconcile only reads it
    from kimik3_operator.runtime.gpu_ledger import GpuLedger

log = logging.getLogger(__name__)
CRD_API = "apiextensions.k8s.io/v1"
LWS_API = f"{c.LWS_GROUP}/{c.LWS_VERSION}"


class NameConflictError(Exception):
    """Objects with a child's name that this resource does not control: never applied over."""

    def __init__(self, objects: Sequence[str]) -> None:
        self.objects = tuple(objects)
        super().__init__(", ".join(self.objects))


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the object whose uid is ``uid`` controls ``obj``: a label is anyone's to set
    in a namespace, a controller's uid is not (an object naming a controller that does not
    exist is garbage-collected)."""
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


def _live_or_conflict(kube: Kube, child: Mapping[str, Any], owner: Owner) -> Obj | None:
    """The live child when this resource controls it, None when there is none; raises
    NameConflictError when an object of that name exists that it does not control."""
    meta = child["metadata"]
    args = (child["apiVersion"], child["kind"], meta["name"], meta["namespace"])
    live = kube.get(*args)
    if live is None:
        # The caches hold only labelled objects: ask the API server before creating.
        live = kube.get_from_server(*args)
    if live is not None and not controlled_by(live, owner.uid):
        raise NameConflictError([f"{child['kind']}/{meta['name']} ({_describe_controller(live)})"])
    return live


def check_names(
    kube: Kube, children: Sequence[Mapping[str, Any]], owner: Owner
) -> list[Obj | None]:
    """The live object of each child (None: not there yet), or every conflict of the set
    at once, before any of it is applied: no half deployment."""
    found: list[str] = []
    lives: list[Obj | None] = []
    for child in children:
        try:
            lives.append(_live_or_conflict(kube, child, owner))
        except NameConflictError as err:
            found.extend(err.objects)
    if found:
        raise NameConflictError(found)
    return lives


def name_conflict(err: NameConflictError) -> Observation:
    objects = ", ".join(err.objects)
    return blocked(
        Reason.NAME_CONFLICT,
        f"{objects} already exists in the namespace and is not this KimiK3Deployment's; the "
        "operator changes nothing of it and creates nothing else. Rename this "
        "KimiK3Deployment, or remove that object if it is unused",
    )


@dataclass
class ReconcileResult:
    invalid: bool = False
    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[str] = field(default_factory=list)


def namespace_labels_from_server(kube: Kube, namespace: str) -> Mapping[str, str] | None:
    """The namespace's labels (None: it cannot be read, so no prediction is made)."""
    try:
        found = kube.get_from_server("v1", "Namespace", namespace)
    except KubeError as err:
        log.warning("namespace %s cannot be read (%s): Pod Security not predicted", namespace, err)
        return None
    if found is None:
        return None
    labels = (found.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


@dataclass(frozen=True)
class Context:
    """What a reconcile reads besides the API: the clock (as status text and as seconds),
    the GPU ledger, the readers' latest readings and the namespaces' labels (the runtime
    keeps them a while rather than asking at every reconcile)."""

    clock: Callable[[], str] = now_rfc3339
    seconds: Callable[[], float] = time.time
    ledger: GpuLedger | None = None
    readings: Readings = field(default_factory=Readings)
    namespace_labels: Callable[[Kube, str], Mapping[str, str] | None] = namespace_labels_from_server
    # The operator's setting: labels on every PodMonitor it makes.
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)


def reconcile(kube: Kube, key: tuple[str, str], context: Context | None = None) -> ReconcileResult:
    """One reconcile of the resource ``key`` (namespace, name). The queue never runs two
    for one key at once, and nothing else writes its status."""
    namespace, name = key
    context = context or Context()
    with metrics.RECONCILE_SECONDS.time():
        body = kube.get(c.API_VERSION, c.KIND, name, namespace)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return ReconcileResult()
        body, dropped = with_readable_status(body)
        if dropped:
            _ignore_malformed_status(kube, body, dropped, context.clock)
        try:
            body = _drop_legacy_finalizer(kube, body)
            result = _reconcile(kube, body, context)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        metrics.RECONCILES.labels("invalid" if result.invalid else "ok").inc()
        return result


def _ignore_malformed_status(
    kube: Kube, body: Mapping[str, Any], dropped: Sequence[str], clock: Callable[[], str]
) -> None:
    """Status fields of the wrong type are read as absent, removed, and named in a Warning
    event; the reconcile goes on and writes what it knows."""
    meta = body["metadata"]
    removal: dict[str, Any] = {}
    for path in dropped:
        parts = path.split(".")[1:]
        if not parts or "[" in path:
            continue  # the whole status, or list items: the list is written whole anyway
        if len(parts) == 1:
            removal[parts[0]] = None
        elif isinstance(removal.setdefault(parts[0], {}), dict):
            removal[parts[0]][parts[1]] = None  # a merge patch removes a key named with null
    if removal:
        kube.patch_status(c.API_VERSION, c.KIND, meta["name"], meta["namespace"], removal)
    message = (
        f"ignored {', '.join(dropped)}: not of the type the operator writes; the operator "
        "writes these fields itself, nothing else should"
    )
    log.warning("%s/%s: %s", meta["namespace"], meta["name"], message)
    post_event(
        kube,
        body,
        Condition(ConditionType.DEGRADED, "True", Reason.STATUS_FIELD_IGNORED, message),
        clock(),
    )


def _drop_legacy_finalizer(kube: Kube, body: Obj) -> Obj:
    """Resources made under earlier releases carry kopf's finalizer; nothing needs it now,
    and it would block their deletion while the operator is down."""
    meta = body["metadata"]
    finalizers = list(meta.get("finalizers") or [])
    if c.LEGACY_KOPF_FINALIZER not in finalizers:
        return body
    kept = [f for f in finalizers if f != c.LEGACY_KOPF_FINALIZER]
    patch = {"metadata": {"finalizers": kept, "resourceVersion": meta.get("resourceVersion")}}
    return kube.patch(c.API_VERSION, c.KIND, meta["name"], meta["namespace"], patch)


def _reconcile(kube: Kube, body: Mapping[str, Any], context: Context) -> ReconcileResult:
    clock = context.clock
    meta = body["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    result = ReconcileResult()
    problem = names.name_error(owner.name)
    if problem is not None:
        result.invalid = True
        _write_status(
            kube, body, None, invalid_spec(f"{problem}. No child was created."), result, clock
        )
        return result
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as err:
        result.invalid = True
        observation = invalid_spec(f"{err}. No child was created or changed.")
        _write_status(kube, body, None, observation, result, clock)
        return result
    refusal = _pod_security(kube, spec, owner, context)
    if refusal is not None:
        # Before any child: a Job or a group the namespace refuses would only fail later,
        # pod by pod, in events of objects the user does not watch.
        _write_status(kube, body, spec, refusal, result, clock)
        return result
    try:
        return _deploy(kube, body, spec, owner, result, context)
    except NameConflictError as err:
        # Retried by the periodic resync; a user's change of the name reconciles at once.
        _write_status(kube, body, spec, name_conflict(err), result, clock)
        return result
    except Exception as exc:
        # Whatever step failed (the probe Job, the cache, the children), the user reads it in
        # the status; the controller retries with backoff.
        _write_status(kube, body, spec, step_failed(exc), result, clock)
        raise


def _pod_security(
    kube: Kube, spec: KimiK3DeploymentSpec, owner: Owner, context: Context
) -> Observation | None:
    """PodSecurityRefused when the namespace's enforced level would refuse a pod this spec
    makes; None when it admits them all, or its labels cannot be read."""
    labels = context.namespace_labels(kube, owner.namespace)
    if labels is None:
        return None
    refusal = predict(spec, owner, namespace_policy(labels))
    if refusal is None:
        return None
    return blocked(Reason.POD_SECURITY_REFUSED, refusal.message(owner.namespace))


def step_failed(exc: Exception) -> Observation:
    if isinstance(exc, KubeError):
        reason, what = Reason.APPLY_FAILED, f"writing a child failed: {exc}"
    else:
        reason, what = Reason.RECONCILE_FAILED, f"the reconcile failed: {type(exc).__name__}"
        if str(exc):
            what += f": {exc}"
    message = redact(f"{what[:600]}; the operator retries")
    return Observation(0, (Condition(ConditionType.DEGRADED, "True", reason, message),), reason)


def _deploy(
    kube: Kube,
    body: Mapping[str, Any],
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    result: ReconcileResult,
    context: Context,
) -> ReconcileResult:
    clock, ledger, now = context.clock, context.ledger, context.seconds
    gate = _preflight(kube, spec, owner, body, result, clock)
    lws_installed = _crd_exists(kube, c.LWS_CRD)
    pods = _pods(kube, owner) if lws_installed else []
    failures = _failure_budget(body, spec, pods)
    parked = failures is not None and bool(failures.get("parked"))
    cache: CacheState | None = None
    rollout: RolloutStep | None = None
    if lws_installed and gate.deploy:
        pod_monitor_installed = _crd_exists(kube, c.PODMONITOR_CRD)
        # Every name first, so a conflict leaves nothing half made.
        check_names(
            kube,
            build_children(
                spec,
                owner,
                pod_monitor_available=pod_monitor_installed,
                pod_monitor_labels=context.pod_monitor_labels,
            ),
            owner,
        )
        cache = _model_cache(kube, spec, owner, body, result, clock)
        # No serving pod may start on a replaced, empty volume, not even one LWS recreates;
        # a parked deployment frees its accelerators.
        serving = (
            dataclasses.replace(spec, replicas=0)
            if parked or (cache is not None and cache.volume_replaced)
            else spec
        )
        weight_bytes = cache.bytes_total if cache is not None and cache.ready else None
        waiting_for_cache = cache is not None and not cache.ready and not cache.volume_replaced
        live_lws = kube.get(
            LWS_API, "LeaderWorkerSet", names.leader_worker_set(owner.name), owner.namespace
        )
        step = rollout_step(
            body, serving, owner, live_lws, pods, weight_bytes, context.readings, now()
        )
        children = build_children(
            serving,
            owner,
            pod_monitor_available=pod_monitor_installed,
            weight_bytes=weight_bytes,
            rollout=step.render,
            pod_monitor_labels=context.pod_monitor_labels,
        )
        if waiting_for_cache:
            # No serving pod before the weights are there; a running LeaderWorkerSet
            # keeps serving its revision until the new one is in the cache.
            children = [ch for ch in children if ch["kind"] != "LeaderWorkerSet"]
        else:
            rollout = step
        _apply_children(kube, children, owner, result)
        if pod_monitor_installed and not any(ch["kind"] == "PodMonitor" for ch in children):
            _delete_owned(
                kube,
                f"{c.MONITORING_GROUP}/v1",
                "PodMonitor",
                names.pod_monitor(owner.name),
                owner,
                result,
            )
    lws = (
        kube.get(LWS_API, "LeaderWorkerSet", names.leader_worker_set(owner.name), owner.namespace)
        if lws_installed
        else None
    )
    gone = frozenset(
        node
        for node in (p.get("spec", {}).get("nodeName") for p in pods)
        if node and ledger is not None and not ledger.has_node(node)
    )
    placement = spec.placement
    # The ledger is summed only for a pod the scheduler turned away for want of GPUs.
    gpus = (
        ledger.counts(placement.gpu_resource, placement.node_selector, placement.tolerations)
        if ledger is not None and wants_gpu_counts(pods, spec)
        else None
    )
    observation = (
        blocked(Reason.PARKED_AFTER_STARTUP_FAILURES, parked_message(failures or {}))
        if parked
        else observe(
            spec,
            lws_crd_installed=lws_installed,
            lws=lws,
            pods=pods,
            gpus=gpus,
            name=owner.name,
            gone_nodes=gone,
        )
    )
    status = body.get("status") or {}
    numbers, speculation = speculation_update(spec, status, context.readings.acceptance)
    settled = rollout is None or rollout.settled
    if cache is not None and lws_installed and gate.deploy and settled:
        cache = _collect_old_revisions(kube, spec, owner, cache, pods, observation, result)
    final = final_observation(observation, gate, cache, speculation, spec)
    if rollout is not None:
        final = with_rollout(final, rollout)
        metrics.record_rollout(owner.namespace, owner.name, rollout.plan.tracks)
    startup = startup_section(cache, pods, spec.replicas, final.ready_replicas)
    _write_status(
        kube,
        body,
        spec,
        final,
        result,
        clock,
        gate,
        cache,
        startup,
        context.readings,
        numbers,
        failures,
        RolloutStatus(rollout.plan.section, rollout.render.pods_from)
        if rollout is not None
        else RolloutStatus(status.get("rollout")),
    )
    return result


def _failure_budget(
    body: Mapping[str, Any], spec: KimiK3DeploymentSpec, pods: Sequence[Obj]
) -> dict[str, Any] | None:
    """status.startupFailures after counting the serving pods' start-up failures."""
    serving = [
        p
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(c.LABEL_COMPONENT)
        in (c.COMPONENT_LEADER, c.COMPONENT_WORKER)
    ]
    meta = body["metadata"]
    retry = (meta.get("annotations") or {}).get(c.RETRY_ANNOTATION, "")
    stored = (body.get("status") or {}).get("startupFailures") or {}
    return failure_budget(
        stored,
        startup_failures(serving),
        generation=int(meta.get("generation", 0) or 0),
        retry=str(retry)[:63],
        budget=spec.rollout.max_startup_failures,
    )


def _preflight(
    kube: Kube,
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    body: Mapping[str, Any],
    result: ReconcileResult,
    clock: Callable[[], str],
) -> Gate:
    """The static stage, then (when asked and not already failed) the image probe."""
    table = load_table()
    if spec.preflight.mode == "Disabled" or not spec.preflight.probe:
        return evaluate(spec, table, clock())
    static = evaluate(spec, table, clock())
    if static.failed:
        return static
    key = probe_key(spec)
    # The verdict is read from the probe Job's pod every time, never from the status,
    # which is not the operator's alone to write.
    _apply_children(
        kube,
        [
            with_spec_hash(build_probe_config_map(owner)),
            with_spec_hash(build_probe_job(spec, owner)),
        ],
        owner,
        result,
    )
    job_name = names.preflight_job(owner.name, key)
    job = kube.get("batch/v1", "Job", job_name, owner.namespace)
    kept = ((job or {}).get("metadata", {}).get("annotations") or {}).get(c.PROBE_REPORT_ANNOTATION)
    if kept:
        state = report_state(kept, spec.engine.image)
    else:
        labelled = kube.list(
            "v1", "Pod", owner.namespace, label_selector=f"{c.PROBE_KEY_LABEL}={key}"
        )
        # Only the Job's own pods speak for the image: the label is anyone's to set.
        pods = [pod for pod in labelled if controlled_by(pod, uid_of(job))]
        state = probe_state(job, pods, spec.engine.image)
        if state.phase == "Done" and job is not None:
            # Kept on the Job, so the verdict outlives the pod's garbage collection; without
            # the credentials its errors may quote.
            text = json.dumps(redact_tree(state.report), separators=(",", ":"), sort_keys=True)
            annotations = {c.PROBE_REPORT_ANNOTATION: text}
            kube.patch(
                "batch/v1",
                "Job",
                job_name,
                owner.namespace,
                {"metadata": {"annotations": annotations}},
            )
    try:
        return evaluate(spec, table, clock(), state, key)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        # A report of the right outline with the wrong things inside.
        unreadable = ProbeState(
            "Failed",
            Reason.PROBE_FAILED,
            f"the probe's report in {spec.engine.image} could not be read "
            f"({type(exc).__name__}: {str(exc)[:200]})",
        )
        return evaluate(spec, table, clock(), unreadable, key)


def _model_cache(
    kube: Kube,
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    body: Mapping[str, Any],
    result: ReconcileResult,
    clock: Callable[[], str],
) -> CacheState | None:
    """The claim and the download Job for this spec's weights, and where they stand."""
    if spec.model.cache is None:
        return None
    key = cache_key(spec, owner)
    claim_name = cache_claim_name(owner, spec.model.cache)
    job_name = names.download_job(owner.name, key)
    stored = (body.get("status") or {}).get("modelCache") or {}
    claim_manifest = build_cache_claim(spec, owner)
    if claim_manifest is not None:
        _create_missing(kube, [with_spec_hash(claim_manifest)], owner, result)
    claim = kube.get("v1", "PersistentVolumeClaim", claim_name, owner.namespace)
    claim_uid = ((claim or {}).get("metadata") or {}).get("uid")
    replaced = bool(stored.get("claimUID")) and bool(claim_uid) and stored["claimUID"] != claim_uid
    if replaced:
        # A new, empty volume: the finished Job that filled the old one runs again.
        job = kube.get("batch/v1", "Job", job_name, owner.namespace)
        if job is not None and not (job.get("metadata") or {}).get("deletionTimestamp"):
            _delete_owned(kube, "batch/v1", "Job", job_name, owner, result)
    if replaced or not (stored.get("key") == key and stored.get("phase") == "Ready"):
        _apply_children(kube, [with_spec_hash(build_download_config_map(owner))], owner, result)
        _create_missing(kube, [with_spec_hash(build_download_job(spec, owner))], owner, result)
    _delete_other_downloads(kube, owner, key, result)
    job = kube.get("batch/v1", "Job", job_name, owner.namespace)
    found = cache_state(
        key=key,
        claim_name=claim_name,
        job_name=job_name,
        claim=claim,
        job=job,
        pods=[
            pod
            for pod in kube.list(
                "v1", "Pod", owner.namespace, label_selector=f"{c.CACHE_KEY_LABEL}={key}"
            )
            if controlled_by(pod, uid_of(job))
        ],
        stored=stored,
    )
    return ready_since(found, clock())


def _collect_old_revisions(
    kube: Kube,
    spec: KimiK3DeploymentSpec,
    owner: Owner,
    cache: CacheState,
    pods: Sequence[Obj],
    observation: Observation,
    result: ReconcileResult,
) -> CacheState:
    """Once the rollout to this revision is complete, a Job deletes what only the revisions
    no longer asked for use, in a claim the operator made (one somebody else named may hold
    other deployments' weights)."""
    if spec.model.cache is None or spec.model.cache.claim_name:
        return cache
    if not wants_collection(cache, pods, spec.replicas, observation.ready_replicas):
        return cache
    keep = [
        {"repo": str(r.get("repo")), "commit": str(r.get("commit"))}
        for r in cache.repos
        if r.get("repo") and r.get("commit")
    ]
    if not keep:
        return cache
    _create_missing(
        kube, [with_spec_hash(build_collect_job(spec, owner, cache.key, keep))], owner, result
    )
    collect_pods = [
        p
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(c.COLLECT_KEY_LABEL) == cache.key
    ]
    return with_collection(cache, collect_pods)


def _create_missing(
    kube: Kube, manifests: Sequence[Obj], owner: Owner, result: ReconcileResult
) -> None:
    """For children whose spec is immutable once made (a Job's pods, a claim's volume)."""
    for manifest, live in zip(manifests, check_names(kube, manifests, owner), strict=True):
        meta = manifest["metadata"]
        if live is not None:
            continue
        kube.apply(manifest, force=False)
        result.applied.append(f"{manifest['kind']}/{meta['name']}")


def _delete_other_downloads(kube: Kube, owner: Owner, key: str, result: ReconcileResult) -> None:
    """A download for a revision no longer asked for only takes bandwidth from this one; a
    collection made for another revision would keep the wrong one."""
    for component, label in (
        (c.COMPONENT_DOWNLOAD, c.CACHE_KEY_LABEL),
        (c.COMPONENT_COLLECT, c.COLLECT_KEY_LABEL),
    ):
        selector = (
            f"{c.LABEL_INSTANCE}={owner.name},{c.LABEL_COMPONENT}={component},"
            f"{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
        )
        for job in kube.list("batch/v1", "Job", owner.namespace, label_selector=selector):
            meta = job["metadata"]
            if (meta.get("labels") or {}).get(label) != key:
                _delete_owned(kube, "batch/v1", "Job", meta["name"], owner, result)


def _crd_exists(kube: Kube, name: str) -> bool:
    return kube.get(CRD_API, "CustomResourceDefinition", name) is not None


def _pods(kube: Kube, owner: Owner) -> list[Obj]:
    selector = f"{c.LABEL_INSTANCE}={owner.name},{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
    return kube.list("v1", "Pod", owner.namespace, label_selector=selector)


def _apply_children(
    kube: Kube, children: Sequence[Obj], owner: Owner, result: ReconcileResult
) -> None:
    """Applies what changed; forces only over objects this resource controls, and creates
    without force, so a field another manager holds is a conflict, never taken over."""
    for child, live in zip(children, check_names(kube, children, owner), strict=True):
        meta = child["metadata"]
        if needs_apply(child, live):
            kube.apply(child, force=live is not None)
            result.applied.append(f"{child['kind']}/{meta['name']}")


def _delete_owned(
    kube: Kube, api_version: str, kind: str, name: str, owner: Owner, result: ReconcileResult
) -> None:
    live = kube.get(api_version, kind, name, owner.namespace)
    if live is None:
        return
    refs = live.get("metadata", {}).get("ownerReferences", []) or []
    if any(ref.get("uid") == owner.uid for ref in refs):
        kube.delete(api_version, kind, name, owner.namespace)
        result.deleted.append(f"{kind}/{name}")


def _write_status(
    kube: Kube,
    body: Mapping[str, Any],
    spec: KimiK3DeploymentSpec | None,
    observation: Observation,
    result: ReconcileResult,
    clock: Callable[[], str],
    gate: Gate | None = None,
    cache: CacheState | None = None,
    startup: Mapping[str, Any] | None = None,
    readings: Readings | None = None,
    speculative_numbers: Mapping[str, object] | None = None,
    startup_failures: Mapping[str, Any] | None = None,
    rollout: RolloutStatus | None = None,
) -> None:
    """``observation`` is final: every condition the status ends with."""
    meta = body["metadata"]
    current: Mapping[str, Any] = body.get("status") or {}
    status = desired_status(
        body,
        spec,
        observation,
        clock(),
        gate,
        cache,
        startup,
        readings,
        speculative_numbers,
        startup_failures,
        rollout,
    )
    metrics.record_conditions(meta["namespace"], meta["name"], observation.conditions)
    metrics.record_status(meta["namespace"], meta["name"], status)
    delta = status_delta(current, status)
    if not delta:
        return
    log.debug("%s/%s: status fields changed: %s", meta["namespace"], meta["name"], sorted(delta))
    kube.patch_status(c.API_VERSION, c.KIND, meta["name"], meta["namespace"], delta)
    result.status_written = True
    old_conditions = current.get("conditions", []) or []
    for condition in observation.conditions:
        if changed(old_conditions, condition):
            if condition.type in (
                ConditionType.CAPABILITIES_VERIFIED,
                ConditionType.DRAFTER_PAIRED,
            ):
                metrics.PREFLIGHT_VERDICTS.labels(
                    condition.type, condition.status, condition.reason
                ).inc()
            post_event(kube, body, condition, clock())
            result.events.append(f"{condition.type}={condition.status}/{condition.reason}")
