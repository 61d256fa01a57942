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

from .helpers import vllm_python
from .test_probe_script import probe_report

pytestmark = pytest.mark.vllm
SAMPLE = 48


def test_static_verdicts_agree_with_vllm_on_a_sample_of_the_space() -> None:
    points = sample_points(SAMPLE, 20261204)
    outcomes, unreadable = compare("0.33.0", vllm_python(), points)
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
