"""What the readers last saw of one deployment's pods, handed to its reconcile."""

from __future__ import annotations

from dataclasses import dataclass

from kimik3_operator.observation.acceptance import AcceptanceReading
from kimik3_operator.observation.download_progress import ProgressReading


@dataclass(frozen=True)
class Readings:
    """The leaders' acceptance and the download pod's progress, as last read."""

    acceptance: AcceptanceReading | None = None
    progress: ProgressReading | None = None
