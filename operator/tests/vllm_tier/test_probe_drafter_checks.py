"""The image probe asks the real vllm 0.33.0 (on a CPU) to build the speculative config the
way the serving pods will, and parses the exact leader and worker command lines with vLLM's
own parser: per method, a drafter vLLM loads and one it refuses; a flag it does not know."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.preflight_job import probe_request
from kimik3_operator.preflight.facts import drafter_facts, target_facts
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table

from .helpers import ROOT, run_vllm

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "probe.py"
RUNNER = pathlib.Path(__file__).parent / "run_probe_checks.py"

TARGET = {
    "model_type": "kimi_k3",
    "architectures": ["KimiLinearForCausalLM"],
    "text_config": {
        "model_type": "kimi_linear",
        "num_attention_heads": 96,
        "num_experts": 896,
        "vocab_size": 163840,
        "num_hidden_layers": 93,
        "hidden_size": 7168,
        "num_nextn_predict_layers": 1,
    },
}
K3_DSPARK = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "vocab_size": 163840,
    "draft_vocab_size": 163840,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "num_target_layers": 5,
}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 163840}

# name: (spec, drafter config.json or None for the target itself)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "dspark-k3": (
        {"drafter": {"method": "dspark", "repo": "local/dspark", "numSpeculativeTokens": 8}},
        K3_DSPARK,
    ),
    "dspark-llama": (
        {"drafter": {"method": "dspark", "repo": "local/llama", "numSpeculativeTokens": 8}},
        LLAMA,
    ),
    "eagle3-k3": ({"drafter": {"method": "eagle3", "repo": "local/dspark"}}, K3_DSPARK),
    "dflash-k3": ({"drafter": {"method": "dflash", "repo": "local/dspark"}}, K3_DSPARK),
    "mtp-k3": ({"drafter": {"method": "mtp", "repo": "local/dspark"}}, K3_DSPARK),
    "unknown-flag": (
        {"engine": {"extraArgs": ["--no-such-flag", "1"]}, "drafter": {"method": "none"}},
        None,
    ),
    "bad-value": (
        {"engine": {"extraArgs": ["--max-num-seqs", "many"]}, "drafter": {"method": "none"}},
        None,
    ),
}


def write_config(directory: pathlib.Path, config: dict[str, Any]) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("probe-checks")
    target = write_config(tmp / "target", TARGET)
    requests = {}
    for name, (raw, drafter) in CASES.items():
        request = probe_request(parse_spec(raw))
        request["target"] = {"path": str(target)}
        request["drafter"] = (
            {"path": str(write_config(tmp / name, drafter))} if drafter is not None else {}
        )
        requests[name] = request
    result = run_vllm([RUNNER, SCRIPT], input=json.dumps(requests), timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def verdicts(name: str, answer: dict[str, Any]) -> dict[str, str]:
    """The preflight's failing findings for a case, from the probe's answer."""
    raw, drafter = CASES[name]
    report = {"speculative": answer["speculative"], "serve": answer["serve"]}
    facts = Facts(
        load_table(),
        target=target_facts(TARGET),
        drafter=drafter_facts(drafter),
        probed={},
        probed_release=report,
    )
    return {f.reason: f.message for f in run_rules(parse_spec(raw), facts) if f.status == "Fail"}


def test_dspark_loads_the_k3_drafter(answers: dict[str, Any]) -> None:
    speculative = answers["dspark-k3"]["speculative"]
    assert speculative == {"ok": True, "draftArchitectures": ["K3DSparkModel"]}
    assert "DrafterArchitectureUnsupportedByMethod" not in verdicts(
        "dspark-k3", answers["dspark-k3"]
    )


def test_dspark_turns_another_drafter_into_deepseek_v4s(answers: dict[str, Any]) -> None:
    speculative = answers["dspark-llama"]["speculative"]
    assert speculative.get("draftArchitectures") == ["DSparkDraftModel"] or not speculative["ok"]
    found = verdicts("dspark-llama", answers["dspark-llama"])
    assert "DrafterArchitectureUnsupportedByMethod" in found


@pytest.mark.parametrize(
    ("name", "becomes"),
    [("eagle3-k3", "Eagle3K3DSparkModel"), ("dflash-k3", "DFlashK3DSparkModel")],
)
def test_eagle3_and_dflash_rename_the_dspark_drafter_to_nothing_vllm_has(
    answers: dict[str, Any], name: str, becomes: str
) -> None:
    speculative = answers[name]["speculative"]
    assert speculative["ok"] is False
    assert becomes in speculative["error"]
    found = verdicts(name, answers[name])
    assert becomes in found["DrafterArchitectureUnsupportedByMethod"]


def test_mtp_needs_an_mtp_model(answers: dict[str, Any]) -> None:
    speculative = answers["mtp-k3"]["speculative"]
    assert speculative["ok"] is False
    assert "Unsupported speculative method" in speculative["error"]
    assert "DrafterArchitectureUnsupportedByMethod" in verdicts("mtp-k3", answers["mtp-k3"])


def test_the_rendered_command_lines_parse(answers: dict[str, Any]) -> None:
    for name in ("dspark-k3", "eagle3-k3"):
        assert answers[name]["serve"] == {"leader": {"ok": True}, "worker": {"ok": True}}


def test_a_flag_the_image_does_not_know_is_named(answers: dict[str, Any]) -> None:
    serve = answers["unknown-flag"]["serve"]
    assert serve["leader"]["ok"] is False
    assert serve["leader"]["unknownFlags"] == ["--no-such-flag"]
    found = verdicts("unknown-flag", answers["unknown-flag"])
    assert "--no-such-flag" in found["ServeFlagUnknown"]


def test_a_bad_value_is_refused_with_vllms_words(answers: dict[str, Any]) -> None:
    serve = answers["bad-value"]["serve"]
    assert serve["leader"]["ok"] is False and serve["leader"]["unknownFlags"] == []
    assert "max-num-seqs" in serve["leader"]["error"]
    assert "ServeArgsRefused" in verdicts("bad-value", answers["bad-value"])
