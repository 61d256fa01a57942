"""Reads every Ready leader's /metrics on a timer and keeps status.speculative and the
SpeculationEffective condition current, writing only when a value moved or grew old."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator import metrics
from kimik3_operator.acceptance import (
    MAX_POSITIONS,
    Acceptance,
    LeaderWindow,
    Thresholds,
    aggregate,
    parse_metrics,
    speculative_section,
)
from kimik3_operator.api import constants as c
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.spec import SpecError, parse_spec
from kimik3_operator.conditions import Condition, find, now_rfc3339, set_condition
from kimik3_operator.handlers.events import post_event
from kimik3_operator.handlers.locks import lock_for
from kimik3_operator.kube import Kube, Obj
from kimik3_operator.observe import pod_ready
from kimik3_operator.preflight.pairing import resolve_drafter
from kimik3_operator.runtime.bounded_http import fetch as bounded_fetch
from kimik3_operator.status_input import readable_status

log = logging.getLogger(__name__)
Fetch = Callable[[str], str]


def http_fetch(url: str) -> str:
    """A leader's /metrics: vLLM's exposition is tens of KiB; 4 MiB and 5 s are ample."""
    return bounded_fetch(url)


def effective_condition(acceptance: Acceptance, minimum: float, window_seconds: float) -> Condition:
    kind = ConditionType.SPECULATION_EFFECTIVE
    if acceptance.rate is None and not acceptance.window_covered:
        return Condition(
            kind,
            "Unknown",
            Reason.MEASURING_ACCEPTANCE,
            f"no drafts measured yet; the first {window_seconds:.0f}s window is still filling",
        )
    if acceptance.rate is None:
        return Condition(
            kind,
            "Unknown",
            Reason.NO_TRAFFIC,
            f"no drafts in the last {window_seconds:.0f}s: the model is idle",
        )
    rate = f"{acceptance.rate:.3f}"
    if acceptance.rate >= minimum:
        return Condition(
            kind,
            "True",
            Reason.ACCEPTANCE_ABOVE_MINIMUM,
            f"acceptance rate at or above spec.monitoring.minAcceptanceRate {minimum}; the "
            "current value is in status.speculative",
        )
    if not acceptance.window_covered:
        return Condition(
            kind,
            "Unknown",
            Reason.MEASURING_ACCEPTANCE,
            f"acceptance rate {rate} so far, below {minimum}; waiting for a whole "
            f"{window_seconds:.0f}s window",
        )
    return Condition(
        kind,
        "False",
        Reason.ACCEPTANCE_BELOW_MINIMUM,
        (
            f"acceptance rate {rate} over the last {window_seconds:.0f}s ({acceptance.drafts:.0f} "
            f"drafts) is below spec.monitoring.minAcceptanceRate {minimum}: the drafter costs more "
            "than it saves; check the drafter matches the target, lower "
            "drafter.numSpeculativeTokens, or set drafter.method: none"
        ),
    )


def _transition(conditions: list[dict[str, Any]], condition: Condition) -> bool:
    """A new status or reason; the numbers in a message alone do not warrant a write."""
    current = find(conditions, condition.type)
    return current is None or (current.get("status"), current.get("reason")) != (
        condition.status,
        condition.reason,
    )


@dataclass
class Tracker:
    """Per deployment, the windows of its leaders and when status.speculative was written."""

    windows: dict[str, LeaderWindow] = field(default_factory=dict)
    last_write: float | None = None


@dataclass
class Scraper:
    window_seconds: float = 300.0
    url_override: str = ""  # e.g. http://127.0.0.1:9400/metrics, where pods have no network
    thresholds: Thresholds = field(default_factory=Thresholds)
    fetch: Fetch = http_fetch
    clock: Callable[[], float] = time.time
    trackers: dict[tuple[str, str], Tracker] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        self.trackers.pop((namespace, name), None)

    def known(self) -> set[tuple[str, str]]:
        return set(self.trackers)

    def url(self, pod: Mapping[str, Any], port: int) -> str | None:
        if self.url_override:
            return self.url_override.format(
                pod=pod["metadata"]["name"], namespace=pod["metadata"]["namespace"]
            )
        ip = pod.get("status", {}).get("podIP")
        return f"http://{ip}:{port}/metrics" if ip else None

    def tick(self, kube: Kube, body: Mapping[str, Any]) -> bool:
        """Scrape, aggregate, write when worth it. True when status was written."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError:
            return False
        if spec.drafter.method == "none":
            self.forget(namespace, name)
            return False
        drafter = resolve_drafter(spec)
        positions = (
            drafter.num_speculative_tokens
            if drafter is not None and drafter.num_speculative_tokens
            else MAX_POSITIONS
        )
        tracker = self.trackers.setdefault((namespace, name), Tracker())
        selector = (
            f"{c.LABEL_INSTANCE}={name},{c.LABEL_COMPONENT}={c.COMPONENT_LEADER},"
            f"{c.LABEL_MANAGED_BY}={c.OPERATOR_NAME}"
        )
        leaders = [
            p for p in kube.list("v1", "Pod", namespace, label_selector=selector) if pod_ready(p)
        ]
        now = self.clock()
        unreachable = []
        for pod in leaders:
            pod_name = pod["metadata"]["name"]
            url = self.url(pod, spec.service.port)
            try:
                if url is None:
                    raise OSError("no pod IP")
                snapshot = parse_metrics(self.fetch(url), now, positions)
            except (OSError, ValueError, RecursionError) as exc:
                log.info("cannot read %s of %s/%s: %s", url, namespace, pod_name, exc)
                unreachable.append(pod_name)
                continue
            if snapshot is not None:
                tracker.windows.setdefault(pod_name, LeaderWindow()).add(
                    snapshot, self.window_seconds
                )
        present = {p["metadata"]["name"] for p in leaders}
        for gone in set(tracker.windows) - present:
            del tracker.windows[gone]
        acceptance = aggregate(tracker.windows.values(), self.window_seconds)
        metrics.MIN_ACCEPTANCE.labels(namespace, name).set(spec.monitoring.min_acceptance_rate)
        if acceptance.rate is not None:
            metrics.ACCEPTANCE.labels(namespace, name).set(acceptance.rate)
        condition = effective_condition(
            acceptance, spec.monitoring.min_acceptance_rate, self.window_seconds
        )
        with lock_for(namespace, name):
            fresh = kube.get(c.API_VERSION, c.KIND, name, namespace)
            if fresh is None:
                return False
            return self._write(kube, fresh, tracker, acceptance, condition, unreachable, now)

    def _write(
        self,
        kube: Kube,
        body: Obj,
        tracker: Tracker,
        acceptance: Acceptance,
        condition: Condition,
        unreachable: list[str],
        now: float,
    ) -> bool:
        status, _ = readable_status(body.get("status"))
        section = speculative_section(
            status.get("speculative") or {},
            acceptance,
            now=now,
            sampled_at=now_rfc3339(),
            unreachable=unreachable,
            thresholds=self.thresholds,
            last_write=tracker.last_write,
        )
        conditions = status.get("conditions") or []
        patch: dict[str, Any] = {}
        if section is not None:
            patch["speculative"] = section
        if _transition(conditions, condition):
            generation = int(body["metadata"].get("generation", 0) or 0)
            patch["conditions"] = set_condition(conditions, condition, generation, now_rfc3339())
        if not patch:
            return False
        meta = body["metadata"]
        kube.patch_status(c.API_VERSION, c.KIND, meta["name"], meta["namespace"], patch)
        if section is not None:
            tracker.last_write = now
        if "conditions" in patch:
            post_event(kube, body, condition, now_rfc3339())
            metrics.record_conditions(meta["namespace"], meta["name"], [condition])
        return True
