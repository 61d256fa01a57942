"""The image probe goes on past vLLM's configuration: it constructs the target and the drafter
from it on PyTorch's meta device, with the real vllm 0.33.0 on a CPU, as the model runner does
before the first weight. Shapes vLLM's configuration accepts and its model classes refuse are
refused here with vLLM's own words and the line that raised them; what cannot be constructed
without a GPU is said, never taken for a refusal. Tiny Llama configs stand in for checkpoints
(no weights)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.support.k3_configs import DRAFTER_CONFIG, TARGET_CONFIG
from kimik3_operator.api.constants import ConditionType, Reason
from kimik3_operator.api.parse import parse_spec
from kimik3_operator.preflight.rules import Facts, run_rules
from kimik3_operator.preflight.table import load_table

from .helpers import ROOT, run_vllm

pytestmark = pytest.mark.vllm
SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "probe.py"


def llama(heads: int, kv_heads: int, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        **extra,
    }


def eagle3(heads: int, kv_heads: int) -> dict[str, Any]:
    config = llama(heads, kv_heads, num_hidden_layers=1, draft_vocab_size=1000)
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    return config


def leader(tensor: int, speculative: dict[str, Any]) -> list[str]:
    return [
        "local/model",
        "--tensor-parallel-size",
        str(tensor),
        "--speculative-config",
        json.dumps({"model": "local/drafter", **speculative}),
    ]


EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3}
CASES: dict[str, dict[str, Any]] = {
    # 16 heads and 4 KV heads shard over 2 ranks: both classes construct.
    "fits": {"argv": leader(2, EAGLE3), "target": llama(16, 4), "drafter": eagle3(4, 2)},
    # The target as its own draft model: two models with the same layer names, which the
    # runner keeps apart.
    "draft-model": {
        "argv": leader(1, {"method": "draft_model", "num_speculative_tokens": 3}),
        "target": llama(16, 4),
        "drafter": llama(16, 4),
    },
    # 16 heads shard over 4 ranks, which vLLM's configuration checks; 6 KV heads do not,
    # which only the Llama class asserts.
    "kv-heads": {"argv": leader(4, EAGLE3), "target": llama(16, 6), "drafter": eagle3(4, 2)},
    # The drafter's 4 heads over 3 KV heads: its attention layer refuses it.
    "drafter-heads": {"argv": leader(1, EAGLE3), "target": llama(16, 4), "drafter": eagle3(4, 3)},
    # The Kimi-K3 stand-ins with DSpark at TP 8: the real NVIDIA classes, constructed.
    "kimi-k3": {
        "argv": [
            *leader(8, {"method": "dspark", "num_speculative_tokens": 8}),
            "--trust-remote-code",
        ],
        "target": TARGET_CONFIG,
        "drafter": DRAFTER_CONFIG,
    },
    # Over two nodes, as the leader's line says it: the probe joins no peer.
    "kimi-k3-two-nodes": {
        "argv": [
            *leader(16, {"method": "dspark", "num_speculative_tokens": 8}),
            "--trust-remote-code",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-addr",
            "leader.invalid",
        ],
        "target": TARGET_CONFIG,
        "drafter": DRAFTER_CONFIG,
    },
    # The same, the drafter's config.json without target_hidden_size, which the DSpark
    # class reads in its constructor: the engine would stop there.
    "kimi-k3-no-field": {
        "argv": [
            *leader(8, {"method": "dspark", "num_speculative_tokens": 8}),
            "--trust-remote-code",
        ],
        "target": TARGET_CONFIG,
        "drafter": {k: v for k, v in DRAFTER_CONFIG.items() if k != "target_hidden_size"},
    },
    # A Kimi-K3 checkpoint whose linear-attention (KDA) layers have 24 heads, at tensor 16:
    # vLLM's configuration checks the 96 attention heads only; the KDA layer asserts its own.
    "kimi-k3-kda-heads": {
        "argv": [
            *leader(16, {"method": "dspark", "num_speculative_tokens": 8}),
            "--trust-remote-code",
        ],
        "target": {
            **TARGET_CONFIG,
            "text_config": {
                **TARGET_CONFIG["text_config"],
                "linear_attn_config": {
                    **TARGET_CONFIG["text_config"]["linear_attn_config"],
                    "num_heads": 24,
                },
            },
        },
        "drafter": DRAFTER_CONFIG,
    },
    # The drafter's config.json without the token its parallel drafting slots are filled
    # with: the models construct, and Model Runner V2's DSpark speculator refuses it.
    "kimi-k3-no-noise-token": {
        "argv": [
            *leader(8, {"method": "dspark", "num_speculative_tokens": 8}),
            "--trust-remote-code",
        ],
        "target": TARGET_CONFIG,
        "drafter": {k: v for k, v in DRAFTER_CONFIG.items() if k != "dspark_noise_token_id"},
    },
}


def probe_cases() -> list[dict[str, Any]]:
    """CASES as the probe's --differential takes them, each constructed."""
    return [
        {
            "id": name,
            "argv": case["argv"],
            "platform": "nvidia",
            "targetConfig": case["target"],
            "drafterConfig": case["drafter"],
            "construct": True,
        }
        for name, case in CASES.items()
    ]


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("construction")
    (tmp / "cases.json").write_text(json.dumps(probe_cases()))
    result = run_vllm([SCRIPT, "--differential", tmp / "cases.json", tmp / "out"])
    assert result.returncode == 0, result.stderr[-3000:]
    return {a["id"]: a for a in json.loads((tmp / "out").read_text())}


def findings(name: str, answer: dict[str, Any]) -> list[Any]:
    release = {"engine": {"ok": answer["ok"]}, "construct": answer.get("construct")}
    facts = Facts(load_table(), probed={}, probed_release=release)
    spec = parse_spec({"engine": {"version": "0.33.0"}})
    return [f for f in run_rules(spec, facts) if f.id == "construct"]


def test_a_shape_that_shards_constructs_both_models(answers: dict[str, dict[str, Any]]) -> None:
    built = answers["fits"]["construct"]
    assert built["ok"] is True, built
    assert built["built"] == ["target: LlamaForCausalLM", "drafter: Eagle3LlamaForCausalLM"]
    # The proposer Model Runner V2 picks for EAGLE3, built by vLLM's own init_speculator.
    assert built["proposer"] == {"runner": "v2", "class": "EagleSpeculator"}
    assert any("rank 0 of each parallel group (tp=2)" in s for s in built["stubbed"])
    assert any("attention backends" in s for s in built["stubbed"])
    [finding] = findings("fits", answers["fits"])
    assert (finding.status, finding.reason) == ("Pass", Reason.MODELS_CONSTRUCTED)


def test_a_draft_model_with_the_targets_layer_names_constructs(
    answers: dict[str, dict[str, Any]],
) -> None:
    built = answers["draft-model"]["construct"]
    assert built["ok"] is True, built
    assert built["built"] == ["target: LlamaForCausalLM", "drafter: LlamaForCausalLM"]
    assert built["proposer"] == {"runner": "v2", "class": "StandaloneARSpeculator"}


@pytest.mark.parametrize(
    ("name", "file", "statement"),
    [
        # A Llama target's KV heads.
        ("kv-heads", "vllm/model_executor/models/llama.py", "total_num_kv_heads % tp_size"),
        # The Kimi-K3 NVIDIA class's own KDA layer.
        ("kimi-k3-kda-heads", "vllm/models/kimi_k3/nvidia/kda.py", "num_heads % self.tp_size"),
    ],
)
def test_a_target_shape_vllms_configuration_accepts_is_refused_by_the_class(
    answers: dict[str, dict[str, Any]], name: str, file: str, statement: str
) -> None:
    answer = answers[name]
    assert answer["ok"] is True  # VllmConfig alone passes it
    built = answer["construct"]
    assert built["ok"] is False and built["model"] == "target", built
    assert built["site"].startswith(f"{file}:")
    assert statement in built["error"]
    [finding] = findings(name, answer)
    assert (finding.status, finding.reason) == ("Fail", Reason.MODEL_CONSTRUCTION_REFUSED)
    assert finding.condition == ConditionType.CAPABILITIES_VERIFIED
    assert file.rsplit("/", 1)[1] in finding.message and "spec.model" in finding.message


def test_a_drafter_its_class_refuses_is_named_on_the_drafter_condition(
    answers: dict[str, dict[str, Any]],
) -> None:
    answer = answers["drafter-heads"]
    assert answer["ok"] is True
    built = answer["construct"]
    assert built["model"] == "drafter", built
    assert "not divisible by num_kv_heads (3)" in built["error"]
    assert built["built"] == ["target: LlamaForCausalLM"]
    [finding] = findings("drafter-heads", answer)
    assert finding.status == "Fail"
    assert finding.condition == ConditionType.DRAFTER_PAIRED
    assert "spec.drafter" in finding.message


@pytest.mark.parametrize("name", ["kimi-k3", "kimi-k3-two-nodes"])
def test_the_kimi_k3_classes_construct_with_the_gpus_kernel_choices_stood_in(
    answers: dict[str, dict[str, Any]], name: str
) -> None:
    """The Kimi-K3 NVIDIA target and the DSpark drafter, the real classes of the GPU wheel,
    at tensor 8 and at 16 over two nodes: the choices the GPU makes from its device (MoE
    kernel, MLA prefill, compute units) are stood in and said, and every layer is built."""
    answer = answers[name]
    assert answer["ok"] is True
    built = answer["construct"]
    assert built["ok"] is True, built
    assert built["built"] == ["target: KimiLinearForCausalLM", "drafter: K3DSparkForCausalLM"]
    assert built["notBuilt"] == {}
    assert built["proposer"] == {"runner": "v2", "class": "DSparkSpeculator"}
    stubbed = " | ".join(built["stubbed"])
    for stand_in in ("MoE experts: Triton's kernel", "MLA prefill", "compute units: 132"):
        assert stand_in in stubbed, stubbed
    [finding] = findings(name, answer)
    assert (finding.status, finding.reason) == ("Pass", Reason.MODELS_CONSTRUCTED)
    assert "KimiLinearForCausalLM" in finding.message and "DSparkSpeculator" in finding.message
    assert "not constructed" not in finding.message
    size = 16 if name == "kimi-k3-two-nodes" else 8
    assert f"rank 0 of each parallel group (tp={size}), no peers" in built["stubbed"]


def test_a_drafter_missing_a_field_its_class_reads_is_refused(
    answers: dict[str, dict[str, Any]],
) -> None:
    built = answers["kimi-k3-no-field"]["construct"]
    assert built["model"] == "drafter", built
    assert "target_hidden_size" in built["error"]
    assert built["site"].startswith("vllm/models/kimi_k3/")


def test_a_drafter_its_speculator_refuses_is_named_on_the_drafter_condition(
    answers: dict[str, dict[str, Any]],
) -> None:
    built = answers["kimi-k3-no-noise-token"]["construct"]
    assert built["model"] == "proposer", built
    assert built["proposer"] == {"runner": "v2"}
    assert "dspark_noise_token_id" in built["error"]
    assert built["site"].startswith("vllm/v1/worker/gpu/spec_decode/")
    [finding] = findings("kimi-k3-no-noise-token", answers["kimi-k3-no-noise-token"])
    assert (finding.status, finding.reason) == ("Fail", Reason.MODEL_CONSTRUCTION_REFUSED)
    assert finding.condition == ConditionType.DRAFTER_PAIRED
    assert "the drafter's proposer (model runner v2)" in finding.message
    assert "spec.drafter" in finding.message
