"""The refusal inventory (data/refusals.json): every site vLLM can refuse a start-up at before
the first weight, in every release of the capability table, is mapped to a static rule, the
image probe, the device, or after the weights; none is left unmapped."""

from __future__ import annotations

import ast
import json
from collections import Counter

import pytest

from kimik3_operator.api.constants import Reason
from kimik3_operator.preflight.generate import RELEASES
from kimik3_operator.preflight.refusals import (
    STAGES,
    TABLE_PATH,
    _sites,
    file_phase,
    map_site,
    summary,
)

TABLE = json.loads(TABLE_PATH.read_text())


def test_every_release_of_the_capability_table_is_inventoried() -> None:
    assert list(TABLE["releases"]) == list(RELEASES)


@pytest.mark.parametrize("version", RELEASES)
def test_every_site_is_mapped(version: str) -> None:
    release = TABLE["releases"][version]
    stages = Counter(TABLE["sites"][line.split(":")[0]][3] for line in release["lines"])
    assert release["sites"] == len(release["lines"]) == sum(release["counts"].values())
    assert dict(stages) == {s: n for s, n in release["counts"].items() if n}
    unmapped = [
        TABLE["sites"][line.split(":")[0]][:3]
        for line in release["lines"]
        if TABLE["sites"][line.split(":")[0]][3] == "unmapped"
    ]
    assert not unmapped, unmapped
    assert release["counts"]["probe"] > release["counts"]["device"]


def test_a_rule_site_names_a_reason_the_operator_gives() -> None:
    reasons = {r.value for r in Reason}
    rule_sites = [s for s in TABLE["sites"].values() if s[3] == "rule"]
    assert rule_sites
    assert {s[4] for s in rule_sites} <= reasons
    assert all(f"{s[3]}/{s[4]}" in TABLE["why"] for s in TABLE["sites"].values())


def test_a_new_file_where_start_up_runs_is_unmapped_until_placed() -> None:
    assert file_phase("vllm/models/kimi_k3/nvidia/new_layer.py") == "unmapped"
    assert file_phase("vllm/models/kimi_k3/nvidia/model.py") == "model"
    assert file_phase("vllm/models/kimi_k3/nvidia/ops/kda_conv.py") == "kernel"
    assert file_phase("vllm/config/speculative.py") == "engine"
    assert file_phase("vllm/v1/spec_decode/eagle.py") == "proposer"
    assert file_phase("vllm/model_executor/models/gemma.py") is None  # not on this path
    assert map_site("unmapped", "f", "raise X").stage == "unmapped"


def test_where_a_site_is_met() -> None:
    assert map_site("model", "KimiDecoderLayer.__init__", "assert x").detail == "construct"
    assert map_site("model", "KimiModel.forward", "assert x").stage == "after-weights"
    assert map_site("model", "Model.load_weights", "raise ValueError()").stage == "after-weights"
    assert map_site("proposer", "EagleProposer.__init__", "raise X").stage == "device"
    assert map_site("gpu-platform", "CudaPlatform.check_and_update_config", "raise X").stage == (
        "device"
    )
    assert map_site("platform", "CpuPlatform.check_and_update_config", "raise X").stage == ("probe")
    dspark = "raise ValueError('DSpark does not support pipeline parallelism')"
    found = map_site("proposer", "init", dspark)
    assert (found.stage, found.detail) == ("rule", "DSparkRefusesPipelineParallel")


def test_sites_are_read_with_the_function_that_holds_them() -> None:
    tree = ast.parse(
        "class A:\n"
        "    def f(self, x):\n"
        "        assert x > 0, 'positive'\n"
        "        try:\n"
        "            g()\n"
        "        except KeyError:\n"
        "            raise\n"
        "        def inner():\n"
        "            raise ValueError('no')\n"
        "raise ImportError('x')\n"
    )
    assert list(_sites(tree)) == [
        ("A.f", 3, "assert x > 0, 'positive'"),
        ("A.f.inner", 9, "raise ValueError('no')"),
        ("<module>", 10, "raise ImportError('x')"),
    ]


def test_the_summary_prints_each_release() -> None:
    lines = summary(TABLE)
    assert len(lines) == len(RELEASES)
    assert all(stage in lines[0] for stage in STAGES)


def test_the_readme_prints_the_committed_counts() -> None:
    readme = (TABLE_PATH.parents[3] / "README.md").read_text()
    for version, entry in TABLE["releases"].items():
        counts = entry["counts"]
        row = (
            f"| {version} | {entry['sites']} | {counts['rule']} | {counts['probe']} | "
            f"{counts['device']} | {counts['after-weights']} | {counts['unmapped']} |"
        )
        assert row in readme, row
