"""The static preflight against vLLM's own configuration code for the release in this tier
(bench/differential.py runs every release and the whole space): a sample of the CRD's space,
each spec judged by the static rules and by vLLM building its whole configuration from the
rendered command line. A static Pass vLLM refuses is a rule bug; a static Fail it accepts,
a false alarm (unless the rule is one vLLM decides later, at model load)."""

from __future__ import annotations

import json
import pathlib

import pytest
from bench.differential import compare, report, sample_points

from kimik3_operator.api.parse import parse_spec
from kimik3_operator.builders.preflight_job import probe_request
from kimik3_operator.preflight.gate import probed_facts
from kimik3_operator.preflight.rules import run_rules
from kimik3_operator.preflight.table import load_table

from .helpers import run_differential, vllm_python
from .test_probe_script import probe_report

pytestmark = pytest.mark.vllm
SAMPLE = 48


def test_static_verdicts_agree_with_vllm_on_a_sample_of_the_space() -> None:
    points = sample_points(SAMPLE, 20261204)
    outcomes, unreadable = compare("0.33.0", vllm_python(), points, run=run_differential)
    result = report("0.33.0", outcomes, unreadable)
    print(json.dumps({k: result[k] for k in ("compared", "agreement", "counts")}))
    assert result["compared"] >= SAMPLE * 3 // 4
    assert result["disagreements"] == []
    assert result["agreement"] == 1.0


def test_the_probe_builds_vllms_whole_configuration(tmp_path: pathlib.Path) -> None:
    """What the rules cannot know, vLLM's own configuration refuses in the probe: decode
    context parallelism on a GQA model needs more tensor ranks than KV heads."""
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
    }
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(llama))
    answers = {}
    for dcp in (1, 2):
        spec = parse_spec(
            {
                "model": {"architecture": "LlamaForCausalLM"},
                "drafter": {"method": "none"},
                "engine": {"maxModelLen": 2048},
                "parallelism": {"tensor": 2, "decodeContext": dcp},
                "placement": {"gpusPerNode": 2},
            }
        )
        request = probe_request(spec)
        request["target"] = {"path": str(tmp_path / "target")}
        report_ = probe_report(request)
        answers[dcp] = report_["engine"]
        findings = run_rules(spec, probed_facts(load_table(), report_))
        refused = [f for f in findings if f.reason == "EngineConfigRefused"]
        assert bool(refused) == (dcp == 2), (dcp, report_["engine"])
    assert answers[1]["ok"] is True
    assert answers[2]["ok"] is False
    assert "Decode context parallelism" in answers[2]["error"]


BASE_POINT = {
    "architecture": "LlamaForCausalLM",
    "platform": "nvidia",
    "method": "none",
    "tokens": None,
    "parallel": (8, 1),
    "decode_context": 1,
    "expert": False,
    "kv_cache_dtype": "auto",
    "samples": ("greedy", "standard"),
    "max_model_len": 32768,
    "drafter_config": "published",
    "extra_args": "none",
    "tag": "release",
}


def test_the_attention_types_and_head_kinds_agree_with_vllm() -> None:
    """The axes the sampled space reaches rarely, each asked of vLLM: grouped-query attention
    with decode-context parallelism against its KV heads (refused at tensor 8, accepted at
    16), expert parallelism on a dense model, an EAGLE3 head with its smaller draft vocabulary
    and one whose heads do not divide the draft's tensor size, a DSpark drafter whose block
    size gives the token count and one with none, and a DFlash head under dspark, which vLLM
    configures as DeepSeek-V4's drafter and fails to build."""
    points = {
        "gqa dcp 2 at tensor 8": ({"decode_context": 2}, "Fail", False),
        "gqa dcp 2 at tensor 16": ({"decode_context": 2, "parallel": (16, 1)}, "Pass", True),
        "gqa dense with expert parallel": ({"expert": True}, "Fail", False),
        "eagle3 head on kimi": (
            {
                "architecture": "KimiK3ForConditionalGeneration",
                "method": "eagle3",
                "tokens": 3,
                "drafter_config": "eagle3_head",
            },
            "Pass",
            True,
        ),
        "eagle3 head whose heads do not divide tensor 8": (
            {
                "architecture": "KimiK3ForConditionalGeneration",
                "method": "eagle3",
                "tokens": 3,
                "drafter_config": "eagle3_head_28_heads",
            },
            "Fail",
            False,
        ),
        "dspark drafter with its block size": (
            {
                "architecture": "KimiLinearForCausalLM",
                "method": "dspark",
                "drafter_config": "block_size",
            },
            "Pass",
            True,
        ),
        "dspark drafter without any token count": (
            {
                "architecture": "KimiLinearForCausalLM",
                "method": "dspark",
                "drafter_config": "published",
            },
            "Fail",
            False,
        ),
        "dflash head under dspark": (
            {
                "architecture": "KimiLinearForCausalLM",
                "method": "dspark",
                "drafter_config": "dflash_head",
            },
            "Fail",
            True,
        ),
    }
    names = list(points)
    outcomes, unreadable = compare(
        "0.33.0",
        vllm_python(),
        [{**BASE_POINT, **points[name][0]} for name in names],
        run=run_differential,
    )
    assert unreadable == 0
    for name, outcome in zip(names, outcomes, strict=True):
        _, static, accepted = points[name]
        assert (outcome.static.verdict, outcome.vllm_ok) == (static, accepted), (name, outcome)
        assert outcome.verdict in ("agree", "earlier"), (name, outcome)
