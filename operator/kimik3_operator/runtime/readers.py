"""The two readers of pods' HTTP answers: every Ready leader's /metrics (the acceptance of
the speculative drafter) and the running download pod's /progress.

A reader never writes to the API server. It keeps its latest reading in memory and answers
whether that reading would change the stored status; the manager then enqueues the
resource, and the reconcile, the status's one writer, folds the reading in.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator import metrics
from kimik3_operator.api import constants as c
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.api.spec import KimiK3DeploymentSpec
from kimik3_operator.api.types import DISAGGREGATED_ROLES, SpecError
from kimik3_operator.builders.model_cache import PROGRESS_PORT
from kimik3_operator.kube import Kube
from kimik3_operator.observation.acceptance import (
    MAX_POSITIONS,
    AcceptanceReading,
    LeaderWindow,
    Thresholds,
    aggregate,
    parse_metrics,
    speculative_update,
)
from kimik3_operator.observation.download_progress import (
    ACTIVE_PHASES,
    PROGRESS_MAX_BYTES,
    ProgressReading,
    next_sample,
    parse_progress,
    progress_fields,
)
from kimik3_operator.observation.pods import from_leader_set, from_role_set, pod_ready
from kimik3_operator.observation.status_input import readable_status
from kimik3_operator.runtime.bounded_http import DEFAULT_DEADLINE_SECONDS
from kimik3_operator.runtime.bounded_http import fetch as bounded_fetch

log = logging.getLogger(__name__)
Key = tuple[str, str]
Fetch = Callable[[str], str]
# A deployment's leaders are read at once, this many at a time, under one deadline: the
# fetch's own bound and a second for the threads to start.
LEADER_FETCHES = 16
SCRAPE_DEADLINE_SECONDS = DEFAULT_DEADLINE_SECONDS + 1.0


def metrics_fetch(url: str) -> str:
    """A leader's /metrics: vLLM's exposition is tens of KiB; 4 MiB and 5 s are ample."""
    return bounded_fetch(url)


def progress_fetch(url: str) -> str:
    return bounded_fetch(url, max_bytes=PROGRESS_MAX_BYTES)


def _key(body: Mapping[str, Any]) -> Key:
    meta = body["metadata"]
    return meta["namespace"], meta["name"]


def surge_groups(spec: KimiK3DeploymentSpec) -> int:
    """The groups a rollout may add above spec.replicas (maxSurge, a count or a percentage)."""
    surge = spec.rollout.max_surge
    if isinstance(surge, int):
        return max(0, surge)
    text = str(surge).removesuffix("%")
    return math.ceil(spec.replicas * int(text) / 100) if text.isdigit() else 0


def scraped_leaders(
    pods: Sequence[Mapping[str, Any]], name: str, spec: KimiK3DeploymentSpec
) -> list[Mapping[str, Any]]:
    """The leaders worth a scrape: Ready pods whose controller is the LeaderWorkerSet's
    leader StatefulSet (it has the LeaderWorkerSet's name, the deployment's), one per group
    index, and no more groups than the spec can have. A labelled pod of a namespace user
    costs nothing, and however many there are, a deployment's scrape is bounded. A
    disaggregated deployment's leaders are taken role by role, each from the LeaderWorkerSet
    its DisaggregatedSet names <set>-<revision>-<role>."""
    if not spec.disaggregated:
        groups = spec.replicas + surge_groups(spec)
        return _one_per_group(pods, groups, lambda meta: from_leader_set(meta, name))
    found: list[Mapping[str, Any]] = []
    for role in DISAGGREGATED_ROLES:

        def owned(meta: Mapping[str, Any], role: str = role) -> bool:
            return from_role_set(meta, name, role)

        # A rollout of the set runs two revisions of a role side by side.
        found += _one_per_group(pods, 2 * spec.role_spec(role).replicas, owned)
    return found


def engine_port(pod: Mapping[str, Any], spec: KimiK3DeploymentSpec) -> int:
    """Where a leader's engine serves its metrics: a decode leader's behind its routing
    sidecar, on the decode role's port."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if spec.disaggregated and labels.get(c.LABEL_ROLE) == "decode":
        return spec.role_spec("decode").service.port
    return spec.service.port


def _one_per_group(
    pods: Sequence[Mapping[str, Any]], groups: int, owned: Callable[[Mapping[str, Any]], bool]
) -> list[Mapping[str, Any]]:
    chosen: dict[tuple[str, int], Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        index = str(labels.get(c.LWS_GROUP_INDEX_LABEL, ""))
        if not (pod_ready(pod) and owned(meta)):
            continue
        if not (index.isdigit() and len(index) <= 6 and int(index) < groups):
            continue
        chosen.setdefault((str(labels.get(c.LWS_NAME_LABEL, "")), int(index)), pod)
    return [chosen[key] for key in sorted(chosen)][:groups]


def retained_seconds(window_seconds: float, spec: KimiK3DeploymentSpec) -> float:
    """How far back a leader's samples are kept: the acceptance window, or the canary's
    window with room for the reconcile that judges it to come round."""
    canary = spec.rollout.canary
    if canary is None:
        return window_seconds
    return max(window_seconds, canary.window_seconds * 1.25 + 120.0)


@dataclass
class AcceptanceReader:
    """Per deployment, the windows of its leaders and the latest aggregate over them."""

    window_seconds: float = 300.0
    url_override: str = ""  # e.g. http://127.0.0.1:9400/metrics, where pods have no network
    thresholds: Thresholds = field(default_factory=Thresholds)
    fetch: Fetch = metrics_fetch
    clock: Callable[[], float] = time.time
    # Leaders read at once per deployment (1: one after another).
    concurrency: int = LEADER_FETCHES
    _windows: dict[Key, dict[str, LeaderWindow]] = field(default_factory=dict)
    _readings: dict[Key, AcceptanceReading] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._windows.pop((namespace, name), None)
            self._readings.pop((namespace, name), None)

    def known(self) -> set[Key]:
        with self._lock:
            return set(self._windows)

    def reading(self, key: Key) -> AcceptanceReading | None:
        with self._lock:
            return self._readings.get(key)

    def url(self, pod: Mapping[str, Any], port: int) -> str | None:
        if self.url_override:
            return self.url_override.format(
                pod=pod["metadata"]["name"], namespace=pod["metadata"]["namespace"]
            )
        ip = pod.get("status", {}).get("podIP")
        return f"http://{ip}:{port}/metrics" if ip else None

    def _fetch_all(self, urls: Sequence[str | None]) -> list[str | BaseException]:
        """Every leader's answer (or why there is none), read at once under one deadline."""
        if self.concurrency <= 1 or len(urls) <= 1:
            return [self._fetch_one(url) for url in urls]
        pool = ThreadPoolExecutor(min(len(urls), self.concurrency), "leader-fetch")
        try:
            futures: list[Future[str | BaseException]] = [
                pool.submit(self._fetch_one, url) for url in urls
            ]
            wait_all(futures, timeout=SCRAPE_DEADLINE_SECONDS)
            return [
                f.result()
                if f.done()
                else TimeoutError(f"no answer in {SCRAPE_DEADLINE_SECONDS:.0f}s")
                for f in futures
            ]
        finally:
            # A fetch past the deadline ends at its own bound; nobody waits for it.
            pool.shutdown(wait=False, cancel_futures=True)

    def _fetch_one(self, url: str | None) -> str | BaseException:
        if url is None:
            return OSError("no pod IP")
        try:
            return self.fetch(url)
        except Exception as exc:  # the caller names it per pod
            return exc

    def tick(self, kube: Kube, body: Mapping[str, Any]) -> bool:
        """Scrapes the leaders and records the reading; True when it would change the
        stored status (the caller then enqueues the resource)."""
        namespace, name = key = _key(body)
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError:
            return False
        drafter = spec.paired_drafter
        if drafter is None:
            self.forget(namespace, name)
            return False
        positions = drafter.num_speculative_tokens or MAX_POSITIONS
        selector = (
            f"{c.LABEL_INSTANCE}={name},{c.LABEL_COMPONENT}={c.COMPONENT_LEADER},"
            f"{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
        )
        leaders = scraped_leaders(
            kube.list("v1", "Pod", namespace, label_selector=selector), name, spec
        )
        now = self.clock()
        unreachable: list[str] = []
        with self._lock:
            windows = dict(self._windows.get(key, {}))
        retain = retained_seconds(self.window_seconds, spec)
        answers = self._fetch_all([self.url(pod, engine_port(pod, spec)) for pod in leaders])
        for pod, answer in zip(leaders, answers, strict=True):
            meta = pod["metadata"]
            pod_name = meta["name"]
            try:
                if isinstance(answer, BaseException):
                    raise answer
                snapshot = parse_metrics(answer, now, positions)
            except (OSError, ValueError, RecursionError, TimeoutError) as exc:
                log.info("cannot read the metrics of %s/%s: %s", namespace, pod_name, exc)
                unreachable.append(pod_name)
                continue
            if snapshot is not None:
                labels = meta.get("labels") or {}
                # By uid: LeaderWorkerSet gives a recreated group's pods the same names.
                window = windows.setdefault(
                    str(meta.get("uid") or pod_name),
                    LeaderWindow(
                        str(labels.get(c.LWS_GROUP_INDEX_LABEL, "")),
                        str(labels.get(c.TEMPLATE_HASH_LABEL, "")),
                    ),
                )
                window.add(snapshot, retain)
        present = {str(p["metadata"].get("uid") or p["metadata"]["name"]) for p in leaders}
        windows = {pod: window for pod, window in windows.items() if pod in present}
        acceptance = aggregate(windows.values(), self.window_seconds)
        reading = AcceptanceReading(
            acceptance,
            now,
            self.window_seconds,
            tuple(sorted(unreachable)),
            self.thresholds,
            {pod: window.series() for pod, window in windows.items()},
        )
        with self._lock:
            self._windows[key] = windows
            self._readings[key] = reading
        minimum = spec.monitoring.min_acceptance_rate
        metrics.MIN_ACCEPTANCE.labels(namespace, name).set(minimum)
        if acceptance.rate is not None:
            metrics.ACCEPTANCE.labels(namespace, name).set(acceptance.rate)
        status, _ = readable_status(body.get("status"))
        update = speculative_update(
            status.get("speculative") or {}, status.get("conditions") or [], reading, minimum
        )
        return not update.empty


@dataclass
class ProgressReader:
    """Per deployment, the latest /progress answer of its running download pod."""

    url_override: str = ""  # where pods have no network (the KWOK tests); {pod}, {namespace}
    fetch: Fetch = progress_fetch
    clock: Callable[[], float] = time.time
    _readings: dict[Key, ProgressReading] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._readings.pop((namespace, name), None)

    def reading(self, key: Key) -> ProgressReading | None:
        with self._lock:
            return self._readings.get(key)

    def url(self, pod: Mapping[str, Any]) -> str | None:
        meta = pod["metadata"]
        if self.url_override:
            return self.url_override.format(pod=meta["name"], namespace=meta["namespace"])
        ip = pod.get("status", {}).get("podIP")
        return f"http://{ip}:{PROGRESS_PORT}/progress" if ip else None

    def tick(self, kube: Kube, body: Mapping[str, Any]) -> bool:
        """Reads the download pod's progress; True when it would change status.modelCache."""
        namespace, name = key = _key(body)
        stored = readable_status(body.get("status"))[0].get("modelCache") or {}
        cache_key = stored.get("key")
        if stored.get("phase") not in ACTIVE_PHASES or not isinstance(cache_key, str):
            self.forget(namespace, name)
            return False
        pods = kube.list("v1", "Pod", namespace, label_selector=f"{c.CACHE_KEY_LABEL}={cache_key}")
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        if not running:
            return False
        url = self.url(running[0])
        if url is None:
            return False
        try:
            report = parse_progress(self.fetch(url))
        except (OSError, ValueError) as exc:
            log.info(
                "cannot read the download progress of %s/%s at %s: %s", namespace, name, url, exc
            )
            return False
        with self._lock:
            previous = self._readings.get(key)
            sample = next_sample(
                previous.sample
                if previous is not None and previous.cache_key == cache_key
                else None,
                self.clock(),
                int(report.get("bytesDone") or 0),
            )
            self._readings[key] = ProgressReading(cache_key, report, sample)
        return progress_fields(stored, report, sample) != stored
