"""The model cache's state, the ModelCached condition, the status.modelCache section and the
start-up phase of the whole deployment: pure, from the objects the watches hold."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kimik3_operator.api import constants as c
from kimik3_operator.api.conditions import Condition
from kimik3_operator.api.constants import IMAGE_PULL_REASONS, ConditionType, Reason
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.observation.pods import pod_ready

Obj = Mapping[str, Any]
CachePhase = Literal["Pending", "Downloading", "Verifying", "Ready", "Failed"]
StartupPhase = Literal["WaitingForCache", "Downloading", "Scheduling", "LoadingWeights", "Ready"]
# Fields the progress reader keeps current between reconciles.
PROGRESS_FIELDS = ("bytesDone", "bytesPerSecond", "etaSeconds", "verifiedBytes", "progress")


@dataclass(frozen=True)
class CacheState:
    phase: CachePhase
    reason: Reason
    message: str
    key: str
    claim_name: str
    job: str
    bytes_total: int = 0
    repos: tuple[Mapping[str, Any], ...] = field(default=())
    claim_uid: str = ""
    # The claim was deleted and made anew since the cache was Ready: an empty volume.
    volume_replaced: bool = False
    ready_at: str = ""  # when the cache for this key was first seen Ready
    # What the volume holds for revisions no longer asked for, until they are collected.
    old_revisions: tuple[str, ...] = ()
    old_bytes: int = 0
    bytes_freed: int | None = None

    @property
    def ready(self) -> bool:
        return self.phase == "Ready"


def _terminated(pod: Obj) -> Mapping[str, Any]:
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        found = (status.get("state") or {}).get("terminated")
        if found:
            return dict(found)
    return {}


# Far above any checkpoint (1.6 TB), far below where a float loses integers.
_MAX_COUNT = 2**50
_COUNTS = ("bytesTotal", "oldBytes", "bytesFreed")
_TEXTS = ("phase", "reason")
_LISTS = {"repos": dict, "oldRevisions": str, "problems": str}


def checked_report(found: Any) -> dict[str, Any] | None:
    """A download or collect pod's report with every field the operator reads of the type
    it reads it as, or None: the pod runs the user's image, so a malformed report is no
    report (it fails nothing), never an exception at every reconcile."""
    if not isinstance(found, dict):
        return None
    for name in _COUNTS:
        value = found.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT
        ):
            return None
    if any(found.get(name) is not None and not isinstance(found[name], str) for name in _TEXTS):
        return None
    for name, kind in _LISTS.items():
        value = found.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(item, kind) for item in value):
            return None
    for repo in found.get("repos") or ():
        if not all(isinstance(repo.get(k, ""), str) for k in ("repo", "commit")):
            return None
    return found


def _report(pod: Obj) -> dict[str, Any] | None:
    text = _terminated(pod).get("message") or ""
    try:
        found = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    return checked_report(found)


def _job_condition(job: Obj | None, kind: str) -> Mapping[str, Any] | None:
    for cond in (job or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _created(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("creationTimestamp") or "")


def cache_state(
    *,
    key: str,
    claim_name: str,
    job_name: str,
    claim: Obj | None,
    job: Obj | None,
    pods: Sequence[Obj],
    stored: Mapping[str, Any],
) -> CacheState:
    """Where the cache for ``key`` stands. A Ready cache stays Ready through its status, so
    the Job's pods may be garbage-collected without a new download."""

    claim_meta = (claim or {}).get("metadata") or {}
    claim_uid = str(claim_meta.get("uid") or "")
    recorded = stored.get("claimUID")
    # A cache recorded before claim uids were (no claimUID) is taken as this claim's.
    replaced = bool(recorded) and bool(claim_uid) and recorded != claim_uid

    def state(phase: CachePhase, reason: Reason, message: str, **more: Any) -> CacheState:
        return CacheState(
            phase,
            reason,
            message,
            key,
            claim_name,
            job_name,
            claim_uid=claim_uid,
            volume_replaced=replaced and phase != "Ready",
            **more,
        )

    if claim is not None:
        # Only a pod made after the claim can have filled this volume; reports from before
        # it describe a volume that is gone.
        since = _created(claim)
        pods = [p for p in pods if not since or _created(p) >= since]
    if (
        stored.get("key") == key
        and stored.get("phase") == "Ready"
        and claim is not None
        and not replaced
    ):
        freed = stored.get("bytesFreed")
        return state(
            "Ready",
            Reason.CACHE_READY,
            str(stored.get("message") or "the weights are in the cache, verified"),
            bytes_total=int(stored.get("bytesTotal") or 0),
            repos=tuple(stored.get("repos") or ()),
            ready_at=str(stored.get("readyAt") or ""),
            old_revisions=tuple(str(r) for r in stored.get("oldRevisions") or ()),
            old_bytes=int(stored.get("oldBytes") or 0),
            bytes_freed=int(freed) if isinstance(freed, int) else None,
        )
    newest = sorted(pods, key=_created)
    for pod in reversed(newest):
        report = _report(pod)
        if report and report.get("phase") == "Ready":
            total = int(report.get("bytesTotal") or 0)
            repos = tuple(report.get("repos") or ())
            listed = ", ".join(f"{r.get('repo')}@{str(r.get('commit', ''))[:12]}" for r in repos)
            return state(
                "Ready",
                Reason.CACHE_READY,
                f"{total} bytes in {claim_name}, sizes and checksums verified: {listed}",
                bytes_total=total,
                repos=repos,
                old_revisions=tuple(str(r) for r in report.get("oldRevisions") or ())[:20],
                old_bytes=int(report.get("oldBytes") or 0),
            )
    failed = _job_condition(job, "Failed")
    if failed is not None:
        last = next((r for r in map(_report, reversed(newest)) if r and r.get("problems")), {})
        problems = [str(p) for p in last.get("problems") or []]
        detail = (
            "; ".join(problems) if problems else f"{failed.get('reason')}: {failed.get('message')}"
        )
        too_small = last.get("reason") == "VolumeTooSmall"
        return state(
            "Failed",
            Reason.MODEL_CACHE_TOO_SMALL if too_small else Reason.DOWNLOAD_FAILED,
            f"the download Job {job_name} failed: {detail}; "
            + (
                "grow the claim (its storage class must allow expansion) or name a larger one "
                "in spec.model.cache.claimName, then delete the Job to try again"
                if too_small
                else "fix the cause and delete the Job to try again (the files already in "
                "the cache are kept)"
            ),
        )
    if claim is None:
        return state(
            "Pending",
            Reason.WAITING_FOR_VOLUME,
            f"PersistentVolumeClaim {claim_name} does not exist: create it, or leave "
            "model.cache.claimName empty for the operator to create one",
        )
    if job is None or not newest:
        return state("Pending", Reason.WAITING_FOR_VOLUME, f"starting the download Job {job_name}")
    pod = newest[-1]
    pod_name = pod.get("metadata", {}).get("name")
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return state(
                "Failed",
                Reason.DOWNLOAD_FAILED,
                f"the download pod {pod_name} cannot pull its image (spec.engine.image): "
                f"{waiting.get('reason')}",
            )
    if not pod.get("spec", {}).get("nodeName"):
        claim_phase = (claim.get("status") or {}).get("phase") or "Pending"
        why = (
            "the download pod is waiting for a node"
            if claim_phase == "Bound"
            else f"PersistentVolumeClaim {claim_name} is {claim_phase}: no volume is bound to "
            "it yet (check its storage class and access mode)"
        )
        return state("Pending", Reason.WAITING_FOR_VOLUME, why)
    attempts = sum(1 for p in pods if p.get("status", {}).get("phase") == "Failed")
    retry = f" (attempt {attempts + 1}; partial files are resumed)" if attempts else ""
    if stored.get("key") == key and stored.get("phase") == "Verifying":
        return state("Verifying", Reason.VERIFYING, f"checking sizes and checksums{retry}")
    return state("Downloading", Reason.DOWNLOADING, f"the download Job {job_name} runs{retry}")


def ready_since(cache: CacheState, now: str) -> CacheState:
    """A cache Ready for the first time for its key is Ready from now."""
    if cache.ready and not cache.ready_at:
        return dataclasses.replace(cache, ready_at=now)
    return cache


def _serving(pods: Sequence[Obj]) -> list[Obj]:
    return [
        p
        for p in pods
        if p.get("metadata", {}).get("labels", {}).get(c.LABEL_COMPONENT)
        in (c.COMPONENT_LEADER, c.COMPONENT_WORKER)
        and not p.get("metadata", {}).get("deletionTimestamp")
    ]


def wants_collection(
    cache: CacheState, pods: Sequence[Obj], replicas: int, ready_replicas: int
) -> bool:
    """Old revisions are collected once the rollout to this one is complete: every group
    ready, every serving pod ready and made after this revision was in the cache (so none
    of them can be reading an old one)."""
    serving = _serving(pods)
    return (
        cache.ready
        and bool(cache.old_revisions)
        and bool(cache.ready_at)
        and replicas > 0
        and ready_replicas >= replicas
        and bool(serving)
        and all(_created(p) >= cache.ready_at and pod_ready(p) for p in serving)
    )


def with_collection(cache: CacheState, collect_pods: Sequence[Obj]) -> CacheState:
    """The collect Job's report, once in: the bytes freed, and nothing old left."""
    for pod in sorted(collect_pods, key=_created, reverse=True):
        report = _report(pod)
        if report and report.get("phase") == "Collected":
            freed = report.get("bytesFreed")
            return dataclasses.replace(
                cache,
                old_revisions=(),
                old_bytes=0,
                bytes_freed=int(freed) if isinstance(freed, int) else 0,
            )
    return cache


def cache_condition(cache: CacheState) -> Condition:
    status: Literal["True", "False", "Unknown"] = (
        "True" if cache.ready else "False" if cache.phase == "Failed" else "Unknown"
    )
    return Condition(ConditionType.MODEL_CACHED, status, cache.reason, cache.message)


def with_failed_download(conditions: list[Condition], cache: CacheState) -> list[Condition]:
    """A failed download is terminal until someone acts: Degraded says so (and alerts),
    unless an earlier problem already holds it."""
    failed = Condition(
        ConditionType.DEGRADED,
        "True",
        cache.reason,
        f"the model download failed: {cache.message}",
    )
    found = [c_ for c_ in conditions if c_.type == ConditionType.DEGRADED]
    if found and found[0].status == "True":
        return conditions
    if not found:
        return [*conditions, failed]
    return [failed if c_.type == ConditionType.DEGRADED else c_ for c_ in conditions]


def human_bytes(amount: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(amount) < 1000 or unit == "TB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1000
    return f"{amount:.1f} TB"


def progress_text(phase: str, done: int, total: int) -> str:
    """The printer column: phase and, once known, percent and size."""
    if phase == "Ready":
        return f"Ready {human_bytes(total)}" if total else "Ready"
    if total and phase in ("Downloading", "Verifying"):
        return f"{phase} {100 * done / total:.0f}% of {human_bytes(total)}"
    return phase


def cache_section(cache: CacheState, stored: Mapping[str, Any]) -> dict[str, Any]:
    """status.modelCache. The progress reader's numbers are kept while the same download
    runs, so a reconcile does not undo them."""
    section: dict[str, Any] = {
        "key": cache.key,
        "phase": cache.phase,
        "claimName": cache.claim_name,
        "job": cache.job,
        "message": cache.message,
    }
    claim_uid = cache.claim_uid or stored.get("claimUID")
    if claim_uid:
        section["claimUID"] = claim_uid
    same_run = stored.get("key") == cache.key and cache.phase in ("Downloading", "Verifying")
    if same_run:
        section.update({k: stored[k] for k in PROGRESS_FIELDS if k in stored})
        if stored.get("bytesTotal"):
            section["bytesTotal"] = stored["bytesTotal"]
    if cache.ready:
        section.update({"bytesTotal": cache.bytes_total, "bytesDone": cache.bytes_total})
        section["repos"] = [dict(r) for r in cache.repos]
        if cache.ready_at:
            section["readyAt"] = cache.ready_at
        if cache.old_revisions:
            section.update({"oldRevisions": list(cache.old_revisions), "oldBytes": cache.old_bytes})
        if cache.bytes_freed is not None:
            section["bytesFreed"] = cache.bytes_freed
    moving = section.get("verifiedBytes" if cache.phase == "Verifying" else "bytesDone")
    section["progress"] = progress_text(
        cache.phase, int(moving or 0), int(section.get("bytesTotal") or 0)
    )
    return section


def startup_section(
    cache: CacheState | None, pods: Sequence[Obj], replicas: int, ready_replicas: int
) -> dict[str, Any]:
    """The start-up phase of the whole deployment, in one place, with the slowest pod: the
    earliest-created serving pod still in the least advanced phase."""
    if cache is not None and not cache.ready:
        phase: StartupPhase = (
            "Downloading" if cache.phase in ("Downloading", "Verifying") else "WaitingForCache"
        )
        return {"phase": phase, "message": cache.message}
    serving = sorted(_serving(pods), key=_created)
    if replicas and ready_replicas >= replicas:
        return {"phase": "Ready", "message": f"{ready_replicas} of {replicas} groups ready"}
    unscheduled = [p for p in serving if not p.get("spec", {}).get("nodeName")]
    if unscheduled or not serving:
        slowest = unscheduled[0]["metadata"]["name"] if unscheduled else ""
        section: dict[str, Any] = {
            "phase": "Scheduling",
            "message": f"{len(unscheduled)} serving pods wait for a node"
            if unscheduled
            else "waiting for the LeaderWorkerSet to create the pods",
        }
        if slowest:
            section["slowestPod"] = slowest
        return section
    loading = [p for p in serving if not pod_ready(p)]
    section = {
        "phase": "LoadingWeights",
        "message": f"{len(loading)} of {len(serving)} serving pods are starting (loading weights)",
    }
    if loading:
        section["slowestPod"] = loading[0]["metadata"]["name"]
    return section


def every_pod_downloads(spec: KimiK3DeploymentSpec) -> Condition | None:
    """Without the model cache each serving pod downloads the whole checkpoint from the Hub
    into its own ephemeral storage: said, where there is more than one pod."""
    if spec.model.cache is not None or spec.model.source.pvc is not None:
        return None
    pods = spec.replicas * spec.nodes_per_replica
    if pods <= 1:
        return None
    return Condition(
        ConditionType.MODEL_CACHED,
        "False",
        Reason.NO_MODEL_CACHE,
        f"no spec.model.cache: each of the {pods} serving pods ({spec.nodes_per_replica} per "
        f"group, {spec.replicas} groups) downloads the whole checkpoint of {spec.model.repo} "
        "from the Hub into its own ephemeral storage, and again after every restart; set "
        "spec.model.cache to download it once into a volume they all read",
    )
