"""Regenerates one release of the capability table from its wheel on PyPI (cached under
~/.cache/kimik3-operator/wheels) and compares it with the committed table."""

from __future__ import annotations

import pytest

from kimik3_operator.preflight.generate import WHEELS, generate
from kimik3_operator.preflight.table import load_table

pytestmark = pytest.mark.vllm


def test_regenerated_release_matches_the_committed_table() -> None:
    regenerated = generate(["0.33.0"], WHEELS)["releases"]["0.33.0"]
    committed = load_table().data["releases"]["0.33.0"]
    assert regenerated == committed
