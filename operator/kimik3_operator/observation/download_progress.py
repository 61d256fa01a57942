"""The download pod's /progress answer: checked, smoothed into a rate, and folded into
status.modelCache. Pure: the reader in ``runtime/readers.py`` fetches, the reconcile writes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3_operator.observation.model_cache import progress_text

ACTIVE_PHASES = ("Downloading", "Verifying")
SMOOTHING = 0.5  # weight of the newest rate in the moving average
PROGRESS_MAX_BYTES = 64 * 1024  # the download pod's answer is a few hundred bytes
# Far above any checkpoint (1.6 TB), far below where a float loses integers.
MAX_BYTES_COUNT = 2**50
COUNTS = ("bytesTotal", "bytesDone", "verifiedBytes")


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


@dataclass(frozen=True)
class ProgressReading:
    """The latest answer of the download pod for one cache key, and the smoothed rate."""

    cache_key: str
    report: Mapping[str, Any]
    sample: Sample


def with_progress(section: Mapping[str, Any], reading: ProgressReading | None) -> dict[str, Any]:
    """status.modelCache with the reading's numbers, while that download is the one running."""
    if (
        reading is None
        or section.get("key") != reading.cache_key
        or section.get("phase") not in ACTIVE_PHASES
    ):
        return dict(section)
    return progress_fields(section, reading.report, reading.sample)
