"""Reads the running download pod's /progress on the operator-wide loop and keeps
status.modelCache's bytes, rate and estimate current, writing only when they moved."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3_operator.api import constants as c
from kimik3_operator.builders.model_cache import PROGRESS_PORT
from kimik3_operator.handlers.locks import lock_for
from kimik3_operator.handlers.speculation import Fetch
from kimik3_operator.kube import Kube
from kimik3_operator.runtime.bounded_http import fetch as bounded_fetch
from kimik3_operator.status_input import readable_status
from kimik3_operator.weights.state import progress_text

log = logging.getLogger(__name__)
Key = tuple[str, str]
ACTIVE_PHASES = ("Downloading", "Verifying")
SMOOTHING = 0.5  # weight of the newest rate in the moving average
PROGRESS_MAX_BYTES = 64 * 1024  # the download pod's answer is a few hundred bytes
# Far above any checkpoint (1.6 TB), far below where a float loses integers.
MAX_BYTES_COUNT = 2**50
COUNTS = ("bytesTotal", "bytesDone", "verifiedBytes")


def progress_fetch(url: str) -> str:
    return bounded_fetch(url, max_bytes=PROGRESS_MAX_BYTES)


def parse_progress(text: str) -> dict[str, Any]:
    """The download pod's /progress answer, checked: an object, the byte counts whole numbers
    in range, the phase a string. Anything else is a ValueError naming what is wrong (the
    pod runs the user's image, so its answer is untrusted)."""
    try:
        report = json.loads(text)
    except RecursionError:
        raise ValueError("progress answer nests too deeply") from None
    if not isinstance(report, dict):
        raise ValueError(f"progress answer is a {type(report).__name__}, not an object")
    checked: dict[str, Any] = {}
    for name in COUNTS:
        value = report.get(name, 0)
        if value is None:
            value = 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"progress {name}={value!r} is not a whole number")
        if not 0 <= value <= MAX_BYTES_COUNT:
            raise ValueError(f"progress {name}={value} is out of range")
        checked[name] = value
    phase = report.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise ValueError(f"progress phase={phase!r} is not a string")
    checked["phase"] = phase
    return checked


@dataclass(frozen=True)
class Sample:
    at: float
    done: int
    rate: float = 0.0


def next_sample(previous: Sample | None, at: float, done: int) -> Sample:
    """The rate as a moving average, so one slow interval does not swing the estimate."""
    if previous is None or at <= previous.at or done < previous.done:
        return Sample(at, done, previous.rate if previous else 0.0)
    latest = (done - previous.done) / (at - previous.at)
    rate = latest if previous.rate == 0 else SMOOTHING * latest + (1 - SMOOTHING) * previous.rate
    return Sample(at, done, rate)


def progress_fields(
    stored: Mapping[str, Any], report: Mapping[str, Any], sample: Sample
) -> dict[str, Any]:
    """status.modelCache with the pod's numbers; phase moves only between the active ones."""
    section = dict(stored)
    phase = report.get("phase")
    if phase in ACTIVE_PHASES:
        section["phase"] = phase
    total = int(report.get("bytesTotal") or 0)
    verified = int(report.get("verifiedBytes") or 0)
    section.update({"bytesTotal": total, "bytesDone": sample.done, "verifiedBytes": verified})
    moving = verified if section["phase"] == "Verifying" else sample.done
    if sample.rate > 0:
        section["bytesPerSecond"] = int(sample.rate)
        section["etaSeconds"] = max(0, int((total - moving) / sample.rate))
    section["progress"] = progress_text(str(section["phase"]), moving, total)
    return section


@dataclass
class DownloadProgress:
    url_override: str = ""  # where pods have no network (the KWOK tests); {pod}, {namespace}
    fetch: Fetch = progress_fetch
    clock: Callable[[], float] = time.time
    samples: dict[Key, Sample] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        self.samples.pop((namespace, name), None)

    def url(self, pod: Mapping[str, Any]) -> str | None:
        meta = pod["metadata"]
        if self.url_override:
            return self.url_override.format(pod=meta["name"], namespace=meta["namespace"])
        ip = pod.get("status", {}).get("podIP")
        return f"http://{ip}:{PROGRESS_PORT}/progress" if ip else None

    def tick(self, kube: Kube, body: Mapping[str, Any]) -> bool:
        """True when status.modelCache was written."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        stored = readable_status(body.get("status"))[0].get("modelCache") or {}
        if stored.get("phase") not in ACTIVE_PHASES:
            self.forget(namespace, name)
            return False
        pods = kube.list(
            "v1", "Pod", namespace, label_selector=f"{c.CACHE_KEY_LABEL}={stored.get('key')}"
        )
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        if not running:
            phases = [p.get("status", {}).get("phase") for p in pods]
            log.debug("no running download pod for %s/%s yet: %s", namespace, name, phases)
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
        log.debug("download progress of %s/%s: %s", namespace, name, report)
        key = (namespace, name)
        sample = next_sample(self.samples.get(key), self.clock(), int(report.get("bytesDone") or 0))
        self.samples[key] = sample
        section = progress_fields(stored, report, sample)
        if section == stored:
            return False
        with lock_for(namespace, name):
            fresh = kube.get(c.API_VERSION, c.KIND, name, namespace)
            current = readable_status((fresh or {}).get("status"))[0].get("modelCache") or {}
            if fresh is None or current.get("key") != stored.get("key"):
                return False
            kube.patch_status(c.API_VERSION, c.KIND, name, namespace, {"modelCache": section})
        return True
