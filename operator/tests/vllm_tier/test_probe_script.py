"""The image probe script, run as a subprocess against the real vllm==0.33.0 on a CPU, gives
the same answers as the capability table for that release, on nvidia and on amd."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

from e2e.support.k3_configs import DRAFTER_CONFIG, TARGET_CONFIG
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.preflight_job import probe_request
from kimik3_operator.preflight.table import load_table

from .helpers import ROOT, run_vllm

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "probe.py"
FIXTURES = ROOT / "operator" / "tests" / "fixtures"


def run_probe(platform: str, tmp: pathlib.Path) -> dict[str, Any]:
    request = probe_request(parse_spec({"engine": {"platform": platform}}))
    request["drafter"] = {"path": str(tmp / "drafter")}
    request["target"] = {"path": str(tmp / "target")}
    return probe_report(request)


def probe_report(request: dict[str, Any]) -> dict[str, Any]:
    """The report the probe script prints for ``request``, run with the real vLLM."""
    result = run_vllm([SCRIPT, json.dumps(request)])
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Small config.json files standing in for the checkpoints (no weights here)."""
    tmp = tmp_path_factory.mktemp("checkpoints")
    (tmp / "target").mkdir()
    (tmp / "target" / "config.json").write_text(json.dumps(TARGET_CONFIG))
    (tmp / "drafter").mkdir()
    (tmp / "drafter" / "config.json").write_text(json.dumps(DRAFTER_CONFIG))
    return tmp


@pytest.mark.parametrize("platform", ["nvidia", "amd"])
def test_probe_answers_like_the_table(platform: str, configs: pathlib.Path) -> None:
    report = run_probe(platform, configs)
    assert report["vllmVersion"] == "0.33.0"
    assert report["errors"] == []
    release = load_table().release((0, 33, 0))
    assert release is not None
    for arch, answers in report["architectures"].items():
        table = release["architectures"][arch]["platforms"][platform]
        assert {k: table[k] for k in answers} == answers, arch
    assert set(report["architectures"]) == {
        a for a, e in release["architectures"].items() if e["servesKimiK3"]
    }
    assert report["dspark"] == release["dspark"]
    assert report["drafters"] == {
        k: {"platforms": v["platforms"]} for k, v in release["drafters"].items()
    }
    assert report["checksAuxHiddenStatesOverPP"] == release["checksAuxHiddenStatesOverPP"]
    assert report["targetConfig"]["num_attention_heads"] == 96
    assert report["drafterConfig"]["architectures"] == ["K3DSparkModel"]
    fixture = FIXTURES / f"probe-report-vllm-0.33.0-{platform}.json"
    if os.environ.get("KIMIK3_RECORD_PROBE_REPORTS"):  # after a deliberate probe change
        # The configs are this test's stand-ins, not a checkpoint's: not replayed.
        kept = {**report, "targetConfig": None, "drafterConfig": None}
        fixture.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(fixture.read_text())
    live = {k: v for k, v in report.items() if k not in ("targetConfig", "drafterConfig")}
    assert live == {
        k: v for k, v in recorded.items() if k not in ("targetConfig", "drafterConfig")
    }, "the recorded probe report the unit and end-to-end tests replay has drifted"


def test_the_probe_judges_classes_outside_the_table(tmp_path: pathlib.Path) -> None:
    """spec.model.architecture takes any class: the probe answers it from vLLM's registry and
    the class itself (a Llama target that supports EAGLE3, a Gemma one that does not, and a
    name vLLM does not know)."""
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512}
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(llama))
    for architecture, expected in (
        ("LlamaForCausalLM", {"registered": True, "supportsEagle3": True}),
        ("GemmaForCausalLM", {"registered": True, "supportsEagle3": False}),
        ("NoSuchForCausalLM", {"registered": False}),
    ):
        spec = parse_spec({"model": {"architecture": architecture}, "drafter": {"method": "none"}})
        request = probe_request(spec)
        request["target"] = {"path": str(tmp_path / "target")}
        answer = probe_report(request)["architectures"][architecture]
        assert {k: answer.get(k) for k in expected} == expected, answer
        if architecture == "LlamaForCausalLM":
            assert (answer["innerModel"], answer["innerEagleMixin"]) == ("LlamaModel", True)


def test_the_probe_starts_no_kernel_builds(tmp_path: pathlib.Path) -> None:
    """vllm 0.33.0 requires humming-kernels, whose modules start two background builds of
    their CUDA launcher when imported (each a Python importing torch, left running after the
    probe exits); the probe runs no kernel and turns them off before vLLM's import."""
    script = tmp_path / "import_kernels.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(SCRIPT.parent)!r})\n"
        "import probe\n"
        "assert 'humming' not in sys.modules\n"
        "os.environ.pop(probe.HUMMING_NO_BUILDS, None)  # the probe's own setting, tested\n"
        "probe._gpu_node_environment()\n"
        "import humming.ops.utils, humming.utils.nvrtc\n"
        "children = set()\n"
        "for task in os.listdir('/proc/self/task'):\n"
        "    with open(f'/proc/self/task/{task}/children') as listed:\n"
        "        children.update(listed.read().split())\n"
        "print(len(children))\n"
    )
    result = run_vllm([script], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "0", "kernel builds started beside the probe"
