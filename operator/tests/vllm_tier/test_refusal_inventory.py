"""The refusal inventory against vLLM itself (vllm 0.33.0 on a CPU): regenerated from the
wheel it matches the committed table, and no refusal site in a function the image probe
actually runs is mapped out of its reach (``device`` or ``after-weights``): the probe's
configuration and construction steps run on specs of each method under a profiler, which
records every function of vLLM's they enter."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kimik3_operator.preflight.generate import WHEELS, Wheel, download
from kimik3_operator.preflight.refusals import TABLE_PATH, inventory, release_sites

from .helpers import ROOT, run_vllm
from .test_probe_construction import CASES, probe_cases

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "probe.py"
TRACER = pathlib.Path(__file__).parent / "trace_probe.py"


@pytest.fixture(scope="module")
def regenerated() -> dict[str, Any]:
    return inventory({"0.33.0": release_sites(Wheel(download("0.33.0", WHEELS)))})


def test_regenerated_release_matches_the_committed_inventory(regenerated: dict[str, Any]) -> None:
    committed = json.loads(TABLE_PATH.read_text())
    assert regenerated["releases"]["0.33.0"] == committed["releases"]["0.33.0"]
    for key, site in regenerated["sites"].items():
        assert committed["sites"][key] == site


def test_no_site_the_probe_runs_is_mapped_out_of_its_reach(
    regenerated: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    (tmp_path / "cases.json").write_text(json.dumps(probe_cases()))
    result = run_vllm([TRACER, SCRIPT, tmp_path / "cases.json", tmp_path / "out"])
    assert result.returncode == 0, result.stderr[-3000:]
    traced = json.loads((tmp_path / "out").read_text())
    assert {a["id"] for a in traced["answers"]} == set(CASES)
    entered = {tuple(pair) for pair in traced["entered"]}
    sites = regenerated["sites"]
    reached = {key: s for key, s in sites.items() if (s[0], s[1]) in entered}
    wrong = sorted(
        f"{s[0]} {s[1]}: {s[2][:80]} ({s[3]})"
        for s in reached.values()
        if s[3] not in ("probe", "rule")
    )
    assert not wrong, "\n".join(wrong)
    probe_sites = [s for s in sites.values() if s[3] == "probe"]
    # The figure the README prints: how much of what the table credits to the probe these
    # few specs reach (the rest waits on flags and classes they do not use).
    print(
        f"probe-mapped sites on 0.33.0 in functions these specs entered: "
        f"{sum(1 for s in probe_sites if (s[0], s[1]) in entered)} of {len(probe_sites)}"
    )
