"""Acceptance of the speculative drafter, from the leaders' vLLM counters.

Pure: parse a /metrics text into a Snapshot; keep per-leader windows; aggregate the counter
deltas over the window, weighted by drafts, handling counter resets (a restarted pod), idle
windows (no drafts: no values, not zero) and a missing per-position series.
"""

from __future__ import annotations

import datetime
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kimik3_operator.api.conditions import Condition, find
from kimik3_operator.api.constants import ConditionType, Reason

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# The CRD's maximum of drafter.numSpeculativeTokens: no position index beyond it is real.
MAX_POSITIONS = 64
# What the parser is given of an answer: the spec-decode lines only, and at most this many
# (a leader has one line per counter and position, per engine and model: a few hundred).
SPEC_DECODE_PREFIXES = tuple(f"{lead}vllm:spec_decode_" for lead in ("", "# HELP ", "# TYPE "))
MAX_SPEC_DECODE_LINES = 4096
# Samples kept per leader pod.
MAX_SAMPLES = 1500


def spec_decode_lines(text: str) -> str:
    """The answer's spec-decode lines: the parser's cost is bounded by what vLLM writes of
    them, not by the rest of an answer of up to the fetch's limit (the pod's image is the
    user's). More lines than a leader can have is a ValueError."""
    kept = [line for line in text.splitlines() if line.startswith(SPEC_DECODE_PREFIXES)]
    if len(kept) > MAX_SPEC_DECODE_LINES:
        raise ValueError(f"{len(kept)} spec-decode lines, over {MAX_SPEC_DECODE_LINES}")
    return "\n".join(kept) + "\n"


@dataclass(frozen=True)
class Snapshot:
    at: float
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: Mapping[int, float] = field(default_factory=dict)

    def reset_since(self, earlier: Snapshot) -> bool:
        pairs = [
            (self.drafts, earlier.drafts),
            (self.draft_tokens, earlier.draft_tokens),
            (self.accepted, earlier.accepted),
        ]
        pairs += [(v, earlier.per_position.get(k, 0.0)) for k, v in self.per_position.items()]
        return any(now < before for now, before in pairs)


def parse_metrics(text: str, at: float, positions: int = MAX_POSITIONS) -> Snapshot | None:
    """The spec-decode counters of one leader (summed over engines and models), or None when
    the leader exposes none (no drafter). Position indexes at or above ``positions`` (the
    speculative token count) are ignored: the pod's answer is the user's to shape, and an
    index of 30,000,000 would otherwise size every array after it."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_position: dict[int, float] = {}
    seen = False
    for family in text_string_to_metric_families(spec_decode_lines(text)):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if sample.name.endswith("_created"):
                continue
            if not math.isfinite(sample.value) or sample.value < 0:
                continue  # counters are finite and never negative
            if name in totals:
                totals[name] += sample.value
                seen = True
            elif name == ACCEPTED_PER_POS:
                position = sample.labels.get("position", "")
                if position.isdigit() and len(position) <= 3 and int(position) < positions:
                    index = int(position)
                    per_position[index] = per_position.get(index, 0.0) + sample.value
    if not seen:
        return None
    return Snapshot(at, totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], per_position)


@dataclass(frozen=True)
class Acceptance:
    """Over one window, aggregated over the leaders; None fields: no drafts (idle)."""

    rate: float | None
    mean_length: float | None
    per_position: tuple[float, ...] | None
    drafts: float
    window_covered: bool


def delta_since(samples: Sequence[Snapshot], since: float | None = None) -> Snapshot | None:
    """The counters' growth from the last sample at or before ``since`` (the first sample
    when none is that old; None: from the first) to the last; ``at`` is the time spanned."""
    if len(samples) < 2:
        return None
    first = samples[0]
    if since is not None:
        for sample in samples:
            if sample.at > since:
                break
            first = sample
    last = samples[-1]
    if first is last:
        return None
    per_pos = {k: v - first.per_position.get(k, 0.0) for k, v in last.per_position.items()}
    return Snapshot(
        last.at - first.at,
        last.drafts - first.drafts,
        last.draft_tokens - first.draft_tokens,
        last.accepted - first.accepted,
        per_pos,
    )


class LeaderWindow:
    """The recent snapshots of one leader pod; a counter reset starts them afresh. The
    pod's group and template hash go with them, for the canary's comparison."""

    def __init__(self, group: str = "", template_hash: str = "") -> None:
        # Bounded whatever the interval: the longest canary window (6h) at one scrape in 15 s.
        self.samples: deque[Snapshot] = deque(maxlen=MAX_SAMPLES)
        self.group = group
        self.template_hash = template_hash

    def add(self, snapshot: Snapshot, retain_seconds: float) -> None:
        if self.samples and snapshot.reset_since(self.samples[-1]):
            self.samples.clear()
        self.samples.append(snapshot)
        # Keep one sample at or before the retained span's start, so a delta spans it.
        while len(self.samples) > 2 and self.samples[1].at <= snapshot.at - retain_seconds:
            self.samples.popleft()

    def delta(self, window_seconds: float | None = None) -> Snapshot | None:
        """Over the last ``window_seconds`` (None: everything retained)."""
        if not self.samples:
            return None
        since = None if window_seconds is None else self.samples[-1].at - window_seconds
        return delta_since(self.samples, since)

    def series(self) -> LeaderSeries:
        return LeaderSeries(self.group, self.template_hash, tuple(self.samples))


@dataclass(frozen=True)
class LeaderSeries:
    """One leader pod's retained samples, as a reading carries them to the reconcile."""

    group: str
    template_hash: str
    samples: tuple[Snapshot, ...]


def aggregate(windows: Iterable[LeaderWindow], window_seconds: float) -> Acceptance:
    drafts = draft_tokens = accepted = 0.0
    per_position: dict[int, float] = {}
    positions_complete = True
    covered = False
    for window in windows:
        delta = window.delta(window_seconds)
        if delta is None:
            continue
        covered = covered or delta.at >= window_seconds * 0.99
        drafts += delta.drafts
        draft_tokens += delta.draft_tokens
        accepted += delta.accepted
        if delta.drafts > 0 and not delta.per_position:
            positions_complete = False
        for k, v in delta.per_position.items():
            per_position[k] = per_position.get(k, 0.0) + v
    if drafts <= 0 or draft_tokens <= 0:
        return Acceptance(None, None, None, drafts, covered)
    positions = None
    if per_position and positions_complete:
        positions = tuple(per_position.get(i, 0.0) / drafts for i in range(max(per_position) + 1))
    return Acceptance(accepted / draft_tokens, 1 + accepted / drafts, positions, drafts, covered)


@dataclass(frozen=True)
class Thresholds:
    min_rate_change: float = 0.01
    min_length_change: float = 0.05
    max_age_seconds: float = 300.0


def _rounded(values: Iterable[float]) -> list[float]:
    return [round(v, 4) for v in values]


def speculative_section(
    current: Mapping[str, object],
    acceptance: Acceptance,
    *,
    now: float,
    sampled_at: str,
    unreachable: Iterable[str] = (),
    thresholds: Thresholds = Thresholds(),
    last_write: float | None = None,
) -> dict[str, object] | None:
    """The new status.speculative, or None when it need not be written."""
    stale = sorted(unreachable)
    section = dict(current)
    if acceptance.rate is None or acceptance.mean_length is None:
        if stale and "acceptanceRate" in current:
            # Keep the last value with its timestamp and say it is stale.
            section["stale"] = f"unreachable leader(s): {', '.join(stale)}"
            return section if section != dict(current) else None
        for key in ("acceptanceRate", "meanAcceptanceLength", "perPositionAcceptance", "stale"):
            section.pop(key, None)
        return section if section != dict(current) else None
    old_rate = current.get("acceptanceRate")
    old_length = current.get("meanAcceptanceLength")
    moved = (
        not isinstance(old_rate, int | float)
        or not isinstance(old_length, int | float)
        or (
            abs(old_rate - acceptance.rate) > thresholds.min_rate_change
            or abs(old_length - acceptance.mean_length) > thresholds.min_length_change
        )
    )
    old = last_write is None or now - last_write > thresholds.max_age_seconds
    stale_changed = bool(stale) != ("stale" in current)
    if not (moved or old or stale_changed):
        return None
    section["acceptanceRate"] = round(acceptance.rate, 4)
    section["meanAcceptanceLength"] = round(acceptance.mean_length, 4)
    if acceptance.per_position is not None:
        section["perPositionAcceptance"] = _rounded(acceptance.per_position)
    else:
        section.pop("perPositionAcceptance", None)
    section["sampledAt"] = sampled_at
    if stale:
        section["stale"] = f"unreachable leader(s): {', '.join(stale)}"
    else:
        section.pop("stale", None)
    return section


@dataclass(frozen=True)
class AcceptanceReading:
    """One scrape of a deployment's leaders, kept in memory until the reconcile writes it."""

    acceptance: Acceptance
    at: float  # seconds since the epoch
    window_seconds: float
    unreachable: tuple[str, ...] = ()
    thresholds: Thresholds = Thresholds()
    # Per leader pod (by uid), for the canary's comparison of groups over its own window.
    series: Mapping[str, LeaderSeries] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeculativeUpdate:
    """What a reading changes in the status: the new status.speculative (None: keep it) and
    the SpeculationEffective condition (None: its status and reason stand)."""

    section: dict[str, object] | None
    condition: Condition | None

    @property
    def empty(self) -> bool:
        return self.section is None and self.condition is None


def rfc3339(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> float | None:
    """Seconds since the epoch of a status timestamp (None: not one the operator writes)."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def _written_at(section: Mapping[str, object]) -> float | None:
    """When status.speculative's numbers were last written, from its own sampledAt."""
    return parse_rfc3339(section.get("sampledAt"))


def speculative_update(
    section: Mapping[str, object],
    conditions: Sequence[Mapping[str, Any]],
    reading: AcceptanceReading,
    minimum: float,
) -> SpeculativeUpdate:
    """What ``reading`` changes in a status whose status.speculative is ``section``. The
    acceptance reader asks it to decide whether the reconcile is needed; the reconcile asks
    it for what to write: one answer for both."""
    condition = effective_condition(reading.acceptance, minimum, reading.window_seconds)
    current = find(conditions, condition.type)
    moved = current is None or (current.get("status"), current.get("reason")) != (
        condition.status,
        condition.reason,
    )
    # A reader with nothing measured yet (the operator restarted) keeps the verdict and the
    # numbers it found: a restart is no news to write to every deployment, and a collapse
    # measured before it is not forgotten. The first whole window replaces them.
    kept = (
        condition.reason == Reason.MEASURING_ACCEPTANCE
        and reading.acceptance.rate is None
        and current is not None
        and current.get("reason")
        in (Reason.ACCEPTANCE_ABOVE_MINIMUM, Reason.ACCEPTANCE_BELOW_MINIMUM)
    )
    moved = moved and not kept
    new_section = (
        None
        if kept and not reading.unreachable
        else speculative_section(
            section,
            reading.acceptance,
            now=reading.at,
            sampled_at=rfc3339(reading.at),
            unreachable=reading.unreachable,
            thresholds=reading.thresholds,
            last_write=_written_at(section),
        )
    )
    # The numbers in a message alone do not warrant a write.
    return SpeculativeUpdate(new_section, condition if moved else None)


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
